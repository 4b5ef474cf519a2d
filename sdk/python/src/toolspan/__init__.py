"""toolspan: stage spans, retries and error envelopes for AI-agent tool calls.

Wrap a tool once::

    import toolspan

    @toolspan.tool(arguments=SearchArgs, retry=toolspan.RetryPolicy(max_attempts=3))
    def search_docs(query: str, limit: int = 5) -> list[dict]: ...

    result = search_docs.invoke(tool_call.arguments, call_id=tool_call.id)
    messages.append(result.to_openai())     # the answer, or an error envelope

Replay a failed call against your tools (``python -m toolspan replay REF --query-url URL
--tools my_pkg.tools``, or :func:`replay`) and run exported failures as test cases
(``python -m toolspan evals run FILE``, or :func:`toolspan.evals.cases`).

Spans follow toolspan's conventions (``gen_ai.operation.name = execute_tool``,
``toolspan.attempt``, ``toolspan.stage``, ``toolspan.error.*``) through the OpenTelemetry
API; toolspan never configures the SDK and has no side effects on import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Optional

from ._core import Attempt, StageSpan, ToolCall, Toolspan
from ._replaying import ReplayError, ReplayInfo, ReplayRefused, replaying
from .envelope import ArgumentError, ErrorEnvelope, ErrorMapper, ToolError, new_reference
from .propagation import inject
from .result import ToolResult, ToolStatus
from .retry import RetryPolicy
from .tool import Tool, tool

if TYPE_CHECKING:
    from types import ModuleType

    from . import evals
    from ._replay import ReplayResult

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "Attempt",
    "ErrorEnvelope",
    "ErrorMapper",
    "ReplayError",
    "ReplayInfo",
    "ReplayRefused",
    "RetryPolicy",
    "StageSpan",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolStatus",
    "Toolspan",
    "call",
    "configure",
    "default",
    "evals",
    "inject",
    "new_reference",
    "replay",
    "replaying",
    "tool",
]

_default: Optional[Toolspan] = None


def configure(**settings: Any) -> Toolspan:
    """Replaces the settings that :func:`call` and tools without their own use (see
    :class:`Toolspan` for the keywords) and returns them."""
    global _default
    _default = Toolspan(**settings)
    return _default


def default() -> Toolspan:
    """The settings :func:`call` and tools use; created on first use (the global tracer
    provider, no payload capture, the built-in mappings)."""
    global _default
    if _default is None:
        _default = Toolspan()
    return _default


def call(tool: str, **kwargs: Any) -> ToolCall:
    """A logical tool call with the default settings: ``with toolspan.call("fetch_url",
    call_id=...) as call:`` (see :meth:`Toolspan.call`)."""
    return default().call(tool, **kwargs)


def replay(
    ref: str,
    *,
    query_url: str,
    tools: "Iterable[ModuleType | str | Tool[Any]]",
    token: Optional[str] = None,
    args_override: Optional[Mapping[str, Any]] = None,
    allow_side_effects: bool = False,
    recorded_responses: bool = False,
    table_version: Optional[int] = None,
) -> "ReplayResult":
    """Replays a failed call: fetches its replay document from the query service at
    ``query_url`` (``ref``: an error reference, a call id or ``TRACEID:SPANID``; ``token``:
    its bearer token; ``table_version``: read the table at that version), runs the tool of that
    name among ``tools`` (modules, module names or Tool objects) on the same arguments as a
    new traced call linked to the original (``toolspan.replay.of``), and judges it
    (``result.verdict``: ``fixed``, ``same_failure`` or ``different_failure``).

    Raises :class:`ReplayRefused` when the arguments are not exact and ``args_override``
    (values by JSON path or top-level field name, ``"$"`` for the whole arguments) does not
    supply every inexact part, or when the tool has side effects and neither
    ``allow_side_effects`` nor the tool's sandbox allows them. ``recorded_responses``: the
    tool's outbound HTTP (urllib, httpx, requests) is answered from the original attempts'
    recorded responses instead of the network."""
    from ._replay import replay as _replay

    return _replay(
        ref,
        query_url=query_url,
        tools=tools,
        token=token,
        args_override=args_override,
        allow_side_effects=allow_side_effects,
        recorded_responses=recorded_responses,
        table_version=table_version,
    )


def __getattr__(name: str) -> Any:
    # ``toolspan.evals`` loads on first use: importing toolspan stays light.
    if name == "evals":
        import importlib

        return importlib.import_module(".evals", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
