"""The configuration's schema: one row per key, from which the rest comes.

A row (`Key`) is a key's name, its reader (the kind of value, checked, in
`fields.Reader`), its default as the TOML would write it, the tables it is allowed in
and one line of doc. The rows of a table that fills a dataclass are that dataclass's
fields, each declared with `key()`::

    prefetch: int = key(0, read.integers(0, MAX_PREFETCH), "Jobs leased ahead of ...")

so a new `[[queue]]` option is that one line plus the code that uses it: the loader
reads it (`read_rows`: unknown and missing keys, and the "expected …" errors, come from
the rows), the dataclass has it, typed for mypy, with its default read from the TOML
form, and the reference page (`python -m forq.supervisor.config.reference`) documents
it. The job policy's rows live in `forq.defaults` (the producer needs them too, and
jobs/ never imports the supervisor); `policy_rows` gives them their readers here.
Tables that fill no dataclass of their own write their rows as `Key(...)` directly.

Like gunicorn's `Setting` classes, a row is the whole truth about its key; unlike them,
the settings stay attributes of plain frozen dataclasses, so mypy checks every use.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from forq.defaults import POLICY_KEYS, PolicyKey
from forq.supervisor.config import fields as read


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # a key's default when the table must have it


@dataclass(frozen=True)
class Key:
    """One configuration key: everything the loader, the dataclass and the docs need."""

    name: str  # as written in the TOML; "backoff.base" is `base` inside `backoff = {...}`
    reader: read.Reader  # the value, checked, as the program uses it
    default: Any  # as the TOML writes it ("15s"); REQUIRED; None: unset unless given
    doc: str  # one line for the reference page
    scopes: tuple[str, ...] = ()  # the tables it may be set in: "[[queue]]", "enqueue", …
    attr: str = ""  # the dataclass attribute (or job policy field) it fills
    shown: str = ""  # the default as the reference page says it, when it is computed


@dataclass(frozen=True)
class Table:
    """A table of the TOML and its rows, in the order the reference page lists them."""

    title: str  # "[supervisor]", "[[queue]]", '[tasks."name"]'
    doc: str
    rows: tuple[Key, ...]

    @property
    def top(self) -> str:
        """Its key in the document: "queue" for [[queue]], "sandbox" for [sandbox.tasks]."""
        return self.title.strip("[]").partition(".")[0]


def key(default: Any, reader: read.Reader, doc: str, *, scope: str = "", name: str = "",
        factory: Callable[[], Any] | None = None, shown: str = "") -> Any:
    """A dataclass field that is also the row of its key.

    `default` is written as in the TOML and read by `reader` for the field's default
    (REQUIRED: the field has none; None: it is None). `scope` names the table when the
    class gathers keys of several; `name` the key when it is not the attribute's name;
    `factory` computes a default the TOML cannot write (`shown` says it in the docs).
    """
    row = Key(name, reader, default, doc, (scope,) if scope else (), shown=shown)
    metadata = {"key": row}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    if default is REQUIRED:
        return dataclasses.field(metadata=metadata)
    if default is None:
        return dataclasses.field(default=None, metadata=metadata)
    value = reader(default, f"the default of {name or 'a key'}")
    if isinstance(value, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: copy.copy(value), metadata=metadata)
    return dataclasses.field(default=value, metadata=metadata)


def rows(cls: type, scope: str) -> tuple[Key, ...]:
    """The rows of `scope` declared as `cls`'s fields, each with its name and attribute."""
    found = []
    for field in dataclasses.fields(cls):
        row = field.metadata.get("key")
        if row is None or (row.scopes and scope not in row.scopes):
            continue
        found.append(dataclasses.replace(row, name=row.name or field.name, attr=field.name,
                                         scopes=row.scopes or (scope,)))
    return tuple(found)


def _policy_reader(policy: PolicyKey) -> read.Reader:
    if policy.kind == "duration":
        return read.milliseconds(positive=policy.positive)
    if policy.kind == "size":
        return read.sizes(minimum=int(policy.minimum))
    if policy.kind == "integer":
        return read.integers(int(policy.minimum))
    if policy.kind == "boolean":  # stored as 1/0: the policy a claim stores holds numbers
        return read.Reader("true or false", lambda value, where: int(read.boolean(value, where)))
    return read.numbers(policy.minimum, policy.maximum)


POLICY: tuple[Key, ...] = tuple(
    Key(p.name, _policy_reader(p), p.default, p.doc, p.scopes, attr=p.field)
    for p in POLICY_KEYS
)


def policy_rows(scope: str) -> tuple[Key, ...]:
    """The job policy's keys that `scope` ("[defaults]", "[[queue]]", …) may set."""
    return tuple(row for row in POLICY if scope in row.scopes)


# --------------------------------------------------------------------------
# Reading a table by its rows


def _heads(rows: Sequence[Key]) -> dict[str, list[Key]]:
    """Rows by the key they sit under: "backoff" holds backoff.base, backoff.max, …"""
    heads: dict[str, list[Key]] = {}
    for row in rows:
        heads.setdefault(row.name.partition(".")[0], []).append(row)
    return heads


def check(table: Mapping[str, Any], rows: Sequence[Key], where: str) -> None:
    """Refuse a key no row names (suggesting the closest), then a missing required one."""
    read.check_keys(table, tuple(_heads(rows)), where)
    for row in rows:
        if row.default is REQUIRED and row.name not in table:
            raise read.Invalid(f"{where}: missing required key {row.name}")


def values(table: Mapping[str, Any], rows: Sequence[Key], where: str) -> dict[str, Any]:
    """The keys of `rows` present in `table`, each read by its row: {attribute: value}.
    Absent keys are left out (the dataclass, or the policy below, has the default)."""
    out: dict[str, Any] = {}
    for head, group in _heads(rows).items():
        if head not in table:
            continue
        here = f"{where}.{read.toml_key(head)}" if where else head
        if len(group) == 1 and group[0].name == head:
            out[group[0].attr] = group[0].reader(table[head], here)
            continue
        inner = [dataclasses.replace(row, name=row.name.partition(".")[2]) for row in group]
        sub = read.table(table[head], here)
        check(sub, inner, here)
        out.update(values(sub, inner, here))
    return out


def read_rows(table: Mapping[str, Any], rows: Sequence[Key], where: str) -> dict[str, Any]:
    """`check` then `values`: a table that holds only these rows, read."""
    check(table, rows, where)
    return values(table, rows, where)
