"""``traceparent`` on the requests a tool makes, so the tool service's own spans join the
agent's trace (W3C Trace Context through the application's configured propagator).

- :func:`inject` — headers for any client: ``httpx.get(url, headers=inject())``;
- :func:`httpx_hooks` / :func:`httpx_async_hooks` — ``httpx.Client(event_hooks=...)``;
- :func:`requests_session` — a ``requests.Session`` whose every request carries it.

Nothing is patched globally: each helper touches only the client it is given.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Optional

from opentelemetry import propagate

__all__ = ["inject", "httpx_hooks", "httpx_async_hooks", "requests_session"]


def inject(headers: Optional[MutableMapping[str, str]] = None) -> MutableMapping[str, str]:
    """Adds the current context's propagation headers (``traceparent``, ``tracestate``,
    baggage: whatever the application's propagator writes) to ``headers`` (a new dict when
    None) and returns it."""
    carrier: MutableMapping[str, str] = {} if headers is None else headers
    propagate.inject(carrier)
    return carrier


def _inject_request(request: Any) -> None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    for k, v in carrier.items():
        request.headers[k] = v


async def _inject_request_async(request: Any) -> None:
    _inject_request(request)


def httpx_hooks() -> dict[str, list[Any]]:
    """Event hooks for ``httpx.Client(event_hooks=httpx_hooks())``."""
    return {"request": [_inject_request]}


def httpx_async_hooks() -> dict[str, list[Any]]:
    """Event hooks for ``httpx.AsyncClient(event_hooks=httpx_async_hooks())``."""
    return {"request": [_inject_request_async]}


def requests_session(session: Any = None) -> Any:
    """A ``requests.Session`` (``session``, or a new one) that injects the context into every
    request it sends, through a mounted transport adapter."""
    import requests
    from requests.adapters import HTTPAdapter

    class _PropagatingAdapter(HTTPAdapter):
        def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            _inject_request(request)
            return super().send(request, *args, **kwargs)

    s = session if session is not None else requests.Session()
    adapter = _PropagatingAdapter()
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    return s
