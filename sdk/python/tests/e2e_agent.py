#!/usr/bin/env python3
"""A scripted agent using the toolspan SDK, exporting over OTLP/HTTP (tests/sdk_agent.rs).

It plays one agent run whose tools fail at every stage and recover or exhaust retries:

  call id        tool           what happens                                   expected
  c_prepare      update_ticket  the model's status is not an allowed value     PREPARE
  c_refused      fetch_url      connection refused (nothing listens)           NETWORK
  c_recover      search_docs    a gateway answers 502, the retry succeeds      ok after 2 attempts
  c_exhaust      search_docs    the gateway answers 502 three times            RETRY_EXHAUSTED
  c_tool_error   run_sql        the tool's own error (driver text, SQL, path)  TOOL_ERROR
  c_parse        search_docs    the service answers truncated JSON             PARSE
  c_ok           update_ticket  fine                                           ok
  c_leak         legacy_lookup  NOT wrapped: the agent hands the model the traceback

The tool services are local HTTP servers in this process. Writes the model-facing results
(JSON: call id → tool, status, content, reference) to --out and the application's log
(records with tracebacks) to --log.

usage: e2e_agent.py --endpoint http://127.0.0.1:4318 --out results.json --log agent.log
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import httpx
import pydantic
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import toolspan


class Docs(BaseHTTPRequestHandler):
    """The docs search service behind a gateway: /search?q=flaky answers 502 once, q=down
    always, q=broken answers truncated JSON."""

    seen: dict[str, int] = {}

    def do_GET(self) -> None:  # noqa: N802
        q = self.path.split("q=", 1)[-1]
        n = Docs.seen[q] = Docs.seen.get(q, 0) + 1
        if q == "down" or (q == "flaky" and n == 1):
            status, body = 502, b"<html><body>502 Bad Gateway</body></html>"
        elif q == "broken":
            status, body = 200, b'{"hits": [{"title": "Reset your pass'
        else:
            status, body = 200, json.dumps({"hits": [{"title": f"About {q}"}]}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class Hit(pydantic.BaseModel):
    title: str


class Answer(pydantic.BaseModel):
    hits: list[Hit]


class TicketArgs(pydantic.BaseModel):
    ticket_id: int
    status: Literal["open", "pending", "closed"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--log", required=True)
    args = ap.parse_args()

    # The application's own logging: full exceptions land here under their reference.
    log = logging.getLogger("support_agent.tools")
    handler = logging.FileHandler(args.log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False

    provider = TracerProvider(resource=Resource.create({"service.name": "e2e-agent"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=args.endpoint.rstrip("/") + "/v1/traces")))
    ts = toolspan.Toolspan(tracer_provider=provider, capture_payloads=True, logger=log)
    tracer = provider.get_tracer("e2e-agent")

    docs = ThreadingHTTPServer(("127.0.0.1", 0), Docs)
    threading.Thread(target=docs.serve_forever, daemon=True).start()
    docs_url = f"http://127.0.0.1:{docs.server_address[1]}"
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed_port = s.getsockname()[1]
    s.close()

    fast = dict(initial_backoff_s=0.01, max_backoff_s=0.02)

    @toolspan.tool(toolspan=ts, retry=toolspan.RetryPolicy(max_attempts=3, **fast))
    def search_docs(attempt: toolspan.Attempt, query: str) -> list[dict[str, Any]]:
        with attempt.send(**{"server.address": "127.0.0.1"}) as span:
            resp = httpx.get(docs_url + "/search", params={"q": query}, headers=toolspan.inject())
            span.set_attribute("http.response.status_code", resp.status_code)
            resp.raise_for_status()
        with attempt.parse():
            return Answer.model_validate_json(resp.text).model_dump()["hits"]

    @toolspan.tool(toolspan=ts)
    def fetch_url(attempt: toolspan.Attempt, path: str) -> str:
        with attempt.send(**{"server.address": "127.0.0.1", "server.port": closed_port}):
            resp = httpx.get(f"http://127.0.0.1:{closed_port}{path}", timeout=5)
        with attempt.parse():
            return resp.text

    @toolspan.tool(toolspan=ts, arguments=TicketArgs)
    def update_ticket(ticket_id: int, status: str) -> dict[str, Any]:
        return {"ticket_id": ticket_id, "status": status}

    @toolspan.tool(toolspan=ts)
    def run_sql(question: str) -> list[Any]:
        raise RuntimeError(
            'psycopg.errors.UndefinedTable: relation "tickets_v2" does not exist\n'
            "LINE 1: SELECT id, email FROM tickets_v2 WHERE owner = 'ops' -- /srv/agent/db/queries.py"
        )

    def legacy_lookup(customer: str) -> str:
        return {"acme": "gold"}[customer]

    script: list[tuple[str, Any, Any]] = [
        ("c_prepare", update_ticket, {"ticket_id": 7, "status": "resolved"}),
        ("c_refused", fetch_url, {"path": "/status"}),
        ("c_recover", search_docs, {"query": "flaky"}),
        ("c_exhaust", search_docs, {"query": "down"}),
        ("c_tool_error", run_sql, {"question": "open tickets per owner"}),
        ("c_parse", search_docs, {"query": "broken"}),
        ("c_ok", update_ticket, {"ticket_id": 7, "status": "closed"}),
    ]
    results: dict[str, Any] = {}
    with tracer.start_as_current_span(
        "invoke_agent support-agent",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support-agent"},
    ):
        for call_id, tool, arguments in script:
            # What a model would send: the arguments as JSON text.
            r = tool.invoke(json.dumps(arguments), call_id=call_id)
            results[call_id] = {
                "tool": tool.name,
                "status": r.status,
                "attempts": r.attempts,
                "content": r.to_openai()["content"],
                "reference": r.error.reference if r.error else None,
            }
        # A tool left unwrapped: the agent's loop catches the exception and hands the model
        # the traceback, and its own instrumentation records what the model got.
        with tracer.start_as_current_span(
            "execute_tool legacy_lookup",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "legacy_lookup",
                "gen_ai.tool.call.id": "c_leak",
            },
        ) as span:
            try:
                content = legacy_lookup("initech")
            except Exception:  # noqa: BLE001 - the anti-pattern under test
                content = traceback.format_exc()
                span.set_status(trace.Status(trace.StatusCode.ERROR, "lookup failed"))
            span.set_attribute("gen_ai.tool.call.result", content)
            results["c_leak"] = {"tool": "legacy_lookup", "status": "tool_error", "content": content, "reference": None}

    provider.shutdown()
    docs.shutdown()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
