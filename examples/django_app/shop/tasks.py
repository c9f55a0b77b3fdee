"""The shop's handlers. The supervisor imports this module (``imports = ["shop.tasks"]``)
without setting Django up: a handler gets what it needs in its arguments."""

from __future__ import annotations

from forq import current, task


@task("shop.send_receipt")
def send_receipt(order_id: int, email: str) -> str:
    # a real handler would send mail here; the result is what `forq job ID` shows
    return f"receipt for order {order_id} sent to {email} (job {current().id})"
