#!/usr/bin/env python3
"""Write golden OTLP trace requests for toolspan's tests.

For each scenario in scenarios.py this runs the official OpenTelemetry Python SDK
(TracerProvider + SimpleSpanProcessor + InMemorySpanExporter), then encodes the finished
spans with the SDK's own exporter encoders:

  DIR/<scenario>.pb    ExportTraceServiceRequest bytes, exactly what the OTLP/HTTP protobuf
                       exporter sends (opentelemetry-exporter-otlp-proto-common encode_spans)
  DIR/<scenario>.json  the OTLP/JSON body, exactly what the OTLP/HTTP JSON exporter sends
                       (opentelemetry-exporter-otlp-json-common encode_spans(...).to_json())

Output is byte-for-byte deterministic (fixed ids, timestamps and resource).

usage: gen_spans.py --out DIR [--scenario NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans as encode_spans_json  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as encode_spans_proto  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

import scenarios  # noqa: E402


def collect(name: str, base_ns: int = scenarios.BASE_TIME_NS):
    """Run one scenario through the SDK and return its finished spans (in end order)."""
    provider = scenarios.make_provider(name)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    scenarios.run_scenario(name, provider, base_ns=base_ns)
    provider.force_flush()
    spans = exporter.get_finished_spans()
    provider.shutdown()
    if not spans:
        raise RuntimeError(f"scenario {name} produced no spans")
    return spans


def encode(spans) -> tuple[bytes, bytes]:
    pb = encode_spans_proto(spans).SerializeToString()
    js = encode_spans_json(spans).to_json().encode()
    return pb, js


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output directory (created if missing)")
    ap.add_argument("--scenario", action="append", help="scenario name (repeatable; default: all)")
    ap.add_argument("--list", action="store_true", help="print the scenario names and exit")
    args = ap.parse_args(argv)

    if args.list:
        print("\n".join(scenarios.SCENARIOS))
        return 0
    if not args.out:
        ap.error("--out is required")

    os.makedirs(args.out, exist_ok=True)
    for name in scenarios.select(args.scenario):
        spans = collect(name)
        pb, js = encode(spans)
        for ext, data in (("pb", pb), ("json", js)):
            with open(os.path.join(args.out, f"{name}.{ext}"), "wb") as f:
                f.write(data)
        print(f"{name}: {len(spans)} spans, {len(pb)} B protobuf, {len(js)} B json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
