"""Replaying a failed call: the sandbox rules refuse what cannot be replayed faithfully or
safely, recorded responses replay a parse failure offline, the replay is a new trace linked to
the original, and its verdict says whether the failure is fixed.

The replay documents are built from the spans the tools themselves produced, the way the
server builds them (tests/replaydocs.py), and served by a local stand-in for the query
service."""

from __future__ import annotations

import io
import json
import logging
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
import requests
from opentelemetry.trace import StatusCode

import toolspan
from conftest import Service, Spans, ok_json
from replaydocs import replay_document
from toolspan import _cli
from toolspan._verdict import Outcome, judge, passes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

from fleet_tools import broken, fixed  # noqa: E402

ANSWER = {"hits": [{"title": "Rotate API keys", "link": "https://docs.example/rotate"}]}
TOKEN = "s3cret-token"


@pytest.fixture
def app(provider: Any) -> Iterator[toolspan.Toolspan]:
    """The application's settings, as its start-up code makes them: spans to the test's
    provider, payloads captured (what replays need)."""
    before = toolspan._default
    ts = toolspan.configure(tracer_provider=provider, capture_payloads=True, logger=logging.getLogger("toolspan.test"))
    yield ts
    toolspan._default = before


@pytest.fixture
def docs(service: Service, monkeypatch: pytest.MonkeyPatch) -> Service:
    """The docs service after the rename: hits carry ``link``, no longer ``url``."""
    service.answers("/search", ok_json(ANSWER))
    monkeypatch.setenv("FLEET_DOCS_URL", service.url + "/search")
    return service


@pytest.fixture
def query() -> Iterator[Service]:
    """A stand-in for the query service's replay endpoint."""
    s = Service()
    yield s
    s.close()


def publish(query: Service, ref: str, doc: dict[str, Any]) -> None:
    """Serves ``doc`` at ``/api/v1/calls/{ref}/replay`` to requests with the bearer token."""

    def handler(req: Any) -> tuple[int, dict[str, str], bytes]:
        if req.headers.get("Authorization") != f"Bearer {TOKEN}":
            body = {"error": {"code": "unauthenticated", "class": "permission", "message": "a bearer token is required",
                              "retryable": False, "reference": "err_000000000001"}}
            return 401, {"Content-Type": "application/json"}, json.dumps(body).encode()
        return ok_json(doc)

    query.route(f"/api/v1/calls/{ref}/replay", handler)


@pytest.fixture
def failed(app: toolspan.Toolspan, spans: Spans, docs: Service, exporter: Any) -> dict[str, Any]:
    """The replay document of a call the broken tool failed (PARSE, bad_answer)."""
    r = broken.search_docs.invoke('{"query": "rotate api keys"}', call_id="call_1")
    assert r.status == "tool_error" and r.error is not None and r.error.code == "bad_answer"
    doc = replay_document(spans, spans.call("search_docs"))
    exporter.clear()
    assert doc["call"]["error_type"] == "PARSE" and doc["call"]["stage"] == "parse"
    return doc


def offline(monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    monkeypatch.setenv("FLEET_DOCS_URL", f"http://127.0.0.1:{closed_port}/search")


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = _cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# -- what the SDK records


def test_record_response_lands_on_the_send_and_parse_spans(app: toolspan.Toolspan, spans: Spans) -> None:
    with app.call("lookup") as call:
        with call.send() as s:
            s.set_attribute("http.response.status_code", 200)
            s.record_response(b'{"ok": true}')
        with call.parse() as p:
            p.record_response('{"ok": true}')
    send, parse = spans.stages(spans.call("lookup"))
    assert send.attributes["gen_ai.tool.call.result"] == '{"ok": true}'
    assert send.attributes["http.response.status_code"] == 200
    # The parse stage's input is what it parsed.
    assert parse.attributes["gen_ai.tool.call.arguments"] == '{"ok": true}'


def test_record_response_follows_the_capture_settings(ts: toolspan.Toolspan, spans: Spans) -> None:
    with ts.call("lookup") as call:
        with call.send() as s:
            s.record_response("secret answer")
    (send,) = spans.stages(spans.call("lookup"))
    assert "gen_ai.tool.call.result" not in send.attributes


# -- replays of the broken tool's failure


def test_parse_failure_replays_offline_from_recorded_responses(
    failed: dict[str, Any], query: Service, docs: Service, spans: Spans, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    publish(query, "err_5f0c2a9d41b3", failed)
    offline(monkeypatch, closed_port)
    served = len(docs.requests)

    r = toolspan.replay(
        "err_5f0c2a9d41b3", query_url=query.url, tools=[broken], token=TOKEN, recorded_responses=True
    )
    assert r.verdict == "same_failure" and not r.passed and r.exit_code == 1
    assert r.replay.describe() == "PARSE bad_answer at parse"
    assert len(docs.requests) == served  # the docs service was never asked

    # A traced call like any other, in a trace of its own, linked to the original.
    call = spans.call("search_docs")
    original = f"{failed['call']['trace_id']}:{failed['call']['span_id']}"
    assert call.attributes["toolspan.replay.of"] == original == r.of
    assert call.parent is None and f"{call.context.trace_id:032x}" != failed["call"]["trace_id"]
    # (The call's other links are its own attempts.)
    (link,) = [ln for ln in call.links if ln.context.trace_id != call.context.trace_id]
    assert f"{link.context.trace_id:032x}:{link.context.span_id:016x}" == original
    assert (r.replay.trace_id, r.replay.span_id) == (f"{call.context.trace_id:032x}", f"{call.context.span_id:016x}")
    assert call.status.status_code is StatusCode.ERROR and call.attributes["error.type"] == "PARSE"


def test_fixed_tool_passes_on_the_same_recording(
    failed: dict[str, Any], query: Service, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    publish(query, "call_1", failed)
    offline(monkeypatch, closed_port)
    r = toolspan.replay("call_1", query_url=query.url, tools=["fleet_tools.fixed"], token=TOKEN, recorded_responses=True)
    assert r.verdict == "fixed" and r.passed and r.exit_code == 0
    assert r.result.value == [{"title": "Rotate API keys", "url": "https://docs.example/rotate"}]


def test_live_replay_reaches_the_service_and_judges_a_new_failure(
    failed: dict[str, Any], query: Service, docs: Service
) -> None:
    publish(query, "err_x", failed)
    docs.answers("/search", (500, {}, b"upstream exploded"))
    r = toolspan.replay("err_x", query_url=query.url, tools=[fixed], token=TOKEN)
    assert r.verdict == "different_failure" and r.replay.error_code == "tool_failed"
    # A mapped envelope that leaks nothing: an eval case would pass.
    assert r.passed and r.replay.attempts == 1


def test_cli_prints_a_table_or_json_and_exits_by_verdict(
    failed: dict[str, Any], query: Service, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    ref = failed["call"]["trace_id"] + ":" + failed["call"]["span_id"]
    publish(query, ref, failed)
    offline(monkeypatch, closed_port)
    base = ["replay", ref, "--query-url", query.url, "--token", TOKEN, "--recorded-responses"]

    code, out, _ = cli(*base, "--tools", "fleet_tools.broken")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].split() == ["original", "replay"]
    assert lines[-1].split() == ["verdict", "same", "failure"]
    assert any(ln.split()[:1] == ["outcome"] and ln.count("PARSE bad_answer at parse") == 2 for ln in lines)

    code, out, _ = cli(*base, "--tools", "fleet_tools.fixed", "--format", "json")
    assert code == 0
    got = json.loads(out)
    assert got["verdict"] == "fixed" and got["replay_of"] == ref and got["table_version"] == 12
    assert got["original"]["error_code"] == "bad_answer" and got["replay"]["status"] == "ok"
    assert json.loads(got["replay"]["content"])[0]["url"] == "https://docs.example/rotate"


def test_query_service_errors_are_usage_errors(failed: dict[str, Any], query: Service) -> None:
    publish(query, "err_5f0c2a9d41b3", failed)
    code, _, err = cli("replay", "err_5f0c2a9d41b3", "--query-url", query.url, "--tools", "fleet_tools.fixed")
    assert code == 2 and "401" in err and "a bearer token is required" in err and "err_000000000001" in err
    code, _, err = cli("replay", "err_nope", "--query-url", query.url, "--tools", "fleet_tools.fixed", "--token", TOKEN)
    assert code == 2 and "404" in err
    code, _, err = cli("replay", "err_5f0c2a9d41b3", "--tools", "fleet_tools.fixed")
    assert code == 2 and "--query-url" in err


# -- the sandbox rules


def failing_call(
    ts: toolspan.Toolspan, spans: Spans, exporter: Any, tool: toolspan.Tool[Any], arguments: Any, **stored: Any
) -> dict[str, Any]:
    """Runs ``tool`` once (it must fail) and answers the replay document of that call
    (``stored``: how the server stored it, see :func:`replay_document`)."""
    r = tool.invoke(arguments)
    assert not r.ok
    doc = replay_document(spans, spans.call(tool.name), **stored)
    exporter.clear()
    return doc


def test_inexact_arguments_are_refused_until_the_redacted_field_is_supplied(
    app: toolspan.Toolspan, spans: Spans, exporter: Any, query: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []

    @toolspan.tool
    def create_ticket(title: str, api_key: str) -> dict:
        seen.append({"title": title, "api_key": api_key})
        if api_key != "k-live":
            raise toolspan.ToolError("the ticket service refused the key", code="bad_key", error_class="permission")
        return {"id": 7}

    # Stored as ingest stores it: the secret redacted.
    doc = failing_call(app, spans, exporter, create_ticket, {"title": "printer on fire", "api_key": "k-old"},
                       redact=["api_key"])
    assert doc["exact"] is False and doc["arguments"]["api_key"] == "[REDACTED:secret]"
    publish(query, "err_t", doc)
    monkeypatch.setattr(sys.modules[__name__], "create_ticket", create_ticket, raising=False)
    base = ["replay", "err_t", "--query-url", query.url, "--token", TOKEN, "--tools", __name__]

    code, out, err = cli(*base)
    assert code == 2 and out == ""
    assert "$.api_key was redacted" in err and "--arg api_key=VALUE" in err and "--args-file" in err
    with pytest.raises(toolspan.ReplayRefused, match=r"\$\.api_key was redacted.*args_override"):
        toolspan.replay("err_t", query_url=query.url, tools=[create_ticket], token=TOKEN)
    assert len(seen) == 1  # only the original call ran

    code, out, err = cli(*base, "--arg", "api_key=k-live")
    assert code == 0, err
    assert seen[-1] == {"title": "printer on fire", "api_key": "k-live"}
    # FIELD:=JSON for any JSON value; a value that is not JSON is a usage error.
    code, out, err = cli(*base, "--arg", "api_key=k-live", "--arg", 'title:="printer smoking"')
    assert code == 0 and seen[-1]["title"] == "printer smoking"
    code, out, err = cli(*base, "--arg", "api_key:=k-live")
    assert code == 2 and "is not JSON" in err

    # By JSON path too; the replay is judged like any other.
    r = toolspan.replay("err_t", query_url=query.url, tools=[create_ticket], token=TOKEN,
                        args_override={"$.api_key": "k-old"})
    assert r.verdict == "same_failure" and r.replay.error_code == "bad_key"


def test_cut_or_unrecorded_arguments_need_the_whole_arguments(
    app: toolspan.Toolspan, spans: Spans, exporter: Any, query: Service, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @toolspan.tool
    def lookup(query: str) -> str:
        raise toolspan.ToolError("nothing found", code="no_match", error_class="not_found")

    doc = failing_call(app, spans, exporter, lookup, {"query": "a long query " * 20}, truncated=True)
    publish(query, "err_cut", doc)
    with pytest.raises(toolspan.ReplayRefused, match="cut short.*whole arguments"):
        toolspan.replay("err_cut", query_url=query.url, tools=[lookup], token=TOKEN, args_override={"query": "x"})
    r = toolspan.replay("err_cut", query_url=query.url, tools=[lookup], token=TOKEN,
                        args_override={"$": {"query": "x"}})
    assert r.verdict == "same_failure"

    publish(query, "err_none", dict(doc, arguments=None, arguments_text=None, exact=False, inexact=None))
    args = tmp_path / "args.json"
    args.write_text('{"query": "printer"}')
    monkeypatch.setattr(sys.modules[__name__], "lookup", lookup, raising=False)
    base = ["replay", "err_none", "--query-url", query.url, "--token", TOKEN, "--tools", __name__]
    code, _, err = cli(*base)
    assert code == 2 and "not recorded" in err and "capture_payloads=True" in err
    code, out, err = cli(*base, "--args-file", str(args), "--format", "json")
    assert code == 1, err
    assert json.loads(out)["verdict"] == "same_failure"


def test_side_effects_run_only_when_allowed_or_sandboxed(
    app: toolspan.Toolspan, spans: Spans, exporter: Any, query: Service
) -> None:
    sent: list[Optional[toolspan.ReplayInfo]] = []

    @toolspan.tool(side_effects=True)
    def send_email(to: str) -> str:
        sent.append(toolspan.replaying())
        raise toolspan.ToolError("the mail relay is down", code="relay_down", error_class="transient")

    doc = failing_call(app, spans, exporter, send_email, {"to": "a@example.com"})
    assert sent == [None]  # normal operation: not a replay
    publish(query, "err_mail", doc)

    with pytest.raises(toolspan.ReplayRefused, match="side effects.*--allow-side-effects"):
        toolspan.replay("err_mail", query_url=query.url, tools=[send_email], token=TOKEN)
    assert len(sent) == 1

    r = toolspan.replay("err_mail", query_url=query.url, tools=[send_email], token=TOKEN, allow_side_effects=True)
    assert r.verdict == "same_failure"
    info = sent[-1]
    assert info is not None and info.of == r.of and info.reference == doc["call"]["reference"]
    assert info.allow_side_effects and info.tool == "send_email" and info.table_version == 12
    assert toolspan.replaying() is None  # only inside the replay

    entered: list[str] = []

    class Staging:
        def __init__(self, info: toolspan.ReplayInfo) -> None:
            self.info = info

        def __enter__(self) -> None:
            entered.append(self.info.of)

        def __exit__(self, *exc: Any) -> None:
            entered.append("left")

    sandboxed = toolspan.Tool(send_email.fn, name="send_email", side_effects=True, sandbox=Staging)
    r = toolspan.replay("err_mail", query_url=query.url, tools=[sandboxed], token=TOKEN)
    assert entered == [r.of, "left"] and r.verdict == "same_failure"


# -- recorded responses, client by client


def _urllib_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def _httpx_get(url: str) -> str:
    with httpx.Client() as c:
        resp = c.get(url)
        resp.raise_for_status()
        return resp.text


def _requests_get(url: str) -> str:
    resp = toolspan.propagation.requests_session().get(url, timeout=5)
    resp.raise_for_status()
    return resp.text


@pytest.mark.parametrize("get", [_urllib_get, _httpx_get, _requests_get], ids=["urllib", "httpx", "requests"])
def test_recorded_responses_answer_each_client(
    get: Any, app: toolspan.Toolspan, spans: Spans, exporter: Any, docs: Service, query: Service,
    monkeypatch: pytest.MonkeyPatch, closed_port: int,
) -> None:
    @toolspan.tool
    def count_hits(attempt: toolspan.Attempt, query: str) -> int:
        import os

        with attempt.send() as s:
            body = get(os.environ["FLEET_DOCS_URL"] + "?q=" + query)
            s.record_response(body)
        with attempt.parse():
            return len(json.loads(body)["hits"][0]["url"])  # the old field: a KeyError

    doc = failing_call(app, spans, exporter, count_hits, {"query": "keys"})
    publish(query, "err_h", doc)
    offline(monkeypatch, closed_port)
    originals = (httpx.HTTPTransport.handle_request, requests.adapters.HTTPAdapter.send,
                 urllib.request.HTTPHandler.http_open)

    r = toolspan.replay("err_h", query_url=query.url, tools=[count_hits], token=TOKEN, recorded_responses=True)
    assert r.verdict == "same_failure", r
    assert r.replay.error_type == "PARSE" and r.replay.error_code == "internal_error"
    # Patched only while the replay ran.
    assert (httpx.HTTPTransport.handle_request, requests.adapters.HTTPAdapter.send,
            urllib.request.HTTPHandler.http_open) == originals
    with pytest.raises(Exception):
        get(f"http://127.0.0.1:{closed_port}/search")


def test_recordings_that_cannot_answer_are_refused(
    failed: dict[str, Any], query: Service, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    offline(monkeypatch, closed_port)
    publish(query, "err_none", dict(failed, recorded_responses=[]))
    with pytest.raises(toolspan.ReplayRefused, match="no recorded responses.*record_response"):
        toolspan.replay("err_none", query_url=query.url, tools=[fixed], token=TOKEN, recorded_responses=True)

    cut = [dict(e, exact=False) for e in failed["recorded_responses"]]
    publish(query, "err_cut", dict(failed, recorded_responses=cut))
    code, _, err = cli("replay", "err_cut", "--query-url", query.url, "--token", TOKEN,
                       "--tools", "fleet_tools.fixed", "--recorded-responses")
    assert code == 2 and "refused" in err and "attempt 1" in err and "not exact" in err


def test_a_second_request_in_one_attempt_is_not_answered_from_the_recording(
    app: toolspan.Toolspan, spans: Spans, exporter: Any, docs: Service, query: Service,
    monkeypatch: pytest.MonkeyPatch, closed_port: int,
) -> None:
    import os

    @toolspan.tool
    def twice(attempt: toolspan.Attempt) -> str:
        with attempt.send() as s:
            body = httpx.get(os.environ["FLEET_DOCS_URL"]).text
            s.record_response(body)
            httpx.get(os.environ["FLEET_DOCS_URL"] + "?page=2")
        raise toolspan.ToolError("no", code="no")

    publish(query, "err_2", failing_call(app, spans, exporter, twice, {}))
    offline(monkeypatch, closed_port)
    with pytest.raises(toolspan.ReplayError, match="more than one request in attempt 1"):
        toolspan.replay("err_2", query_url=query.url, tools=[twice], token=TOKEN, recorded_responses=True)


def test_tools_are_found_by_name_among_the_given_ones(failed: dict[str, Any], query: Service) -> None:
    publish(query, "err_t", failed)

    @toolspan.tool
    def other() -> None: ...

    with pytest.raises(toolspan.ReplayRefused, match="tool 'search_docs'.*they have: other"):
        toolspan.replay("err_t", query_url=query.url, tools=[other], token=TOKEN)
    with pytest.raises(toolspan.ReplayError, match="two different tools are named 'search_docs'"):
        toolspan.replay("err_t", query_url=query.url, tools=[broken, fixed], token=TOKEN)


# -- the verdict rules


def test_verdicts_follow_the_rules() -> None:
    parse = Outcome("error", stage="parse", error_type="PARSE", error_code="bad_answer")
    unmapped = Outcome("error", stage="execute", error_type="TOOL_ERROR", error_code="internal_error")
    leaked = Outcome("error", stage="execute", error_type="TOOL_ERROR", error_code="db_error", leaked_internals=True)
    ok = Outcome("ok")

    assert judge(parse, ok) == "fixed"
    assert judge(parse, parse) == "same_failure"
    # The same failure after retries is still the same failure.
    exhausted = Outcome("error", stage="parse", error_type="RETRY_EXHAUSTED", attempt_error_type="PARSE",
                        error_code="bad_answer", attempts=3)
    assert judge(parse, exhausted) == "same_failure"
    # An envelope where the original answered without one (or leaked) is a fix.
    timeout = Outcome("error", stage="execute", error_type="TOOL_ERROR", error_code="timeout")
    assert judge(unmapped, timeout) == "fixed" and judge(leaked, timeout) == "fixed"
    assert judge(unmapped, unmapped) == "same_failure"
    # Anything else is a different failure, which passes only with a mapped envelope.
    assert judge(parse, timeout) == "different_failure" and passes("different_failure", timeout)
    assert judge(parse, unmapped) == "different_failure" and not passes("different_failure", unmapped)
    assert not passes("different_failure", leaked) and not passes("same_failure", parse)


def test_async_tools_replay_through_httpx_async_and_see_the_recording(
    app: toolspan.Toolspan, spans: Spans, exporter: Any, docs: Service, query: Service,
    monkeypatch: pytest.MonkeyPatch, closed_port: int,
) -> None:
    import asyncio
    import os

    seen: list[Optional[str]] = []

    @toolspan.tool
    async def first_title(attempt: toolspan.Attempt, query: str) -> str:
        info = toolspan.replaying()
        seen.append(info.recorded_response() if info is not None else None)
        with attempt.send() as s:
            async with httpx.AsyncClient() as c:
                body = (await c.get(os.environ["FLEET_DOCS_URL"], params={"q": query})).text
            s.record_response(body)
        with attempt.parse():
            return json.loads(body)["hits"][0]["url"]

    assert not asyncio.run(first_title.ainvoke({"query": "keys"})).ok
    doc = replay_document(spans, spans.call("first_title"))
    exporter.clear()
    publish(query, "err_a", doc)
    offline(monkeypatch, closed_port)
    r = toolspan.replay("err_a", query_url=query.url, tools=[first_title], token=TOKEN, recorded_responses=True)
    assert r.verdict == "same_failure" and r.replay.stage == "parse"
    assert seen == [None, json.dumps(ANSWER)]


def test_importing_toolspan_loads_no_replay_machinery() -> None:
    import subprocess

    code = (
        "import sys, toolspan\n"
        "loaded = {'urllib.request', 'http.client', 'toolspan._replay', 'toolspan._recorded', 'toolspan.evals'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
        "assert toolspan.replaying() is None and callable(toolspan.evals.cases)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
