"""The config schema is the one source of every key: the reference page, etc/forq.toml,
the dataclasses and the producer's options agree with its rows."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest

from forq.defaults import DEFAULTS, ENQUEUE, JOB_POLICY, POLICY_KEYS
from forq.payload import OPTIONS
from forq.supervisor.config import fields as read
from forq.supervisor.config import schema
from forq.supervisor.config.load import (
    TABLES,
    QueueConfig,
    SandboxConfig,
    ScheduleConfig,
    load_config,
)
from forq.supervisor.config.reference import render, section
from forq.supervisor.config.schema import POLICY, Table, key
from forq.supervisor.observe.tracing import TracingConfig

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "etc" / "forq.toml"
PAGE = REPO / "docs" / "configuration.md"
# a commented-out example in etc/forq.toml: "# key = value" or "# [table]"
_COMMENTED = re.compile(r"^# ?(\[.*\]|[A-Za-z_][\w.\"-]* *= *\S.*)$")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def uncommented(text: str) -> str:
    """etc/forq.toml with its commented-out examples switched on."""
    return "\n".join(
        match.group(1) if (match := _COMMENTED.match(line)) else line
        for line in text.splitlines()
    )


def tables_in(doc: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The tables of a parsed config that `title` ("[[queue]]", '[tasks."name"]') names."""
    if title == '[sandbox.tasks."name"]':
        return list(doc.get("sandbox", {}).get("tasks", {}).values())
    if title == '[tasks."name"]':
        return list(doc.get("tasks", {}).values())
    value = doc.get(title.strip("[]"), [])
    return value if isinstance(value, list) else [value]


def keys_set(doc: dict[str, Any], table: Table) -> set[str]:
    """The keys `doc` sets in `table`'s tables, a sub-table's as "backoff.base"."""
    names = {row.name for row in table.rows}
    found = set()
    for item in tables_in(doc, table.title):
        for name, value in item.items():
            if isinstance(value, dict) and any(n.startswith(f"{name}.") for n in names):
                found.update(f"{name}.{inner}" for inner in value)
            else:
                found.add(name)
    return found


# -- the reference page ---------------------------------------------------------


def test_the_committed_reference_page_is_the_generators_output():
    out = subprocess.run([sys.executable, "-m", "forq.supervisor.config.reference"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out == render()
    assert PAGE.read_text(encoding="utf-8") == out, (
        "docs/configuration.md is stale: python -m forq.supervisor.config.reference "
        "> docs/configuration.md")


def test_the_page_documents_every_row_once():
    page = render()
    for table in TABLES:
        assert f"## `{table.title}`" in page
        for row in table.rows:
            if table.title == DEFAULTS or row not in POLICY:
                assert f"| `{row.name}` | {row.reader.what} |" in page, (table.title, row.name)


def test_every_row_has_one_line_of_doc():
    for table in TABLES:
        for row in table.rows:
            assert row.doc.endswith(".") and "\n" not in row.doc, (table.title, row.name)
            assert len(row.doc) <= 100, (table.title, row.name, len(row.doc))
            assert row.scopes and (table.title in row.scopes), (table.title, row.name)


# -- etc/forq.toml --------------------------------------------------------------


def test_every_key_in_etc_forq_toml_is_a_row_of_its_table():
    doc = tomllib.loads(uncommented(EXAMPLE.read_text(encoding="utf-8")))
    assert set(doc) <= {table.top for table in TABLES}
    for table in TABLES:
        extra = keys_set(doc, table) - {row.name for row in table.rows}
        assert not extra, (table.title, extra)


def test_every_row_has_an_example_in_etc_forq_toml():
    """Each key is shown in the example config (commented out when it is not what the
    demo uses); the job policy's keys once, in [defaults]."""
    doc = tomllib.loads(uncommented(EXAMPLE.read_text(encoding="utf-8")))
    for table in TABLES:
        wanted = {row.name for row in table.rows
                  if table.title == DEFAULTS or row not in POLICY}
        missing = wanted - keys_set(doc, table)
        assert not missing, f"etc/forq.toml has no example of {table.title} {sorted(missing)}"


def test_the_commented_examples_in_etc_forq_toml_are_valid(tmp_path):
    text = uncommented(EXAMPLE.read_text(encoding="utf-8"))
    try:
        pwd.getpwnam("nobody")
    except KeyError:  # pragma: no cover - a machine without the user
        text = text.replace('run_as = "nobody"', f'run_as = "{pwd.getpwuid(os.getuid()).pw_name}"')
    path = tmp_path / "forq.toml"
    path.write_text(text, encoding="utf-8")
    # the password comes from the environment, so the example's password_file is not read
    config = load_config(path, env={"FORQ_REDIS_PASSWORD": "x"})
    assert config.sandbox.require and config.sandbox.task_network == {"images.fetch": "host"}


# -- the rows and what they make ------------------------------------------------


def test_every_field_of_a_table_dataclass_is_a_row():
    """A field without a row would be an attribute the TOML cannot set."""
    derived = {ScheduleConfig: {"every"}}  # worked out from cron
    for cls in (QueueConfig, SandboxConfig, ScheduleConfig, TracingConfig):
        plain = {f.name for f in fields(cls) if "key" not in f.metadata}
        assert plain == derived.get(cls, set()), cls


def test_the_job_policy_defaults_are_the_rows_defaults_as_the_config_reads_them():
    # forq.defaults converts each TOML default by forq.units, the config by its readers
    assert {row.attr: row.reader(row.default, row.name) for row in POLICY} == JOB_POLICY
    assert [row.attr for row in POLICY] == [policy.field for policy in POLICY_KEYS]


def test_the_producers_policy_options_are_the_rows_set_per_job():
    per_job = {p.name.partition(".")[0] for p in POLICY_KEYS if ENQUEUE in p.scopes}
    assert per_job <= OPTIONS
    assert "idempotency_ttl" not in OPTIONS  # a row without the enqueue scope
    assert {"timeout", "backoff", "max_crashes"} <= per_job


def test_a_new_row_is_read_checked_defaulted_and_documented():
    """What adding a [[queue]] option takes: one field declared with key()."""

    @dataclass(frozen=True)
    class WithBurst(QueueConfig):
        burst: int = key(3, read.integers(1, 9), "Jobs started at once after a pause.")

    rows = schema.rows(WithBurst, "[[queue]]")
    base = {"name": "q", "concurrency": 1}
    assert WithBurst(**schema.read_rows(base, rows, "[queue 1]")).burst == 3
    assert WithBurst(**schema.read_rows({**base, "burst": 5}, rows, "[queue 1]")).burst == 5
    with pytest.raises(read.Invalid) as info:
        schema.read_rows({**base, "burst": 0}, rows, "[queue 1]")
    assert str(info.value) == "[queue 1].burst: expected an integer from 1 to 9, got 0"
    with pytest.raises(read.Invalid) as info:
        schema.read_rows({**base, "burts": 5}, rows, "[queue 1]")
    assert str(info.value) == "unknown key [queue 1].burts (did you mean burst?)"
    page = section(Table("[[queue]]", "", rows))
    assert ("| `burst` | an integer from 1 to 9 | `3` | Jobs started at once after a pause. |"
            in page)
