"""The JSON paths replay documents name redacted values by (``$``, ``$.a.b``,
``$.items[0].c``, ``$['odd key']``): parsing, writing, setting a value at one, and finding the
redaction markers in stored arguments."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from typing import Any, Optional, Union

__all__ = ["Path", "parse", "format_path", "covers", "set_at", "redacted_paths"]

Path = tuple[Union[str, int], ...]

_TOKEN = re.compile(
    r"""\.(?P<name>[^.\[\]]+)|\[(?P<index>\d+)\]|\[(?P<quoted>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\]"""
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
#: What ingest writes in place of a secret: ``[REDACTED:kind]``.
REDACTION_MARKER = "[REDACTED:"


def parse(text: str) -> Optional[Path]:
    """``$.a[0]['b c']`` → ``("a", 0, "b c")``; a bare name is a top-level field
    (``api_key`` → ``("api_key",)``); ``None`` when ``text`` is not a path this reads."""
    if not text.startswith("$"):
        return (text,) if text else None
    out: list[Union[str, int]] = []
    pos = 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            return None
        if m.group("name") is not None:
            out.append(m.group("name"))
        elif m.group("index") is not None:
            out.append(int(m.group("index")))
        else:
            out.append(ast.literal_eval(m.group("quoted")))  # a quoted string literal, nothing else
        pos = m.end()
    return tuple(out)


def format_path(path: Path) -> str:
    """The path as ``$.a[0]['b c']``."""
    parts = ["$"]
    for p in path:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif _IDENT.match(p):
            parts.append(f".{p}")
        else:
            parts.append("[" + json.dumps(p) + "]")
    return "".join(parts)


def covers(given: Path, needed: Path) -> bool:
    """True when a value supplied at ``given`` replaces the one at ``needed`` (the same path
    or one of its ancestors; ``$`` covers everything)."""
    return needed[: len(given)] == given


def set_at(doc: Any, path: Path, value: Any) -> Any:
    """``doc`` with ``value`` at ``path`` (objects on the way are created; a list index must
    exist). Returns the new document (``value`` itself for ``$``)."""
    if not path:
        return value
    cur = doc
    for i, key in enumerate(path):
        last = i == len(path) - 1
        if isinstance(key, int):
            if not isinstance(cur, list) or key >= len(cur):
                raise KeyError(f"{format_path(path[: i + 1])} does not exist in the arguments")
            if last:
                cur[key] = value
            else:
                cur = cur[key]
        else:
            if not isinstance(cur, dict):
                raise KeyError(f"{format_path(path[:i])} is not an object in the arguments")
            if last:
                cur[key] = value
            else:
                cur = cur.setdefault(key, {})
    return doc


def redacted_paths(doc: Any) -> Iterator[Path]:
    """The paths of the string values that hold a redaction marker."""

    def walk(v: Any, at: Path) -> Iterator[Path]:
        if isinstance(v, str):
            if REDACTION_MARKER in v:
                yield at
        elif isinstance(v, dict):
            for k, x in v.items():
                yield from walk(x, at + (k,))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                yield from walk(x, at + (i,))

    yield from walk(doc, ())
