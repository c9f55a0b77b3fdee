"""One source for every job default (forq.defaults): the Lua scripts' fallbacks and the
supervisor's must agree with it."""

from __future__ import annotations

import re

from forq.defaults import ENQUEUE, JOB_POLICY, POLICY_KEYS
from forq.store.scripts import TRANSITIONS, source
from forq.supervisor.config.load import BUILTIN_POLICY

# a script's fallback for a job field it finds missing: num_field(jkey, 'name', default),
# or a `name = default` entry of job_limits(prefix, jkey, {...}) (limits a policy may set)
_FALLBACK = re.compile(r"num_field\(\w+, '(\w+)', ([0-9.]+)\)")
_LIMITS = re.compile(r"job_limits\(\w+, \w+, \{([^}]*)\}\)")
_ENTRY = re.compile(r"(\w+) = ([0-9.]+)")


def _fallbacks(text: str) -> list[tuple[str, str]]:
    found = _FALLBACK.findall(text)
    for entries in _LIMITS.findall(text):
        found += _ENTRY.findall(entries)
    return found


def test_every_lua_fallback_is_the_default_of_forq_defaults():
    found = {}
    for name in TRANSITIONS:
        for field, value in _fallbacks(source(name)):
            if field in JOB_POLICY:
                found[field] = float(value)
                assert float(value) == JOB_POLICY[field], (name, field, value)
    ttl = re.search(r"DEFAULT_RESULT_TTL_MS = (\d+)", source("ack"))
    assert ttl and int(ttl.group(1)) == JOB_POLICY["result_ttl_ms"]
    # the test reads real fallbacks (it fails if the pattern stops matching them)
    assert {"max_attempts", "backoff_base_ms", "backoff_max_ms", "backoff_jitter"} <= set(found)


def test_the_enqueue_script_stores_every_policy_key_a_producer_may_set():
    """A policy row with the enqueue scope is an option of enqueue (forq.payload) and a
    field the enqueue script copies into the job: the Lua list must name each one."""
    listed = re.search(r"local OPTION_FIELDS = \{([^}]*)\}", source("enqueue"))
    assert listed
    fields = set(re.findall(r"'(\w+)'", listed.group(1)))
    per_job = {key.field for key in POLICY_KEYS if ENQUEUE in key.scopes}
    assert per_job <= fields
    assert (set(JOB_POLICY) - per_job) & fields == set()  # idempotency_ttl: config only


def test_the_config_starts_from_forq_defaults():
    assert BUILTIN_POLICY is JOB_POLICY


def test_the_version_supervisors_register_is_the_package_version():
    import sys

    from forq.supervisor.redis_io.roster import VERSION
    from tests.supervisors import REPO

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert VERSION == project["version"]
