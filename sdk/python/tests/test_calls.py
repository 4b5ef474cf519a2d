"""The decorator and the context managers emit the call, attempt and stage spans, and every failure becomes
an envelope at the boundary."""

from __future__ import annotations

import asyncio
import json
from typing import Literal, Optional

import httpx
import pydantic
import pytest
from opentelemetry.trace import StatusCode

import toolspan
from conftest import LogCapture, Service, Spans, assert_clean, ok_json

FAST = dict(initial_backoff_s=0.001, max_backoff_s=0.002)


class TicketArgs(pydantic.BaseModel):
    ticket_id: int
    status: Literal["open", "pending", "closed"]


def test_success_emits_call_and_stage_spans_without_payloads(ts: toolspan.Toolspan, spans: Spans) -> None:
    @toolspan.tool(toolspan=ts, arguments=TicketArgs)
    def update_ticket(ticket_id: int, status: str) -> dict:
        return {"ticket_id": ticket_id, "status": status}

    r = update_ticket.invoke('{"ticket_id": 7, "status": "closed"}', call_id="call_1")
    assert r.ok and r.status == "ok"
    assert r.value == {"ticket_id": 7, "status": "closed"}
    assert json.loads(r.content()) == {"ticket_id": 7, "status": "closed"}

    call = spans.call("update_ticket")
    assert call.attributes["gen_ai.operation.name"] == "execute_tool"
    assert call.attributes["gen_ai.tool.call.id"] == "call_1"
    assert "toolspan.attempt" not in call.attributes
    # Payloads only when the application opts in.
    assert "gen_ai.tool.call.arguments" not in call.attributes
    assert "gen_ai.tool.call.result" not in call.attributes
    assert call.status.status_code is StatusCode.OK
    # One permitted attempt: the stages hang off the call.
    assert [s.attributes["toolspan.stage"] for s in spans.stages(call)] == ["prepare", "execute"]
    assert spans.attempts(call) == []
    assert all(s.status.status_code is not StatusCode.ERROR for s in spans.all)


def test_payloads_are_recorded_when_opted_in_and_capped(provider, spans: Spans) -> None:
    ts = toolspan.Toolspan(tracer_provider=provider, capture_payloads=True, payload_limit=100)

    @toolspan.tool(toolspan=ts)
    def echo(text: str) -> str:
        return text * 3

    echo.invoke({"text": "x" * 80})
    call = spans.call("echo")
    assert json.loads(call.attributes["gen_ai.tool.call.arguments"]) == {"text": "x" * 80}
    result = call.attributes["gen_ai.tool.call.result"]
    assert result.startswith("x" * 100) and "140 more characters" in result


def test_argument_errors_name_the_field_the_value_and_what_is_permitted(ts, spans: Spans, logs: LogCapture) -> None:
    ran = []

    @toolspan.tool(toolspan=ts, arguments=TicketArgs)
    def update_ticket(ticket_id: int, status: str) -> None:
        ran.append(1)

    r = update_ticket.invoke({"ticket_id": 7, "status": "resolved"}, call_id="c")
    assert r.status == "invalid_args" and not ran
    e = r.error
    assert (e.code, e.error_class, e.field, e.received) == ("invalid_argument", "invalid_request", "status", "resolved")
    assert e.permitted == ("open", "pending", "closed")
    assert e.retryable is False and e.reference.startswith("err_")
    body = json.loads(r.content())["error"]
    assert body["permitted"] == ["open", "pending", "closed"] and body["class"] == "invalid_request"
    assert_clean(r.content())

    call = spans.call()
    (prep,) = spans.stages(call)
    assert prep.attributes["toolspan.stage"] == "prepare"
    for s in (prep, call):
        assert s.status.status_code is StatusCode.ERROR
        assert s.attributes["error.type"] == "PREPARE"
        assert s.attributes["toolspan.error.code"] == "invalid_argument"
        assert s.attributes["toolspan.error.reference"] == e.reference
    # The full exception: on the span as an exception event, in the log under the reference.
    (ev,) = [ev for ev in prep.events if ev.name == "exception"]
    assert "ValidationError" in ev.attributes["exception.type"]
    assert "Traceback" in ev.attributes["exception.stacktrace"]
    (logged,) = logs.by_reference(e.reference)
    assert "Traceback" in logged and "ValidationError" in logged


def test_json_schema_callable_and_signature_validation(ts, spans: Spans) -> None:
    schema = {
        "type": "object",
        "properties": {"query": {"type": "string"}, "mode": {"enum": ["fast", "exact"]}},
        "required": ["query"],
    }

    @toolspan.tool(toolspan=ts, arguments=schema)
    def search(query: str, mode: str = "fast") -> str:
        return query

    r = search.invoke({"query": "q", "mode": "slow"})
    assert (r.status, r.error.field, r.error.received, r.error.permitted) == ("invalid_args", "mode", "slow", ("fast", "exact"))
    r = search.invoke({"mode": "fast"})
    assert (r.status, r.error.field) == ("invalid_args", "query")
    assert search.invoke({"query": "ok"}).value == "ok"

    def positive(args):
        if args.get("n", 0) <= 0:
            raise toolspan.ArgumentError("n must be positive", field="n", received=args.get("n"))
        return args

    @toolspan.tool(toolspan=ts, arguments=positive)
    def count(n: int) -> int:
        return n

    r = count.invoke({"n": -2})
    assert (r.status, r.error.message, r.error.field, r.error.received) == ("invalid_args", "n must be positive", "n", -2)

    @toolspan.tool(toolspan=ts)
    def plain(a: int, b: int = 1) -> int:
        return a + b

    r = plain.invoke({"a": 1, "c": 2})
    assert (r.error.code, r.error.field, r.error.permitted) == ("invalid_argument", "c", ("a", "b"))
    r = plain.invoke({"b": 2})
    assert (r.error.field, r.error.message) == ("a", "missing required argument 'a'")
    r = plain.invoke('{"a": 1,')
    assert (r.status, r.error.code, r.error.message) == ("invalid_args", "invalid_json", "the arguments are not valid JSON")
    assert {c.attributes["error.type"] for c in spans.calls() if c.status.status_code is StatusCode.ERROR} == {"PREPARE"}


def test_the_tools_own_error_is_enveloped_and_logged_with_its_traceback(ts, spans: Spans, logs: LogCapture) -> None:
    @toolspan.tool(toolspan=ts)
    def run_sql(query: str) -> list:
        raise RuntimeError(
            "psycopg.errors.UndefinedTable: relation \"tickets\" does not exist\n"
            "LINE 1: SELECT * FROM tickets WHERE password='hunter2' /srv/app/db.py"
        )

    r = run_sql.invoke({"query": "open tickets"})
    assert r.status == "tool_error"
    assert (r.error.code, r.error.error_class, r.error.retryable) == ("internal_error", "internal", False)
    assert r.error.unmapped
    assert_clean(r.content())
    assert_clean(json.dumps(r.to_openai()))

    call = spans.call()
    (prep, exe) = spans.stages(call)
    assert exe.attributes["toolspan.stage"] == "execute"
    assert exe.attributes["error.type"] == "TOOL_ERROR" and call.attributes["error.type"] == "TOOL_ERROR"
    assert prep.status.status_code is not StatusCode.ERROR
    stack = [ev for ev in exe.events if ev.name == "exception"][0].attributes["exception.stacktrace"]
    assert "RuntimeError" in stack and "UndefinedTable" in stack
    (logged,) = logs.by_reference(r.error.reference)
    assert "Traceback (most recent call last)" in logged and "hunter2" in logged
    assert r.error.reference in logged


def test_tool_error_raised_by_the_tool_is_returned_as_written(ts, spans: Spans) -> None:
    @toolspan.tool(toolspan=ts)
    def update_ticket(ticket_id: int) -> None:
        raise toolspan.ToolError(
            "ticket 7 is locked by another agent; try again in a minute",
            code="ticket_locked",
            error_class="conflict",
            retryable=True,
            retry_after_ms=60000,
        )

    r = update_ticket.invoke({"ticket_id": 7})
    assert r.to_dict() == {
        "error": {
            "code": "ticket_locked",
            "class": "conflict",
            "message": "ticket 7 is locked by another agent; try again in a minute",
            "retryable": True,
            "retry_after_ms": 60000,
            "reference": r.error.reference,
        }
    }
    call = spans.call()
    assert call.attributes["toolspan.error.retry_after_ms"] == 60000
    assert call.attributes["toolspan.error.retryable"] is True


def test_applications_register_their_own_mappings(provider, spans: Spans) -> None:
    class QuotaExceeded(Exception):
        pass

    class LockHeld(Exception):
        def __init__(self, seconds: int) -> None:
            self.seconds = seconds

    mapper = toolspan.ErrorMapper()
    mapper.register(QuotaExceeded, code="quota_exceeded", error_class="permission", message="the workspace is out of quota")
    mapper.register(
        LockHeld,
        lambda e, stage: toolspan.ErrorEnvelope(
            code="locked", error_class="conflict", message="locked", retryable=True, retry_after_ms=e.seconds * 1000
        ),
    )
    ts = toolspan.Toolspan(tracer_provider=provider, mapper=mapper)

    @toolspan.tool(toolspan=ts)
    def f(kind: str) -> None:
        raise QuotaExceeded("tenant 42 used 1.2 GB of 1 GB") if kind == "q" else LockHeld(3)

    r = f.invoke({"kind": "q"})
    assert (r.error.code, r.error.error_class, r.error.message) == ("quota_exceeded", "permission", "the workspace is out of quota")
    r = f.invoke({"kind": "l"})
    assert (r.error.code, r.error.retry_after_ms) == ("locked", 3000)


def test_staged_tool_send_network_failure_retries_then_exhausts(ts, spans: Spans, closed_port: int, logs: LogCapture) -> None:
    @toolspan.tool(toolspan=ts, retry=toolspan.RetryPolicy(max_attempts=3, **FAST))
    def fetch_url(attempt: toolspan.Attempt, path: str) -> str:
        with attempt.send(**{"server.address": "127.0.0.1", "server.port": closed_port}):
            resp = httpx.get(f"http://127.0.0.1:{closed_port}{path}", timeout=2)
        with attempt.parse():
            return resp.text

    r = fetch_url.invoke({"path": "/x"}, call_id="call_9")
    assert r.status == "tool_error" and r.attempts == 3
    assert (r.error.code, r.error.error_class, r.error.retryable) == ("connection_refused", "transient", True)
    assert_clean(r.content())

    call = spans.call()
    attempts = spans.attempts(call)
    assert [a.attributes["toolspan.attempt"] for a in attempts] == [1, 2, 3]
    assert call.attributes["error.type"] == "RETRY_EXHAUSTED"
    assert call.status.status_code is StatusCode.ERROR
    # The call links every attempt.
    assert {l.context.span_id for l in call.links} == {a.context.span_id for a in attempts}
    for a in attempts:
        (prep, send) = spans.stages(a)
        assert (prep.attributes["toolspan.stage"], send.attributes["toolspan.stage"]) == ("prepare", "send")
        assert send.attributes["error.type"] == "NETWORK" and a.attributes["error.type"] == "NETWORK"
        assert send.attributes["toolspan.error.code"] == "connection_refused"
    # Each failed attempt has its own reference; the call carries the last one.
    refs = [a.attributes["toolspan.error.reference"] for a in attempts]
    assert len(set(refs)) == 3 and call.attributes["toolspan.error.reference"] == refs[-1] == r.error.reference
    for ref in refs:
        (logged,) = logs.by_reference(ref)
        assert "ConnectError" in logged and "Traceback" in logged
    assert [r.levelname for r in logs.records] == ["WARNING", "WARNING", "ERROR"]


def test_gateway_502_is_network_and_recovers_on_retry(ts, spans: Spans, service: Service) -> None:
    service.answers("/search", (502, {}, b"<html>bad gateway nginx/1.25</html>"), ok_json({"hits": [1, 2]}))

    @toolspan.tool(toolspan=ts, retry=toolspan.RetryPolicy(max_attempts=3, **FAST))
    def search_docs(attempt: toolspan.Attempt, query: str) -> list:
        with attempt.send(**{"server.address": "127.0.0.1"}) as span:
            resp = httpx.get(service.url + "/search", params={"q": query})
            span.set_attribute("http.response.status_code", resp.status_code)
            resp.raise_for_status()
        with attempt.parse():
            return resp.json()["hits"]

    r = search_docs.invoke({"query": "reset"})
    assert r.ok and r.value == [1, 2] and r.attempts == 2
    call = spans.call()
    a1, a2 = spans.attempts(call)
    assert a1.status.status_code is StatusCode.ERROR and a1.attributes["error.type"] == "NETWORK"
    assert a1.attributes["toolspan.error.code"] == "bad_gateway"
    (_, send1) = spans.stages(a1)
    assert send1.attributes["http.response.status_code"] == 502
    assert a2.status.status_code is StatusCode.OK
    assert call.status.status_code is StatusCode.OK and "error.type" not in call.attributes


def test_http_statuses_map_to_the_taxonomy(ts, service: Service) -> None:
    cases = {
        401: ("unauthorized", "permission", "NETWORK", False),
        403: ("forbidden", "permission", "NETWORK", False),
        404: ("not_found", "not_found", "TOOL_ERROR", False),
        422: ("arguments_rejected", "invalid_request", "PREPARE", False),
        429: ("rate_limited", "transient", "TOOL_ERROR", True),
        500: ("tool_failed", "internal", "TOOL_ERROR", False),
        503: ("service_unavailable", "transient", "NETWORK", True),
        504: ("gateway_timeout", "transient", "NETWORK", True),
    }
    for status in cases:
        service.answers(f"/s{status}", (status, {"Retry-After": "2"}, b"Internal error at /srv/app/main.py line 3"))

    for status, (code, cls, et, retryable) in cases.items():
        with ts.call("http_tool") as call:
            with call.send():
                httpx.get(f"{service.url}/s{status}").raise_for_status()
        r = call.result
        assert (r.error.code, r.error.error_class, r.error.retryable) == (code, cls, retryable), status
        assert call.span.attributes["error.type"] == et, status
        assert r.error.retry_after_ms == (2000 if retryable else None), status
        assert_clean(r.content())


def test_requests_errors_are_mapped_like_httpx(ts, service: Service, closed_port: int) -> None:
    import requests

    service.answers("/gw", (502, {}, b""))
    with ts.call("req") as call:
        with call.send():
            requests.get(f"http://127.0.0.1:{closed_port}/", timeout=2)
    assert call.result.error.code == "connection_refused"
    with ts.call("req") as call:
        with call.send():
            requests.get(service.url + "/gw", timeout=2).raise_for_status()
    assert call.result.error.code == "bad_gateway" and call.span.attributes["error.type"] == "NETWORK"


def test_malformed_answer_is_a_parse_error(ts, spans: Spans, service: Service) -> None:
    service.answers("/search", (200, {"Content-Type": "application/json"}, b'{"hits": [1, 2'))

    class Answer(pydantic.BaseModel):
        hits: list[int]

    @toolspan.tool(toolspan=ts, result=Answer)
    def search_docs(query: str) -> str:
        return httpx.get(service.url + "/search").text

    r = search_docs.invoke({"query": "x"})
    assert (r.status, r.error.error_class) == ("tool_error", "internal")
    call = spans.call()
    assert [s.attributes["toolspan.stage"] for s in spans.stages(call)] == ["prepare", "execute", "parse"]
    assert spans.stages(call)[2].attributes["error.type"] == "PARSE"
    assert call.attributes["error.type"] == "PARSE"

    with ts.call("search_docs") as c2:
        with c2.parse():
            json.loads('{"hits": [1, 2')
    assert (c2.result.error.code, c2.result.error.message) == ("invalid_json", "the tool's answer was not valid JSON")
    assert c2.span.attributes["error.type"] == "PARSE"

    service.answers("/ok", ok_json({"hits": ["a"]}))

    @toolspan.tool(toolspan=ts, result=Answer)
    def wrong_shape(query: str) -> dict:
        return httpx.get(service.url + "/ok").json()

    r = wrong_shape.invoke({"query": "x"})
    assert (r.error.code, r.error.message) == ("invalid_response", "the tool's answer did not have the expected shape")
    assert "field" not in r.to_dict()["error"]


def test_explicit_context_managers_with_an_attempt_loop(ts, spans: Spans) -> None:
    outcomes = iter([ConnectionRefusedError(111, "Connection refused"), None])
    with ts.call("fetch_url", call_id="c1", retry=toolspan.RetryPolicy(max_attempts=4, **FAST)) as call:
        for attempt in call.attempts():
            with attempt:
                with attempt.prepare():
                    pass
                with attempt.send():
                    err = next(outcomes)
                    if err:
                        raise err
                with attempt.parse():
                    attempt.succeed({"ok": True})
    assert call.result.ok and call.result.value == {"ok": True} and call.result.attempts == 2
    root = spans.call()
    a1, a2 = spans.attempts(root)
    assert [s.attributes["toolspan.stage"] for s in spans.stages(a1)] == ["prepare", "send"]
    assert [s.attributes["toolspan.stage"] for s in spans.stages(a2)] == ["prepare", "send", "parse"]
    assert spans.stages(a1)[1].attributes["toolspan.error.code"] == "connection_refused"


def test_non_retryable_failures_are_not_retried(ts, spans: Spans) -> None:
    n = []

    @toolspan.tool(toolspan=ts, retry=toolspan.RetryPolicy(max_attempts=5, **FAST))
    def f() -> None:
        n.append(1)
        raise ValueError("boom")

    r = f.invoke({})
    assert len(n) == 1 and r.attempts == 1
    call = spans.call()
    assert call.attributes["error.type"] == "TOOL_ERROR"
    assert len(spans.attempts(call)) == 1


def test_retry_after_is_honoured_and_the_deadline_stops_retries(ts) -> None:
    import time

    seen: list[float] = []

    @toolspan.tool(toolspan=ts, retry=toolspan.RetryPolicy(max_attempts=3, **FAST))
    def limited() -> None:
        seen.append(time.monotonic())
        raise toolspan.ToolError("slow down", code="rate_limited", error_class="transient", retryable=True, retry_after_ms=120)

    r = limited.invoke({})
    assert r.attempts == 3
    assert all(b - a >= 0.12 for a, b in zip(seen, seen[1:])), seen

    seen.clear()

    @toolspan.tool(toolspan=ts, retry=toolspan.RetryPolicy(max_attempts=10, initial_backoff_s=0.05, jitter=0, deadline_s=0.12))
    def flaky() -> None:
        seen.append(time.monotonic())
        raise ConnectionResetError("reset")

    r = flaky.invoke({})
    # Waits of 0.05 then 0.1: the second would pass the deadline, so two attempts.
    assert r.attempts == 2 and len(seen) == 2


def test_backoff_grows_exponentially_within_its_jitter() -> None:
    import random

    p = toolspan.RetryPolicy(max_attempts=5, initial_backoff_s=0.1, multiplier=2, max_backoff_s=0.3, jitter=0.5)
    rng = random.Random(1)
    for n, base in [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.3)]:
        for _ in range(50):
            w = p.backoff_s(n, None, rng)
            assert base * 0.5 <= w <= base
    assert p.backoff_s(1, 5000, rng) == 5.0
    with pytest.raises(ValueError):
        toolspan.RetryPolicy(max_attempts=0)


def test_async_tool_past_its_deadline_is_a_timeout(ts, spans: Spans) -> None:
    @toolspan.tool(toolspan=ts, retry=toolspan.RetryPolicy(max_attempts=3, deadline_s=0.05))
    async def slow(query: str) -> str:
        await asyncio.sleep(5)
        return query

    r = asyncio.run(slow.ainvoke({"query": "x"}))
    assert r.status == "timeout" and r.error.code == "timeout" and r.attempts == 1
    call = spans.call()
    (_, exe) = spans.stages(spans.attempts(call)[0])
    assert exe.attributes["error.type"] == "TOOL_ERROR"

    @toolspan.tool(toolspan=ts)
    async def fine(query: str) -> str:
        await asyncio.sleep(0)
        return query.upper()

    assert asyncio.run(fine(query="ok")).value == "OK"
    with pytest.raises(TypeError):
        fine.invoke({"query": "x"})


def test_cancellation_and_interrupts_are_never_swallowed(ts, spans: Spans) -> None:
    @toolspan.tool(toolspan=ts)
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted.invoke({})
    assert spans.call().status.status_code is StatusCode.ERROR


def test_tool_results_render_for_openai_and_anthropic(ts) -> None:
    @toolspan.tool(toolspan=ts)
    def f(fail: bool) -> dict:
        if fail:
            raise TimeoutError("read timed out after 30s talking to 10.0.0.7:5432")
        return {"answer": 42}

    ok = f.invoke({"fail": False}, call_id="call_a")
    assert ok.to_openai() == {"role": "tool", "tool_call_id": "call_a", "content": '{"answer": 42}'}
    assert ok.to_anthropic() == {"type": "tool_result", "tool_use_id": "call_a", "content": '{"answer": 42}', "is_error": False}
    assert ok.to_openai_responses() == {"type": "function_call_output", "call_id": "call_a", "output": '{"answer": 42}'}
    bad = f.invoke({"fail": True}, call_id="toolu_b")
    assert bad.status == "timeout"
    msg = bad.to_anthropic()
    assert msg["is_error"] is True and msg["tool_use_id"] == "toolu_b"
    env = json.loads(msg["content"])["error"]
    assert env == {
        "code": "timeout",
        "class": "transient",
        "message": "the tool did not answer in time",
        "retryable": True,
        "retry_after_ms": None,
        "reference": bad.error.reference,
    }
    assert "10.0.0.7" not in msg["content"]


def test_failure_outside_any_stage_still_becomes_an_envelope(ts, spans: Spans) -> None:
    with ts.call("odd") as call:
        raise LookupError("/etc/odd.conf missing")
    assert call.result.error.code == "internal_error"
    span = spans.call()
    assert span.attributes["error.type"] == "TOOL_ERROR"
    assert any(ev.name == "exception" for ev in span.events)


def test_argument_types_are_checked_against_the_annotations(ts, spans: Spans) -> None:
    @toolspan.tool(toolspan=ts)
    def search(query: str, limit: int = 5, mode: Literal["fast", "deep"] = "fast", tag: Optional[str] = None) -> str:
        return query

    r = search.invoke({"query": 42, "limit": "many"})
    assert r.status == "invalid_args"
    assert (r.error.code, r.error.field, r.error.received, r.error.permitted) == ("invalid_argument", "query", 42, ("string",))
    assert r.error.message == "argument 'query' must be a string"
    r = search.invoke({"query": "q", "limit": "many"})
    assert (r.error.field, r.error.received, r.error.permitted) == ("limit", "many", ("integer",))
    r = search.invoke({"query": "q", "limit": True})
    assert r.error.field == "limit", "a boolean is not an integer"
    r = search.invoke({"query": "q", "mode": "slow"})
    assert (r.error.field, r.error.permitted) == ("mode", ("fast", "deep"))
    r = search.invoke({"query": "q", "tag": 3})
    assert (r.error.field, r.error.permitted) == ("tag", ("string", "null"))
    assert search.invoke({"query": "q", "limit": 3, "mode": "deep", "tag": None}).status == "ok"
    failed = [c for c in spans.calls() if c.status.status_code is StatusCode.ERROR]
    assert len(failed) == 5 and {c.attributes["error.type"] for c in failed} == {"PREPARE"}


def test_the_tools_own_exception_inside_send_is_a_tool_error_not_network(ts, spans: Spans, service: Service) -> None:
    @toolspan.tool(toolspan=ts)
    def lookup(attempt: toolspan.Attempt, key: str) -> str:
        with attempt.send():
            url = service.url + "/" + key
            _ = len(url) + None  # the tool's own bug, raised around the request  # type: ignore[operator]
        return url

    r = lookup.invoke({"key": "k"})
    assert r.status == "tool_error" and r.error.unmapped
    call = spans.call()
    (_prep, send) = spans.stages(call)
    assert send.attributes["toolspan.stage"] == "send"
    assert send.attributes["error.type"] == "TOOL_ERROR" and call.attributes["error.type"] == "TOOL_ERROR"
