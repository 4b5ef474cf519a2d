#!/usr/bin/env python3
"""Sanity check for a directory written by gen_spans.py.

For every <scenario>.pb / <scenario>.json pair: the protobuf must parse as an
ExportTraceServiceRequest and carry the same data as the OTLP/JSON body (ids compared as
lowercase hex, as the OTLP/JSON encoding requires). Also checks that the JSON uses hex ids.

usage: check_golden.py DIR   (exit 0 when all pairs agree)
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ID_KEYS = {"traceId", "spanId", "parentSpanId"}
HEX_ID = re.compile(r"^[0-9a-f]{16}([0-9a-f]{16})?$")


def b64_ids_to_hex(node):
    if isinstance(node, dict):
        return {k: (base64.b64decode(v).hex() if k in ID_KEYS else b64_ids_to_hex(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [b64_ids_to_hex(v) for v in node]
    return node


def hex_ids_ok(node) -> bool:
    if isinstance(node, dict):
        return all((HEX_ID.match(v) is not None) if k in ID_KEYS else hex_ids_ok(v) for k, v in node.items())
    if isinstance(node, list):
        return all(hex_ids_ok(v) for v in node)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = argv[1]
    names = sorted(f[:-3] for f in os.listdir(root) if f.endswith(".pb"))
    bad = 0
    for name in names:
        req = ExportTraceServiceRequest()
        with open(os.path.join(root, f"{name}.pb"), "rb") as f:
            req.ParseFromString(f.read())
        from_pb = b64_ids_to_hex(MessageToDict(req, use_integers_for_enums=True))
        with open(os.path.join(root, f"{name}.json"), "rb") as f:
            from_json = json.load(f)
        problems = []
        if from_pb != from_json:
            problems.append("protobuf and JSON differ")
        if not hex_ids_ok(from_json):
            problems.append("JSON ids are not lowercase hex")
        spans = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        print(f"{name}: {spans} spans: {'; '.join(problems) or 'ok'}")
        bad += bool(problems)
    print(f"{len(names) - bad} passed, {bad} failed")
    return 1 if bad or not names else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
