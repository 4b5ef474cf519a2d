"""Tools of the replay test's agent (tests/replay.rs) besides fleet_tools' search_docs:
``create_key`` takes a secret in its arguments (redacted at ingest, so a replay needs it
supplied) and ``send_email`` has side effects (a replay needs them allowed). Both fail the
same way whenever they run."""

from __future__ import annotations

import toolspan


@toolspan.tool
def create_key(api_key: str, name: str) -> dict[str, str]:
    """Create an API key named ``name`` with the account key ``api_key``."""
    if name == "prod":
        raise toolspan.ToolError(
            "the account already has its production key; revoke it first",
            code="key_exists",
            error_class="conflict",
            error_type="TOOL_ERROR",
        )
    return {"name": name}


@toolspan.tool(side_effects=True)
def send_email(to: str, body: str) -> str:
    """Send ``body`` to ``to``."""
    raise toolspan.ToolError(
        f"the mailbox of {to} is full",
        code="mailbox_full",
        error_class="transient",
        error_type="TOOL_ERROR",
    )
