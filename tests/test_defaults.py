"""One source for every job default (forq.defaults): the Lua scripts' fallbacks and the
supervisor's must agree with it."""

from __future__ import annotations

import re

from forq.defaults import JOB_POLICY
from forq.scripts import TRANSITIONS, source
from forq.supervisor.config import BUILTIN_POLICY

# a script's fallback for a job field it finds missing: num_field(jkey, 'name', default)
_FALLBACK = re.compile(r"num_field\(\w+, '(\w+)', ([0-9.]+)\)")


def test_every_lua_fallback_is_the_default_of_forq_defaults():
    found = {}
    for name in TRANSITIONS:
        for field, value in _FALLBACK.findall(source(name)):
            if field in JOB_POLICY:
                found[field] = float(value)
                assert float(value) == JOB_POLICY[field], (name, field, value)
    ttl = re.search(r"DEFAULT_RESULT_TTL_MS = (\d+)", source("ack"))
    assert ttl and int(ttl.group(1)) == JOB_POLICY["result_ttl_ms"]
    # the test reads real fallbacks (it fails if the pattern stops matching them)
    assert {"max_attempts", "backoff_base_ms", "backoff_max_ms", "backoff_jitter"} <= set(found)


def test_the_config_starts_from_forq_defaults():
    assert BUILTIN_POLICY is JOB_POLICY


def test_the_version_supervisors_register_is_the_package_version():
    import sys

    from forq.supervisor.registry import VERSION
    from tests.supervisors import REPO

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert VERSION == project["version"]
