"""toolspan: stage spans, retries and error envelopes for AI-agent tool calls.

Wrap a tool once::

    import toolspan

    @toolspan.tool(arguments=SearchArgs, retry=toolspan.RetryPolicy(max_attempts=3))
    def search_docs(query: str, limit: int = 5) -> list[dict]: ...

    result = search_docs.invoke(tool_call.arguments, call_id=tool_call.id)
    messages.append(result.to_openai())     # the answer, or an error envelope

Spans follow toolspan's conventions (``gen_ai.operation.name = execute_tool``,
``toolspan.attempt``, ``toolspan.stage``, ``toolspan.error.*``) through the OpenTelemetry
API; toolspan never configures the SDK and has no side effects on import.
"""

from __future__ import annotations

from typing import Any, Optional

from ._core import Attempt, StageSpan, ToolCall, Toolspan
from .envelope import ArgumentError, ErrorEnvelope, ErrorMapper, ToolError, new_reference
from .propagation import inject
from .result import ToolResult, ToolStatus
from .retry import RetryPolicy
from .tool import Tool, tool

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "Attempt",
    "ErrorEnvelope",
    "ErrorMapper",
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
    "inject",
    "new_reference",
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
