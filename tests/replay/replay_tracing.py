"""Imported as a ``--tools`` module by the replay test (tests/replay.rs): exports the replay's
spans to toolspan (``REPLAY_OTLP_ENDPOINT``), one export per span, with payloads captured.
It holds no tools of its own."""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import toolspan

_provider = TracerProvider(resource=Resource.create({"service.name": "replayer"}))
_provider.add_span_processor(
    SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["REPLAY_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"))
)
trace.set_tracer_provider(_provider)
toolspan.configure(capture_payloads=True)
