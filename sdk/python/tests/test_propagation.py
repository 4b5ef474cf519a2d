"""Requests made in the send stage carry the send span's context (W3C traceparent), so the
tool service's spans join the agent's trace."""

from __future__ import annotations

import asyncio

import httpx
import requests

import toolspan
from toolspan.propagation import httpx_async_hooks, httpx_hooks, requests_session
from conftest import Service, Spans, ok_json


def _traceparent_of(span) -> str:
    c = span.context
    return f"00-{c.trace_id:032x}-{c.span_id:016x}"


def _sent_traceparent(service: Service) -> str:
    path, headers = service.requests[-1]
    # version-trace id-parent id; the flags (sampled, random) are the SDK's business.
    return headers.get("traceparent", "")[:52]


def test_inject_httpx_hooks_and_requests_session_carry_the_send_span(ts, spans: Spans, service: Service) -> None:
    service.answers("/svc", ok_json({"ok": True}))
    clients = {
        "inject": lambda: httpx.get(service.url + "/svc", headers=toolspan.inject()),
        "httpx": lambda: httpx.Client(event_hooks=httpx_hooks()).get(service.url + "/svc"),
        "requests": lambda: requests_session().get(service.url + "/svc", timeout=5),
    }
    for name, send in clients.items():
        with ts.call(f"via_{name}") as call:
            with call.send():
                send().raise_for_status()
        (send_span,) = [s for s in spans.stages(spans.call(f"via_{name}"))]
        assert _sent_traceparent(service) == _traceparent_of(send_span), name


def test_async_httpx_hooks(ts, spans: Spans, service: Service) -> None:
    service.answers("/svc", ok_json({"ok": True}))

    @toolspan.tool(toolspan=ts)
    async def fetch(attempt: toolspan.Attempt) -> int:
        async with httpx.AsyncClient(event_hooks=httpx_async_hooks()) as client:
            with attempt.send():
                r = await client.get(service.url + "/svc")
        return r.status_code

    assert asyncio.run(fetch.ainvoke({})).value == 200
    (send_span,) = [s for s in spans.all if s.attributes.get("toolspan.stage") == "send"]
    assert _sent_traceparent(service) == _traceparent_of(send_span)


def test_no_context_no_header(service: Service) -> None:
    service.answers("/svc", ok_json({}))
    requests_session().get(service.url + "/svc", timeout=5)
    assert "traceparent" not in service.requests[-1][1]
