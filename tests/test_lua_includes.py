"""Each Lua file includes exactly the helper files it uses (lua/README.md, "Includes").

Read from the sources, no Redis. The rule is direct: a script or an include file that
calls (or reads) a name defined in `lua/includes/X.lua` says ``--@include includes/X``
itself; that X's own includes come along does not count, since they go the day X stops
needing them. And a file includes no file none of whose names it uses. A name a file
declares ``local`` itself is its own (claim's ``local held = 0`` is not fencing's
`held`). Every function a file calls is a Lua or Redis builtin, its own, or a helper,
so a helper defined in no file fails too. The loader (`forq.store.scripts.expand`) is
checked here as well: transitive, each file once, in dependency order.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from forq.store.scripts import _INCLUDE, expand, source
from forq.store.transitions import TRANSITIONS

LUA = Path(__file__).resolve().parent.parent / "lua"  # the sources, as in the repo

# comments and strings, blanked before looking for names
_NOT_CODE = re.compile(r"--\[(=*)\[.*?\]\1\]|--[^\n]*|\[(=*)\[.*?\]\2\]"
                       r"|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"", re.DOTALL)
# what an include file defines, at the top level: `local function f`, `local X = ...`,
# `local f` (declared first) and `f = function` (defined later)
_DEFINES = re.compile(r"^(?:local function (\w+)|local (\w+)\b(?!\s*,)|(\w+) = function)",
                      re.MULTILINE)
_LOCALS = re.compile(r"\blocal\s+(?:function\s+)?(\w+(?:\s*,\s*\w+)*)")
_CALL = re.compile(r"(?<![.:\w])([A-Za-z_]\w*)\s*\(")
BUILTINS = frozenset({
    # keywords that a '(' may follow
    "and", "elseif", "function", "if", "in", "local", "not", "or", "return", "until",
    "while",
    # the Lua 5.1 globals Redis leaves to scripts
    "assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall", "rawequal",
    "rawget", "rawset", "select", "setmetatable", "tonumber", "tostring", "type",
    "unpack", "xpcall",
})


def code(text: str) -> str:
    return _NOT_CODE.sub(" ", text)


def include_files() -> list[str]:
    return sorted(f"includes/{p.stem}" for p in (LUA / "includes").glob("*.lua"))


def all_files() -> list[str]:
    return sorted(TRANSITIONS) + include_files()


@cache
def text_of(name: str) -> str:
    return (LUA / f"{name}.lua").read_text()


def defines(text: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in _DEFINES.finditer(code(text))}


@cache
def defined_in() -> dict[str, str]:
    """Helper name -> the include file that defines it (each in exactly one)."""
    where: dict[str, str] = {}
    for name in include_files():
        for helper in defines(text_of(name)):
            assert helper not in where, \
                f"{helper} is defined in lua/{where[helper]}.lua and lua/{name}.lua"
            where[helper] = name
    return where


def own_names(text: str) -> set[str]:
    """Every name the file declares local, anywhere (its own, not a helper)."""
    return {n.strip() for m in _LOCALS.findall(code(text)) for n in m.split(",")}


def uses(text: str) -> set[str]:
    """The helpers (names defined by include files) the file itself uses."""
    words = set(re.findall(r"(?<![.:\w])([A-Za-z_]\w*)", code(text)))
    return (words & set(defined_in())) - own_names(text)


def problems(name: str, text: str) -> list[str]:
    """What breaks the include rule in file `name` (a path under lua/, no .lua)."""
    out = []
    if name.startswith("includes/") and not text.startswith(f"--[[\n  {name[9:]}: "):
        out.append(f"lua/{name}.lua: its header starts '--[[', then '  {name[9:]}: what it is'")
    included = _INCLUDE.findall(text)
    for inc in included:
        if not (LUA / f"{inc}.lua").is_file():
            out.append(f"lua/{name}.lua includes {inc}: no file lua/{inc}.lua")
    if len(set(included)) != len(included):
        out.append(f"lua/{name}.lua includes a file twice: {included}")
    used = uses(text)
    for helper in sorted(used):
        if defined_in()[helper] not in included:
            out.append(f"lua/{name}.lua uses {helper} (lua/{defined_in()[helper]}.lua) "
                       f"without --@include {defined_in()[helper]}")
    for inc in included:
        if (LUA / f"{inc}.lua").is_file() and not defines(text_of(inc)) & used:
            out.append(f"lua/{name}.lua includes {inc} but uses none of its names")
    mine = own_names(text)
    for called in sorted(set(_CALL.findall(code(text))) - BUILTINS - mine - set(defined_in())):
        out.append(f"lua/{name}.lua calls {called}, which no file defines")
    return out


@pytest.mark.parametrize("name", all_files())
def test_each_file_includes_exactly_what_it_uses(name):
    assert problems(name, text_of(name)) == []


def test_the_checker_fails_on_a_missing_or_an_unused_include():
    """The rule must be able to fail, on each of its clauses."""
    assert problems("x", "return now_ms()") == [
        "lua/x.lua uses now_ms (lua/includes/time.lua) without --@include includes/time"]
    assert problems("x", "--@include includes/time\nreturn 1") == [
        "lua/x.lua includes includes/time but uses none of its names"]
    # direct: history includes job, but a file calling job_key includes job itself
    assert problems("x", "--@include includes/history\n"
                         "add_history(p, i, 'e', 1)\nreturn job_key(p, i)") == [
        "lua/x.lua uses job_key (lua/includes/job.lua) without --@include includes/job"]
    # a constant read, not only a call; a comment or a string names nothing
    assert problems("x", "return DEFAULT_RESULT_TTL_MS")[0].startswith(
        "lua/x.lua uses DEFAULT_RESULT_TTL_MS")
    assert problems("x", "-- now_ms()\nreturn 'job_key(p, id)'") == []
    assert problems("x", "local held = 0\nreturn held") == []  # its own local
    assert problems("x", "return no_such_helper(1)") == [
        "lua/x.lua calls no_such_helper, which no file defines"]
    assert problems("x", "--@include includes/nope\nreturn 1")[0] == \
        "lua/x.lua includes includes/nope: no file lua/includes/nope.lua"


def test_every_helper_is_used_somewhere():
    """A helper no file uses (past its own definition) is dead code every caller of its
    file pays for."""
    mentions: dict[str, int] = {}
    for name in all_files():
        for word in re.findall(r"(?<![.:\w])([A-Za-z_]\w*)", code(text_of(name))):
            mentions[word] = mentions.get(word, 0) + 1
    forward = {"links_ended", "member_ended"}  # declared first, defined later: 2 mentions
    unused = {h for h in defined_in() if mentions[h] <= (2 if h in forward else 1)}
    assert unused == set()


@pytest.mark.parametrize("name", sorted(TRANSITIONS))
def test_a_script_declares_each_helper_once_before_any_use(name):
    """Expanded, each helper it carries is declared once (an include pasted once), on
    the line of its first mention (a Lua local exists from its declaration on)."""
    text = code(source(name))
    assert "--@include" not in source(name)
    reached, todo = set(), _INCLUDE.findall(text_of(name))
    while todo:
        inc = todo.pop()
        if inc not in reached:
            reached.add(inc)
            todo += _INCLUDE.findall(text_of(inc))
    carried = set().union(*(defines(text_of(inc)) for inc in reached))
    assert carried >= uses(text_of(name))
    for helper in carried:
        declared = re.findall(rf"^local (?:function )?{helper}\b", text, re.MULTILINE)
        if helper in own_names(text_of(name)):  # the script's own local of that name
            assert len(declared) == 2, f"{name}: {helper} is pasted {len(declared) - 1} times"
            continue
        assert len(declared) == 1, f"{name}: {helper} is declared {len(declared)} times"
        first = re.search(rf"(?<![.:\w]){helper}(?!\w)", text)
        assert first is not None
        line = text[text.rfind("\n", 0, first.start()) + 1:text.find("\n", first.start())]
        assert re.match(rf"local (?:function )?{helper}\b", line), \
            f"{name}: {helper} is used before its declaration: {line.strip()!r}"


def test_pause_carries_the_clock_alone():
    assert defines(source("pause")) == {"now_ms"}
    assert len(source("pause").splitlines()) < 100


def test_expand_is_transitive_once_each_in_dependency_order():
    files = {"s": "--@include a\n--@include b\nS\n", "a": "--@include c\nA\n",
             "b": "--@include c\n--@include a\nB\n", "c": "C\n"}
    assert expand("s", files.__getitem__).split() == ["C", "A", "B", "S"]


def test_expand_names_a_cycle_and_a_missing_file():
    files = {"s": "--@include a\n", "a": "--@include b\n", "b": "--@include a\n"}
    with pytest.raises(ValueError, match=r"^lua/b\.lua: include cycle a -> b -> a$"):
        expand("s", files.__getitem__)
    with pytest.raises(ValueError, match=r"^lua/s\.lua: --@include a: no file lua/a\.lua"):
        expand("s", {"s": "--@include a\n"}.__getitem__)


def test_the_readme_table_lists_each_include_file_and_its_includes():
    """lua/README.md's "Includes" table: a row per include file, naming its includes."""
    rows = re.findall(r"^\| `(\w+)` \| .* \|\s*([\w, ]*?)\s*\|$",
                      (LUA / "README.md").read_text(), re.MULTILINE)
    table = {f"includes/{name}": sorted(f"includes/{i.strip()}" for i in incs.split(",")
                                        if i.strip()) for name, incs in rows}
    actual = {name: sorted(_INCLUDE.findall(text_of(name))) for name in include_files()}
    assert table == actual
