"""``search_docs`` as it was before the docs service renamed ``url`` to ``link``: every answer
of the renamed service fails its parse stage (``PARSE``, ``bad_answer``)."""

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
            if "url" not in hit:
                raise bad_answer("url")
            hits.append({"title": hit["title"], "url": hit["url"]})
        return hits
