"""Huge pages for the fork server's heap: what makes a big application cheap to fork.

A fork copies a page-table entry, and takes a reference, for every 4 KiB page of its
parent's private memory, and the child's exit drops them all again: a fork server that
holds an application's 300 MiB heap pays that for 77,000 pages per job (measured here:
fork+exit of a 300 MiB Python at 0.2-0.5× the rate of a 20 MiB one). Backed by 2 MiB
transparent huge pages, the same heap is 150 page-table entries.

Two steps, on unless `[supervisor].huge_pages = false`:

* The fork server is exec'd with glibc's `mmap_threshold` at its maximum (32 MiB) and
  `hugetlb=1` (`GLIBC_TUNABLES`, kept with any the environment already has). CPython's
  allocator takes its memory in 1 MiB mappings ("arenas"), placed one below the other;
  glibc, by default, maps its own blocks of 128 KiB and more (a big list's or dict's
  table) in between, so the arenas rarely form the aligned 2 MiB runs a huge page
  needs (measured: 78% of a 300 MiB heap could be collapsed, 40% of a Django app's).
  With the threshold up, those blocks come from glibc's heap instead, and nearly all
  of the arenas form such runs (98%); `hugetlb=1` puts glibc's heap on huge pages as
  it grows. Python's allocator stays: PYTHONMALLOC=malloc would cover the heap too,
  but measured 6-38% slower on a handler's allocation-heavy code, and these two
  tunables within 2% either way (the README has the figures).
* Once the handler modules are imported and the heap frozen, it asks the kernel to
  move each aligned 2 MiB run of its private anonymous memory onto a huge page
  (madvise MADV_HUGEPAGE, then MADV_COLLAPSE: Linux 6.1 or later).

Where the kernel offers no transparent huge pages
(/sys/kernel/mm/transparent_hugepage/enabled is "never", or absent), neither is done;
`report` says what took effect, for the supervisor's start-up line.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
HUGE = 2 << 20  # a PMD-sized transparent huge page on x86-64 and arm64 (4 KiB pages)
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25  # Linux 6.1
# glibc's tunables for the fork server (glibc ignores those it does not know: hugetlb
# needs 2.35); 32 MiB is the largest mmap_threshold glibc takes on 64-bit
TUNABLES = {"glibc.malloc.mmap_threshold": "33554432", "glibc.malloc.hugetlb": "1"}


def thp_mode() -> str:
    """The kernel's transparent huge page setting: "always", "madvise", "never", or ""
    when this kernel has none (or does not say)."""
    try:
        with open(THP_ENABLED) as f:
            text = f.read()
    except OSError:
        return ""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return ""


def offered() -> bool:
    """Whether the kernel offers transparent huge pages to a process that asks."""
    return thp_mode() in ("always", "madvise")


def exec_env(env: Mapping[str, str]) -> dict[str, str]:
    """The fork server's environment: `env` with `TUNABLES` added to GLIBC_TUNABLES
    (the environment's own tunables kept, ours winning), where huge pages are offered."""
    out = dict(env)
    if not offered():
        return out
    kept = [t for t in out.get("GLIBC_TUNABLES", "").split(":")
            if t and t.split("=", 1)[0] not in TUNABLES]
    out["GLIBC_TUNABLES"] = ":".join([*kept, *(f"{k}={v}" for k, v in TUNABLES.items())])
    return out


def _aligned_anonymous_runs(maps: str = "/proc/self/maps") -> list[tuple[int, int]]:
    """(start, length) of each 2 MiB-aligned run inside our private, writable,
    anonymous mappings (the brk heap included): what a huge page can back."""
    runs = []
    with open(maps) as f:
        for line in f:
            fields = line.split()
            if fields[1] != "rw-p" or (len(fields) > 5 and fields[5] != "[heap]"):
                continue
            low, high = (int(x, 16) for x in fields[0].split("-"))
            start = (low + HUGE - 1) & ~(HUGE - 1)
            end = high & ~(HUGE - 1)
            if end - start >= HUGE:
                runs.append((start, end - start))
    return runs


def _madvise() -> Callable[..., int] | None:
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def collapse() -> str:
    """Move our heap's aligned runs onto huge pages, now; "" if that worked, for at
    least part of it, else why not."""
    if not offered():
        return "the kernel offers no transparent huge pages"
    madvise = _madvise()
    if madvise is None:
        return "no madvise in this C library"
    try:
        runs = _aligned_anonymous_runs()
    except OSError as exc:
        return f"cannot read /proc/self/maps ({exc.strerror})"
    why = "no 2 MiB-aligned run of memory to put on huge pages"
    collapsed, refused = 0, 0
    for start, length in runs:
        # MADV_HUGEPAGE first: under "madvise" it is what makes a region eligible, and
        # it stays so (khugepaged may collapse again what a copy-on-write split)
        if madvise(start, length, MADV_HUGEPAGE) != 0:
            why = f"madvise(MADV_HUGEPAGE): {os.strerror(ctypes.get_errno())}"
            continue
        if madvise(start, length, MADV_COLLAPSE) == 0:
            collapsed += 1
            continue
        errno = ctypes.get_errno()
        if errno == 22:  # EINVAL: a region that may not have them (a thread's stack), or
            refused += 1  # a kernel without MADV_COLLAPSE, if every region says so
        else:  # EAGAIN/ENOMEM: no free huge page for some of it
            why = f"madvise(MADV_COLLAPSE): {os.strerror(errno)}"
    if collapsed:
        return ""
    if refused and refused == len(runs):
        return "no MADV_COLLAPSE (Linux 6.1 or later)"
    return why


def huge_bytes(rollup: str = "/proc/self/smaps_rollup") -> tuple[int, int]:
    """(bytes on transparent huge pages, resident anonymous bytes) of this process."""
    huge = anon = 0
    try:
        with open(rollup) as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    huge = int(line.split()[1]) * 1024
                elif line.startswith("Anonymous:"):
                    anon = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return huge, anon


def report(enabled: bool, problem: str) -> str:
    """One phrase for the start-up line: what is on huge pages, or why nothing is."""
    if not enabled:
        return "huge pages off ([supervisor].huge_pages = false)"
    if not offered():
        return f"no huge pages: the kernel offers none ({THP_ENABLED}: {thp_mode() or 'absent'})"
    huge, anon = huge_bytes()
    if huge == 0:
        return f"no huge pages ({problem or 'none collapsed'})"
    return (f"{huge >> 20} of {anon >> 20} MiB of its memory on huge pages "
            f"(transparent huge pages: {thp_mode()})")
