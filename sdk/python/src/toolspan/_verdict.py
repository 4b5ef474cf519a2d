"""Judging a replay against its original: *fixed*, *same failure* or *different failure*, and
whether an eval case passes.

- fixed: the replay is ok, or it failed with an envelope (a mapped error code, leaking
  nothing) where the original answered without one (no code, ``internal_error``, or a
  result that leaked internals);
- same failure: it failed at the same stage with the same error type and code;
- different failure: any other failure.

A case passes when its verdict is fixed, or a different failure that answers an envelope
with a code other than ``internal_error`` and leaks nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional

from ._conventions import UNMAPPED_CODE

__all__ = ["Outcome", "Verdict", "judge", "passes", "leaks"]

Verdict = Literal["fixed", "same_failure", "different_failure"]

# What a model-facing answer must not carry: stack frames, source paths, SQL, driver text.
_LEAK = re.compile(
    r"Traceback \(most recent call last\)"
    r"|File \"[^\"]+\", line \d+"
    r"|(?:/[\w.@+-]+)+\.(?:py|rs|go|java|js|ts|rb)\b"
    r"|site-packages|node_modules"
    r"|\bSELECT\b[\s\S]+?\bFROM\b|\bINSERT\s+INTO\b|\bUPDATE\s+\w+\s+SET\b"
    r"|psycopg|SQLSTATE|sqlalchemy|ORA-\d{5}",
    re.IGNORECASE,
)


def leaks(text: Optional[str]) -> bool:
    """True when ``text`` carries stack frames, file paths, SQL or driver text."""
    return bool(text) and _LEAK.search(text) is not None  # type: ignore[arg-type]


@dataclass(frozen=True)
class Outcome:
    """How one call ended: ``status`` ``ok`` or ``error``, and for a failure the stage, the
    call's error type (``RETRY_EXHAUSTED`` after more than one attempt), the last attempt's
    error type, the envelope's code and reference, and whether the answer leaked internals."""

    status: str
    stage: Optional[str] = None
    error_type: Optional[str] = None
    attempt_error_type: Optional[str] = None
    error_code: Optional[str] = None
    attempts: int = 1
    reference: Optional[str] = None
    leaked_internals: bool = False
    trace_id: Optional[str] = None
    span_id: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def mapped(self) -> bool:
        """An envelope with a code of its own (not ``internal_error``), leaking nothing."""
        return self.error_code not in (None, UNMAPPED_CODE) and not self.leaked_internals

    def describe(self) -> str:
        """``ok``, or ``PARSE bad_answer at parse``."""
        if self.ok:
            return "ok"
        what = f"{self.error_type or '-'} {self.error_code or '(no code)'}"
        what += f" at {self.stage}" if self.stage else ""
        return what + (" (leaked internals)" if self.leaked_internals else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of_call(cls, call: Mapping[str, Any]) -> "Outcome":
        """The original's outcome, from a replay document's ``call`` object."""
        return cls(
            status=str(call.get("status") or "ok"),
            stage=call.get("stage"),
            error_type=call.get("error_type"),
            error_code=call.get("error_code"),
            attempts=int(call.get("attempts") or 1),
            reference=call.get("reference"),
            leaked_internals=bool(call.get("leaked_internals")),
            trace_id=call.get("trace_id"),
            span_id=call.get("span_id"),
        )


def _same(original: Mapping[str, Any], replay: Outcome) -> bool:
    # The call's error type, or the last attempt's: a retry policy changed since the original
    # does not make the same failure a different one.
    return (
        original.get("stage") == replay.stage
        and original.get("error_code") == replay.error_code
        and original.get("error_type") in (replay.error_type, replay.attempt_error_type)
    )


def judge(original: Outcome, replay: Outcome, expect_not: Optional[Mapping[str, Any]] = None) -> Verdict:
    """The verdict of ``replay`` against ``original``; ``expect_not`` (an eval case's
    ``expect.not``: stage, error_type, error_code) names the failure to compare with instead
    of the original's own."""
    if replay.ok:
        return "fixed"
    original_unmapped = original.error_code in (None, UNMAPPED_CODE) or original.leaked_internals
    if replay.mapped and not original.ok and original_unmapped:
        return "fixed"
    failure = expect_not if expect_not is not None else {
        "stage": original.stage,
        "error_type": original.error_type,
        "error_code": original.error_code,
    }
    if not original.ok and _same(failure, replay):
        return "same_failure"
    return "different_failure"


def passes(verdict: Verdict, replay: Outcome, expect: Optional[Mapping[str, Any]] = None) -> bool:
    """Whether an eval case with this verdict passes (``expect``: the case's expectations,
    ``envelope_on_failure`` and ``leaked_internals``)."""
    if verdict == "fixed":
        return True
    if verdict == "same_failure":
        return False
    expect = expect or {}
    if expect.get("envelope_on_failure", True) and replay.error_code in (None, UNMAPPED_CODE):
        return False
    if expect.get("leaked_internals", False) is False and replay.leaked_internals:
        return False
    return True
