"""The sample application's payments (docs/guide/steps.md): a stand-in charge."""


def charge(order_id: int) -> dict[str, str]:
    return {"id": f"ch_{order_id}"}
