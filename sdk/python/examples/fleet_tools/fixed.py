"""``search_docs`` after the fix: reads ``link`` (and still ``url``, for answers of the old
service)."""

from __future__ import annotations

import json

import toolspan

from . import RETRY, bad_answer, fetch


@toolspan.tool(retry=RETRY)
def search_docs(attempt: toolspan.Attempt, query: str, limit: int = 5) -> list[dict[str, str]]:
    """Search the product documentation; answers titles and links."""
    body = fetch(attempt, query, limit)
    with attempt.parse():
        hits = []
        for hit in json.loads(body)["hits"]:
            link = hit.get("link", hit.get("url"))
            if link is None:
                raise bad_answer("link")
            hits.append({"title": hit["title"], "url": link})
        return hits
