"""The error envelope the model sees, and the mapping from exceptions to envelopes.

At the dispatch boundary every exception becomes an :class:`ErrorEnvelope`: a stable
``code``, a ``class``, a ``message`` written for the model, ``retryable``,
``retry_after_ms`` and a ``reference`` that also labels the full exception in the
application's log and on the span. The model-facing fields never carry the exception's own
text (which may hold frames, file paths, SQL or driver messages): built-in mappings write
their own messages, and an application's mappings choose theirs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import ssl
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from ._conventions import UNMAPPED_CODE, ErrorClass, ErrorType

__all__ = [
    "ArgumentError",
    "ErrorEnvelope",
    "ErrorMapper",
    "MappingFunction",
    "ToolError",
    "new_reference",
]

_RECEIVED_LIMIT = 200


def new_reference() -> str:
    """A fresh error reference, e.g. ``err_5f0c2a9d41b3``: joins what the model was told to
    what the engineer's log and the span hold."""
    return "err_" + secrets.token_hex(6)


@dataclass(frozen=True)
class ErrorEnvelope:
    """What a failed tool call tells the model, plus how toolspan classifies it.

    ``error_type`` (``None``: the stage the failure happened in decides: prepare PREPARE, send NETWORK, execute TOOL_ERROR, parse PARSE) and
    ``timeout`` are for the span and the :class:`~toolspan.ToolResult` status; they are not
    part of the model-facing dictionary.
    """

    code: str
    error_class: ErrorClass
    message: str
    retryable: bool = False
    retry_after_ms: Optional[int] = None
    reference: str = ""
    field: Optional[str] = None
    received: Any = None
    permitted: Optional[tuple[Any, ...]] = None
    error_type: Optional[ErrorType] = None
    timeout: bool = False

    @property
    def unmapped(self) -> bool:
        """True for the generic envelope of an exception no mapping knows."""
        return self.code == UNMAPPED_CODE

    def to_dict(self) -> dict[str, Any]:
        """The model-facing envelope: ``code``, ``class``, ``message``, ``retryable``,
        ``retry_after_ms``, ``reference`` and, for argument errors, ``field``, ``received``
        and ``permitted``."""
        d: dict[str, Any] = {
            "code": self.code,
            "class": self.error_class,
            "message": self.message,
            "retryable": self.retryable,
            "retry_after_ms": self.retry_after_ms,
            "reference": self.reference,
        }
        if self.field is not None:
            d["field"] = self.field
            d["received"] = self.received
            if self.permitted is not None:
                d["permitted"] = list(self.permitted)
        return d

    def with_reference(self, reference: str) -> "ErrorEnvelope":
        return dataclasses.replace(self, reference=reference)


class ToolError(Exception):
    """Raise from a tool to answer the model with exactly this envelope.

    The ``message`` is shown to the model as written, so write it for the model: what was
    wrong and what is allowed. ``error_type`` overrides the stage's error type."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "tool_error",
        error_class: ErrorClass = "internal",
        retryable: bool = False,
        retry_after_ms: Optional[int] = None,
        field: Optional[str] = None,
        received: Any = None,
        permitted: Optional[tuple[Any, ...] | list[Any]] = None,
        error_type: Optional[ErrorType] = None,
    ) -> None:
        super().__init__(message)
        self.envelope = ErrorEnvelope(
            code=code,
            error_class=error_class,
            message=message,
            retryable=retryable,
            retry_after_ms=retry_after_ms,
            field=field,
            received=_safe_received(received) if field is not None else None,
            permitted=tuple(permitted) if permitted is not None else None,
            error_type=error_type,
        )


class ArgumentError(ToolError):
    """An argument the model gave is not acceptable (a prepare-stage failure). Raise it from
    a plain-callable argument validator."""

    def __init__(
        self,
        message: str,
        *,
        field: Optional[str] = None,
        received: Any = None,
        permitted: Optional[tuple[Any, ...] | list[Any]] = None,
        code: str = "invalid_argument",
    ) -> None:
        super().__init__(
            message,
            code=code,
            error_class="invalid_request",
            field=field,
            received=received,
            permitted=permitted,
            error_type="PREPARE",
        )


#: A mapping: ``(exception, stage)`` → envelope (its ``reference`` is filled in later), or
#: ``None`` to let the next mapping try. ``stage`` is the stage the exception escaped from
#: (``"prepare"``, ``"send"``, ``"execute"``, ``"parse"``) or ``None``.
MappingFunction = Callable[[BaseException, Optional[str]], Optional[ErrorEnvelope]]


class ErrorMapper:
    """Turns exceptions into envelopes: the application's registrations first (most derived
    exception class first), then the built-in mappings, then one generic envelope with code
    ``internal_error``.

    Built-ins cover toolspan's :class:`ToolError`, argument and answer validation (pydantic,
    jsonschema), timeouts, connection, DNS and TLS errors, HTTP statuses (httpx, requests)
    and JSON decode errors. Optional libraries are recognised by class name, never
    imported."""

    def __init__(self, *, builtins: bool = True) -> None:
        self._registered: dict[type[BaseException], MappingFunction] = {}
        self._builtins = builtins

    def register(
        self,
        exc_type: type[BaseException],
        mapping: Optional[MappingFunction] = None,
        *,
        code: Optional[str] = None,
        error_class: ErrorClass = "internal",
        message: Optional[str] = None,
        retryable: bool = False,
        retry_after_ms: Optional[int] = None,
        error_type: Optional[ErrorType] = None,
    ) -> None:
        """Map ``exc_type`` (and its subclasses) either with a function or to a fixed
        envelope (``code`` and ``message`` required)."""
        if mapping is None:
            if code is None or message is None:
                raise ValueError("register() needs a mapping function, or code and message")
            fixed = ErrorEnvelope(
                code=code,
                error_class=error_class,
                message=message,
                retryable=retryable,
                retry_after_ms=retry_after_ms,
                error_type=error_type,
            )

            def mapping(_exc: BaseException, _stage: Optional[str]) -> ErrorEnvelope:
                return fixed

        self._registered[exc_type] = mapping

    def map(self, exc: BaseException, stage: Optional[str] = None) -> ErrorEnvelope:
        """The envelope for ``exc`` (without a reference). Never raises: a mapping that fails
        falls back to the generic envelope."""
        try:
            for cls in type(exc).__mro__:
                fn = self._registered.get(cls)
                if fn is not None:
                    env = fn(exc, stage)
                    if env is not None:
                        return env
            if self._builtins:
                for cls in type(exc).__mro__:
                    fn = _BUILTIN.get(f"{cls.__module__}.{cls.__qualname__}")
                    if fn is not None:
                        env = fn(exc, stage)
                        if env is not None:
                            return env
        except Exception:  # noqa: BLE001 - a broken mapping must not break the boundary
            pass
        return UNMAPPED


UNMAPPED = ErrorEnvelope(
    code=UNMAPPED_CODE,
    error_class="internal",
    message="the tool failed unexpectedly; the reference identifies the failure in the tool's log",
)


# ---------------------------------------------------------------------------------------
# Built-in mappings, keyed by "module.QualifiedName" of an exception class.


def _tool_error(exc: BaseException, _stage: Optional[str]) -> Optional[ErrorEnvelope]:
    return getattr(exc, "envelope", None)


def _timeout(exc: BaseException, stage: Optional[str]) -> ErrorEnvelope:
    return ErrorEnvelope(
        code="timeout",
        error_class="transient",
        message="the tool did not answer in time",
        retryable=True,
        error_type="TOOL_ERROR",
        timeout=True,
    )


def _connect_timeout(exc: BaseException, stage: Optional[str]) -> ErrorEnvelope:
    return ErrorEnvelope(
        code="connect_timeout",
        error_class="transient",
        message="the tool's service could not be reached in time",
        retryable=True,
        timeout=True,
    )


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        for arg in getattr(cur, "args", ()):
            # urllib3 keeps the low-level error as an argument (MaxRetryError.reason).
            if isinstance(arg, BaseException) and id(arg) not in seen:
                yield from _causes(arg)
        reason = getattr(cur, "reason", None)
        if isinstance(reason, BaseException) and id(reason) not in seen:
            yield from _causes(reason)
        cur = cur.__cause__ or cur.__context__


def _connection(exc: BaseException, stage: Optional[str]) -> ErrorEnvelope:
    """Connection, DNS and TLS failures: the tool was not reached (NETWORK in the send
    stage). The stage decides the error type: the same error inside the tool's own work is
    the tool's error."""
    code, message, retryable = (
        "connection_failed",
        "the tool's service could not be reached",
        True,
    )
    for c in _causes(exc):
        if isinstance(c, socket.gaierror) or "NameResolution" in type(c).__name__:
            code, message = "dns_failure", "the tool's service host name could not be resolved"
            break
        if isinstance(c, ssl.SSLError) or type(c).__name__ in ("SSLError", "CertificateError"):
            code, message, retryable = (
                "tls_error",
                "a secure connection to the tool's service could not be established",
                False,
            )
            break
        if isinstance(c, ConnectionRefusedError) or "refused" in str(c).lower():
            code, message = "connection_refused", "the tool's service refused the connection"
            break
    return ErrorEnvelope(
        code=code, error_class="transient", message=message, retryable=retryable
    )


def _retry_after_ms(headers: Any) -> Optional[int]:
    try:
        v = headers.get("retry-after") if headers is not None else None
    except Exception:  # noqa: BLE001
        return None
    if not v:
        return None
    try:
        return max(0, int(float(v) * 1000))
    except ValueError:
        from email.utils import parsedate_to_datetime
        import time

        try:
            when = parsedate_to_datetime(v).timestamp()
        except (TypeError, ValueError):
            return None
        return max(0, int((when - time.time()) * 1000))


_HTTP: dict[int, tuple[str, ErrorClass, str, bool, ErrorType]] = {
    400: ("arguments_rejected", "invalid_request", "the tool rejected the arguments", False, "PREPARE"),
    401: ("unauthorized", "permission", "the tool's service refused the agent's credentials", False, "NETWORK"),
    403: ("forbidden", "permission", "the agent is not allowed to use the tool's service", False, "NETWORK"),
    404: ("not_found", "not_found", "the tool found nothing at the requested address", False, "TOOL_ERROR"),
    407: ("proxy_auth_required", "permission", "a proxy refused the agent's credentials", False, "NETWORK"),
    408: ("timeout", "transient", "the tool did not answer in time", True, "TOOL_ERROR"),
    409: ("conflict", "conflict", "the request conflicts with the tool's current state", False, "TOOL_ERROR"),
    422: ("arguments_rejected", "invalid_request", "the tool rejected the arguments", False, "PREPARE"),
    429: ("rate_limited", "transient", "the tool is rate limiting requests; wait before retrying", True, "TOOL_ERROR"),
    502: ("bad_gateway", "transient", "a gateway in front of the tool's service failed", True, "NETWORK"),
    503: ("service_unavailable", "transient", "the tool's service is unavailable", True, "NETWORK"),
    504: ("gateway_timeout", "transient", "a gateway timed out reaching the tool's service", True, "NETWORK"),
}


def http_status_envelope(status: int, headers: Any = None) -> ErrorEnvelope:
    """The built-in envelope of an HTTP error status. Authentication (401/403/407) and
    gateway errors (502/503/504) mean the tool was not reached (``NETWORK``); 400/422 mean it
    rejected the arguments (``PREPARE``); the rest are the tool's own errors."""
    known = _HTTP.get(status)
    if known is not None:
        code, cls, message, retryable, et = known
    elif status >= 500:
        code, cls, message, retryable, et = (
            "tool_failed", "internal", f"the tool's service failed (HTTP {status})", False, "TOOL_ERROR",
        )
    else:
        code, cls, message, retryable, et = (
            "request_refused", "invalid_request", f"the tool's service refused the request (HTTP {status})", False, "TOOL_ERROR",
        )
    return ErrorEnvelope(
        code=code,
        error_class=cls,
        message=message,
        retryable=retryable,
        retry_after_ms=_retry_after_ms(headers) if retryable else None,
        error_type=et,
        timeout=status == 408,
    )


def _http_status(exc: BaseException, stage: Optional[str]) -> Optional[ErrorEnvelope]:
    resp = getattr(exc, "response", None)
    status = getattr(resp, "status_code", None)
    if not isinstance(status, int):
        return None
    return http_status_envelope(status, getattr(resp, "headers", None))


def _json_decode(exc: BaseException, stage: Optional[str]) -> ErrorEnvelope:
    if stage == "prepare":
        return ErrorEnvelope(
            code="invalid_json",
            error_class="invalid_request",
            message="the arguments are not valid JSON",
            error_type="PREPARE",
        )
    return ErrorEnvelope(
        code="invalid_json",
        error_class="internal",
        message="the tool's answer was not valid JSON",
        error_type="PARSE",
    )


def _permitted_from_expected(expected: Any) -> Optional[tuple[Any, ...]]:
    if not isinstance(expected, str):
        return None
    quoted = re.findall(r"'((?:[^'\\]|\\.)*)'", expected)
    if quoted:
        return tuple(quoted)
    parts = [p.strip() for p in re.split(r",| or ", expected) if p.strip()]
    return tuple(parts) or None


def _validation(
    stage: Optional[str], field: Optional[str], received: Any, permitted: Any, detail: str
) -> Optional[ErrorEnvelope]:
    if stage == "prepare":
        where = f"argument '{field}'" if field else "the arguments"
        return ErrorEnvelope(
            code="invalid_argument",
            error_class="invalid_request",
            message=f"{where}: {detail}" if detail else f"{where} are not valid",
            field=field or "",
            received=_safe_received(received),
            permitted=permitted,
            error_type="PREPARE",
        )
    if stage != "parse":
        # Validation inside the tool's own work: the tool's error, the generic envelope.
        return None
    return ErrorEnvelope(
        code="invalid_response",
        error_class="internal",
        message="the tool's answer did not have the expected shape",
        error_type="PARSE",
    )


def _pydantic(exc: BaseException, stage: Optional[str]) -> Optional[ErrorEnvelope]:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return None
    errs = errors(include_url=False)
    if not errs:
        return _validation(stage, None, None, None, "")
    e = errs[0]
    field = ".".join(str(p) for p in e.get("loc", ()))
    permitted = None
    ctx = e.get("ctx") or {}
    if e.get("type") in ("literal_error", "enum"):
        permitted = _permitted_from_expected(ctx.get("expected"))
    received = None if e.get("type") == "missing" else e.get("input")
    detail = str(e.get("msg", ""))[:300]
    if len(errs) > 1:
        detail += f" (and {len(errs) - 1} more)"
    return _validation(stage, field, received, permitted, detail)


def _jsonschema(exc: BaseException, stage: Optional[str]) -> Optional[ErrorEnvelope]:
    path = list(getattr(exc, "absolute_path", None) or getattr(exc, "path", None) or [])
    validator = getattr(exc, "validator", None)
    value = getattr(exc, "validator_value", None)
    instance = getattr(exc, "instance", None)
    permitted = None
    field = ".".join(str(p) for p in path)
    received: Any = instance
    if validator == "enum" and isinstance(value, (list, tuple)):
        permitted = tuple(value)
    elif validator == "const":
        permitted = (value,)
    elif validator == "required" and isinstance(instance, Mapping) and isinstance(value, list):
        missing = [k for k in value if k not in instance]
        if missing:
            field = ".".join([*map(str, path), str(missing[0])])
            received = None
    detail = str(getattr(exc, "message", ""))[:300]
    return _validation(stage, field, received, permitted, detail)


def _os_error(code: str, cls: ErrorClass, message: str) -> MappingFunction:
    env = ErrorEnvelope(code=code, error_class=cls, message=message)
    return lambda _exc, _stage: env


_BUILTIN: dict[str, MappingFunction] = {
    "toolspan.envelope.ToolError": _tool_error,
    "builtins.TimeoutError": _timeout,
    "asyncio.exceptions.TimeoutError": _timeout,
    "concurrent.futures._base.TimeoutError": _timeout,
    "httpx.ConnectTimeout": _connect_timeout,
    "httpx.TimeoutException": _timeout,
    "requests.exceptions.ConnectTimeout": _connect_timeout,
    "requests.exceptions.Timeout": _timeout,
    "builtins.ConnectionError": _connection,
    "socket.gaierror": _connection,
    "ssl.SSLError": _connection,
    "httpx.NetworkError": _connection,
    "httpx.ProxyError": _connection,
    "requests.exceptions.ConnectionError": _connection,
    "urllib3.exceptions.HTTPError": _connection,
    "urllib.error.URLError": _connection,
    "httpx.HTTPStatusError": _http_status,
    "requests.exceptions.HTTPError": _http_status,
    "urllib.error.HTTPError": lambda e, s: http_status_envelope(getattr(e, "code", 500), getattr(e, "headers", None)),
    "json.decoder.JSONDecodeError": _json_decode,
    "pydantic_core._pydantic_core.ValidationError": _pydantic,
    "jsonschema.exceptions.ValidationError": _jsonschema,
    "builtins.PermissionError": _os_error(
        "permission_denied", "permission", "the tool is not allowed to do that"
    ),
    "builtins.FileNotFoundError": _os_error(
        "not_found", "not_found", "the tool could not find what it was asked for"
    ),
}


def _safe_received(v: Any) -> Any:
    """The model's own argument value, bounded, as a JSON scalar."""
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, str):
        return v if len(v) <= _RECEIVED_LIMIT else v[:_RECEIVED_LIMIT] + "…"
    try:
        text = json.dumps(v, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        text = type(v).__name__
    return text if len(text) <= _RECEIVED_LIMIT else text[:_RECEIVED_LIMIT] + "…"
