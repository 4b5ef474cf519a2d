"""ToolResult: what a tool call answers the model, ready for the chat APIs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Optional

from .envelope import ErrorEnvelope

__all__ = ["ToolResult", "ToolStatus"]

ToolStatus = Literal["ok", "invalid_args", "tool_error", "timeout"]


def _status_for(envelope: ErrorEnvelope, error_type: Optional[str]) -> ToolStatus:
    if envelope.timeout:
        return "timeout"
    if error_type == "PREPARE":
        return "invalid_args"
    return "tool_error"


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one logical tool call.

    ``status`` is ``ok``, ``invalid_args`` (the model's arguments failed validation),
    ``tool_error`` or ``timeout``; ``value`` is the tool's answer when ``ok``; ``error`` is
    the envelope otherwise. :meth:`content` is the text the model should see."""

    status: ToolStatus
    value: Any = None
    error: Optional[ErrorEnvelope] = None
    tool: str = ""
    call_id: Optional[str] = None
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def success(cls, value: Any, *, tool: str = "", call_id: Optional[str] = None, attempts: int = 1) -> "ToolResult":
        return cls("ok", value=value, tool=tool, call_id=call_id, attempts=attempts)

    @classmethod
    def _ok(cls, value: Any, tool: str, call_id: Optional[str], attempts: int) -> "ToolResult":
        """``success(...)`` without the frozen dataclass's ``__init__`` (one
        ``object.__setattr__`` per field): the same fields, set at once."""
        r = object.__new__(cls)
        r.__dict__.update(
            status="ok", value=value, error=None, tool=tool, call_id=call_id, attempts=attempts
        )
        return r

    @classmethod
    def failure(
        cls,
        envelope: ErrorEnvelope,
        *,
        error_type: Optional[str] = None,
        tool: str = "",
        call_id: Optional[str] = None,
        attempts: int = 1,
    ) -> "ToolResult":
        return cls(
            _status_for(envelope, error_type),
            error=envelope,
            tool=tool,
            call_id=call_id,
            attempts=attempts,
        )

    def to_dict(self) -> Any:
        """The JSON-ready answer: the value, or ``{"error": envelope}``."""
        if self.error is not None:
            return {"error": self.error.to_dict()}
        return self.value

    def content(self) -> str:
        """The text of the tool-result message: a string value as is, anything else (the
        envelope included) as JSON."""
        if self.error is None and isinstance(self.value, str):
            return self.value
        return json.dumps(_jsonable(self.to_dict()), ensure_ascii=False, default=str)

    def to_openai(self) -> dict[str, Any]:
        """An OpenAI Chat Completions tool message: ``{"role": "tool", "tool_call_id", "content"}``."""
        return {"role": "tool", "tool_call_id": self.call_id or "", "content": self.content()}

    def to_openai_responses(self) -> dict[str, Any]:
        """An OpenAI Responses API input item: ``{"type": "function_call_output", "call_id", "output"}``."""
        return {"type": "function_call_output", "call_id": self.call_id or "", "output": self.content()}

    def to_anthropic(self) -> dict[str, Any]:
        """An Anthropic Messages API content block: ``{"type": "tool_result", "tool_use_id",
        "content", "is_error"}`` (put it in a ``user`` message)."""
        return {
            "type": "tool_result",
            "tool_use_id": self.call_id or "",
            "content": self.content(),
            "is_error": not self.ok,
        }


def _jsonable(v: Any) -> Any:
    dump = getattr(v, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v
