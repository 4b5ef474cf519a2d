"""LangChain / LangGraph: ``traced(tool)`` makes a LangChain tool (or a plain function)
traced and enveloped.

The result is a LangChain ``BaseTool`` with the same name, description and argument schema.
Given a tool call (as LangGraph's ``ToolNode`` passes it) it answers a ``ToolMessage`` whose
content is the answer or the error envelope (``status="error"``); given plain arguments, the
content string. It never raises for a tool failure: the original tool's argument validation
is the prepare stage, its run the execute stage.
"""

from __future__ import annotations

from typing import Any, Optional

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, PrivateAttr

from .._core import Toolspan
from ..result import ToolResult
from ..retry import RetryPolicy
from ..tool import Tool
from ._common import as_tool

__all__ = ["traced", "TracedTool"]


class TracedTool(BaseTool):
    """A LangChain tool that runs another through toolspan."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _traced: Tool[Any] = PrivateAttr()

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - invoke is overridden
        raise NotImplementedError

    @staticmethod
    def _split(input: Any) -> tuple[Optional[str], Any]:
        if isinstance(input, dict) and input.get("type") == "tool_call":
            return input.get("id"), input.get("args", {})
        return None, input

    def _answer(self, call_id: Optional[str], r: ToolResult) -> Any:
        if call_id is None:
            return r.content()
        return ToolMessage(
            content=r.content(),
            tool_call_id=call_id,
            name=self.name,
            status="success" if r.ok else "error",
        )

    def invoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        call_id, args = self._split(input)
        return self._answer(call_id, self._traced.invoke(args, call_id=call_id))

    async def ainvoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        call_id, args = self._split(input)
        return self._answer(call_id, await self._traced.ainvoke(args, call_id=call_id))


def traced(
    tool: Any,
    *,
    retry: Optional[RetryPolicy] = None,
    toolspan: Optional[Toolspan] = None,
) -> TracedTool:
    """Wrap a LangChain ``BaseTool`` (``@tool`` functions included), a plain function or a
    :class:`toolspan.Tool`."""
    if isinstance(tool, BaseTool):
        original = tool
        schema = original.args_schema
        if hasattr(original, "coroutine") and getattr(original, "coroutine", None) and not getattr(original, "func", None):
            async def run(**kwargs: Any) -> Any:
                return await original.ainvoke(kwargs)
        else:
            def run(**kwargs: Any) -> Any:  # type: ignore[misc]
                return original.invoke(kwargs)

        t: Tool[Any] = Tool(
            run,
            name=original.name,
            description=original.description,
            arguments=schema if schema is not None else None,
            retry=retry,
            toolspan=toolspan,
        )
        out = TracedTool(name=original.name, description=original.description, args_schema=schema)
    else:
        t = as_tool(tool, retry=retry, toolspan=toolspan)
        from ._common import json_schema

        out = TracedTool(name=t.name, description=t.description or t.name, args_schema=json_schema(t))
    out._traced = t
    return out
