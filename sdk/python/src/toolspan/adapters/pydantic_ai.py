"""pydantic-ai: ``traced(function)`` is a ``pydantic_ai.Tool`` that runs the function through
toolspan.

The tool is declared with the function's JSON Schema, and pydantic-ai's own validation is
left to toolspan's prepare stage, so a bad argument is a traced ``PREPARE`` failure whose
envelope (field, received, permitted) is what the model gets back. Failures never raise
into the agent run; pydantic-ai's ``ModelRetry`` passes through untouched.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic_ai import RunContext
from pydantic_ai import Tool as PydanticAITool

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
) -> PydanticAITool[Any]:
    """A pydantic-ai tool for ``function`` (a plain function, sync or async, or a
    :class:`toolspan.Tool`)."""
    t = as_tool(function, name=name, description=description, retry=retry, toolspan=toolspan)

    async def run(ctx: RunContext[Any], **arguments: Any) -> Any:
        r = await t.ainvoke(arguments, call_id=ctx.tool_call_id)
        return r.to_dict()

    return PydanticAITool.from_schema(
        run,
        name=t.name,
        description=t.description,
        json_schema=json_schema(t),
        takes_ctx=True,
    )
