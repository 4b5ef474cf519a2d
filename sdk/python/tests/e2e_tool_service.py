#!/usr/bin/env python3
"""An agent whose tool calls a tool service in a second process (tests/sdk_agent.rs).

The agent (the toolspan SDK, BatchSpanProcessor) calls ``search_docs``; its send stage
requests ``examples/tool_service.py``, started here as its own process, with the trace context
(``toolspan.inject()``). The service continues the trace and exports its own spans one request
per span (SimpleSpanProcessor) under service ``docs-service``: they reach toolspan before
their parent send stage, from another process. Two calls: ``c_remote_ok`` (the service
answers) and ``c_remote_fail`` (its database step fails and it answers 500).

Writes {call id: status} to --out.

usage: e2e_tool_service.py --endpoint http://127.0.0.1:4318 --out results.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import toolspan

SERVICE = Path(__file__).resolve().parent.parent / "examples" / "tool_service.py"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    svc = subprocess.Popen(
        [sys.executable, str(SERVICE), "--endpoint", args.endpoint, "--max-requests", "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = svc.stdout.readline() if svc.stdout else ""
        port = int(line.split()[-1])
        provider = TracerProvider(resource=Resource.create({"service.name": "e2e-agent-remote"}))
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=args.endpoint.rstrip("/") + "/v1/traces"))
        )
        ts = toolspan.Toolspan(tracer_provider=provider)
        tracer = provider.get_tracer("e2e-agent-remote")

        @toolspan.tool(toolspan=ts)
        def search_docs(attempt: toolspan.Attempt, query: str) -> Any:
            with attempt.send(**{"server.address": "127.0.0.1"}) as span:
                resp = httpx.get(
                    f"http://127.0.0.1:{port}/search", params={"q": query}, headers=toolspan.inject(), timeout=10
                )
                span.set_attribute("http.response.status_code", resp.status_code)
                resp.raise_for_status()
            with attempt.parse():
                return resp.json()["hits"]

        results: dict[str, Any] = {}
        with tracer.start_as_current_span(
            "invoke_agent remote-agent",
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "remote-agent"},
        ):
            for call_id, query in [("c_remote_ok", "rotate keys"), ("c_remote_fail", "fail")]:
                r = search_docs.invoke(json.dumps({"query": query}), call_id=call_id)
                results[call_id] = r.status
        provider.shutdown()
        svc.wait(timeout=30)
    finally:
        if svc.poll() is None:
            svc.kill()
    with open(args.out, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
