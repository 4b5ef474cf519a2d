#!/usr/bin/env python3
"""Per-call overhead of the toolspan Python SDK.

Three ways to run the same tool call, measured in one process, interleaved in rounds:

  bare   the tool function called directly;
  hand   the same spans written by hand with the OpenTelemetry API (a call span with
         gen_ai.* attributes and four stage spans, each current while it runs, attributes
         as toolspan's conventions want them);
  sdk    the function wrapped with @toolspan.tool, staged by the tool itself (prepare by the
         SDK: argument check; then send, execute, parse), returning a ToolResult;
  sdk_noop  the same wrapped tool on the OpenTelemetry API's no-op tracer: toolspan's own
         cost (argument check, context managers, ToolResult) without the spans' cost.

The OpenTelemetry SDK runs a real TracerProvider with a BatchSpanProcessor whose exporter
drops the spans (what is measured is the agent-side cost, not the network). Prints p50 and
p99 in µs per mode, then a last line of key=value.

usage: python bench/sdk/bench.py [--calls 20000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import toolspan


class Discard(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def work(query: str) -> list[str]:
    """The tool's own work: small, so that the instrumentation is what is measured."""
    return [query.upper()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000, help="calls per mode")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()

    exporter = Discard()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    ts = toolspan.Toolspan(tracer_provider=provider)

    def bare(args: dict[str, Any], call_id: str) -> Any:
        return work(**args)

    def hand(args: dict[str, Any], call_id: str) -> Any:
        with tracer.start_as_current_span(
            "execute_tool search_docs",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "search_docs",
                "gen_ai.tool.call.id": call_id,
            },
        ):
            with tracer.start_as_current_span("search_docs prepare", attributes={"toolspan.stage": "prepare"}):
                kwargs = dict(args)
            with tracer.start_as_current_span("search_docs send", attributes={"toolspan.stage": "send"}):
                raw = work(**kwargs)
            with tracer.start_as_current_span("search_docs execute", attributes={"toolspan.stage": "execute"}):
                pass
            with tracer.start_as_current_span("search_docs parse", attributes={"toolspan.stage": "parse"}):
                return list(raw)

    @toolspan.tool(name="search_docs", toolspan=ts)
    def search_docs(attempt: toolspan.Attempt, query: str) -> Any:
        with attempt.send():
            raw = work(query)
        with attempt.execute():
            pass
        with attempt.parse():
            return list(raw)

    def sdk(args: dict[str, Any], call_id: str) -> Any:
        return search_docs.invoke(args, call_id=call_id)

    # toolspan's own cost, without any span cost: the same tool on the API's no-op tracer.
    from opentelemetry.trace import NoOpTracerProvider

    noop_ts = toolspan.Toolspan(tracer_provider=NoOpTracerProvider())
    search_noop = toolspan.Tool(search_docs.fn, name="search_docs", toolspan=noop_ts)

    def sdk_noop(args: dict[str, Any], call_id: str) -> Any:
        return search_noop.invoke(args, call_id=call_id)

    # Same answer from each (the sdk's wrapped in a ToolResult).
    assert bare({"query": "q"}, "c") == hand({"query": "q"}, "c") == sdk({"query": "q"}, "c").value

    modes: dict[str, Callable[[dict[str, Any], str], Any]] = {
        "bare": bare,
        "hand": hand,
        "sdk": sdk,
        "sdk_noop": sdk_noop,
    }
    samples: dict[str, list[int]] = {m: [] for m in modes}
    per_round = max(1, a.calls // a.rounds)
    args = {"query": "reset password"}
    # Warm-up.
    for fn in modes.values():
        for _ in range(2000):
            fn(args, "call_w")
    clock = time.perf_counter_ns
    for r in range(a.rounds):
        order = list(modes.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            gc.collect()
            out = samples[name]
            for i in range(per_round):
                t0 = clock()
                fn(args, "call_1")
                out.append(clock() - t0)
    provider.shutdown()

    def q(xs: list[int], p: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))] / 1000.0

    figures: dict[str, float] = {}
    print(f"python {platform.python_version()}, {per_round * a.rounds} calls per mode, {a.rounds} rounds, "
          f"{exporter.spans} spans exported (and dropped) by the batch processor")
    print(f"{'mode':6} {'p50 µs':>8} {'p99 µs':>8} {'mean µs':>8}")
    for name, xs in samples.items():
        p50, p99 = q(xs, 0.5), q(xs, 0.99)
        figures[f"{name}_p50_us"], figures[f"{name}_p99_us"] = p50, p99
        print(f"{name:6} {p50:8.2f} {p99:8.2f} {statistics.fmean(xs) / 1000:8.2f}")
    ratio = figures["sdk_p50_us"] / figures["hand_p50_us"]
    ratio99 = figures["sdk_p99_us"] / figures["hand_p99_us"]
    over_bare = figures["sdk_p50_us"] - figures["bare_p50_us"]
    print(f"loadavg {' '.join(f'{x:.2f}' for x in __import__('os').getloadavg())} on {__import__('os').cpu_count()} cores")
    print(f"sdk vs hand-written spans: p50 ratio {ratio:.3f} (target ≤ 1.1), p99 ratio {ratio99:.3f}; "
          f"sdk p50 {figures['sdk_p50_us']:.1f} µs, {over_bare:.1f} µs over the bare function; "
          f"toolspan's own work (no-op tracer) p50 {figures['sdk_noop_p50_us']:.2f} µs (target ≤ 10)")
    kv = {
        **{k: f"{v:.2f}" for k, v in figures.items()},
        "overhead_vs_bare_p50_us": f"{over_bare:.2f}",
        "ratio_to_hand_written": f"{ratio:.3f}",
        "ratio_to_hand_written_p99": f"{ratio99:.3f}",
        "toolspan_own_p50_us": f"{figures['sdk_noop_p50_us'] - figures['bare_p50_us']:.2f}",
        "calls_per_mode": str(per_round * a.rounds),
    }
    print(" ".join(f"{k}={v}" for k, v in kv.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
