"""MCP: ``traced(client)`` traces and envelopes the tool calls an MCP client makes.

Wrap an ``mcp.Client`` or ``mcp.ClientSession`` (anything with ``call_tool`` and
``list_tools``); ``await traced_client.call_tool(name, arguments, call_id=...)`` returns a
:class:`~toolspan.ToolResult`. Stages: prepare validates the arguments against the tool's
``inputSchema`` (from ``list_tools``, when the ``jsonschema`` package is there), send is the
``tools/call`` request (the MCP SDK carries the trace context in ``_meta``), execute is the
server's verdict (``isError``: the tool's own error; its text goes to the log, never to the
model), parse decodes the answer (``structuredContent``, else JSON or text content).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .._core import Attempt, Toolspan
from ..envelope import ToolError
from ..result import ToolResult
from ..retry import RetryPolicy
from ..tool import Tool

__all__ = ["traced", "TracedMCPClient", "MCPToolError"]


class MCPToolError(ToolError):
    """The MCP server answered ``isError``. The server's text is kept on the exception (for
    the log and the span), not in the model-facing message."""

    def __init__(self, tool: str, text: str) -> None:
        super().__init__(f"the tool {tool} reported an error", code="tool_reported_error")
        self.server_text = text

    def __str__(self) -> str:
        return f"{self.envelope.message}: {self.server_text}"


class TracedMCPClient:
    """An MCP client whose tool calls are traced and enveloped."""

    def __init__(self, client: Any, *, retry: Optional[RetryPolicy] = None, toolspan: Optional[Toolspan] = None) -> None:
        self.client = client
        self._retry = retry
        self._ts = toolspan
        self._schemas: Optional[dict[str, dict[str, Any]]] = None
        self._tools: dict[str, Tool[Any]] = {}

    async def _schema(self, name: str) -> Optional[dict[str, Any]]:
        if self._schemas is None:
            listed = await self.client.list_tools()
            self._schemas = {t.name: _attr(t, "input_schema", "inputSchema") for t in listed.tools}
        return self._schemas.get(name)

    def _tool(self, name: str, schema: Optional[dict[str, Any]]) -> Tool[Any]:
        t = self._tools.get(name)
        if t is None:
            client = self.client
            try:
                import jsonschema  # noqa: F401

                validator: Any = schema
            except ImportError:
                validator = None

            async def call(attempt: Attempt, **arguments: Any) -> Any:
                with attempt.send(**{"rpc.system": "mcp", "rpc.method": "tools/call"}):
                    res = await client.call_tool(name, arguments)
                with attempt.execute():
                    if _attr(res, "is_error", "isError"):
                        raise MCPToolError(name, _text(res))
                with attempt.parse():
                    structured = _attr(res, "structured_content", "structuredContent")
                    if structured is not None:
                        return structured
                    text = _text(res)
                    try:
                        return json.loads(text)
                    except ValueError:
                        return text

            t = Tool(call, name=name, arguments=validator, retry=self._retry, toolspan=self._ts)
            self._tools[name] = t
        return t

    async def call_tool(self, name: str, arguments: Optional[dict[str, Any]] = None, *, call_id: Optional[str] = None) -> ToolResult:
        """Calls the tool; never raises for a tool failure."""
        schema = await self._schema(name)
        return await self._tool(name, schema).ainvoke(arguments or {}, call_id=call_id)

    async def list_tools(self) -> Any:
        return await self.client.list_tools()


def _attr(obj: Any, *names: str) -> Any:
    """The first of ``names`` that ``obj`` has (the MCP SDK renamed its camelCase fields)."""
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    return None


def _text(res: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in (res.content or []) if getattr(c, "type", "") == "text")


def traced(client: Any, *, retry: Optional[RetryPolicy] = None, toolspan: Optional[Toolspan] = None) -> TracedMCPClient:
    """Trace and envelope the tool calls of an MCP ``Client`` or ``ClientSession``."""
    return TracedMCPClient(client, retry=retry, toolspan=toolspan)
