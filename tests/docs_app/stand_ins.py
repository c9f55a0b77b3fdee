"""Handlers for the tasks the documentation's samples enqueue without showing them.

tests/test_docs.py's supervisors import this module first, then the page's own
handler files, so a handler a page shows replaces its stand-in here.
"""

from __future__ import annotations

from typing import Any

from forq import task

STAND_INS = (
    "emails.send", "emails.welcome", "reports.build", "otp.send", "images.resize",
    "images.index", "images.upload", "images.thumbs", "pdf.render", "albums.publish",
    "albums.report", "albums.cleanup", "billing.sync", "payments.capture",
)


def _done(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


for _name in STAND_INS:
    task(_name)(_done)
