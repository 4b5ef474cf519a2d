"""Attribute keys and values of toolspan's span conventions (shared/DESIGN.md §2)."""

from __future__ import annotations

from typing import Final, Literal

OPERATION_NAME: Final = "gen_ai.operation.name"
EXECUTE_TOOL: Final = "execute_tool"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
TOOL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
TOOL_RESULT: Final = "gen_ai.tool.call.result"

STAGE: Final = "toolspan.stage"
ATTEMPT: Final = "toolspan.attempt"
#: On the call span: how many attempts it made, so that its row is right even when its
#: attempts reach toolspan after it (traces in pieces).
ATTEMPTS: Final = "toolspan.attempts"

ERROR_TYPE: Final = "error.type"
ERROR_CODE: Final = "toolspan.error.code"
ERROR_CLASS: Final = "toolspan.error.class"
ERROR_RETRYABLE: Final = "toolspan.error.retryable"
ERROR_RETRY_AFTER_MS: Final = "toolspan.error.retry_after_ms"
ERROR_REFERENCE: Final = "toolspan.error.reference"

#: On a replayed call's span: the original call's span, ``TRACEID:SPANID`` (the span also
#: links to it).
REPLAY_OF: Final = "toolspan.replay.of"

StageName = Literal["prepare", "send", "execute", "parse"]
STAGES: Final[tuple[StageName, ...]] = ("prepare", "send", "execute", "parse")

ErrorType = Literal["PREPARE", "NETWORK", "TOOL_ERROR", "PARSE", "RETRY_EXHAUSTED"]

#: The error type a failure in each stage has unless its mapping says otherwise.
STAGE_ERROR_TYPE: Final[dict[str, ErrorType]] = {
    "prepare": "PREPARE",
    "send": "NETWORK",
    "execute": "TOOL_ERROR",
    "parse": "PARSE",
}

ErrorClass = Literal["invalid_request", "transient", "permission", "not_found", "conflict", "internal"]

#: The code of every exception no mapping knows; toolspan counts it as "unmapped".
UNMAPPED_CODE: Final = "internal_error"
