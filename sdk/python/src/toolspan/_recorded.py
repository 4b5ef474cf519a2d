"""Recorded responses: while a replay with ``recorded_responses`` runs, the replayed tool's
outbound HTTP is answered from what its original attempts recorded, never the network.

The transports of the standard library (``urllib.request``'s HTTP and HTTPS handlers), of
``httpx`` (``HTTPTransport``, ``AsyncHTTPTransport``) and of ``requests``
(``HTTPAdapter``) are patched while at least one such replay runs, and answer from the
recording only inside the replay's context; everywhere else (other threads, other calls, span
exports, which run with OpenTelemetry's suppress-instrumentation flag) they pass through to
the real transport. Attempt *n* of the replay is answered with the recorded response of
attempt *n* (the last recorded one past them), one request per attempt: that is what a
recording holds.
"""

from __future__ import annotations

import http
import http.client
import importlib
import importlib.util
import io
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional

from opentelemetry import context as otel_context

from ._replaying import _SESSION, Session

__all__ = ["serving"]


class _NoAnswer(Exception):
    """The recording holds no answer for this request (the original's send failed); the
    library's own connection error is raised in its place."""


def _active() -> Optional[Session]:
    s = _SESSION.get()
    if s is None or s.recorded is None:
        return None
    if otel_context.get_value(otel_context._SUPPRESS_INSTRUMENTATION_KEY):
        return None  # a span exporter's own request
    return s


def _answer(s: Session, method: str, url: str) -> tuple[int, dict[str, str], bytes]:
    """The recorded answer to this request: status, headers, body. Raises :class:`_NoAnswer`
    for an attempt whose send failed without an answer; sets ``s.problem`` (and raises
    :class:`_NoAnswer`) when the recording cannot answer it faithfully."""
    n = s.attempt()
    seen = s.served.get(n, 0)
    s.served[n] = seen + 1
    entry = s.entry(n)
    if seen or entry is None:
        s.problem = s.problem or (
            f"the tool made more than one request in attempt {n} ({method} {url}); a recording "
            "holds one response per attempt, so this replay needs the live service "
            "(run it without recorded responses)"
        )
        raise _NoAnswer(s.problem)
    body = entry.get("body")
    status = entry.get("http_status")
    failed_send = entry.get("stage") == "send" and entry.get("status") == "error"
    if body is None:
        if failed_send:
            raise _NoAnswer(f"attempt {n} of the original call got no answer (its send failed)")
        s.problem = s.problem or f"attempt {n} of the original call has no recorded response"
        raise _NoAnswer(s.problem)
    if not isinstance(status, int):
        if failed_send:
            s.problem = s.problem or (
                f"attempt {n}'s recorded response came with a failed send and no HTTP status to "
                "answer it with; replay it without recorded responses"
            )
            raise _NoAnswer(s.problem)
        status = 200
    data = body.encode("utf-8")
    try:
        json.loads(body)
        ctype = "application/json"
    except ValueError:
        ctype = "text/plain; charset=utf-8"
    return status, {"Content-Type": ctype, "Content-Length": str(len(data))}, data


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


# -- urllib.request


def _urllib_open(original: Callable[..., Any]) -> Callable[..., Any]:
    import urllib.error
    import urllib.response

    def open_(handler: Any, req: Any) -> Any:
        s = _active()
        if s is None:
            return original(handler, req)
        url = req.full_url
        try:
            status, headers, body = _answer(s, req.get_method(), url)
        except _NoAnswer as e:
            raise urllib.error.URLError(ConnectionError(str(e))) from None
        raw = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        msg = http.client.parse_headers(io.BytesIO(raw.encode("latin-1")))
        resp = urllib.response.addinfourl(io.BytesIO(body), msg, url, status)
        resp.msg = _reason(status)  # what HTTPErrorProcessor reads, as from http.client
        return resp

    return open_


# -- httpx


def _httpx_sync(original: Callable[..., Any]) -> Callable[..., Any]:
    import httpx

    def handle_request(transport: Any, request: Any) -> Any:
        s = _active()
        if s is None:
            return original(transport, request)
        try:
            status, headers, body = _answer(s, request.method, str(request.url))
        except _NoAnswer as e:
            raise httpx.ConnectError(str(e), request=request) from None
        return httpx.Response(status, headers=headers, content=body, request=request)

    return handle_request


def _httpx_async(original: Callable[..., Any]) -> Callable[..., Any]:
    import httpx

    async def handle_async_request(transport: Any, request: Any) -> Any:
        s = _active()
        if s is None:
            return await original(transport, request)
        try:
            status, headers, body = _answer(s, request.method, str(request.url))
        except _NoAnswer as e:
            raise httpx.ConnectError(str(e), request=request) from None
        return httpx.Response(status, headers=headers, content=body, request=request)

    return handle_async_request


# -- requests


def _requests_send(original: Callable[..., Any]) -> Callable[..., Any]:
    import requests
    from urllib3.response import HTTPResponse

    def send(adapter: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        s = _active()
        if s is None:
            return original(adapter, request, *args, **kwargs)
        try:
            status, headers, body = _answer(s, request.method, request.url)
        except _NoAnswer as e:
            raise requests.exceptions.ConnectionError(str(e), request=request) from None
        raw = HTTPResponse(
            body=io.BytesIO(body), headers=headers, status=status, reason=_reason(status), preload_content=False
        )
        return adapter.build_response(request, raw)

    return send


# (module, class path, method, wrapper factory): the transports answered from recordings.
_TARGETS: tuple[tuple[str, str, str, Callable[[Callable[..., Any]], Callable[..., Any]]], ...] = (
    ("urllib.request", "HTTPHandler", "http_open", _urllib_open),
    ("urllib.request", "HTTPSHandler", "https_open", _urllib_open),
    ("httpx", "HTTPTransport", "handle_request", _httpx_sync),
    ("httpx", "AsyncHTTPTransport", "handle_async_request", _httpx_async),
    ("requests.adapters", "HTTPAdapter", "send", _requests_send),
)

_lock = threading.Lock()
_users = 0
_saved: list[tuple[type, str, Any]] = []


def _install() -> None:
    for module, cls_name, method, factory in _TARGETS:
        top = module.split(".")[0]
        if importlib.util.find_spec(top) is None:
            continue  # not installed: nothing can use it
        cls = getattr(importlib.import_module(module), cls_name, None)
        if cls is None:
            continue  # urllib.request without ssl has no HTTPSHandler
        original = cls.__dict__[method]
        _saved.append((cls, method, original))
        setattr(cls, method, factory(original))


def _uninstall() -> None:
    while _saved:
        cls, method, original = _saved.pop()
        setattr(cls, method, original)


@contextmanager
def serving() -> Iterator[None]:
    """The transports answer from recordings (inside replay sessions) while this is open."""
    global _users
    with _lock:
        if _users == 0:
            _install()
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _uninstall()
