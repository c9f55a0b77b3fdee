"""A job list's filters on the dashboard: task, error (a regular expression), since,
before, argument text and group, read from the query string of a list page and from
the form of its bulk actions, and the filtered page itself.

Filtering walks the list's set a bounded page at a time (`forq.store.finder`): a page
of matches may be short, and goes on from a cursor (the "more" link), never from an
offset; it costs the same however large the set. The filters are checked by
`JobFilter`, whose refusal (a bad pattern, a duration that is not one) is the page's
error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import redis

from forq import Queue
from forq.web import data

# the query parameter -> the JobFilter field
FIELDS = {"task": "task", "error": "error", "since": "since", "before": "before",
          "args": "args_contains", "group": "group"}
FILTERABLE = ("pending", "scheduled", "waiting", "active", "dead")  # lists with filters


def filters_of(params: Mapping[str, str]) -> dict[str, str]:
    """The filters given (non-empty), as `Queue.find` takes them."""
    return {FIELDS[name]: str(params[name]).strip() for name in FIELDS
            if str(params.get(name) or "").strip()}


def query_of(filters: Mapping[str, str]) -> str:
    """The filters back as a query string (for the "more" link)."""
    by_field = {v: k for k, v in FIELDS.items()}
    return urlencode({by_field[name]: value for name, value in filters.items()})


def filtered_page(client: redis.Redis, queue: str, state: str, filters: Mapping[str, str],
                  cursor: str | None) -> dict[str, Any]:
    """One page of the jobs in `state` that pass `filters`, from `cursor` on: its rows
    (as `data.rows` has them), the cursor of the next page, and what was examined."""
    page = Queue(queue, redis=client).find(state, cursor=cursor or None, count=data.PAGE_SIZE,
                                           **filters)
    entries = [(r["id"], float(r["score"])) for r in page.records]
    return {"rows": data.rows(client, queue, entries), "cursor": page.cursor,
            "examined": page.examined, "gone": page.gone}
