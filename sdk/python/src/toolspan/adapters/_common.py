"""What the adapters share: turning a function into a :class:`~toolspan.Tool` whose
prepare stage validates the model's raw arguments against the function's signature."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Collection
from typing import Any, Optional

from .._core import Attempt, Toolspan
from ..retry import RetryPolicy
from ..tool import Tool


def signature_model(fn: Callable[..., Any], skip: Collection[str] = ()) -> type:
    """A pydantic model of ``fn``'s keyword parameters (for validation and the JSON Schema
    the model is shown). Needs pydantic, which every supported framework brings."""
    import pydantic

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001
        hints = {}
    fields: dict[str, Any] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = hints.get(p.name, Any if p.annotation is p.empty else p.annotation)
        if ann is Attempt:
            continue
        fields[p.name] = (ann, ... if p.default is p.empty else p.default)
    name = "".join(w.capitalize() for w in getattr(fn, "__name__", "tool").split("_")) + "Arguments"
    return pydantic.create_model(name, **fields)  # type: ignore[call-overload,no-any-return]


def as_tool(
    fn: Any,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    retry: Optional[RetryPolicy] = None,
    toolspan: Optional[Toolspan] = None,
) -> Tool[Any]:
    """``fn`` if it already is a :class:`Tool`, else a Tool validating against ``fn``'s
    signature."""
    if isinstance(fn, Tool):
        return fn
    return Tool(
        fn,
        name=name,
        description=description,
        arguments=signature_model(fn),
        retry=retry,
        toolspan=toolspan,
    )


def json_schema(t: Tool[Any]) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments (its pydantic model or JSON Schema)."""
    spec = t._args.spec
    if isinstance(spec, type) and hasattr(spec, "model_json_schema"):
        return spec.model_json_schema()  # type: ignore[no-any-return]
    if isinstance(spec, dict):
        return spec
    return signature_model(t.fn).model_json_schema()  # type: ignore[attr-defined,no-any-return]
