"""The sample application's CRM client (docs/guide/handlers.md): a stand-in that
answers 429 once for account 7, 503 once for account 8, else 200."""

from __future__ import annotations

import os
import tempfile


class Response:
    def __init__(self, status: int, retry_after: float = 0.0) -> None:
        self.status = status
        self.retry_after = retry_after

    def json(self) -> dict[str, int]:
        return {"synced": 1}


def push(account: int) -> Response:
    flag = os.path.join(tempfile.gettempdir(), f"forq-docs-crm-{os.getuid()}-{account}")
    if account in (7, 8) and not os.path.exists(flag):
        open(flag, "w").close()
        return Response(429, 0.5) if account == 7 else Response(503)
    if os.path.exists(flag):
        os.unlink(flag)
    return Response(200)
