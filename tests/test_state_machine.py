"""lua/README.md's state diagram against the scripts, so neither drifts from the other.

Each script's header declares its arrows (`Transitions: a -> b, ...`); the README's
mermaid block must draw exactly their union, label each arrow with exactly the scripts
that declare it, and name only (and all) the states of `forq.job.STATES`. The headers
are in turn checked against the code: the states a script writes (`'state', 'X'` in its
own code or in the helpers of lua/includes/ it calls, transitively) are exactly the targets it
declares, so a new write of the state field without a header line fails here.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from forq.job import STATES
from forq.store.transitions import TRANSITIONS

LUA = Path(__file__).resolve().parent.parent / "lua"  # the sources, as in the repo
NOWHERE = "[*]"  # no job yet (left of an arrow), no record any more (right)
Edge = tuple[str, str]

_ARROW = re.compile(r"^\s*(\[\*\]|\w+)\s*-->\s*(\[\*\]|\w+)\s*(?::\s*(.*))?$")
# a write of the state field: in an HSET or a field list ('state', 'active'), or in
# fields built one table.insert at a time (enqueue_one); reads (HGET/HMGET) are skipped
_STATE_WRITE = re.compile(r"'state'\)?\s*,?\s*(?:table\.insert\(\w+,\s*)?'(\w+)'")


def scripts() -> list[str]:
    return sorted(p.stem for p in LUA.glob("*.lua") if not p.stem.startswith("_"))


def _split_header(name: str) -> tuple[str, str]:
    text = (LUA / f"{name}.lua").read_text()
    header, _, code = text.partition("]]")
    return header, code


@cache
def declared(name: str) -> frozenset[Edge]:
    """The arrows a script's header declares on its `Transitions:` lines."""
    header, _ = _split_header(name)
    lines = re.findall(r"^\s*Transitions:\s*(.+)$", header, re.MULTILINE)
    assert lines, f"lua/{name}.lua: its header has no 'Transitions:' line (see lua/README.md)"
    edges = set()
    for line in lines:
        if line.strip() == "none":
            continue
        for part in line.split(","):
            ends = [s.strip() for s in part.split("->")]
            assert len(ends) == 2 and all(ends), \
                f"lua/{name}.lua: {part.strip()!r} is not 'state -> state'"
            edges.add((ends[0], ends[1]))
    return frozenset(edges)


def _code_without_reads(code: str) -> str:
    lines = [re.sub(r"--.*", "", line) for line in code.splitlines()]
    return "\n".join(line for line in lines if "HGET" not in line and "HMGET" not in line)


@cache
def _helpers() -> dict[str, str]:
    """The top-level functions of lua/includes/*.lua: name -> body. A script can call
    only those it includes (tests/test_lua_includes.py), so following a call by name
    follows what the script carries."""
    helpers = {}
    for path in sorted((LUA / "includes").glob("*.lua")):
        text = path.read_text().partition("]]")[2]
        # `local function f` and `f = function` (a helper declared earlier, defined later)
        pieces = re.split(r"^(?:local function (\w+)|(\w+) = function)", text,
                          flags=re.MULTILINE)
        helpers.update({pieces[i] or pieces[i + 1]: pieces[i + 2]
                        for i in range(1, len(pieces), 3)})
    return helpers


def _writes(code: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """States written by `code` itself or by the helpers it calls."""
    states = set(_STATE_WRITE.findall(_code_without_reads(code)))
    for helper, body in _helpers().items():
        if helper not in seen and re.search(rf"\b{helper}\(", code):
            states |= _writes(body, seen | {helper})
    return states


@cache
def diagram() -> dict[Edge, frozenset[str]]:
    """The README's mermaid arrows, each with the script names of its label."""
    text = (LUA / "README.md").read_text()
    blocks = re.findall(r"```mermaid\n(.*?)```", text, re.DOTALL)
    assert len(blocks) == 1, "lua/README.md must hold exactly one mermaid block"
    edges: dict[Edge, frozenset[str]] = {}
    for line in blocks[0].splitlines()[1:]:  # past "stateDiagram-v2"
        if not line.strip():
            continue
        m = _ARROW.match(line)
        assert m, f"lua/README.md: {line.strip()!r} is not 'a --> b: scripts'"
        edge = (m[1], m[2])
        assert edge not in edges, f"lua/README.md draws {edge} twice"
        edges[edge] = frozenset(re.findall(r"\w+", m[3] or ""))
    return edges


def test_every_script_is_a_transition_and_declares_its_arrows():
    assert set(scripts()) == set(TRANSITIONS)
    for name in scripts():
        declared(name)  # each has a well-formed Transitions: line


def test_the_diagram_draws_exactly_the_declared_arrows():
    union = {edge for name in scripts() for edge in declared(name)}
    drawn = set(diagram())
    assert drawn - union == set(), "drawn in lua/README.md, declared by no script header"
    assert union - drawn == set(), "declared by a script header, missing in lua/README.md"


def test_each_arrow_is_labelled_with_the_scripts_that_take_it():
    for edge, label in diagram().items():
        takers = {name for name in scripts() if edge in declared(name)}
        assert label == takers, f"lua/README.md: {edge[0]} --> {edge[1]} should say {sorted(takers)}"


def test_the_diagram_names_every_state_and_no_other():
    named = {end for edge in diagram() for end in edge} - {NOWHERE}
    assert named == set(STATES)


@pytest.mark.parametrize("name", scripts())
def test_a_header_declares_exactly_the_states_its_code_writes(name):
    _, code = _split_header(name)
    targets = {b for _, b in declared(name)} - {NOWHERE}
    written = _writes(code)
    assert written == targets, \
        f"lua/{name}.lua writes states {sorted(written)}, its header declares {sorted(targets)}"


def test_the_checker_sees_writes_through_helpers():
    """The code check must be able to fail: release writes nothing itself, its helpers do."""
    _, code = _split_header("release")
    assert "'state'" not in code
    assert _writes(code) == {"pending", "cancelled", "scheduled", "dead"}  # + its links
    assert _writes("redis.call('HSET', k, 'state', 'waiting')") == {"waiting"}
    assert _writes("local f = redis.call('HMGET', k, 'state', 'token')") == set()
