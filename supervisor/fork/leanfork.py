"""A fork without Python's after-fork work, where that work has nothing to do.

`os.fork()` runs, in the child, every hook registered with `os.register_at_fork`: the
standard library's threading module rebuilds its thread table, logging re-creates its
locks, random reseeds. In a process that only forks, that is most of what a child pays
for: measured in a fork server that preloads the benchmark's handlers (threading,
logging and random imported), a child that exits at once costs 1.15 ms of CPU and 234
page faults after `os.fork()`, 0.53 ms and 36 after a bare `fork()`: the hooks run
Python code whose every first write to an object copies its page. On a no-op job's
whole child the difference is 0.55–0.88 ms of CPU, a sixth to a quarter of it
(`python -m bench.childcost`, two runs).

So the fork server forks with libc's `fork()` (glibc still runs the C-level
`pthread_atfork` handlers of extension modules) when the hooks it skips are known to
have nothing to do, and does their one useful part itself (CPython 3.10–3.12 only:
`_find_fork`):

* threading's and logging's hooks repair what other threads held at the fork; with
  one thread there is nothing to repair (checked before each fork: a handler module's
  top-level code may have started one). So is most of CPython's own after-fork work
  (the GIL and the import lock re-made); a signal pending at the fork is handled in
  the child by the fork server's handler, which does nothing, at the child's first
  `signal.signal` (`child.detach`).
* random's reseeds the module's generator, or every job would draw the same numbers:
  `child_after_lean_fork` reseeds it.
* a lock's own methods as hooks (acquired before the fork, re-made in the child,
  released in the parent: `concurrent.futures.thread`'s shutdown lock, imported by
  Django and asyncio's users) keep another thread from holding the lock across the
  fork; with one thread there is none.

Any other hook (a library that restarts its worker thread in the child, asyncio's
loop reset on 3.12) means `os.fork()`: `watch_registrations` records each hook
registered from the fork server's start on, before the handler modules are imported
(what the fork server imported before registers only skippable ones: a test checks).
"""

from __future__ import annotations

import _thread
import ctypes
import os
import sys
import sysconfig
from collections.abc import Callable

# whose hooks a lean fork may skip: they only repair other threads' state, or (random)
# are done by `child_after_lean_fork`
_SKIPPABLE = frozenset({"threading", "logging", "random"})
# a lock's methods that make a hook of it (`_skippable`)
_LOCK_TYPES = (_thread.LockType, _thread.RLock)
_LOCK_HOOKS = frozenset({"acquire", "release", "_at_fork_reinit"})
_foreign_hooks: list[str] = []  # who registered a hook a lean fork would skip wrongly
_watching = False


def _find_fork() -> Callable[[], int] | None:
    """libc's fork(), where skipping CPython's own after-fork work is understood: CPython
    3.10–3.12 with its GIL (3.13 also re-makes its thread handles there, and a
    free-threaded build its allocator's state; neither is tested here)."""
    if (sys.implementation.name != "cpython" or not (3, 10) <= sys.version_info < (3, 13)
            or sysconfig.get_config_var("Py_GIL_DISABLED")):
        return None
    try:
        # PyDLL: the GIL stays held across the call, as it does across os.fork()
        fork = ctypes.PyDLL(None, use_errno=True).fork
    except (OSError, AttributeError):
        return None
    fork.restype = ctypes.c_int
    fork.argtypes = []
    return fork


_LIBC_FORK = _find_fork()


def watch_registrations() -> None:
    """From now on, note every at-fork hook registered and by which module (the fork
    server calls this before importing handler modules)."""
    global _watching
    if _watching:
        return
    _watching = True
    register = os.register_at_fork

    def recording(**hooks: Callable[[], object]) -> None:
        register(**hooks)
        for hook in hooks.values():
            if not _skippable(hook):
                module = getattr(hook, "__module__", None) or type(hook).__module__
                _foreign_hooks.append(f"{module}.{getattr(hook, '__qualname__', hook)!s}")

    os.register_at_fork = recording  # type: ignore[assignment]


def _skippable(hook: Callable[[], object]) -> bool:
    """Whether a lean fork may skip `hook` in a one-thread process: one of the modules
    in `_SKIPPABLE`, or a lock's acquire, release or re-make."""
    module = getattr(hook, "__module__", None) or type(hook).__module__
    if module in _SKIPPABLE:
        return True
    return (isinstance(getattr(hook, "__self__", None), _LOCK_TYPES)
            and getattr(hook, "__name__", "") in _LOCK_HOOKS)


def blocker() -> str:
    """Why a lean fork is not safe now ("" if it is)."""
    if _LIBC_FORK is None:
        return "not on this Python (CPython 3.10–3.12 only)"
    if not _watching:
        return "at-fork registrations not watched"
    if _foreign_hooks:
        return f"an at-fork hook of {_foreign_hooks[0]}"
    threads = _thread_count()
    if threads != 1:
        return f"{threads} threads"
    return ""


def _thread_count() -> int:
    """num_threads of /proc/self/stat, as `memory._stat` reads it (not imported: it
    brings psutil, which no fork server should carry); 0 if it cannot tell: not lean."""
    try:
        fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
        return int(stat.rsplit(b")", 1)[1].split()[17])
    except (OSError, ValueError, IndexError):
        return 0


def fork() -> int:
    """`os.fork()`, lean when `blocker()` finds nothing in the way."""
    if blocker():
        return os.fork()
    assert _LIBC_FORK is not None
    pid = _LIBC_FORK()
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    if pid == 0:
        child_after_lean_fork()
    return pid


def child_after_lean_fork() -> None:
    """What the skipped hooks did that still matters in a one-thread child."""
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
