#!/usr/bin/env python3
"""A tool service in its own process that joins the calling agent's trace.

It serves ``GET /search?q=...`` and continues the trace context the request carries
(``traceparent``, as toolspan's send stage injects it), exporting its own spans over
OTLP/HTTP, one export request per span (SimpleSpanProcessor) under its own service name:
exactly the "trace in pieces" toolspan has to assemble (a trace split over many requests classifies as the whole trace) and attribute
to the calling tool's call and attempt. ``q=fail`` makes its database step fail (an
exception event and status ERROR on the service's own span).

  python tool_service.py --endpoint http://127.0.0.1:4318 [--port 0] [--max-requests N]

Prints ``listening on PORT`` once it accepts requests. Pair it with an agent tool such as:

    @toolspan.tool(retry=toolspan.RetryPolicy(max_attempts=2))
    def search_docs(attempt: toolspan.Attempt, query: str) -> dict:
        with attempt.send():
            resp = httpx.get(f"http://127.0.0.1:{port}/search", params={"q": query},
                             headers=toolspan.inject())
            resp.raise_for_status()
        with attempt.parse():
            return resp.json()
"""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True, help="OTLP/HTTP base URL, e.g. http://127.0.0.1:4318")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--service-name", default="docs-service")
    ap.add_argument("--max-requests", type=int, default=0, help="exit after this many (0: never)")
    a = ap.parse_args()

    provider = TracerProvider(resource=Resource.create({"service.name": a.service_name}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=a.endpoint.rstrip("/") + "/v1/traces")))
    tracer = provider.get_tracer("tool_service")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            url = urlparse(self.path)
            q = parse_qs(url.query).get("q", [""])[0]
            parent = propagate.extract(dict(self.headers.items()))
            with tracer.start_as_current_span(
                f"GET {url.path}",
                context=parent,
                kind=trace.SpanKind.SERVER,
                attributes={"http.request.method": "GET", "url.path": url.path},
            ) as server_span:
                status, body = 200, {"hits": [{"title": f"About {q}"}]}
                with tracer.start_as_current_span("db.query", kind=trace.SpanKind.CLIENT, attributes={"db.system": "postgresql"}) as db:
                    if q == "fail":
                        try:
                            raise RuntimeError("canceling statement due to statement timeout")
                        except RuntimeError as e:
                            db.record_exception(e)
                            db.set_status(trace.Status(trace.StatusCode.ERROR, "statement timeout"))
                        status, body = 500, {"error": {"code": "search_failed", "class": "internal"}}
                server_span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    server_span.set_status(trace.Status(trace.StatusCode.ERROR))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", a.port), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        n = 0
        while a.max_requests == 0 or n < a.max_requests:
            server.handle_request()
            n += 1
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
