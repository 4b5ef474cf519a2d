"""Golden span scenarios for toolspan, emitted through the official OpenTelemetry Python SDK.

Every scenario is a function taking an ``Emitter``. It creates spans with a real SDK tracer
(``start_as_current_span`` / ``start_span``), explicit nanosecond timestamps, real
``set_status`` / ``record_exception`` / ``add_event`` calls. Ids come from a deterministic
``IdGenerator`` so that the encoded output is byte-for-byte reproducible.

Used by gen_spans.py (writes .pb/.json files) and send_otlp_http.py (exports to a receiver).
See DESIGN.md sections 2 and 3 for the conventions these spans exercise.
"""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

# 2026-11-29T10:00:00Z in nanoseconds since the epoch.
BASE_TIME_NS = calendar.timegm((2026, 11, 29, 10, 0, 0, 0, 0, 0)) * 1_000_000_000

SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
DEFAULT_SCOPE = ("toolspan.golden", "0.1.0")
SERVICE = {"service.name": "golden-agent", "service.version": "1.4.0", "deployment.environment.name": "test"}

# A JWT (the well-known jwt.io example token) used by the `secrets` scenario.
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)


# ---------------------------------------------------------------------------------------------
# Deterministic SDK plumbing
# ---------------------------------------------------------------------------------------------


class SequentialIdGenerator(IdGenerator):
    """Trace id = sha256(seed)[:12] + 4-byte counter; span id = sha256(seed)[16:20] + 4-byte counter."""

    def __init__(self, seed: str) -> None:
        digest = hashlib.sha256(seed.encode("utf-8")).digest()
        self._trace_prefix = int.from_bytes(digest[:12], "big") << 32
        self._span_prefix = int.from_bytes(digest[16:20], "big") << 32
        self._traces = 0
        self._spans = 0

    def generate_trace_id(self) -> int:
        self._traces += 1
        return self._trace_prefix | self._traces

    def generate_span_id(self) -> int:
        self._spans += 1
        return self._span_prefix | self._spans


# Explicit limits so OTEL_* environment variables cannot change the output.
SPAN_LIMITS = SpanLimits(
    max_attributes=128,
    max_events=128,
    max_links=128,
    max_span_attributes=128,
    max_event_attributes=128,
    max_link_attributes=128,
    max_attribute_length=SpanLimits.UNSET,
    max_span_attribute_length=SpanLimits.UNSET,
)


def make_resource(extra: Mapping[str, Any] | None = None, marker: str | None = None) -> Resource:
    """A fixed resource. Uses the constructor (not Resource.create) so that no telemetry.sdk.*
    or process attributes from the environment are merged in."""
    attrs: dict[str, Any] = dict(SERVICE)
    if extra:
        attrs.update(extra)
    if marker is not None:
        attrs["test.marker"] = marker
    return Resource(attrs, schema_url=SCHEMA_URL)


def make_provider(name: str, marker: str | None = None) -> TracerProvider:
    scenario = SCENARIOS[name]
    seed = name if marker is None else f"{marker}/{name}"
    return TracerProvider(
        sampler=ALWAYS_ON,
        resource=make_resource(scenario.resource, marker),
        shutdown_on_exit=False,
        id_generator=SequentialIdGenerator(seed),
        span_limits=SPAN_LIMITS,
    )


# Exception classes that carry the module name real libraries would report, so that
# exception.type reads e.g. "requests.exceptions.ConnectionError" without importing them.
def _exc_class(module: str, name: str) -> type[Exception]:
    return type(name, (Exception,), {"__module__": module})


ValidationError = _exc_class("jsonschema.exceptions", "ValidationError")
HTTPStatusError = _exc_class("httpx", "HTTPStatusError")
JSONDecodeError = _exc_class("json.decoder", "JSONDecodeError")
ReadTimeout = _exc_class("httpx", "ReadTimeout")
ConnectError = _exc_class("httpx", "ConnectError")
RequestsConnectionError = _exc_class("requests.exceptions", "ConnectionError")
UndefinedTable = _exc_class("psycopg2.errors", "UndefinedTable")
PydanticValidationError = _exc_class("pydantic_core._pydantic_core", "ValidationError")
ToolArgumentConversionError = _exc_class("acme_agents.errors", "ToolArgumentConversionError")
BuiltinValueError = _exc_class("builtins", "ValueError")


def fake_traceback(frames: Sequence[tuple[str, int, str, str]], exc_line: str) -> str:
    """A fixed Python traceback text (the SDK would otherwise embed this checkout's paths)."""
    out = ["Traceback (most recent call last):\n"]
    for path, line, func, code in frames:
        out.append(f'  File "{path}", line {line}, in {func}\n    {code}\n')
    out.append(exc_line + "\n")
    return "".join(out)


def envelope_attrs(code: str, cls: str, retryable: bool, reference: str, retry_after_ms: int | None = None) -> dict:
    attrs: dict[str, Any] = {
        "toolspan.error.code": code,
        "toolspan.error.class": cls,
        "toolspan.error.retryable": retryable,
    }
    if retry_after_ms is not None:
        attrs["toolspan.error.retry_after_ms"] = retry_after_ms
    attrs["toolspan.error.reference"] = reference
    return attrs


def envelope_json(code: str, cls: str, retryable: bool, reference: str, retry_after_ms: int | None = None) -> str:
    err: dict[str, Any] = {"code": code, "class": cls, "retryable": retryable}
    if retry_after_ms is not None:
        err["retry_after_ms"] = retry_after_ms
    err["reference"] = reference
    return json.dumps({"error": err}, separators=(",", ":"))


def compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Emitter: thin helpers over the real SDK calls
# ---------------------------------------------------------------------------------------------


class Emitter:
    def __init__(self, provider: TracerProvider, base_ns: int = BASE_TIME_NS, marker: str | None = None) -> None:
        self.provider = provider
        self.base_ns = base_ns
        self.marker = marker
        self.tracer = self.scope(*DEFAULT_SCOPE)

    def scope(self, name: str, version: str | None = None) -> Tracer:
        return self.provider.get_tracer(name, version, schema_url=SCHEMA_URL)

    def t(self, ms: float) -> int:
        return self.base_ns + int(round(ms * 1_000_000))

    def _name(self, name: str) -> str:
        return name if self.marker is None else f"{name} #{self.marker}"

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        start_ms: float,
        end_ms: float,
        attrs: Mapping[str, Any] | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        status: Status | None = None,
        root: bool = False,
        tracer: Tracer | None = None,
    ) -> Iterator[Span]:
        """A parent span made current with start_as_current_span; ended explicitly at end_ms."""
        with (tracer or self.tracer).start_as_current_span(
            self._name(name),
            context=Context() if root else None,
            kind=kind,
            attributes=dict(attrs or {}),
            start_time=self.t(start_ms),
            record_exception=False,
            set_status_on_exception=False,
            end_on_exit=False,
        ) as span:
            yield span
            if status is not None:
                span.set_status(status)
            span.end(end_time=self.t(end_ms))

    def leaf(
        self,
        name: str,
        start_ms: float,
        end_ms: float,
        attrs: Mapping[str, Any] | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        status: Status | None = None,
        exception: tuple[Exception, float, Mapping[str, Any]] | None = None,
        events: Sequence[tuple[str, float, Mapping[str, Any]]] = (),
        root: bool = False,
        tracer: Tracer | None = None,
    ) -> Span:
        """A leaf span made with start_span (parent = current span)."""
        span = (tracer or self.tracer).start_span(
            self._name(name),
            context=Context() if root else None,
            kind=kind,
            attributes=dict(attrs or {}),
            start_time=self.t(start_ms),
        )
        for ev_name, ev_ms, ev_attrs in events:
            span.add_event(ev_name, attributes=dict(ev_attrs), timestamp=self.t(ev_ms))
        if exception is not None:
            exc, exc_ms, exc_attrs = exception
            span.record_exception(exc, attributes=dict(exc_attrs), timestamp=self.t(exc_ms))
        if status is not None:
            span.set_status(status)
        span.end(end_time=self.t(end_ms))
        return span


OK = Status(StatusCode.OK)


def err(msg: str) -> Status:
    return Status(StatusCode.ERROR, msg)


def agent(e: Emitter, name: str, start: float, end: float, **extra: Any):
    attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
    attrs.update(extra)
    return e.span(f"invoke_agent {name}", start, end, attrs, root=True, status=OK)


def tool_attrs(tool: str, call_id: str, **extra: Any) -> dict:
    attrs: dict[str, Any] = {"gen_ai.tool.name": tool, "gen_ai.tool.call.id": call_id}
    attrs.update(extra)
    return attrs


def call(e: Emitter, tool: str, call_id: str, start: float, end: float, args: str | None, result: str | None,
         status: Status, extra: Mapping[str, Any] | None = None):
    attrs = {"gen_ai.operation.name": "execute_tool", **tool_attrs(tool, call_id), "gen_ai.tool.type": "function"}
    if args is not None:
        attrs["gen_ai.tool.call.arguments"] = args
    if result is not None:
        attrs["gen_ai.tool.call.result"] = result
    attrs.update(extra or {})
    return e.span(f"execute_tool {tool}", start, end, attrs, status=status)


def attempt(e: Emitter, tool: str, call_id: str, n: int, start: float, end: float, status: Status):
    return e.span(f"{tool} attempt {n}", start, end, tool_attrs(tool, call_id, **{"toolspan.attempt": n}),
                  status=status)


def stage(e: Emitter, tool: str, call_id: str, stage_name: str, start: float, end: float, status: Status = OK,
          extra: Mapping[str, Any] | None = None, name: str | None = None, **kw: Any) -> Span:
    attrs = tool_attrs(tool, call_id, **{"toolspan.stage": stage_name})
    attrs.update(extra or {})
    return e.leaf(name or f"{tool} {stage_name}", start, end, attrs, status=status, **kw)


def ok_stages(e: Emitter, tool: str, call_id: str, start: float, server: str, status_code: int = 200,
              durations: tuple[float, float, float, float] = (5, 40, 120, 8)) -> float:
    """prepare/send/execute/parse all OK, back to back from start; returns the end time."""
    t = start
    names = ("prepare", "send", "execute", "parse")
    extras = ({}, {"server.address": server, "server.port": 443}, {"http.response.status_code": status_code}, {})
    for stage_name, dur, extra in zip(names, durations, extras):
        stage(e, tool, call_id, stage_name, t, t + dur, OK, extra)
        t += dur
    return t


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------


def conventions_ok(e: Emitter) -> None:
    tool, cid = "search_docs", "toolu_01ABCsearchdocs0001"
    args = compact({"query": "how do I rotate the ingest keys?", "top_k": 3})
    result = compact({"hits": [
        {"id": "doc-112", "title": "Rotating ingest keys", "score": 0.91},
        {"id": "doc-087", "title": "Key management overview", "score": 0.74},
        {"id": "doc-203", "title": "Ingest troubleshooting", "score": 0.52},
    ]})
    with agent(e, "research_assistant", 0, 2400, **{"gen_ai.conversation.id": "conv_5f0e2a"}):
        e.leaf("chat claude-sonnet-4-5", 10, 900, {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "anthropic",
            "gen_ai.request.model": "claude-sonnet-4-5",
            "gen_ai.response.model": "claude-sonnet-4-5-20250929",
            "gen_ai.usage.input_tokens": 1250,
            "gen_ai.usage.output_tokens": 87,
            "gen_ai.response.finish_reasons": ["tool_use"],
        }, kind=SpanKind.CLIENT)
        with call(e, tool, cid, 910, 1100, args, result, OK):
            with attempt(e, tool, cid, 1, 912, 1098, OK):
                ok_stages(e, tool, cid, 915, "docs-search.internal", durations=(4, 30, 130, 9))


def _single_failure(e: Emitter, *, agent_name: str, tool: str, cid: str, args: str, fail_stage: str,
                    server: str, status_msg: str, exc: Exception, exc_attrs: Mapping[str, Any],
                    env: dict, fail_extra: Mapping[str, Any] | None = None,
                    ok_extra: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """invoke_agent -> execute_tool -> attempt 1 -> stages up to and including the failing one."""
    order = ["prepare", "send", "execute", "parse"]
    durations = {"prepare": 6, "send": 35, "execute": 140, "parse": 7}
    default_extra = {"send": {"server.address": server, "server.port": 443},
                     "execute": {"http.response.status_code": 200}}
    ok_extra = ok_extra or {}
    result = envelope_json(**env)
    with agent(e, agent_name, 0, 1200):
        with call(e, tool, cid, 20, 900, args, result, err(status_msg), envelope_attrs(**env)):
            with attempt(e, tool, cid, 1, 22, 898, err(status_msg)):
                t = 25.0
                for stage_name in order:
                    dur = durations[stage_name]
                    if stage_name == fail_stage:
                        extra = {**default_extra.get(stage_name, {}), **(fail_extra or {}), **envelope_attrs(**env)}
                        stage(e, tool, cid, stage_name, t, t + dur, err(status_msg), extra,
                              exception=(exc, t + dur - 1, exc_attrs))
                        break
                    stage(e, tool, cid, stage_name, t, t + dur, OK,
                          {**default_extra.get(stage_name, {}), **ok_extra.get(stage_name, {})})
                    t += dur


def error_prepare(e: Emitter) -> None:
    msg = "'title' is a required property"
    _single_failure(
        e, agent_name="support_agent", tool="create_ticket", cid="call_prep_0001",
        args=compact({"priority": "high", "body": "printer on fire"}),
        fail_stage="prepare", server="tickets.internal", status_msg=f"arguments failed validation: {msg}",
        exc=ValidationError(msg),
        exc_attrs={"exception.stacktrace": fake_traceback(
            [("/srv/agent/tools/tickets.py", 57, "prepare", "jsonschema.validate(args, CREATE_TICKET_SCHEMA)"),
             ("/srv/agent/.venv/lib/python3.11/site-packages/jsonschema/validators.py", 1332, "validate",
              "raise error")],
            f"jsonschema.exceptions.ValidationError: {msg}")},
        env=dict(code="invalid_arguments", cls="invalid_request", retryable=False, reference="err_7c1f9a"),
    )


def error_network(e: Emitter) -> None:
    msg = "[Errno 111] Connection refused"
    _single_failure(
        e, agent_name="travel_agent", tool="fetch_weather", cid="call_net_0001",
        args=compact({"city": "Lisbon", "days": 3}),
        fail_stage="send", server="weather-api.internal", status_msg=f"connect to weather-api.internal:443: {msg}",
        exc=ConnectionRefusedError(111, "Connection refused"),
        exc_attrs={"exception.stacktrace": fake_traceback(
            [("/srv/agent/tools/weather.py", 31, "send", "sock = socket.create_connection((host, port), timeout=5)"),
             ("/usr/lib/python3.11/socket.py", 851, "create_connection", "raise exceptions[0]")],
            f"ConnectionRefusedError: {msg}")},
        env=dict(code="connection_refused", cls="transient", retryable=True, reference="err_3b9d04",
                 retry_after_ms=1000),
        fail_extra={"network.peer.address": "192.0.2.14"},
    )


def error_tool(e: Emitter) -> None:
    msg = "Server error '500 Internal Server Error' for url 'https://inventory.internal/v1/stock/sku-4411'"
    _single_failure(
        e, agent_name="shop_assistant", tool="check_stock", cid="call_tool_0001",
        args=compact({"sku": "sku-4411", "warehouse": "lis-1"}),
        fail_stage="execute", server="inventory.internal", status_msg="inventory service returned HTTP 500",
        exc=HTTPStatusError(msg),
        exc_attrs={"exception.stacktrace": fake_traceback(
            [("/srv/agent/tools/inventory.py", 88, "execute", "resp.raise_for_status()"),
             ("/srv/agent/.venv/lib/python3.11/site-packages/httpx/_models.py", 829, "raise_for_status",
              "raise HTTPStatusError(message, request=request, response=self)")],
            f"httpx.HTTPStatusError: {msg}")},
        env=dict(code="upstream_500", cls="internal", retryable=False, reference="err_9e41c2"),
        fail_extra={"http.response.status_code": 500},
    )


def error_parse(e: Emitter) -> None:
    msg = "Expecting value: line 1 column 1 (char 0)"
    _single_failure(
        e, agent_name="finance_agent", tool="get_fx_rate", cid="call_parse_0001",
        args=compact({"base": "EUR", "quote": "USD"}),
        fail_stage="parse", server="fx.internal", status_msg=f"response body is not JSON: {msg}",
        exc=JSONDecodeError(msg),
        exc_attrs={"exception.stacktrace": fake_traceback(
            [("/srv/agent/tools/fx.py", 64, "parse", "payload = json.loads(body)"),
             ("/usr/lib/python3.11/json/decoder.py", 355, "raw_decode",
              'raise JSONDecodeError("Expecting value", s, err.value) from None')],
            f"json.decoder.JSONDecodeError: {msg}")},
        env=dict(code="invalid_json", cls="internal", retryable=False, reference="err_52aa7e"),
    )


def retry_recovered(e: Emitter) -> None:
    tool, cid = "search_docs", "toolu_01RETRYrecovered0001"
    args = compact({"query": "quarterly revenue 2026", "top_k": 5})
    result = compact({"hits": [{"id": "doc-501", "title": "Q3 2026 revenue", "score": 0.88}]})
    env = dict(code="timeout", cls="transient", retryable=True, reference="err_0d7f33", retry_after_ms=200)
    timeout_msg = "timed out after 5000 ms waiting for docs-search.internal:443"
    with agent(e, "research_assistant", 0, 7000):
        with call(e, tool, cid, 10, 6600, args, result, OK):
            with attempt(e, tool, cid, 1, 12, 5030, err(timeout_msg)):
                stage(e, tool, cid, "prepare", 14, 18)
                stage(e, tool, cid, "send", 18, 5018, err(timeout_msg),
                      {"server.address": "docs-search.internal", "server.port": 443, **envelope_attrs(**env)},
                      exception=(ReadTimeout("timed out"), 5017, {"exception.stacktrace": fake_traceback(
                          [("/srv/agent/tools/search.py", 40, "send", "resp = client.post(url, json=body)"),
                           ("/srv/agent/.venv/lib/python3.11/site-packages/httpx/_transports/default.py", 86,
                            "map_httpcore_exceptions", "raise mapped_exc(message) from exc")],
                          "httpx.ReadTimeout: timed out")}))
            # backoff 200 ms, as the envelope asked
            with attempt(e, tool, cid, 2, 5230, 6590, OK):
                ok_stages(e, tool, cid, 5232, "docs-search.internal", durations=(4, 38, 1300, 10))


def retry_exhausted(e: Emitter) -> None:
    tool, cid = "lookup_order", "call_exhaust_0001"
    server = "orders.internal"
    args = compact({"order_id": "ord_88213"})
    final_env = dict(code="upstream_unavailable", cls="transient", retryable=True, reference="err_e4c019",
                     retry_after_ms=30000)
    with agent(e, "support_agent", 0, 9000):
        with call(e, tool, cid, 10, 8800, args, envelope_json(**final_env),
                  err("lookup_order failed after 3 attempts"), envelope_attrs(**final_env)):
            # attempt 1: NETWORK (connection reset at send)
            m1 = "[Errno 104] Connection reset by peer"
            with attempt(e, tool, cid, 1, 12, 80, err(m1)):
                stage(e, tool, cid, "prepare", 14, 19)
                stage(e, tool, cid, "send", 19, 78, err(m1), {"server.address": server, "server.port": 443},
                      exception=(ConnectError(m1), 77, {"exception.stacktrace": fake_traceback(
                          [("/srv/agent/tools/orders.py", 22, "send", "resp = client.get(url)")],
                          f"httpx.ConnectError: {m1}")}))
            # attempt 2: TOOL_ERROR (HTTP 503 from the tool backend)
            m2 = "orders service returned HTTP 503"
            with attempt(e, tool, cid, 2, 580, 900, err(m2)):
                stage(e, tool, cid, "prepare", 582, 586)
                stage(e, tool, cid, "send", 586, 620, OK, {"server.address": server, "server.port": 443})
                stage(e, tool, cid, "execute", 620, 898, err(m2), {"http.response.status_code": 503},
                      exception=(HTTPStatusError("Server error '503 Service Unavailable'"), 897, {
                          "exception.stacktrace": fake_traceback(
                              [("/srv/agent/tools/orders.py", 31, "execute", "resp.raise_for_status()")],
                              "httpx.HTTPStatusError: Server error '503 Service Unavailable'")}))
            # attempt 3: TOOL_ERROR (execute timed out; timeouts in execute are TOOL_ERROR)
            m3 = "orders service did not answer within 5000 ms"
            with attempt(e, tool, cid, 3, 1900, 7000, err(m3)):
                stage(e, tool, cid, "prepare", 1902, 1906)
                stage(e, tool, cid, "send", 1906, 1940, OK, {"server.address": server, "server.port": 443})
                stage(e, tool, cid, "execute", 1940, 6995, err(m3), None,
                      exception=(ReadTimeout("timed out"), 6994, {"exception.stacktrace": fake_traceback(
                          [("/srv/agent/tools/orders.py", 31, "execute", "resp = client.get(url, timeout=5.0)")],
                          "httpx.ReadTimeout: timed out")}))


def explicit_error_type(e: Emitter) -> None:
    tool, cid = "extract_table", "call_explicit_0001"
    env = dict(code="unreadable_pdf", cls="invalid_request", retryable=False, reference="err_61b0d8")
    msg = "remote extractor could not parse page 3 of the PDF"
    with agent(e, "analyst_agent", 0, 3000):
        with call(e, tool, cid, 10, 2500, compact({"url": "https://files.example.com/report.pdf", "page": 3}),
                  envelope_json(**env), err(msg), envelope_attrs(**env)):
            with attempt(e, tool, cid, 1, 12, 2498, err(msg)):
                stage(e, tool, cid, "prepare", 14, 20)
                stage(e, tool, cid, "send", 20, 60, OK, {"server.address": "extractor.internal", "server.port": 443})
                stage(e, tool, cid, "execute", 60, 2490, err(msg),
                      {"http.response.status_code": 422, "error.type": "PARSE", **envelope_attrs(**env)})


def genai_execute_tool(e: Emitter) -> None:
    tool = "fetch_url"
    msg = ("HTTPSConnectionPool(host='status.example.org', port=443): Max retries exceeded with url: /api "
           "(Caused by NameResolutionError(\"Failed to resolve 'status.example.org'\"))")
    with e.span("invoke_agent web_agent", 0, 4000,
                {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "web_agent",
                 "gen_ai.provider.name": "openai"}, root=True):
        e.leaf("chat gpt-4.1-mini", 5, 700, {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4.1-mini", "gen_ai.usage.input_tokens": 640,
            "gen_ai.usage.output_tokens": 41,
        }, kind=SpanKind.CLIENT)
        e.leaf(f"execute_tool {tool}", 710, 1900, {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": "call_Xk2pGenAI0001",
            "gen_ai.tool.type": "function",
            "gen_ai.tool.description": "Fetch a URL and return its body as text",
            "gen_ai.tool.call.arguments": compact({"url": "https://status.example.org/api"}),
            "gen_ai.tool.call.result": f"Error: {msg}",
            # OTel semconv puts the exception type here; it is not one of toolspan's five values.
            "error.type": "requests.exceptions.ConnectionError",
        }, status=err(msg), exception=(RequestsConnectionError(msg), 1899, {
            "exception.stacktrace": fake_traceback(
                [("/app/tools/fetch.py", 19, "fetch_url", "r = requests.get(url, timeout=10)"),
                 ("/app/.venv/lib/python3.11/site-packages/requests/adapters.py", 700, "send",
                  "raise ConnectionError(e, request=request)")],
                f"requests.exceptions.ConnectionError: {msg}")}))
        e.leaf(f"execute_tool {tool}", 1910, 2600, {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": "call_Xk2pGenAI0002",
            "gen_ai.tool.type": "function",
            "gen_ai.tool.call.arguments": compact({"url": "https://status.example.com/api"}),
            "gen_ai.tool.call.result": compact({"status": "operational", "incidents": []}),
        }, status=OK)


def openinference_tool(e: Emitter) -> None:
    oi = e.scope("openinference.instrumentation.langchain", "0.1.50")
    query = "SELECT id, total FROM customer_orders WHERE status = 'late' ORDER BY total DESC LIMIT 10"
    traceback_text = fake_traceback(
        [("/app/agent/tools/sql.py", 42, "run_sql", "cur.execute(query)"),
         ("/app/.venv/lib/python3.11/site-packages/psycopg2/extras.py", 146, "execute",
          "return super().execute(query, vars)")],
        'psycopg2.errors.UndefinedTable: relation "customer_orders" does not exist\n'
        f"LINE 1: SELECT id, total FROM customer_orders WHERE status = 'late' ...\n"
        "                              ^",
    )
    with e.span("AgentExecutor", 0, 5000, {
        "openinference.span.kind": "CHAIN",
        "input.value": "Which late orders are the most expensive?",
        "output.value": "The largest late order is #1042 at 1,830.00 EUR.",
    }, root=True, tracer=oi, status=OK):
        e.leaf("ChatOpenAI", 10, 800, {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o-mini",
            "llm.provider": "openai",
            "llm.token_count.prompt": 512,
            "llm.token_count.completion": 64,
            "llm.token_count.total": 576,
        }, tracer=oi, status=OK)
        e.leaf("run_sql", 810, 950, {
            "openinference.span.kind": "TOOL",
            "tool.name": "run_sql",
            "tool.description": "Run a read-only SQL query against the orders database",
            "input.value": compact({"query": query}),
            "input.mime_type": "application/json",
            # leaked internals: the raw traceback, file paths and SQL went back to the model
            "output.value": traceback_text,
            "output.mime_type": "text/plain",
        }, tracer=oi, status=err('relation "customer_orders" does not exist'),
            exception=(UndefinedTable('relation "customer_orders" does not exist'), 949,
                       {"exception.stacktrace": traceback_text}))
        e.leaf("ChatOpenAI", 960, 1700, {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o-mini",
            "llm.provider": "openai",
            "llm.token_count.prompt": 731,
            "llm.token_count.completion": 58,
            "llm.token_count.total": 789,
        }, tracer=oi, status=OK)
        e.leaf("run_sql", 1710, 1850, {
            "openinference.span.kind": "TOOL",
            "tool.name": "run_sql",
            "input.value": compact({"query": "SELECT id, total FROM orders WHERE status = 'late' "
                                             "ORDER BY total DESC LIMIT 3"}),
            "input.mime_type": "application/json",
            "output.value": compact([{"id": 1042, "total": "1830.00"}, {"id": 977, "total": "1210.50"},
                                     {"id": 1003, "total": "990.00"}]),
            "output.mime_type": "application/json",
        }, tracer=oi, status=OK)


def openllmetry_tool(e: Emitter) -> None:
    # OpenLLMetry (traceloop-sdk): a @workflow, its OpenAI instrumentation's chat spans (the
    # token keys it wrote before the GenAI conventions' names) and a @tool whose backend
    # answered something that is not JSON, then a call that succeeds.
    tl = e.scope("traceloop.tracer", "0.47.3")
    oa = e.scope("opentelemetry.instrumentation.openai.v1", "0.47.3")
    with e.span("support_agent.workflow", 0, 3000, {
        "traceloop.span.kind": "workflow",
        "traceloop.workflow.name": "support_agent",
        "traceloop.entity.name": "support_agent",
    }, root=True, tracer=tl, status=OK):
        e.leaf("openai.chat", 10, 700, {
            "llm.request.type": "chat",
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.prompt_tokens": 420,
            "gen_ai.usage.completion_tokens": 31,
            "llm.usage.total_tokens": 451,
        }, tracer=oa, status=OK)
        msg = "Expecting value: line 1 column 1 (char 0)"
        e.leaf("search_docs.tool", 710, 1100, {
            "traceloop.span.kind": "tool",
            "traceloop.workflow.name": "support_agent",
            "traceloop.entity.name": "search_docs",
            "traceloop.entity.path": "support_agent",
            "traceloop.entity.input": compact({"args": [], "kwargs": {"query": "refund policy"}}),
        }, tracer=tl, status=err(f"JSONDecodeError: {msg}"),
            exception=(JSONDecodeError(msg), 1099, {}))
        e.leaf("openai.chat", 1110, 1900, {
            "llm.request.type": "chat",
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.prompt_tokens": 510,
            "gen_ai.usage.completion_tokens": 28,
        }, tracer=oa, status=OK)
        e.leaf("search_docs.tool", 1910, 2300, {
            "traceloop.span.kind": "tool",
            "traceloop.workflow.name": "support_agent",
            "traceloop.entity.name": "search_docs",
            "traceloop.entity.input": compact({"args": [], "kwargs": {"query": "refunds"}}),
            "traceloop.entity.output": compact({"hits": [{"title": "Refunds", "score": 0.92}]}),
        }, tracer=tl, status=OK)


def http_client_under_tool(e: Emitter) -> None:
    tool, cid = "update_ticket", "call_http_0001"
    http = e.scope("opentelemetry.instrumentation.requests", "0.66b1")
    env = dict(code="upstream_unavailable", cls="transient", retryable=True, reference="err_5d2e8b",
               retry_after_ms=5000)
    with agent(e, "support_agent", 0, 1500):
        with call(e, tool, cid, 10, 1200, compact({"ticket_id": 4711, "status": "resolved"}),
                  envelope_json(**env), err("ticket service returned HTTP 503"), envelope_attrs(**env)):
            # a plain HTTP client span from foreign instrumentation: no toolspan.* and no gen_ai.* keys
            e.leaf("PUT", 30, 1180, {
                "http.request.method": "PUT",
                "url.full": "https://tickets.internal.example/api/v2/tickets/4711",
                "server.address": "tickets.internal.example",
                "server.port": 443,
                "http.response.status_code": 503,
                # HTTP semconv sets error.type to the status code; not one of toolspan's five values.
                "error.type": "503",
            }, kind=SpanKind.CLIENT, tracer=http, status=Status(StatusCode.ERROR))


JAVA_STACK = (
    "java.sql.SQLSyntaxErrorException: Unknown column 'invoice.tenant_id' in 'where clause'\n"
    "\tat com.mysql.cj.jdbc.exceptions.SQLError.createSQLException(SQLError.java:121)\n"
    "\tat com.mysql.cj.jdbc.exceptions.SQLExceptionsMapping.translateException(SQLExceptionsMapping.java:122)\n"
    "\tat com.mysql.cj.jdbc.ClientPreparedStatement.executeInternal(ClientPreparedStatement.java:916)\n"
    "\tat com.mysql.cj.jdbc.ClientPreparedStatement.executeQuery(ClientPreparedStatement.java:972)\n"
    "\tat com.acme.billing.InvoiceRepository.findById(InvoiceRepository.java:88)\n"
    "\tat com.acme.billing.api.InvoiceController.get(InvoiceController.java:41)\n"
    "\tat org.springframework.web.servlet.FrameworkServlet.service(FrameworkServlet.java:883)\n"
    "\t... 47 more\n"
)


def leaked_stack_trace(e: Emitter) -> None:
    tool = "get_invoice"
    server = "billing.internal"
    with agent(e, "billing_agent", 0, 3000):
        cid = "call_leak_0001"
        with call(e, tool, cid, 10, 700, compact({"invoice_id": "inv_2024_0091"}), JAVA_STACK,
                  err("billing service returned HTTP 500")):
            with attempt(e, tool, cid, 1, 12, 698, err("billing service returned HTTP 500")):
                stage(e, tool, cid, "prepare", 14, 18)
                stage(e, tool, cid, "send", 18, 50, OK, {"server.address": server, "server.port": 443})
                stage(e, tool, cid, "execute", 50, 690, err("billing service returned HTTP 500"),
                      {"http.response.status_code": 500})
        env = dict(code="not_found", cls="not_found", retryable=False, reference="err_1a2b3c")
        cid = "call_leak_0002"
        with call(e, tool, cid, 1000, 1400, compact({"invoice_id": "inv_2024_0092"}),
                  compact({"error": {"code": "not_found", "class": "not_found", "retryable": False,
                                     "reference": "err_1a2b3c"}}),
                  err("invoice inv_2024_0092 not found"), envelope_attrs(**env)):
            with attempt(e, tool, cid, 1, 1002, 1398, err("invoice inv_2024_0092 not found")):
                stage(e, tool, cid, "prepare", 1004, 1008)
                stage(e, tool, cid, "send", 1008, 1040, OK, {"server.address": server, "server.port": 443})
                stage(e, tool, cid, "execute", 1040, 1390, err("invoice inv_2024_0092 not found"),
                      {"http.response.status_code": 404, **envelope_attrs(**env)})


def secrets(e: Emitter) -> None:
    tool, cid = "send_email", "call_secret_0001"
    args = compact({
        "to": "jane.doe@example.com",
        "subject": "Your credentials",
        "body": "Use aws_access_key_id=AKIAIOSFODNN7EXAMPLE and password=hunter2 to log in.",
        "headers": {"Authorization": "Bearer sk_test_4eC39HqLyjWDarjtT1zdp7dc"},
    })
    url = f"https://hooks.example.com/notify?token={JWT}"
    with agent(e, "ops_agent", 0, 2000):
        with call(e, tool, cid, 10, 900, args, compact({"sent": True, "message_id": "msg_77f1"}), OK):
            with attempt(e, tool, cid, 1, 12, 898, OK):
                stage(e, tool, cid, "prepare", 14, 20)
                stage(e, tool, cid, "send", 20, 300, OK,
                      {"server.address": "hooks.example.com", "server.port": 443, "url.full": url},
                      name=f"{tool} send POST {url}",
                      events=[("auth.token_refreshed", 25, {"auth.token": JWT,
                                                             "http.request.header.authorization": [f"Bearer {JWT}"]})])
                stage(e, tool, cid, "execute", 300, 880, OK, {"http.response.status_code": 202})
                stage(e, tool, cid, "parse", 880, 890)


def unknown_shape(e: Emitter) -> None:
    with agent(e, "batch_agent", 0, 1000):
        with e.span("process_batch", 10, 600):
            e.leaf("cache.lookup", 20, 25)
        e.leaf("custom.work", 610, 900, {
            "custom.flag": True,
            "custom.count": 7,
            "custom.ratio": 0.25,
            "custom.labels": ["a", "b"],
            "custom.ids": [1, 2, 3],
            "custom.weights": [0.5, 1.5],
            "custom.bits": [True, False],
            "operation": "compact",
        }, kind=SpanKind.PRODUCER, status=err("work item rejected"))


def big_payload(e: Emitter) -> None:
    tool, cid = "export_report", "call_big_0001"
    result = big_result()
    with agent(e, "report_agent", 0, 2000):
        with call(e, tool, cid, 10, 1800, compact({"report": "monthly", "format": "json"}), result, OK):
            with attempt(e, tool, cid, 1, 12, 1798, OK):
                ok_stages(e, tool, cid, 14, "reports.internal", durations=(5, 45, 1600, 60))


BIG_RESULT_BYTES = 10 * 1024
EURO_AT_BYTE = 4095  # a 3-byte UTF-8 character straddling the 4 KiB truncation boundary


def big_result() -> str:
    """A JSON document of exactly 10 KiB (UTF-8) with a '€' starting at byte 4095."""

    def row(i: int) -> dict:
        return {"id": i, "name": f"row-{i:05d}", "amount_eur": f"{i * 37 % 1000}.{i % 100:02d}"}

    head = '{"rows":' + compact([row(i) for i in range(40)]) + ',"note":"'
    assert len(head.encode()) < EURO_AT_BYTE, len(head.encode())
    head += "x" * (EURO_AT_BYTE - len(head.encode())) + "€"
    more: list[dict] = []
    while True:
        candidate = more + [row(40 + len(more))]
        if len((head + '","more_rows":' + compact(candidate) + ',"pad":""}').encode()) > BIG_RESULT_BYTES:
            break
        more = candidate
    body = head + '","more_rows":' + compact(more) + ',"pad":"'
    doc = body + "." * (BIG_RESULT_BYTES - len(body.encode()) - 2) + '"}'
    raw = doc.encode()
    assert len(raw) == BIG_RESULT_BYTES, len(raw)
    assert raw[EURO_AT_BYTE:EURO_AT_BYTE + 3] == "€".encode()
    json.loads(doc)
    return doc


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def silent_failures(e: Emitter) -> None:
    # Tool spans whose status is OK (or unset) and whose result alone says the call failed, one
    # per form toolspan recognises, and successes whose results merely mention errors.
    oi = e.scope("openinference.instrumentation.langchain", "0.1.80")
    tl = e.scope("opentelemetry.instrumentation.langchain", "0.62.4")

    def tool(n: int, name: str, start: float, result: str, status: Status | None = OK, **extra: Any) -> None:
        e.leaf(f"execute_tool {name}", start, start + 80, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": f"call_silent_{n:04d}", "gen_ai.tool.call.result": result, **extra,
        }, status=status)

    with agent(e, "quiet_agent", 0, 3000):
        # An error envelope: its class says the model's arguments were invalid.
        tool(1, "update_ticket", 10, envelope_json("invalid_status", "invalid_request", False, "err_3c9d1e"))
        # {"error": "..."}: the text says the tool was not reached.
        tool(2, "update_ticket", 100, compact({"error": "connection refused by tickets.internal:443"}))
        # MCP's CallToolResult with isError (the MCP server rejected the arguments).
        tool(3, "search_docs", 200, compact({"content": [{"type": "text", "text":
             "Error executing tool search_docs: 1 validation error for search_docsArguments\nlimit\n"
             "  Input should be a valid integer [type=int_parsing, input_value='many', input_type=str]"}],
             "isError": True}), status=None)
        # Anthropic's tool_result block with is_error: the tool timed out.
        tool(4, "fetch_url", 300, compact({"type": "tool_result", "tool_use_id": "toolu_01", "content":
             "the upstream request timed out after 30 s", "is_error": True}))
        # A ToolResult with a failing status whose envelope says the answer had the wrong shape.
        tool(5, "search_docs", 400, compact({"status": "tool_error", "error": {
             "code": "invalid_response", "class": "internal",
             "message": "the tool's answer did not have the expected shape"}}))
        # gen_ai.tool.status = error, the result a plain text.
        tool(6, "run_sql", 500, "quota exceeded for project acme", **{"gen_ai.tool.status": "error"})
        # OpenInference: the tool returned a LangChain ToolMessage with status "error"
        # (output.value is the message as message_to_dict renders it).
        e.leaf("search_docs", 600, 680, {
            "openinference.span.kind": "TOOL", "tool.name": "search_docs",
            "input.value": compact({"query": "install guide"}),
            "output.value": compact({"type": "tool", "data": {
                "content": "Expecting value: line 1 column 1 (char 0)", "type": "tool", "name": "search_docs",
                "tool_call_id": "call_silent_0007", "status": "error"}}),
        }, tracer=oi, status=OK)
        # OpenLLMetry: the error object of the tool's answer in traceloop.entity.output.
        e.leaf("fetch_url.tool", 700, 780, {
            "traceloop.span.kind": "tool", "traceloop.entity.name": "fetch_url",
            "traceloop.entity.output": compact({"error": {"code": "dns_failure", "class": "transient",
                                                          "message": "docs.example.invalid could not be resolved"}}),
        }, tracer=tl, status=OK)
        # Successes that only mention errors stay successes.
        tool(9, "search_docs", 800, compact({"results": [{"title": "error codes", "url": "https://docs/errors"}]}))
        tool(10, "search_docs", 900, compact({"hits": ["Install guide"], "error": None}))
        tool(11, "search_docs", 1000, compact({"content": [{"type": "text", "text": "error codes: E1, E2"}],
                                               "isError": False}))
        tool(12, "update_ticket", 1100, compact({"status": "ok", "ticket": {"status": "error_review"}}))


def meaning_not_names(e: Emitter) -> None:
    # Failed tool spans whose error type comes from what the signal says, not from how a class
    # or model is named: validation errors of the arguments and of the answer under CamelCase
    # model names, pydantic's validate_call, an upper-case error.type from a framework that
    # writes it for any error, a framework's own argument-conversion exception, and a KeyError
    # whose text alone is recorded.
    oi = e.scope("openinference.instrumentation.langchain", "0.1.80")
    fw = e.scope("acme_agents", "2.1.0")

    def oi_tool(start: float, args: dict, exc: Exception, msg: str) -> None:
        e.leaf("search_docs", start, start + 60, {
            "openinference.span.kind": "TOOL", "tool.name": "search_docs",
            "input.value": compact(args), "input.mime_type": "application/json",
        }, tracer=oi, status=err(msg), exception=(exc(msg), start + 59, {}))

    def fw_tool(n: int, start: float, msg: str, attrs: Mapping[str, Any] | None = None,
                exc: tuple[Exception, float, Mapping[str, Any]] | None = None) -> None:
        e.leaf("execute_tool search_docs", start, start + 60, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.call.id": f"call_meaning_{n:04d}",
            "gen_ai.tool.call.arguments": compact({"query": "install", "limit": "many"}), **(attrs or {}),
        }, tracer=fw, status=err(msg), exception=exc)

    with e.span("LangGraph", 0, 3000, {"openinference.span.kind": "CHAIN"}, root=True, tracer=oi, status=OK):
        # The arguments' model is CamelCase (a LangChain args_schema): its field is an argument.
        oi_tool(10, {"query": "install", "limit": "many"}, PydanticValidationError,
                "1 validation error for SearchInput\nlimit\n  Input should be a valid integer, unable to parse "
                "string as an integer [type=int_parsing, input_value='many', input_type=str]")
        # A required argument left out: the rejected input is the arguments.
        oi_tool(100, {"limit": 3}, PydanticValidationError,
                "1 validation error for SearchInput\nquery\n  Field required [type=missing, "
                "input_value={'limit': 3}, input_type=dict]")
        # The tool's answer failed its own model: the field is no argument (PARSE).
        oi_tool(200, {"query": "install", "limit": 3}, PydanticValidationError,
                "1 validation error for SearchAnswer\nhits\n  Field required [type=missing, "
                "input_value={'results': []}, input_type=dict]")
    with e.span("invoke_agent docs_agent", 0, 3000, {"gen_ai.operation.name": "invoke_agent",
                                                     "gen_ai.agent.name": "docs_agent"}, root=True, tracer=fw):
        # pydantic's validate_call names the call, not a model.
        fw_tool(1, 10, "1 validation error for call[search_docs]\nlimit\n  Input should be a valid integer "
                       "[type=int_parsing, input_value='many', input_type=str]")
        # The framework writes error.type=TOOL_ERROR for any error; its text says what failed.
        fw_tool(2, 100, "Invalid arguments for tool search_docs: limit must be an integer",
                {"error.type": "TOOL_ERROR"})
        # With toolspan's conventions the same upper-case value is explicit.
        fw_tool(3, 200, "Invalid arguments for tool search_docs: limit must be an integer",
                {"error.type": "TOOL_ERROR", "toolspan.error.code": "search_failed"})
        # ... and so it is from instrumentation the rules file declares (toolspan's SDK scope).
        e.leaf("execute_tool search_docs", 250, 310, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.call.id": "call_meaning_0007", "error.type": "TOOL_ERROR",
        }, tracer=e.scope("toolspan", "0.4.0"),
            status=err("Invalid arguments for tool search_docs: limit must be an integer"))
        # The framework's own exception for an argument it could not convert.
        fw_tool(4, 300, "limit: 'many'", exc=(ToolArgumentConversionError("limit: 'many'"), 359, {}))
        # ... or only its words.
        fw_tool(5, 400, "Could not convert argument 'limit' to int",
                exc=(BuiltinValueError("Could not convert argument 'limit' to int"), 459, {}))
        # DSPy's words for an argument it could not convert.
        fw_tool(8, 450, "Arg limit is invalid: 'many' is not of type 'integer'",
                exc=(BuiltinValueError("Arg limit is invalid: 'many' is not of type 'integer'"), 509, {}))
        # A KeyError inside the tool, recorded as its text alone.
        fw_tool(6, 520, "'status'")


def two_instrumentations(e: Emitter) -> None:
    # Two instrumentations active in one agent, each opening a span for the same tool call: a
    # framework's own GenAI spans with OpenInference's inside them, an MCP client's and server's
    # spans under the framework's tool span (the server joins the trace from params._meta), and
    # two overlapping sibling spans of one call from instrumentations that share no context.
    fw = e.scope("pydantic-ai", "2.68.0")
    oi = e.scope("openinference.instrumentation.pydantic_ai", "0.1.9")
    mcp = e.scope("mcp-python-sdk", "2.3.0")

    def native(tool: str, cid: str, start: float, end: float, **extra: Any):
        return e.span(f"execute_tool {tool}", start, end, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "gen_ai.tool.call.id": cid,
            "gen_ai.tool.type": "function", **extra}, tracer=fw, status=OK)

    def mcp_attrs(tool: str, request_id: str, code: str | None) -> dict:
        attrs = {"mcp.method.name": "tools/call", "gen_ai.tool.name": tool, "jsonrpc.request.id": request_id,
                 "mcp.protocol.version": "2025-06-18", "mcp.session.id": "5f0c2a9d41b34e8f"}
        if code is not None:
            attrs.update({"rpc.response.status_code": code, "error.type": code})
        return attrs

    with e.span("invoke_agent docs_agent", 0, 5000, {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "docs_agent",
        "gen_ai.conversation.id": "conv_two_0001",
    }, root=True, tracer=fw, status=OK):
        # The framework's span says OK; OpenInference's inside it recorded the failure.
        with native("search_docs", "call_two_0001", 100, 900,
                    **{"gen_ai.tool.call.result": "All connection attempts failed"}):
            e.leaf("search_docs", 110, 890, {
                "openinference.span.kind": "TOOL", "tool.name": "search_docs",
                "input.value": compact({"query": "install guide"}), "input.mime_type": "application/json",
            }, tracer=oi, status=err("All connection attempts failed"),
                exception=(ConnectError("All connection attempts failed"), 889, {}))
        # Both say OK.
        with native("search_docs", "call_two_0002", 1000, 1500,
                    **{"gen_ai.tool.call.result": compact(["Install guide"])}):
            e.leaf("search_docs", 1010, 1490, {
                "openinference.span.kind": "TOOL", "tool.name": "search_docs",
                "output.value": compact(["Install guide"]), "output.mime_type": "application/json",
            }, tracer=oi, status=OK)
        # An MCP tool: JSON-RPC's Invalid params (-32602), the server rejected the arguments.
        msg = "Invalid params: order_id must be a string"
        with native("lookup_order", "call_two_0003", 2000, 2800):
            with e.span("tools/call lookup_order", 2010, 2790,
                        {**mcp_attrs("lookup_order", "7", "-32602"), "gen_ai.operation.name": "execute_tool"},
                        kind=SpanKind.CLIENT, tracer=mcp, status=err(msg)):
                e.leaf("tools/call lookup_order", 2020, 2780, mcp_attrs("lookup_order", "7", "-32602"),
                       kind=SpanKind.SERVER, tracer=mcp, status=err(msg))
        # Overlapping siblings of one call: the failed one is the call.
        e.leaf("execute_tool fetch_url", 3000, 3600, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fetch_url",
            "gen_ai.tool.call.id": "call_two_0004"}, tracer=fw, status=OK)
        e.leaf("fetch_url", 3005, 3605, {"openinference.span.kind": "TOOL", "tool.name": "fetch_url"},
               tracer=oi, status=err("Expecting value: line 1 column 1 (char 0)"),
               exception=(JSONDecodeError("Expecting value: line 1 column 1 (char 0)"), 3604, {}))


def framework_retries(e: Emitter) -> None:
    # A framework that runs a failed tool again itself: OpenInference's CrewAI spans, one per
    # run with a rising tool.run_attempts (three failed runs; a failed run and a good one), and a
    # framework that executes one call id again.
    cr = e.scope("openinference.instrumentation.crewai", "0.1.12")
    fw = e.scope("acme_agents", "2.1.0")
    with e.span("Crew.kickoff", 0, 9000, {"openinference.span.kind": "CHAIN"}, root=True, tracer=cr, status=OK):
        for k in range(3):
            start = 100 + k * 600
            e.leaf("search_docs.run", start, start + 500, {
                "openinference.span.kind": "TOOL", "tool.name": "search_docs", "tool.run_attempts": k + 1,
                "tool.agent_role": "Researcher", "input.value": compact({"query": "refund policy"}),
            }, tracer=cr, status=err("timed out"), exception=(ReadTimeout("timed out"), start + 499, {}))
        e.leaf("lookup_order.run", 2000, 2300, {
            "openinference.span.kind": "TOOL", "tool.name": "lookup_order", "tool.run_attempts": 1,
        }, tracer=cr, status=err("All connection attempts failed"),
            exception=(ConnectError("All connection attempts failed"), 2299, {}))
        e.leaf("lookup_order.run", 2400, 2700, {
            "openinference.span.kind": "TOOL", "tool.name": "lookup_order", "tool.run_attempts": 2,
            "output.value": compact({"order": "O-1", "status": "shipped"}),
        }, tracer=cr, status=OK)
    with e.span("invoke_agent ops_agent", 0, 2000, {"gen_ai.operation.name": "invoke_agent",
                                                    "gen_ai.agent.name": "ops_agent"}, root=True, tracer=fw,
                status=OK):
        run = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "run_sql",
               "gen_ai.tool.call.id": "call_rerun_0001"}
        e.leaf("execute_tool run_sql", 100, 400, run, tracer=fw, status=err("read timed out"),
               exception=(ReadTimeout("read timed out"), 399, {}))
        e.leaf("execute_tool run_sql", 500, 800, run, tracer=fw, status=OK)


def genai_conventions(e: Emitter) -> None:
    # What the GenAI semantic conventions define for agents and tools: invoke_agent as a client
    # (a remote agent) and internal, gen_ai.conversation.id, gen_ai.tool.type, and the
    # gen_ai.execute_tool.exception event carrying the exception of a failed tool call.
    fw = e.scope("acme_agents", "2.1.0")
    with e.span("invoke_agent planner", 0, 4000, {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner",
        "gen_ai.conversation.id": "conv_genai_0001", "gen_ai.provider.name": "openai",
    }, root=True, tracer=fw, status=OK):
        with e.span("invoke_agent billing_agent", 100, 1500, {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "billing_agent",
            "gen_ai.conversation.id": "conv_genai_0001", "server.address": "agents.internal.example",
        }, kind=SpanKind.CLIENT, tracer=fw, status=OK):
            e.leaf("execute_tool get_invoice", 200, 1400, {
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_invoice",
                "gen_ai.tool.call.id": "call_genai_0001", "gen_ai.tool.type": "datastore",
            }, tracer=fw, status=err("connect timeout"), events=[("gen_ai.execute_tool.exception", 1399, {
                "exception.type": "httpx.ConnectTimeout", "exception.message": "connect timeout"})])
        e.leaf("execute_tool web_search", 1600, 2400, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "web_search",
            "gen_ai.tool.call.id": "call_genai_0002", "gen_ai.tool.type": "extension",
        }, tracer=fw, status=OK)


@dataclass(frozen=True)
class Scenario:
    fn: Callable[[Emitter], None]
    resource: Mapping[str, Any] = field(default_factory=dict)


SCENARIOS: dict[str, Scenario] = {
    "conventions_ok": Scenario(conventions_ok, {"tenant.id": "acme"}),
    "error_prepare": Scenario(error_prepare),
    "error_network": Scenario(error_network),
    "error_tool": Scenario(error_tool),
    "error_parse": Scenario(error_parse),
    "retry_recovered": Scenario(retry_recovered),
    "retry_exhausted": Scenario(retry_exhausted),
    "explicit_error_type": Scenario(explicit_error_type),
    "genai_execute_tool": Scenario(genai_execute_tool),
    "openinference_tool": Scenario(openinference_tool),
    "openllmetry_tool": Scenario(openllmetry_tool),
    "http_client_under_tool": Scenario(http_client_under_tool),
    "leaked_stack_trace": Scenario(leaked_stack_trace),
    "secrets": Scenario(secrets),
    "unknown_shape": Scenario(unknown_shape),
    "big_payload": Scenario(big_payload),
    "silent_failures": Scenario(silent_failures),
    "meaning_not_names": Scenario(meaning_not_names),
    "two_instrumentations": Scenario(two_instrumentations),
    "framework_retries": Scenario(framework_retries),
    "genai_conventions": Scenario(genai_conventions),
}


def run_scenario(name: str, provider: TracerProvider, base_ns: int = BASE_TIME_NS,
                 marker: str | None = None) -> None:
    SCENARIOS[name].fn(Emitter(provider, base_ns=base_ns, marker=marker))


def select(names: Sequence[str] | None) -> list[str]:
    if not names:
        return list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    return list(names)
