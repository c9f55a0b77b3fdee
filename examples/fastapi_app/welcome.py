"""The example's handler, an `async def` one: the supervisor imports this module
(``imports = ["welcome"]``) and runs each job in its own child with a fresh loop."""

from __future__ import annotations

import asyncio

from forq import current, task


@task("welcome.send")
async def send_welcome(email: str) -> str:
    await asyncio.sleep(0)  # stands for an async mail client
    return f"welcome mail to {email} (job {current().id})"
