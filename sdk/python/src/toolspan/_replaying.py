"""What tool code sees of a replay: :func:`replaying`, the :class:`ReplayInfo` it returns, and
the session that ties the replayed call to its original.

Kept free of heavy imports: every :class:`~toolspan.ToolCall` asks :func:`claim` whether it
is the call a replay is running (one context-variable lookup when it is not).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ._core import ToolCall

__all__ = ["ReplayError", "ReplayInfo", "ReplayRefused", "replaying"]


class ReplayError(Exception):
    """A replay that could not run: the replay document could not be fetched or read, or the
    tool or the recording could not serve it (the CLI exits 2)."""


class ReplayRefused(ReplayError):
    """A replay the sandbox rules refuse: arguments that are not exact and were not supplied,
    a tool with side effects that was not allowed, recorded responses that are missing or
    not exact."""


@dataclass(frozen=True)
class ReplayInfo:
    """What a tool learns from :func:`toolspan.replaying` while it runs as a replay.

    ``of``: the original call's span, ``TRACEID:SPANID``; ``reference``, ``call_id``,
    ``tool``, ``service``, ``service_version``: the original call's; ``table_version``: the
    version of the spans table the replay document was read from; ``case``: the eval case's
    name (``None`` outside ``evals``); ``recorded_responses``: outbound HTTP is answered from
    the original attempts' recorded responses; ``allow_side_effects``: the user allowed a
    tool with side effects to run."""

    of: str
    tool: str
    reference: Optional[str] = None
    call_id: Optional[str] = None
    service: Optional[str] = None
    service_version: Optional[str] = None
    table_version: Optional[int] = None
    case: Optional[str] = None
    recorded_responses: bool = False
    allow_side_effects: bool = False
    _session: Any = field(default=None, repr=False, compare=False)

    def recorded_response(self) -> Optional[str]:
        """The recorded response of the original attempt matching the current one (the last
        recorded one past them), for tools whose client toolspan does not answer itself;
        ``None`` without ``recorded_responses`` or when nothing was recorded."""
        s = self._session
        if s is None or s.recorded is None:
            return None
        entry = s.entry(s.attempt())
        return entry.get("body") if entry else None


class Session:
    """One running replay: its info, the call it claimed, and the recorded responses it
    serves (``None`` without ``recorded_responses``)."""

    def __init__(self, info_kwargs: dict[str, Any], links: list[Any], recorded: Optional[list[dict[str, Any]]]) -> None:
        self.info = ReplayInfo(_session=self, **info_kwargs)
        self.links = links
        self.recorded = recorded
        self.call: Optional["ToolCall"] = None
        #: Requests answered per attempt number.
        self.served: dict[int, int] = {}
        #: Why the recording could not answer the tool (the replay then fails with it).
        self.problem: Optional[str] = None

    def attempt(self) -> int:
        return max(self.call._attempts, 1) if self.call is not None else 1

    def entry(self, attempt: int) -> Optional[dict[str, Any]]:
        """The recorded response of ``attempt``, else the last recorded one."""
        rec = self.recorded or []
        for e in rec:
            if e.get("attempt") == attempt:
                return e
        return rec[-1] if rec else None


_SESSION: ContextVar[Optional[Session]] = ContextVar("toolspan_replay", default=None)


def replaying() -> Optional[ReplayInfo]:
    """The replay the current code runs in, or ``None`` in normal operation. A tool with side
    effects can point itself at a staging endpoint::

        info = toolspan.replaying()
        url = STAGING_URL if info is not None else PRODUCTION_URL
    """
    s = _SESSION.get()
    return s.info if s is not None else None


def claim(call: "ToolCall") -> Optional[Session]:
    """The replay session whose replayed call ``call`` is (the first call of the replayed
    tool inside the replay), else ``None``."""
    s = _SESSION.get()
    if s is None or s.call is not None or call.tool != s.info.tool:
        return None
    s.call = call
    return s
