"""Eval cases: failures exported by ``toolspan evals export`` (JSON Lines, schema
``toolspan.evals/1``) replayed against the application's tools, in CI or in its own pytest
suite::

    import pytest
    import toolspan.evals
    import my_pkg.tools

    @pytest.mark.parametrize("case", toolspan.evals.cases("evals/search_docs.jsonl"))
    def test_failure_is_fixed(case):
        result = case.run(tools=[my_pkg.tools], recorded_responses=True)
        assert result.passed, result

The first line of the file is its header (schema, table version, tool, filters, how many
fingerprints and cases); every other line is one case: a replay document's fields plus the
case's name, its fingerprint and what it expects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ._replay import ReplayResult, ToolSource, fetch, run_document
from ._replaying import ReplayError

__all__ = ["Case", "EvalsFile", "cases", "load", "EVALS_SCHEMA"]

EVALS_SCHEMA = "toolspan.evals/1"


@dataclass(frozen=True)
class Case:
    """One eval case. ``name`` (e.g. ``search_docs/PARSE/3f2a9c01d4e5b6a7/1``) is also its
    ``__name__``, which pytest takes as the id of a parametrized test; ``doc`` is the whole
    line."""

    name: str
    fingerprint: Mapping[str, Any]
    call: Mapping[str, Any]
    expect: Mapping[str, Any]
    doc: Mapping[str, Any] = field(repr=False)

    @property
    def __name__(self) -> str:  # type: ignore[override]
        return self.name

    @property
    def exact(self) -> bool:
        """The case's arguments are exactly what the model sent."""
        return self.doc.get("exact") is True

    def run(
        self,
        *,
        tools: Iterable[ToolSource],
        args_override: Optional[Mapping[str, Any]] = None,
        allow_side_effects: bool = False,
        recorded_responses: bool = False,
    ) -> ReplayResult:
        """Replays the case against ``tools`` under the sandbox rules of
        :func:`toolspan.replay`; the result's ``passed`` says whether the case passes."""
        return run_document(
            self.doc,
            tools=tools,
            args_override=args_override,
            allow_side_effects=allow_side_effects,
            recorded_responses=recorded_responses,
            case=self.name,
            expect=self.expect,
        )


@dataclass(frozen=True)
class EvalsFile:
    """An evals file: its header line and its cases."""

    header: Mapping[str, Any]
    cases: list[Case]


Source = Union[str, "os.PathLike[str]"]


def _read(source: Source, token: Optional[str]) -> str:
    s = os.fspath(source)
    if s.startswith(("http://", "https://")):
        return fetch(s, token=token, accept="application/x-ndjson, application/jsonl, */*").decode("utf-8")
    try:
        with open(s, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ReplayError(f"cannot read the evals file {s}: {e.strerror or e}") from None


def load(source: Source, *, token: Optional[str] = None) -> EvalsFile:
    """Reads an evals file (a path, or an ``http(s)://`` URL fetched with ``token``)."""
    name = os.fspath(source)
    lines = [(i, ln) for i, ln in enumerate(_read(source, token).splitlines(), 1) if ln.strip()]
    if not lines:
        raise ReplayError(f"{name} is empty; an evals file starts with a {EVALS_SCHEMA} header line")
    parsed: list[tuple[int, Any]] = []
    for i, ln in lines:
        try:
            parsed.append((i, json.loads(ln)))
        except ValueError as e:
            raise ReplayError(f"{name}:{i} is not JSON ({e.msg})") from None
    _, header = parsed[0]
    if not isinstance(header, dict) or header.get("schema") != EVALS_SCHEMA:
        got = header.get("schema") if isinstance(header, dict) else None
        raise ReplayError(f"{name} has schema {got!r} in its first line; this SDK reads {EVALS_SCHEMA}")
    out: list[Case] = []
    for i, doc in parsed[1:]:
        if not isinstance(doc, dict) or not isinstance(doc.get("case"), str) or not isinstance(doc.get("call"), dict):
            raise ReplayError(f"{name}:{i} is not a case (a case has a \"case\" name and a \"call\")")
        out.append(
            Case(
                name=doc["case"],
                fingerprint=doc.get("fingerprint") or {},
                call=doc["call"],
                expect=doc.get("expect") or {},
                doc=doc,
            )
        )
    want = header.get("cases")
    if isinstance(want, int) and want != len(out):
        raise ReplayError(f"{name} holds {len(out)} cases but its header says {want}: the file is incomplete")
    return EvalsFile(header=header, cases=out)


def cases(source: Source, *, token: Optional[str] = None) -> list[Case]:
    """The cases of an evals file, in file order, ready for ``pytest.mark.parametrize``
    (their ids are the case names)."""
    return load(source, token=token).cases
