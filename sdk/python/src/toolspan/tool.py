"""``@tool``: wrap a tool function once; every call is traced by stage, retried by policy and
answered with a :class:`~toolspan.ToolResult`."""

from __future__ import annotations

import asyncio
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Generic, Optional, TypeVar, Union, overload

from ._core import Attempt, ToolCall, Toolspan
from ._replaying import ReplayInfo
from .envelope import ArgumentError
from .result import ToolResult
from .retry import RetryPolicy

__all__ = ["Sandbox", "Tool", "tool", "Validator"]

R = TypeVar("R")

#: A tool's replay sandbox: called with the :class:`~toolspan.ReplayInfo` of a replay, it
#: returns the context manager the replayed call runs inside (pointing the tool at a
#: staging service, a scratch database, ...).
Sandbox = Callable[[ReplayInfo], AbstractContextManager[Any]]

#: How arguments (or an answer) are checked: a pydantic model class, a JSON Schema
#: (a dict; needs the ``jsonschema`` package), or a callable that returns the checked value
#: (raise :class:`~toolspan.ArgumentError` from it to reject).
Validator = Union[type, Mapping[str, Any], Callable[[Any], Any]]


def _is_attempt_annotation(a: Any) -> bool:
    return a is Attempt or a in ("Attempt", "toolspan.Attempt")


#: The JSON type each Python annotation accepts: its name (as the model reads it, and in
#: ``permitted``) and its check.
_JSON_TYPES: dict[Any, tuple[str, Callable[[Any], bool]]] = {
    str: ("string", lambda v: isinstance(v, str)),
    int: ("integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    bool: ("boolean", lambda v: isinstance(v, bool)),
    list: ("array", lambda v: isinstance(v, list)),
    tuple: ("array", lambda v: isinstance(v, list)),
    dict: ("object", lambda v: isinstance(v, Mapping)),
}


class _TypeCheck:
    """What an annotated parameter accepts from JSON: ``permitted`` names the JSON types (or
    a ``Literal``'s values), ``accepts`` checks a value."""

    __slots__ = ("permitted", "accepts", "literal")

    def __init__(self, permitted: tuple[Any, ...], accepts: Callable[[Any], bool], literal: bool) -> None:
        self.permitted = permitted
        self.accepts = accepts
        self.literal = literal

    def describe(self) -> str:
        if self.literal:
            return "one of " + ", ".join(json.dumps(c) for c in self.permitted)
        return ("a " if len(self.permitted) == 1 else "") + " or ".join(self.permitted)


def _type_check(ann: Any) -> Optional[_TypeCheck]:
    """The check of an annotation, or ``None`` for annotations that say nothing a JSON value
    can be checked against (``Any``, classes, unresolved strings)."""
    origin = typing.get_origin(ann)
    if origin is typing.Literal:
        choices = typing.get_args(ann)
        return _TypeCheck(
            choices, lambda v: any(v == c and type(v) is type(c) for c in choices), literal=True
        )
    if origin is Union or origin is types.UnionType:
        members = typing.get_args(ann)
        parts = [_type_check(a) for a in members if a is not type(None)]
        if not parts or any(p is None or p.literal for p in parts):
            return None
        nullable = type(None) in members
        checks = [p.accepts for p in parts if p is not None]
        names = tuple(n for p in parts if p is not None for n in p.permitted)
        return _TypeCheck(
            names + (("null",) if nullable else ()),
            lambda v: (nullable and v is None) or any(c(v) for c in checks),
            literal=False,
        )
    known = _JSON_TYPES.get(origin if origin is not None else ann)
    if known is None:
        return None
    return _TypeCheck((known[0],), known[1], literal=False)


class _Check:
    """A compiled validator."""

    def __init__(self, spec: Optional[Validator]) -> None:
        self.spec = spec
        self.model = spec if isinstance(spec, type) and hasattr(spec, "model_validate") else None
        self.schema = spec if isinstance(spec, Mapping) else None
        self._jsonschema: Any = None

    def _schema_validator(self) -> Any:
        if self._jsonschema is None:
            import jsonschema  # optional: only tools declared with a JSON Schema need it

            cls = jsonschema.validators.validator_for(self.schema)
            self._jsonschema = cls(self.schema)
        return self._jsonschema

    def arguments(self, args: Any) -> dict[str, Any]:
        if self.model is not None:
            m = self.model.model_validate(args)
            return {k: getattr(m, k) for k in type(m).model_fields}
        if self.schema is not None:
            v = self._schema_validator()
            import jsonschema

            err = jsonschema.exceptions.best_match(v.iter_errors(args))
            if err is not None:
                raise err
            return dict(args)
        if self.spec is not None:
            out = self.spec(args)  # type: ignore[operator]
            return dict(out) if isinstance(out, Mapping) else dict(args)
        return dict(args)

    def answer(self, value: Any) -> Any:
        if self.model is not None:
            if isinstance(value, self.model):
                m = value
            elif isinstance(value, (str, bytes, bytearray)):
                m = self.model.model_validate_json(value)
            else:
                m = self.model.model_validate(value)
            return m.model_dump(mode="json")
        if self.schema is not None:
            if isinstance(value, (str, bytes, bytearray)):
                value = json.loads(value)
            v = self._schema_validator()
            import jsonschema

            err = jsonschema.exceptions.best_match(v.iter_errors(value))
            if err is not None:
                raise err
            return value
        return self.spec(value)  # type: ignore[operator]


class Tool(Generic[R]):
    """A traced, enveloped tool. Call :meth:`invoke` (or ``await`` :meth:`ainvoke`) with the
    model's arguments (a mapping or a JSON string); it never raises for a tool failure.

    Stages: prepare (argument validation), execute (the function), parse (answer
    validation, when ``result`` is given). A function with a parameter annotated
    :class:`~toolspan.Attempt` opens its own stages instead of execute (``with
    attempt.send(): ...``).

    ``side_effects=True`` declares that running the tool changes something (sends, writes,
    pays): a replay refuses it unless the user allows side effects or the tool has a
    ``sandbox``, which the replayed call then runs inside."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        arguments: Optional[Validator] = None,
        result: Optional[Validator] = None,
        retry: Optional[RetryPolicy] = None,
        toolspan: Optional[Toolspan] = None,
        side_effects: bool = False,
        sandbox: Optional[Sandbox] = None,
    ) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "tool")
        self.description = description if description is not None else inspect.getdoc(fn)
        self.retry = retry
        self.side_effects = side_effects
        self.sandbox = sandbox
        self.is_async = inspect.iscoroutinefunction(fn)
        self._ts = toolspan
        self._args = _Check(arguments)
        self._result = _Check(result) if result is not None else None
        sig = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # noqa: BLE001 - one unresolvable annotation: resolve the others alone
            hints = {}
            for p in sig.parameters.values():
                if isinstance(p.annotation, str):
                    try:
                        hints[p.name] = eval(p.annotation, getattr(fn, "__globals__", {}))  # noqa: S307
                    except Exception:  # noqa: BLE001 - left as text: not checked
                        pass
        self._attempt_param: Optional[str] = None
        params = []
        for p in sig.parameters.values():
            ann = hints.get(p.name, p.annotation)
            if self._attempt_param is None and _is_attempt_annotation(ann):
                self._attempt_param = p.name
            else:
                params.append(p)
        self._var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
        # Without an argument validator, the annotations are the schema the model must meet.
        self._types: dict[str, _TypeCheck] = {}
        if arguments is None:
            for p in params:
                ann = hints.get(p.name, p.annotation)
                check = _type_check(ann) if ann is not p.empty else None
                if check is not None:
                    self._types[p.name] = check
        self._names = tuple(
            p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        )
        self._name_set = frozenset(self._names)
        # No argument validator: the arguments are copied as they are (then checked here).
        self._plain_args = arguments is None
        self._required = tuple(
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty
        )
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__name__ = self.name
        self.__wrapped__ = fn

    @property
    def toolspan(self) -> Toolspan:
        ts = self._ts
        if ts is not None:
            return ts
        from . import default

        return default()

    # -- prepare
    def _prepare(self, arguments: Any) -> dict[str, Any]:
        if type(arguments) is not dict:
            if arguments is None:
                arguments = {}
            elif isinstance(arguments, (str, bytes, bytearray)):
                arguments = json.loads(arguments) if arguments.strip() else {}
            if not isinstance(arguments, Mapping):
                raise ArgumentError("the arguments must be a JSON object", field="", received=arguments)
        kwargs = dict(arguments) if self._plain_args else self._args.arguments(arguments)
        if not self._var_kw:
            names = self._name_set
            for k in kwargs:
                if k not in names:
                    raise ArgumentError(
                        f"unknown argument '{k}'",
                        field=k,
                        received=kwargs[k],
                        permitted=self._names,
                    )
        for k in self._required:
            if k not in kwargs:
                raise ArgumentError(f"missing required argument '{k}'", field=k)
        types_ = self._types
        for k, v in kwargs.items():
            t = types_.get(k)
            if t is not None and not t.accepts(v):
                raise ArgumentError(
                    f"argument '{k}' must be {t.describe()}",
                    field=k,
                    received=v,
                    permitted=t.permitted,
                )
        return kwargs

    # -- invoke
    def invoke(self, arguments: Any = None, *, call_id: Optional[str] = None) -> ToolResult:
        """Run the tool for one tool call of the model (synchronous tools)."""
        if self.is_async:
            raise TypeError(f"tool {self.name} is async: use ainvoke()")
        ts = self.toolspan
        with ts.call(self.name, call_id=call_id, arguments=arguments, retry=self.retry) as call:
            if call.retry.max_attempts == 1:
                # One permitted attempt (the common case): no attempt loop, no attempt span.
                self._attempt(call._single(), arguments)
            else:
                for att in call.attempts():
                    with att:
                        self._attempt(att, arguments)
        return call.result

    def _attempt(self, att: Attempt, arguments: Any) -> None:
        with att.prepare():
            kwargs = self._prepare(arguments)
        if self._attempt_param is not None:
            kwargs[self._attempt_param] = att
            value = self.fn(**kwargs)
        else:
            with att.execute():
                value = self.fn(**kwargs)
        if self._result is not None:
            with att.parse():
                value = self._result.answer(value)
        att.value = value

    async def ainvoke(self, arguments: Any = None, *, call_id: Optional[str] = None) -> ToolResult:
        """Run the tool for one tool call of the model (async or sync tools). With a
        deadline in the retry policy, an async tool is cut off when it passes."""
        ts = self.toolspan
        with ts.call(self.name, call_id=call_id, arguments=arguments, retry=self.retry) as call:
            async for att in call.attempts_async():
                with att:
                    with att.prepare():
                        kwargs = self._prepare(arguments)
                    if self._attempt_param is not None:
                        kwargs[self._attempt_param] = att
                        value = await self._run(call, kwargs)
                    else:
                        with att.execute():
                            value = await self._run(call, kwargs)
                    if self._result is not None:
                        with att.parse():
                            value = self._result.answer(value)
                    att.succeed(value)
        return call.result

    async def _run(self, call: ToolCall, kwargs: dict[str, Any]) -> Any:
        if not self.is_async:
            return self.fn(**kwargs)
        left = call.remaining_s()
        if left is None:
            return await self.fn(**kwargs)
        return await asyncio.wait_for(self.fn(**kwargs), timeout=max(left, 0.0))

    def __call__(self, **arguments: Any) -> Any:
        """``tool(**arguments)``: :meth:`invoke` for sync tools, :meth:`ainvoke` (awaitable)
        for async ones."""
        if self.is_async:
            return self.ainvoke(arguments)
        return self.invoke(arguments)

    def __repr__(self) -> str:
        return f"<toolspan.Tool {self.name}>"


@overload
def tool(fn: Callable[..., R], /) -> Tool[R]: ...


@overload
def tool(
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    arguments: Optional[Validator] = None,
    result: Optional[Validator] = None,
    retry: Optional[RetryPolicy] = None,
    toolspan: Optional[Toolspan] = None,
    side_effects: bool = False,
    sandbox: Optional[Sandbox] = None,
) -> Callable[[Callable[..., R]], Tool[R]]: ...


def tool(
    fn: Optional[Callable[..., Any]] = None,
    /,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    arguments: Optional[Validator] = None,
    result: Optional[Validator] = None,
    retry: Optional[RetryPolicy] = None,
    toolspan: Optional[Toolspan] = None,
    side_effects: bool = False,
    sandbox: Optional[Sandbox] = None,
) -> Any:
    """Decorator: ``@tool`` or ``@tool(name=..., arguments=Model, result=Answer,
    retry=RetryPolicy(max_attempts=3), side_effects=True)``. Without ``toolspan``, calls use
    the settings of :func:`toolspan.configure` (or the defaults: the global tracer
    provider)."""

    def wrap(f: Callable[..., Any]) -> Tool[Any]:
        return Tool(
            f,
            name=name,
            description=description,
            arguments=arguments,
            result=result,
            retry=retry,
            toolspan=toolspan,
            side_effects=side_effects,
            sandbox=sandbox,
        )

    return wrap(fn) if fn is not None else wrap
