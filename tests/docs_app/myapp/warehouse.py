"""The sample application's warehouse (docs/guide/steps.md): three items an order."""


def items(order_id: int) -> list[str]:
    return [f"{order_id}-{n}" for n in range(3)]


def pack(item: str) -> None:
    return None
