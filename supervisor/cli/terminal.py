"""Where the CLI's human output goes: rich on a terminal, plain text anywhere else.

On a terminal (stdout a TTY, ``TERM`` not ``dumb``, ``NO_COLOR`` unset or empty) tables
are drawn by `rich`, a ``--watch`` view redraws in place with ``rich.live``, and long
operations show a progress bar (on stderr, when it is a terminal). Anywhere else — a
pipe, a file, cron, a test, or a terminal whose user set ``NO_COLOR`` — the output is
the plain text of `forq.supervisor.cli.render`, line for line what scripts have always
parsed, with no escape sequence at all (no colour, no cursor movement) and no progress
drawn. ``--json`` never comes here. rich is imported only on a terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

import redis

from forq.supervisor.cli.render import Grid

T = TypeVar("T")

NUMERIC = frozenset({"pending", "scheduled", "active", "dead", "ok/1m", "failed/1m",
                     "attempts", "crashes", "pid", "busy"})
STATE_STYLES = {"dead": "red", "failed/1m": "yellow", "ok/1m": "green"}


def interactive(stream: IO[str] | None = None) -> bool:
    """Whether `stream` (stdout) may get escape sequences: a terminal that is not dumb,
    and no ``NO_COLOR`` (https://no-color.org: set and not empty)."""
    if os.environ.get("NO_COLOR"):
        return False
    stream = sys.stdout if stream is None else stream
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def rich_table(grid: Grid, title: str | None = None) -> Any:
    from rich import box
    from rich.table import Table

    header, rows = grid
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", highlight=False)
    for name in header:
        table.add_column(name, justify="right" if name in NUMERIC else "left",
                         style=STATE_STYLES.get(name), overflow="fold")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    return table


def show(grid: Grid | None, plain: str, title: str | None = None) -> None:
    """Print a table: rich on a terminal, else `plain` (also when there is no grid:
    an empty result is one line of text either way)."""
    if grid is None or not interactive():
        print(plain)
        return
    from rich.console import Console

    Console().print(rich_table(grid, title))


class Live:
    """A view redrawn in place on a terminal (``rich.live``); `update` takes the grid,
    the plain text and a status line."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live as RichLive

        self.console = Console()
        self.live = RichLive(console=self.console, auto_refresh=False, transient=False)

    def __enter__(self) -> Live:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def update(self, grid: Grid | None, plain: str, status: str) -> None:
        from rich.console import Group
        from rich.text import Text

        body = rich_table(grid) if grid is not None else Text(plain)
        self.live.update(Group(Text(status, style="dim"), body), refresh=True)


def watch(read: Callable[[], T], seen: T, interval: float, *, as_json: bool,
          title: Callable[[T], str], frame: Callable[[T], dict[str, Any]],
          grid: Callable[[T], Grid | None], plain: Callable[[T], str], stale: str) -> int:
    """Show what `read` returns (`seen`: its first read) every `interval` s until Ctrl-C:
    redrawn in place on a terminal, frame after frame anywhere else (no escape codes), or
    one compact JSON object (`frame`) a line with `as_json`, for `| jq` or a log. Through
    a Redis outage it keeps the last read, says so (`stale`: what is shown), and reads
    again on the next turn. Returns the exit status, 0."""
    error = None
    live = Live() if not as_json and interactive() else None
    try:
        with live or contextlib.nullcontext():
            while True:
                head = title(seen)
                if error:
                    head += f"\ncannot reach Redis: {error} (retrying; {stale})"
                if as_json:
                    out = frame(seen)
                    if error:
                        out["error"] = error
                    print(json.dumps(out), flush=True)
                elif live is not None:
                    live.update(grid(seen), plain(seen), head)
                else:
                    sys.stdout.write(f"{head}\n\n{plain(seen)}\n\n")
                    sys.stdout.flush()
                time.sleep(interval)
                try:
                    seen, error = read(), None
                except redis.RedisError as exc:
                    error = " ".join(str(exc).split())
    except KeyboardInterrupt:
        if not as_json and live is None:
            print()
    return 0


Advance = Callable[..., None]  # advance(n=1, note=None): n more done; note beside the bar


@contextlib.contextmanager
def progress(total: float, what: str) -> Iterator[Advance]:
    """A progress bar for `total` units of `what` on stderr when it is a terminal;
    yields `advance`. Lines printed meanwhile appear above the bar (stdout's only when
    stdout is the terminal too, so a redirected stdout keeps its lines). Elsewhere
    nothing is drawn and `advance` costs nothing."""
    if total <= 0 or not interactive(sys.stderr):
        yield _nothing
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), TextColumn("{task.fields[note]}"),
                  console=Console(stderr=True), transient=True,
                  redirect_stdout=interactive(sys.stdout)) as bar:
        task = bar.add_task(what, total=total, note="")

        def advance(n: float = 1, note: str | None = None) -> None:
            if note is None:
                bar.update(task, advance=n)
            else:
                bar.update(task, advance=n, note=note)

        yield advance


def _nothing(n: float = 1, note: str | None = None) -> None:
    pass
