"""What the server answers a replay with, built here the way the contract says the server
builds it from stored spans: a ``toolspan.replay/1`` document from a call's finished spans, and
``toolspan.evals/1`` lines from such documents. Tests replay these against the SDK."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from conftest import Spans


def _status(s: ReadableSpan) -> str:
    return "error" if s.status.status_code is StatusCode.ERROR else "ok"


def replay_document(
    spans: Spans,
    call: ReadableSpan,
    *,
    table_version: int = 12,
    redact: Iterable[str] = (),
    truncated: bool = False,
) -> dict[str, Any]:
    """The replay document of ``call``. ``redact``: top-level argument fields to store as
    ``[REDACTED:secret]`` (as ingest does with secrets); ``truncated``: store the arguments
    cut short, as a payload past the stored size is."""
    a = call.attributes
    ctx = call.context
    attempts = spans.attempts(call) or [call]
    failed_stage: Optional[str] = None
    recorded = []
    for n, att in enumerate(attempts, 1):
        stages = {s.attributes["toolspan.stage"]: s for s in spans.stages(att)}
        for s in spans.stages(att):
            if _status(s) == "error":
                failed_stage = s.attributes["toolspan.stage"]
        send, parse = stages.get("send"), stages.get("parse")
        if send is not None and "gen_ai.tool.call.result" in send.attributes:
            recorded.append({"attempt": n, "stage": "send", "status": _status(send),
                             "body": send.attributes["gen_ai.tool.call.result"], "exact": True})
        elif parse is not None and "gen_ai.tool.call.arguments" in parse.attributes:
            recorded.append({"attempt": n, "stage": "parse", "status": _status(parse),
                             "body": parse.attributes["gen_ai.tool.call.arguments"], "exact": True})
        elif send is not None:
            recorded.append({"attempt": n, "stage": "send", "status": _status(send), "body": None, "exact": True})
    text = a.get("gen_ai.tool.call.arguments")
    arguments = json.loads(text) if text is not None else None
    inexact = None
    redacted = [f for f in redact if isinstance(arguments, dict) and f in arguments]
    if redacted:
        for f in redacted:
            arguments[f] = "[REDACTED:secret]"
        text = json.dumps(arguments)
        inexact = {"redacted": [f"$.{f}" for f in redacted], "truncated": False,
                   "reason": "a secret in the arguments was redacted at ingest."}
    if truncated and text is not None:
        text, arguments = text[: len(text) // 2], None
        inexact = {"redacted": [], "truncated": True, "reason": "the arguments were longer than the stored text."}
    return {
        "schema": "toolspan.replay/1",
        "table_version": table_version,
        "call": {
            "trace_id": f"{ctx.trace_id:032x}",
            "span_id": f"{ctx.span_id:016x}",
            "call_id": a.get("gen_ai.tool.call.id"),
            "reference": a.get("toolspan.error.reference"),
            "tool": a["gen_ai.tool.name"],
            "service": "support-bot",
            "service_version": "1.5.0",
            "start_time": "2026-12-03T20:00:00.123456Z",
            "status": _status(call),
            "error_type": a.get("error.type"),
            "error_code": a.get("toolspan.error.code"),
            "error_class": a.get("toolspan.error.class"),
            "stage": failed_stage if _status(call) == "error" else None,
            "attempts": a.get("toolspan.attempts", 1),
            "leaked_internals": False,
        },
        "arguments": arguments,
        "arguments_text": text,
        "exact": inexact is None and text is not None,
        "inexact": inexact,
        "result": a.get("gen_ai.tool.call.result"),
        "recorded_responses": recorded,
    }


def fingerprint_id(tool: str, stage: str, error_type: str, code: Optional[str], shape: str) -> str:
    """The first 16 hex digits of the 64-bit FNV-1a hash of the fields, 0x1f apart."""
    h = 0xCBF29CE484222325
    for b in "\x1f".join([tool, stage, error_type, code or "", shape]).encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def evals_lines(docs: list[Mapping[str, Any]], shape: str, table_version: int = 12) -> str:
    """An evals file (header and one case per document, all of one fingerprint)."""
    c = docs[0]["call"]
    fp = fingerprint_id(c["tool"], c["stage"], c["error_type"], c["error_code"], shape)
    header = {"schema": "toolspan.evals/1", "table_version": table_version, "tool": c["tool"],
              "filters": {"error_type": c["error_type"], "code": None, "since": "7d"},
              "exported_at_version": table_version, "fingerprints": 1, "cases": len(docs)}
    lines = [json.dumps(header, separators=(",", ":"))]
    for i, d in enumerate(docs, 1):
        dc = d["call"]
        case = {
            "case": f"{dc['tool']}/{dc['error_type']}/{fp}/{i}",
            "fingerprint": {"id": fp, "tool": dc["tool"], "stage": dc["stage"], "error_type": dc["error_type"],
                            "error_code": dc["error_code"], "arguments_shape": shape, "failures": len(docs)},
            **{k: d[k] for k in ("call", "arguments", "arguments_text", "exact", "inexact", "result", "recorded_responses")},
            "expect": {"not": {"stage": dc["stage"], "error_type": dc["error_type"], "error_code": dc["error_code"]},
                       "envelope_on_failure": True, "leaked_internals": False},
            "context": {"model_input": None, "model_output": None},
        }
        lines.append(json.dumps(case, separators=(",", ":")))
    return "\n".join(lines) + "\n"
