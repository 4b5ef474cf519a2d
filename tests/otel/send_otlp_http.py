#!/usr/bin/env python3
"""Export the golden scenarios to a live OTLP/HTTP receiver with the real SDK exporters.

  --protocol protobuf  opentelemetry.exporter.otlp.proto.http.trace_exporter.OTLPSpanExporter
  --protocol json      opentelemetry.exporter.otlp.json.http.trace_exporter.OTLPSpanExporter

Each scenario gets its own TracerProvider (its own resource) with a BatchSpanProcessor
(default; one request per scenario) or a SimpleSpanProcessor (one request per span) in front
of the exporter. Without --marker and --base-time, a batch-mode request body is byte-identical
to the file gen_spans.py writes for that scenario.

--marker STR adds resource attribute test.marker=STR, appends " #STR" to every span name, and
seeds the ids with the marker (so repeated runs with different markers never share ids).

Exit status: 0 when every export succeeded, 1 when any export failed, 2 on usage errors.

usage: send_otlp_http.py --endpoint http://127.0.0.1:4318 --protocol protobuf|json
                         [--scenario NAME ...] [--marker STR] [--processor batch|simple]
                         [--base-time now|NANOS] [--timeout SECONDS] [--compression none|gzip]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from opentelemetry.exporter.otlp.common.http import Compression  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

import scenarios  # noqa: E402


class CheckedExporter(SpanExporter):
    """Delegates to the real exporter and remembers whether any export failed
    (span processors swallow export results)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.exports = 0
        self.failures = 0
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:  # noqa: BLE001 - count it as a failure, keep going
            logging.exception("exporter raised")
            result = SpanExportResult.FAILURE
        with self.lock:
            self.exports += 1
            self.spans += len(spans)
            if result is not SpanExportResult.SUCCESS:
                self.failures += 1
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def make_exporter(protocol: str, endpoint: str, timeout: float, compression: Compression) -> SpanExporter:
    url = endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"
    if protocol == "protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    elif protocol == "json":
        from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter
    else:
        raise ValueError(protocol)
    return OTLPSpanExporter(endpoint=url, timeout=timeout, compression=compression)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", required=True, help="receiver base URL (or full URL ending in /v1/traces)")
    ap.add_argument("--protocol", required=True, choices=["protobuf", "json"])
    ap.add_argument("--scenario", action="append", help="scenario name (repeatable; default: all)")
    ap.add_argument("--marker", help="tag put into resource attribute test.marker and span names")
    ap.add_argument("--processor", choices=["batch", "simple"], default="batch")
    ap.add_argument("--base-time", default=None,
                    help="'now' or nanoseconds since the epoch (default: 2026-11-29T10:00:00Z)")
    ap.add_argument("--timeout", type=float, default=10.0, help="per-request timeout in seconds")
    ap.add_argument("--compression", choices=["none", "gzip"], default="none")
    args = ap.parse_args(argv)

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.base_time is None:
        base_ns = scenarios.BASE_TIME_NS
    elif args.base_time == "now":
        base_ns = time.time_ns() // 1_000_000 * 1_000_000
    else:
        base_ns = int(args.base_time)

    names = scenarios.select(args.scenario)
    compression = Compression.GZIP if args.compression == "gzip" else Compression.NONE
    total_exports = total_failures = total_spans = 0
    for name in names:
        exporter = CheckedExporter(make_exporter(args.protocol, args.endpoint, args.timeout, compression))
        provider = scenarios.make_provider(name, marker=args.marker)
        if args.processor == "batch":
            processor = BatchSpanProcessor(exporter, max_queue_size=4096, schedule_delay_millis=60_000,
                                           max_export_batch_size=4096)
        else:
            processor = SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
        scenarios.run_scenario(name, provider, base_ns=base_ns, marker=args.marker)
        flushed = provider.force_flush(timeout_millis=int(args.timeout * 1000 * 3))
        provider.shutdown()
        if not flushed:
            exporter.failures += 1
        status = "ok" if exporter.failures == 0 else "FAILED"
        print(f"{name}: {exporter.spans} spans in {exporter.exports} request(s) via {args.protocol}: {status}")
        total_exports += exporter.exports
        total_failures += exporter.failures
        total_spans += exporter.spans

    print(f"sent {total_spans} spans in {total_exports} request(s), {total_failures} failed")
    return 1 if total_failures or total_exports == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
