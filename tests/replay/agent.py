#!/usr/bin/env python3
"""The replay test's agent (tests/replay.rs): one agent run of support-bot 1.5.0 over
OTLP/HTTP, payloads captured. Before each tool call the model's turn (a chat span).

  call id   tool         what happens
  c_parse1  search_docs  the docs service answers `link` for `url`: PARSE bad_answer (fleet_tools.broken)
  c_parse2  search_docs  the same, other arguments
  c_parse3  search_docs  the same, other arguments
  c_secret  create_key   its `api_key` argument is redacted at ingest; fails key_exists
  c_side    send_email   a tool with side effects; fails mailbox_full
  c_dup     create_key   a call id used twice (in two traces): ambiguous

The docs service is a local HTTP server in this process, gone when it exits (replays with
recorded responses need no service). Writes call id → reference and trace id (JSON) to --out.

usage: agent.py --endpoint http://127.0.0.1:4318 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


class Docs(BaseHTTPRequestHandler):
    """The docs service after it renamed `url` to `link`."""

    def do_GET(self) -> None:  # noqa: N802
        q = self.path.split("q=", 1)[-1].split("&", 1)[0]
        body = json.dumps({"hits": [{"title": f"About {q}", "link": f"https://docs.example/{q}"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    docs = ThreadingHTTPServer(("127.0.0.1", 0), Docs)
    threading.Thread(target=docs.serve_forever, daemon=True).start()
    os.environ["FLEET_DOCS_URL"] = f"http://127.0.0.1:{docs.server_address[1]}/search"

    provider = TracerProvider(
        resource=Resource.create({"service.name": "support-bot", "service.version": "1.5.0"})
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=args.endpoint.rstrip("/") + "/v1/traces")))
    trace.set_tracer_provider(provider)

    import toolspan
    from fleet_tools.broken import search_docs
    from replay_tools import create_key, send_email

    toolspan.configure(capture_payloads=True)
    tracer = trace.get_tracer("replay-agent")
    calls = [
        ("c_parse1", search_docs, {"query": "reset password"}),
        ("c_parse2", search_docs, {"query": "rotate api keys"}),
        ("c_parse3", search_docs, {"query": "billing"}),
        ("c_secret", create_key, {"api_key": "sk_live_51HvQz8k2eX9TqLmNp4", "name": "prod"}),
        ("c_side", send_email, {"to": "ops-team", "body": "the nightly report"}),
    ]
    results: dict[str, Any] = {}

    def run(call_id: str, tool: Any, arguments: dict[str, Any]) -> None:
        text = json.dumps(arguments)
        with tracer.start_as_current_span(
            "chat gpt-4o",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o",
                "input.value": f"user: please help ({call_id})",
                "output.value": f"calling {tool.name} with {text}",
            },
        ):
            pass
        result = tool.invoke(text, call_id=call_id)
        results[call_id] = {
            "status": "ok" if result.ok else "error",
            "reference": None if result.ok else json.loads(result.content())["error"]["reference"],
            "trace_id": f"{trace.get_current_span().get_span_context().trace_id:032x}",
        }

    with tracer.start_as_current_span(
        "invoke_agent support-bot",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support-bot"},
    ):
        for call_id, tool, arguments in calls:
            run(call_id, tool, arguments)
    # One call id in two agent runs (two traces): naming the call by it is ambiguous.
    for _ in range(2):
        with tracer.start_as_current_span(
            "invoke_agent support-bot",
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support-bot"},
        ):
            run("c_dup", create_key, {"api_key": "sk_live_51HvQz8k2eX9TqLmNp4", "name": "prod"})
    provider.shutdown()
    docs.shutdown()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
