"""The sample application's shipping (docs/guide/steps.md): a stand-in dispatch."""


def send(order_id: int, charge_id: str) -> dict[str, str]:
    return {"order": str(order_id), "paid_by": charge_id}
