"""OpenAI Agents SDK: ``traced(function)`` is a ``FunctionTool`` that runs the function
through toolspan.

The SDK hands the tool the model's raw JSON arguments; toolspan parses and validates them in
the prepare stage and answers the model with the result or the error envelope (JSON), so
the SDK's own failure handler never sees an exception.
"""

from __future__ import annotations

from typing import Any, Optional

from agents import FunctionTool
from agents.tool_context import ToolContext

from .._core import Toolspan
from ..retry import RetryPolicy
from ._common import as_tool, json_schema

__all__ = ["traced"]


def traced(
    function: Any,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    retry: Optional[RetryPolicy] = None,
    toolspan: Optional[Toolspan] = None,
) -> FunctionTool:
    """A function tool for ``function`` (a plain function, sync or async, or a
    :class:`toolspan.Tool`)."""
    t = as_tool(function, name=name, description=description, retry=retry, toolspan=toolspan)

    async def on_invoke_tool(ctx: ToolContext[Any], arguments_json: str) -> str:
        r = await t.ainvoke(arguments_json, call_id=getattr(ctx, "tool_call_id", None))
        return r.content()

    return FunctionTool(
        name=t.name,
        description=t.description or t.name,
        params_json_schema=json_schema(t),
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=False,
    )
