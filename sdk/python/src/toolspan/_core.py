"""Calls, attempts and stages: the call, attempt and stage spans toolspan classifies, and the dispatch boundary.

One logical call (``gen_ai.operation.name = execute_tool``) holds one span per attempt
(``toolspan.attempt = n``) when the retry policy allows more than one, and each attempt (or
the call itself, with a single attempt) holds the stage spans (``toolspan.stage``). A failure
is mapped to an envelope once, where it happened; the stage, the attempt and the call each
record it, the application's logger gets the full exception under the envelope's reference,
and the call ends with a :class:`~toolspan.ToolResult` instead of an exception.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from types import TracebackType
from typing import Any, Optional

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NoOpTracer, Span, SpanKind, Status, StatusCode, Tracer

from . import _conventions as conv
from . import _replaying
from .envelope import UNMAPPED, ErrorEnvelope, ErrorMapper, new_reference
from .result import ToolResult
from .retry import NO_RETRY, RetryPolicy

__all__ = ["Attempt", "StageSpan", "ToolCall", "Toolspan"]

_VERSION = "0.1.0"
_OK = Status(StatusCode.OK)
# Shared attribute dicts of stage spans without extra attributes (the SDK copies them).
_STAGE_ATTRS: dict[str, dict[str, Any]] = {name: {conv.STAGE: name} for name in conv.STAGES}
_attach = otel_context.attach
_detach = otel_context.detach
_set_span_in_context = trace.set_span_in_context


def _is_noop(tracer: Tracer) -> bool:
    """True for the OpenTelemetry API's no-op tracer (not a proxy, which may get a real
    tracer later): its spans record nothing, and a span it starts is the parent's
    non-recording span itself (the one in the context it is given), so a call's stages can
    take the call's span and context without asking the tracer again."""
    return type(tracer) is NoOpTracer
_DEFAULT_MAPPER: Optional[ErrorMapper] = None


def _default_mapper() -> ErrorMapper:
    global _DEFAULT_MAPPER
    if _DEFAULT_MAPPER is None:
        _DEFAULT_MAPPER = ErrorMapper()
    return _DEFAULT_MAPPER


class Toolspan:
    """Instrumentation settings: where spans go, what is captured, how errors are mapped.

    ``tracer_provider``: the provider to take a tracer from (default: the global one, looked
    up through the OpenTelemetry API; toolspan never configures the SDK). ``capture_payloads``:
    record the arguments and the model-facing result on the call span (off by default; each is
    cut to ``payload_limit`` characters). ``mapper``: the exception → envelope mapping
    (default: the built-ins). ``logger``: where full exceptions go, under their reference
    (default: the ``toolspan`` logger). ``retry``: the default policy of calls and tools."""

    def __init__(
        self,
        *,
        tracer_provider: Optional[trace.TracerProvider] = None,
        tracer: Optional[Tracer] = None,
        capture_payloads: bool = False,
        payload_limit: int = 8192,
        mapper: Optional[ErrorMapper] = None,
        logger: Optional[logging.Logger] = None,
        retry: RetryPolicy = NO_RETRY,
        rng: Optional[random.Random] = None,
    ) -> None:
        self.tracer: Tracer = tracer or trace.get_tracer("toolspan", _VERSION, tracer_provider)
        self.capture_payloads = capture_payloads
        self.payload_limit = payload_limit
        self.mapper = mapper or _default_mapper()
        self.logger = logger or logging.getLogger("toolspan")
        self.retry = retry
        self.rng = rng or random.Random()

    def call(
        self,
        tool: str,
        *,
        call_id: Optional[str] = None,
        arguments: Any = None,
        retry: Optional[RetryPolicy] = None,
        attributes: Optional[Mapping[str, Any]] = None,
    ) -> "ToolCall":
        """A logical tool call, as a context manager (``with ts.call("search_docs") as call``)."""
        return ToolCall(self, tool, call_id, arguments, retry or self.retry, attributes)

    def capture(self, value: Any) -> str:
        """``value`` as text for a payload attribute, cut to ``payload_limit``."""
        if isinstance(value, str):
            text = value
        else:
            try:
                text = json.dumps(value, default=str, ensure_ascii=False)
            except (TypeError, ValueError):
                text = repr(value)
        if len(text) > self.payload_limit:
            text = text[: self.payload_limit] + f"…[{len(text) - self.payload_limit} more characters]"
        return text


class _Failure:
    """One exception, mapped once where it happened."""

    __slots__ = ("exc", "stage", "envelope", "error_type")

    def __init__(self, exc: BaseException, stage: Optional[str], envelope: ErrorEnvelope, error_type: str) -> None:
        self.exc = exc
        self.stage = stage
        self.envelope = envelope
        self.error_type = error_type


def _record_envelope(span: Span, f: _Failure, description: str) -> None:
    env = f.envelope
    span.set_status(Status(StatusCode.ERROR, description))
    span.set_attribute(conv.ERROR_TYPE, f.error_type)
    span.set_attribute(conv.ERROR_CODE, env.code)
    span.set_attribute(conv.ERROR_CLASS, env.error_class)
    span.set_attribute(conv.ERROR_RETRYABLE, env.retryable)
    if env.retry_after_ms is not None:
        span.set_attribute(conv.ERROR_RETRY_AFTER_MS, env.retry_after_ms)
    span.set_attribute(conv.ERROR_REFERENCE, env.reference)


class StageSpan(Span):
    """A stage span (``prepare``, ``send``, ``execute``, ``parse``) as a context manager;
    ``with`` gives the span (this object, a :class:`~opentelemetry.trace.Span` over the stage's
    own), for stage attributes (``http.response.status_code``, ...) and
    :meth:`record_response`."""

    __slots__ = ("_attempt", "name", "_attrs", "span", "_token")

    def __init__(self, attempt: "Attempt", name: str, attrs: Optional[dict[str, Any]]) -> None:
        self._attempt = attempt
        self.name = name
        self._attrs = attrs

    def record_response(self, text: Any) -> None:
        """Records the backend's raw answer, what a replay with recorded responses serves the
        tool again: on ``send`` (and any stage but ``parse``) as the stage's result
        (``gen_ai.tool.call.result``), on ``parse`` as what it parsed, its input
        (``gen_ai.tool.call.arguments``). Captured like every payload: only with
        ``capture_payloads=True``, cut to ``payload_limit``. Bytes are read as UTF-8."""
        ts = self._attempt.call.ts
        if not ts.capture_payloads:
            return
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        key = conv.TOOL_ARGUMENTS if self.name == "parse" else conv.TOOL_RESULT
        self.span.set_attribute(key, ts.capture(text))

    # -- the stage's span
    def end(self, end_time: Optional[int] = None) -> None:
        self.span.end(end_time)

    def get_span_context(self) -> trace.SpanContext:
        return self.span.get_span_context()

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.span.set_attributes(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)

    def add_event(self, name: str, attributes: Any = None, timestamp: Optional[int] = None) -> None:
        self.span.add_event(name, attributes, timestamp)

    def add_link(self, context: trace.SpanContext, attributes: Any = None) -> None:
        self.span.add_link(context, attributes)

    def update_name(self, name: str) -> None:
        self.span.update_name(name)

    def is_recording(self) -> bool:
        return self.span.is_recording()

    def set_status(self, status: Any, description: Optional[str] = None) -> None:
        self.span.set_status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Any = None,
        timestamp: Optional[int] = None,
        escaped: bool = False,
    ) -> None:
        self.span.record_exception(exception, attributes, timestamp, escaped)

    def __enter__(self) -> "StageSpan":
        a = self._attempt
        call = a.call
        ctx = a._context
        if call._noop and ctx is not None:
            # The no-op tracer would return the non-recording span of the attempt's context
            # (the call's own, which an attempt under the no-op tracer shares), and that
            # context with the span set in it again is the same context.
            self.span = call.span
            self._token = _attach(ctx)
            return self
        if self._attrs:
            attributes: dict[str, Any] = {conv.STAGE: self.name, **self._attrs}
        else:
            attributes = _STAGE_ATTRS.get(self.name) or {conv.STAGE: self.name}
        self.span = span = call.ts.tracer.start_span(
            f"{call.tool} {self.name}",
            context=a._context,
            kind=SpanKind.CLIENT if self.name == "send" else SpanKind.INTERNAL,
            attributes=attributes,
        )
        self._token = _attach(_set_span_in_context(span, a._context))
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        span = self.span
        if exc is not None:
            if isinstance(exc, Exception):
                f = self._attempt._failure_for(exc, self.name)
                if span.is_recording():
                    span.record_exception(exc)
                    _record_envelope(span, f, f"{type(exc).__name__}: {exc}"[:1024])
            else:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        _detach(self._token)
        span.end()


class Attempt:
    """One attempt of a call. Use ``with attempt:``; inside it, the stage context managers.

    An exception that leaves ``with attempt:`` is mapped to an envelope and recorded; it is
    swallowed when the policy retries it, and when it is the call's final failure (the call's
    result then holds the envelope)."""

    __slots__ = ("call", "number", "span", "_context", "_token", "_failure", "value", "done", "retry_wait")

    def __init__(self, call: "ToolCall", number: int, with_span: bool) -> None:
        self.call = call
        self.number = number
        self.span: Optional[Span] = None
        self._failure: Optional[_Failure] = None
        self.value: Any = None
        self.done = False
        self.retry_wait: Optional[float] = None
        self._token: Any = None
        if with_span:
            self._context = None  # set on enter
        else:
            self._context = call._context

    # -- stages
    def stage(self, name: conv.StageName, **attributes: Any) -> StageSpan:
        """A stage span; ``attributes`` are set on it at its start."""
        return StageSpan(self, name, attributes)

    def prepare(self, **attributes: Any) -> StageSpan:
        """Argument validation."""
        return StageSpan(self, "prepare", attributes)

    def send(self, **attributes: Any) -> StageSpan:
        """The request to the tool (requests made here should carry ``traceparent``)."""
        return StageSpan(self, "send", attributes)

    def execute(self, **attributes: Any) -> StageSpan:
        """The tool's own work, or waiting for its answer."""
        return StageSpan(self, "execute", attributes)

    def parse(self, **attributes: Any) -> StageSpan:
        """Decoding and checking the answer."""
        return StageSpan(self, "parse", attributes)

    def succeed(self, value: Any) -> None:
        """The call's answer, when this attempt succeeds."""
        self.value = value

    # -- lifecycle
    def __enter__(self) -> "Attempt":
        call = self.call
        call._current = self
        if self._context is None:
            self.span = call.ts.tracer.start_span(
                f"{call.tool} attempt {self.number}",
                context=call._context,
                attributes={conv.ATTEMPT: self.number},
            )
            call._attempt_spans.append(self.span)
            self._context = trace.set_span_in_context(self.span, call._context)
            self._token = otel_context.attach(self._context)
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool:
        call = self.call
        suppress = False
        if exc is None:
            self.done = True
            if self.span is not None:
                self.span.set_status(_OK)
        elif isinstance(exc, Exception):
            f = self._failure_for(exc, None)
            self.retry_wait = call._retry_wait(self, f)
            call._log_failure(self, f, will_retry=self.retry_wait is not None)
            if self.span is not None:
                if f.stage is None:
                    self.span.record_exception(exc)
                _record_envelope(self.span, f, f.envelope.message)
            self._failure = f
            suppress = True
        elif self.span is not None:
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        if self.span is not None:
            otel_context.detach(self._token)
            self.span.end()
        return suppress

    def _failure_for(self, exc: BaseException, stage: Optional[str]) -> _Failure:
        f = self._failure
        if f is not None and f.exc is exc:
            return f
        call = self.call
        mapped = call.ts.mapper.map(exc, stage)
        if mapped.error_type:
            error_type: str = mapped.error_type
        elif mapped is UNMAPPED and stage == "send":
            # NETWORK says the tool was not reached, which only a network error shows: an
            # exception no mapping knows, raised by the code around the request, is the
            # tool's own failure.
            error_type = "TOOL_ERROR"
        else:
            error_type = (conv.STAGE_ERROR_TYPE.get(stage) if stage else None) or "TOOL_ERROR"
        env = mapped.with_reference(new_reference())
        f = _Failure(exc, stage, env, error_type)
        self._failure = f
        return f


class ToolCall:
    """One logical tool call: a context manager around its attempts.

    ``for attempt in call.attempts(): with attempt: ...`` (``async for`` with
    :meth:`attempts_async`) runs the attempts by the retry policy; code that makes a single
    attempt can use the stage methods on the call directly. After the ``with`` block,
    :attr:`result` holds the :class:`ToolResult`."""

    def __init__(
        self,
        ts: Toolspan,
        tool: str,
        call_id: Optional[str],
        arguments: Any,
        retry: RetryPolicy,
        attributes: Optional[Mapping[str, Any]],
    ) -> None:
        self.ts = ts
        self.tool = tool
        self.call_id = call_id
        self.arguments = arguments
        self.retry = retry
        self._attributes = attributes
        self._attempt_spans: list[Span] = []
        self._current: Optional[Attempt] = None
        self._final: Optional[_Failure] = None
        self._attempts = 0
        self._result: Optional[ToolResult] = None
        self.span: Span
        self._context: Any = None
        self._noop = False

    @property
    def result(self) -> ToolResult:
        """The call's :class:`ToolResult` (``ok`` with no value until the call has ended)."""
        r = self._result
        if r is None:
            r = self._result = ToolResult("ok", tool=self.tool, call_id=self.call_id)
        return r

    @result.setter
    def result(self, value: ToolResult) -> None:
        self._result = value

    def __enter__(self) -> "ToolCall":
        self._start = time.monotonic()
        ts = self.ts
        tracer = ts.tracer
        replay = _replaying.claim(self)
        if replay is None and _is_noop(tracer):
            # Nothing is recorded: no attributes to build, no payload to capture.
            self._noop = True
            self.span = tracer.start_span(f"execute_tool {self.tool}")
            self._context = _set_span_in_context(self.span)
            self._token = _attach(self._context)
            return self
        attrs: dict[str, Any] = {conv.OPERATION_NAME: conv.EXECUTE_TOOL, conv.TOOL_NAME: self.tool}
        if self.call_id:
            attrs[conv.TOOL_CALL_ID] = self.call_id
        if self._attributes:
            attrs.update(self._attributes)
        if ts.capture_payloads and self.arguments is not None:
            attrs[conv.TOOL_ARGUMENTS] = ts.capture(self.arguments)
        if replay is None:
            self.span = tracer.start_span(f"execute_tool {self.tool}", attributes=attrs)
        else:
            # A replay is a call of its own: a new trace, linked to the call it replays.
            attrs[conv.REPLAY_OF] = replay.info.of
            self.span = ts.tracer.start_span(
                f"execute_tool {self.tool}",
                context=otel_context.Context(),
                attributes=attrs,
                links=replay.links,
            )
        self._context = trace.set_span_in_context(self.span)
        self._token = otel_context.attach(self._context)
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool:
        suppress = False
        span = self.span
        if exc is not None and not isinstance(exc, Exception):
            # Cancellation, KeyboardInterrupt, SystemExit: record, never swallow.
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        else:
            if exc is not None:
                # Raised in a single-attempt call's stages, or outside any attempt.
                att = self._current or Attempt(self, 1, False)
                f = att._failure_for(exc, None)
                self._attempts = max(self._attempts, 1)
                self._log_failure(att, f, will_retry=False)
                if f.stage is None:
                    span.record_exception(exc)
                self._final = f
                suppress = True
            self._finish()
        _detach(self._token)
        span.end()
        return suppress

    def _finish(self) -> None:
        span = self.span
        n = max(self._attempts, 1)
        recording = span.is_recording()
        if recording:
            span.set_attribute(conv.ATTEMPTS, n)
            if self._attempt_spans:
                for s in self._attempt_spans:
                    span.add_link(s.get_span_context())
        f = self._final
        if f is None:
            value = self._current.value if self._current is not None else None
            self._result = ToolResult._ok(value, self.tool, self.call_id, n)
            if recording:
                span.set_status(_OK)
        else:
            error_type = "RETRY_EXHAUSTED" if n > 1 else f.error_type
            self.result = ToolResult.failure(
                f.envelope, error_type=f.error_type, tool=self.tool, call_id=self.call_id, attempts=n
            )
            _record_envelope(span, _Failure(f.exc, f.stage, f.envelope, error_type), f.envelope.message)
        if recording and self.ts.capture_payloads:
            span.set_attribute(conv.TOOL_RESULT, self.ts.capture(self.result.content()))

    # -- single-attempt shortcuts
    def _single(self) -> Attempt:
        if self._current is None:
            self._current = Attempt(self, 1, False)
            self._attempts = 1
        return self._current

    def stage(self, name: conv.StageName, **attributes: Any) -> StageSpan:
        return self._single().stage(name, **attributes)

    def prepare(self, **attributes: Any) -> StageSpan:
        return self._single().prepare(**attributes)

    def send(self, **attributes: Any) -> StageSpan:
        return self._single().send(**attributes)

    def execute(self, **attributes: Any) -> StageSpan:
        return self._single().execute(**attributes)

    def parse(self, **attributes: Any) -> StageSpan:
        return self._single().parse(**attributes)

    def succeed(self, value: Any) -> None:
        self._single().succeed(value)

    # -- attempts
    def _next_attempt(self) -> Attempt:
        self._attempts += 1
        # With a single permitted attempt, stages hang off the call (no attempt span).
        return Attempt(self, self._attempts, self.retry.max_attempts > 1)

    def attempts(self) -> Iterator[Attempt]:
        """The attempts, each to be entered with ``with``; waits between them (blocking)."""
        while True:
            att = self._next_attempt()
            yield att
            if not self._after(att):
                return
            time.sleep(att.retry_wait or 0.0)

    async def attempts_async(self) -> AsyncIterator[Attempt]:
        """As :meth:`attempts`, waiting with ``asyncio.sleep``."""
        while True:
            att = self._next_attempt()
            yield att
            if not self._after(att):
                return
            await asyncio.sleep(att.retry_wait or 0.0)

    def _after(self, att: Attempt) -> bool:
        """True when another attempt follows ``att``."""
        if att._failure is None:
            self._final = None
            return False
        if att.retry_wait is None:
            self._final = att._failure
            return False
        return True

    def remaining_s(self) -> Optional[float]:
        """Seconds left before the call's deadline, or None without one."""
        if self.retry.deadline_s is None:
            return None
        return self.retry.deadline_s - (time.monotonic() - self._start)

    def _retry_wait(self, att: Attempt, f: _Failure) -> Optional[float]:
        """How long to wait before retrying after ``att`` failed with ``f``, or None when the
        failure is final (not retryable, no attempts left, or past the deadline)."""
        p = self.retry
        if not f.envelope.retryable or att.number >= p.max_attempts:
            return None
        wait = p.backoff_s(att.number, f.envelope.retry_after_ms, self.ts.rng)
        left = self.remaining_s()
        if left is not None and wait >= left:
            return None
        return wait

    def _log_failure(self, att: Attempt, f: _Failure, will_retry: bool) -> None:
        logger = self.ts.logger
        level = logging.WARNING if will_retry else logging.ERROR
        if not logger.isEnabledFor(level):
            return
        env = f.envelope
        logger.log(
            level,
            "tool %s failed [%s]: %s (%s, stage %s, attempt %d%s, call %s)",
            self.tool,
            env.reference,
            env.code,
            f.error_type,
            f.stage or "-",
            att.number,
            ", retrying" if will_retry else "",
            self.call_id or "-",
            exc_info=(type(f.exc), f.exc, f.exc.__traceback__),
            extra={
                "toolspan_reference": env.reference,
                "toolspan_tool": self.tool,
                "toolspan_call_id": self.call_id,
                "toolspan_code": env.code,
                "toolspan_error_type": f.error_type,
                "toolspan_attempt": att.number,
            },
        )
