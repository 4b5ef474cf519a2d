"""An example tools package for replays and evals: ``search_docs`` over a docs service.

The docs service renamed a field of its answer: ``{"hits": [{"title": ..., "url": ...}]}``
became ``{"hits": [{"title": ..., "link": ...}]}``. :mod:`fleet_tools.broken` still expects
``url`` and fails its parse stage (``PARSE``, code ``bad_answer``); :mod:`fleet_tools.fixed`
accepts ``link``. Both record the service's raw answer, so a replay with recorded responses
needs no service::

    python -m toolspan replay err_5f0c2a9d41b3 --query-url http://127.0.0.1:8080 \\
        --tools fleet_tools.fixed --recorded-responses

The service's address comes from ``FLEET_DOCS_URL`` (default ``http://127.0.0.1:8000/search``).
"""

from __future__ import annotations

import os
import urllib.parse
import urllib.request

import toolspan

__all__ = ["DOCS_URL_ENV", "RETRY", "bad_answer", "fetch"]

#: The environment variable that names the docs service's search URL.
DOCS_URL_ENV = "FLEET_DOCS_URL"

#: Network failures are worth another try; a wrong answer is not.
RETRY = toolspan.RetryPolicy(max_attempts=3, initial_backoff_s=0.2, deadline_s=10)


def fetch(attempt: toolspan.Attempt, query: str, limit: int) -> str:
    """The send stage: asks the docs service and records its raw answer (what a replay with
    recorded responses answers the tool with), which it returns for the parse stage."""
    base = os.environ.get(DOCS_URL_ENV, "http://127.0.0.1:8000/search")
    url = base + "?" + urllib.parse.urlencode({"q": query, "limit": limit})
    with attempt.send(**{"url.full": base}) as s:
        req = urllib.request.Request(url, headers=toolspan.inject({"Accept": "application/json"}))
        with urllib.request.urlopen(req, timeout=5) as resp:
            s.set_attribute("http.response.status_code", resp.status)
            body = resp.read().decode("utf-8")
        s.record_response(body)
    return body


def bad_answer(field: str) -> toolspan.ToolError:
    """The envelope of an answer without a field the tool needs (``PARSE``, ``bad_answer``)."""
    return toolspan.ToolError(
        f"the docs service answered without '{field}' in a hit; try again later",
        code="bad_answer",
        error_class="internal",
        error_type="PARSE",
    )
