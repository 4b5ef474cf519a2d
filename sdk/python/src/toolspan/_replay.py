"""Replaying a failed call: fetch its replay document from the query service
(``GET /api/v1/calls/{id}/replay``, schema ``toolspan.replay/1``), check it against the sandbox
rules, run the application's own tool on the same inputs as a new traced call linked to the
original, and judge the outcome.

Sandbox rules, checked before the tool runs (a refusal raises :class:`ReplayRefused`):
- the arguments are exact (nothing redacted or cut short), or the user supplies every
  redacted value (by JSON path or top-level field name) or the whole arguments;
- a tool declared with ``side_effects=True`` runs only when the user allows it, or inside the
  tool's own ``sandbox``;
- with recorded responses, the call has recorded responses and they are exact.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import json
import re
import types
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Optional, Union

from opentelemetry.trace import Link, SpanContext, TraceFlags

from . import _jsonpath, _recorded
from ._replaying import _SESSION, ReplayError, ReplayRefused, Session
from ._verdict import Outcome, Verdict, judge, leaks, passes
from .result import ToolResult
from .tool import Tool

__all__ = ["ReplayResult", "replay", "run_document", "resolve_tools", "fetch", "REPLAY_SCHEMA"]

REPLAY_SCHEMA = "toolspan.replay/1"
_TRACE_ID = re.compile(r"[0-9a-f]{32}\Z")
_SPAN_ID = re.compile(r"[0-9a-f]{16}\Z")
# How the SDK marks a payload it cut to ``payload_limit`` before export: the store sees only
# the cut text, so its digest cannot tell.
_SDK_CUT = re.compile(r"…\[\d+ more characters\]\Z")

#: Where the tools come from: modules (or their dotted names), whose ``@toolspan.tool``
#: functions are found by name, or :class:`~toolspan.Tool` objects.
ToolSource = Union[types.ModuleType, str, Tool[Any]]


@dataclass(frozen=True)
class ReplayResult:
    """The outcome of one replay: the ``verdict`` (``fixed``, ``same_failure``,
    ``different_failure``), whether it ``passed`` as an eval case would, the ``original``
    and ``replay`` outcomes, and the replayed call's :class:`~toolspan.ToolResult`."""

    verdict: Verdict
    passed: bool
    tool: str
    of: str
    original: Outcome
    replay: Outcome
    result: ToolResult
    table_version: Optional[int] = None
    case: Optional[str] = None

    @property
    def exit_code(self) -> int:
        """0 when fixed, 1 otherwise (what ``python -m toolspan replay`` exits with)."""
        return 0 if self.verdict == "fixed" else 1

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``--format json`` prints."""
        return {
            "verdict": self.verdict,
            "passed": self.passed,
            "tool": self.tool,
            "replay_of": self.of,
            "table_version": self.table_version,
            "case": self.case,
            "original": self.original.to_dict(),
            "replay": {**self.replay.to_dict(), "content": self.result.content()},
        }

    def __str__(self) -> str:
        who = self.case or self.original.reference or self.of
        return (
            f"{self.tool} {who}: {self.verdict.replace('_', ' ')} "
            f"(before: {self.original.describe()}; after: {self.replay.describe()})"
        )


# -- fetching


def fetch(url: str, *, token: Optional[str] = None, accept: str = "application/json", timeout: float = 30.0) -> bytes:
    """``GET url`` (with ``Authorization: Bearer token``); an error answer of the query
    service is a :class:`ReplayError` carrying its envelope's code, message and reference."""
    from . import __version__

    req = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": f"toolspan-python/{__version__}"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()  # type: ignore[no-any-return]
    except urllib.error.HTTPError as e:
        raise ReplayError(f"{url} answered {e.code}: {_envelope_text(e.read())}") from None
    except urllib.error.URLError as e:
        raise ReplayError(f"could not reach {url}: {e.reason}") from None
    except OSError as e:  # a timeout or a reset while reading
        raise ReplayError(f"could not read {url}: {e}") from None


def _envelope_text(body: bytes) -> str:
    try:
        err = json.loads(body)["error"]
        text = f"{err['code']}: {err.get('message', '')}"
        if err.get("reference"):
            text += f" (reference {err['reference']})"
        return text
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", errors="replace") or "no body"


def fetch_document(
    ref: str, *, query_url: str, token: Optional[str] = None, table_version: Optional[int] = None
) -> dict[str, Any]:
    """The replay document of ``ref`` (an error reference, a call id or ``TRACEID:SPANID``)."""
    url = query_url.rstrip("/") + "/api/v1/calls/" + urllib.parse.quote(ref, safe=":") + "/replay"
    if table_version is not None:
        url += f"?version={int(table_version)}"
    body = fetch(url, token=token)
    try:
        doc = json.loads(body)
    except ValueError:
        raise ReplayError(f"{url} did not answer JSON") from None
    if not isinstance(doc, dict) or doc.get("schema") != REPLAY_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else None
        raise ReplayError(f"{url} answered schema {got!r}; this SDK reads {REPLAY_SCHEMA}")
    return doc


# -- the tool


def resolve_tools(tools: Iterable[ToolSource]) -> dict[str, Tool[Any]]:
    """The ``@toolspan.tool`` functions of ``tools`` by name (modules' top-level tools and
    the Tool objects given). Two different tools of one name are an error."""
    found: dict[str, Tool[Any]] = {}
    for src in tools:
        if isinstance(src, str):
            try:
                src = importlib.import_module(src)
            except ImportError as e:
                raise ReplayError(f"cannot import the tools module {src!r}: {e}") from None
        if isinstance(src, Tool):
            candidates: Iterable[Any] = (src,)
        elif isinstance(src, types.ModuleType):
            candidates = vars(src).values()
        else:
            raise ReplayError(f"tools must be modules, module names or toolspan.Tool objects, not {type(src).__name__}")
        for t in candidates:
            if isinstance(t, Tool):
                if found.get(t.name, t) is not t:
                    raise ReplayError(f"two different tools are named {t.name!r} in the given tools; give only one")
                found[t.name] = t
    return found


def _tool_for(name: str, tools: Iterable[ToolSource]) -> Tool[Any]:
    found = resolve_tools(tools)
    t = found.get(name)
    if t is None:
        have = ", ".join(sorted(found)) or "none"
        raise ReplayRefused(f"the original call is of tool {name!r}, which the given tools do not have (they have: {have})")
    return t


# -- the arguments


def _hint(paths: list[_jsonpath.Path]) -> str:
    flags = " ".join(
        f"--arg {p[0]}=VALUE" if len(p) == 1 and isinstance(p[0], str) else f"--arg '{_jsonpath.format_path(p)}=VALUE'"
        for p in paths
    )
    keys = ", ".join(
        json.dumps(p[0] if len(p) == 1 and isinstance(p[0], str) else _jsonpath.format_path(p)) + ": ..." for p in paths
    )
    return (
        f"supply {'it' if len(paths) == 1 else 'each'} ({flags}, or args_override={{{keys}}}), "
        "or the whole arguments (--args-file FILE, or args_override={\"$\": {...}})"
    )


def arguments_for(doc: Mapping[str, Any], overrides: Optional[Mapping[str, Any]]) -> Any:
    """The arguments to replay with: the stored ones when exact, with ``overrides`` (values by
    JSON path or top-level field name; ``"$"``: the whole arguments) applied. Refuses
    arguments that are not exact unless the overrides replace every inexact part."""
    given: list[tuple[_jsonpath.Path, Any]] = []
    for key, value in (overrides or {}).items():
        path = _jsonpath.parse(key)
        if path is None:
            raise ReplayError(f"{key!r} is neither a JSON path ($.a.b, $.items[0].c) nor a field name")
        given.append((path, value))
    given.sort(key=lambda pv: len(pv[0]))  # the whole arguments first, then fields
    whole = bool(given) and given[0][0] == ()

    text = doc.get("arguments_text")
    args = doc.get("arguments")
    inexact = doc.get("inexact") or {}
    if args is None and isinstance(text, str):
        try:
            args = json.loads(text)
        except ValueError:
            args = None
    need_whole: Optional[str] = None
    if text is None and args is None:
        need_whole = (
            "the call's arguments were not recorded (the application records them with "
            "toolspan.configure(capture_payloads=True))"
        )
    elif inexact.get("truncated") or (isinstance(text, str) and _SDK_CUT.search(text)):
        need_whole = "the stored arguments were cut short, so the rest of them is unknown"
    redacted: list[_jsonpath.Path] = []
    for p in inexact.get("redacted") or []:
        parsed = _jsonpath.parse(p)
        if parsed is None:
            need_whole = need_whole or f"the stored arguments have a redacted value at {p}"
        elif parsed not in redacted:
            redacted.append(parsed)
    # Markers the document did not list are redactions all the same.
    for parsed in _jsonpath.redacted_paths(args):
        if parsed not in redacted:
            redacted.append(parsed)
    if need_whole is None and not redacted and doc.get("exact") is not True:
        need_whole = (inexact.get("reason") or "the stored arguments are not exactly what the model sent").rstrip(".")

    if not whole:
        if need_whole is not None:
            raise ReplayRefused(
                f"{need_whole}; supply the whole arguments (--args-file FILE, or args_override={{\"$\": {{...}}}})"
            )
        missing = [r for r in redacted if not any(_jsonpath.covers(p, r) for p, _ in given)]
        if missing:
            where = ", ".join(_jsonpath.format_path(m) for m in missing)
            raise ReplayRefused(f"the arguments are not exact: {where} {'was' if len(missing) == 1 else 'were'} redacted; {_hint(missing)}")
        if not given:
            return text if text is not None else args  # the model's own text, byte for byte
        if not isinstance(args, (dict, list)):
            raise ReplayRefused(
                "the stored arguments are not a JSON object, so single fields cannot be replaced; "
                "supply the whole arguments (--args-file FILE, or args_override={\"$\": {...}})"
            )
        base = copy.deepcopy(args)
    else:
        base = None
    for path, value in given:
        try:
            base = _jsonpath.set_at(base, path, copy.deepcopy(value))
        except KeyError as e:
            raise ReplayError(f"cannot supply {_jsonpath.format_path(path)}: {e.args[0]}") from None
    return base


# -- recorded responses


def _recorded_for(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    rec = [e for e in doc.get("recorded_responses") or [] if isinstance(e, dict)]
    if not any(e.get("body") is not None for e in rec):
        raise ReplayRefused(
            "the original call has no recorded responses (a tool records its backend's answer with "
            "s.record_response(text) in its send stage, with capture_payloads=True); "
            "replay it without recorded responses"
        )
    inexact = [
        str(e.get("attempt"))
        for e in rec
        if e.get("body") is not None
        and (e.get("exact") is False or (isinstance(e.get("body"), str) and _SDK_CUT.search(e["body"])))
    ]
    if inexact:
        raise ReplayRefused(
            f"the recorded response of attempt {', '.join(inexact)} is not exact (redacted or cut short), "
            "so the tool would not see what it saw; replay it without recorded responses"
        )
    return sorted(rec, key=lambda e: int(e.get("attempt") or 0))


# -- running


def _span_context(call: Mapping[str, Any]) -> tuple[str, SpanContext]:
    tid = str(call.get("trace_id") or "").lower()
    sid = str(call.get("span_id") or "").lower()
    if not _TRACE_ID.match(tid) or not _SPAN_ID.match(sid):
        raise ReplayError(f"the replay document's call has no valid trace_id and span_id ({tid!r}, {sid!r})")
    ctx = SpanContext(int(tid, 16), int(sid, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return f"{tid}:{sid}", ctx


def _outcome(session: Session, result: ToolResult) -> Outcome:
    c = session.call
    assert c is not None  # the caller checked that the tool ran
    ctx = c.span.get_span_context()
    ids: dict[str, Any] = {}
    if ctx.is_valid:
        ids = {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}
    n = max(c._attempts, 1)
    f = c._final
    if result.ok or f is None:
        return Outcome("ok", attempts=n, **ids)
    return Outcome(
        "error",
        stage=f.stage,
        error_type="RETRY_EXHAUSTED" if n > 1 else f.error_type,
        attempt_error_type=f.error_type,
        error_code=f.envelope.code,
        attempts=n,
        reference=f.envelope.reference,
        leaked_internals=leaks(result.content()),
        **ids,
    )


def run_document(
    doc: Mapping[str, Any],
    *,
    tools: Iterable[ToolSource],
    args_override: Optional[Mapping[str, Any]] = None,
    allow_side_effects: bool = False,
    recorded_responses: bool = False,
    case: Optional[str] = None,
    expect: Optional[Mapping[str, Any]] = None,
) -> ReplayResult:
    """Replays the call a replay document (or an eval case, which carries the same fields)
    describes; see :func:`toolspan.replay`."""
    call = doc.get("call")
    if not isinstance(call, Mapping) or not call.get("tool"):
        raise ReplayError("the replay document has no call.tool")
    of, original_ctx = _span_context(call)
    tool = _tool_for(str(call["tool"]), tools)
    if tool.side_effects and not allow_side_effects and tool.sandbox is None:
        raise ReplayRefused(
            f"tool {tool.name!r} is declared with side effects; allow them (--allow-side-effects, "
            "or allow_side_effects=True) once its replays are safe (toolspan.replaying() tells the tool "
            "it runs as a replay), or give the tool a sandbox"
        )
    arguments = arguments_for(doc, args_override)
    recorded = _recorded_for(doc) if recorded_responses else None

    session = Session(
        {
            "of": of,
            "tool": tool.name,
            "reference": call.get("reference"),
            "call_id": call.get("call_id"),
            "service": call.get("service"),
            "service_version": call.get("service_version"),
            "table_version": doc.get("table_version"),
            "case": case,
            "recorded_responses": recorded_responses,
            "allow_side_effects": allow_side_effects,
        },
        [Link(original_ctx)],
        recorded,
    )
    token = _SESSION.set(session)
    try:
        with ExitStack() as stack:
            if recorded is not None:
                stack.enter_context(_recorded.serving())
            if tool.sandbox is not None:
                stack.enter_context(tool.sandbox(session.info))
            result = asyncio.run(tool.ainvoke(arguments)) if tool.is_async else tool.invoke(arguments)
    finally:
        _SESSION.reset(token)
    if session.problem is not None:
        raise ReplayError(f"the recording could not serve the replay: {session.problem}")
    if session.call is None:
        raise ReplayError(f"tool {tool.name!r} made no call")  # a Tool always makes one
    original = Outcome.of_call(call)
    after = _outcome(session, result)
    verdict = judge(original, after, (expect or {}).get("not"))
    return ReplayResult(
        verdict=verdict,
        passed=passes(verdict, after, expect),
        tool=tool.name,
        of=of,
        original=original,
        replay=after,
        result=result,
        table_version=doc.get("table_version"),
        case=case,
    )


def replay(
    ref: str,
    *,
    query_url: str,
    tools: Iterable[ToolSource],
    token: Optional[str] = None,
    args_override: Optional[Mapping[str, Any]] = None,
    allow_side_effects: bool = False,
    recorded_responses: bool = False,
    table_version: Optional[int] = None,
) -> ReplayResult:
    """See :func:`toolspan.replay`."""
    doc = fetch_document(ref, query_url=query_url, token=token, table_version=table_version)
    return run_document(
        doc,
        tools=tools,
        args_override=args_override,
        allow_side_effects=allow_side_effects,
        recorded_responses=recorded_responses,
    )
