"""The child's end of its channel to the supervisor: progress, durable steps and the
job's parents' results.

A handler never holds the Redis connection, so what it wants recorded while it runs
goes to its parent over fd 3 (a socketpair: `forq.supervisor.fork.messages` is the
schema the parent checks), and the parent writes it to the job's record, fenced by
the lease token.

* `Channel.progress` is throttled here, in the child: at most one message every
  `PROGRESS_INTERVAL` seconds, the latest value kept and sent when the handler ends
  (`flush`). A handler may call it in a tight loop; Redis sees a write per lease
  extension at most.
* `Channel.step` runs a function once per job, over all of the job's runs: its JSON
  result is sent to the parent, and the handler waits until the parent answers that
  Redis holds it. A later run of the same job (after a crash, a timeout, a reclaim)
  gets the recorded results at launch and returns them without running the function.
  If the parent answers that the lease is lost, `LeaseLost` ends the handler: another
  run owns the job now, and this one must not go on.
* `Channel.parents` asks for the job's parents (its `depends_on`, or a batch callback's
  members) and their results, page by page (each page capped by the parent: at most
  `PARENTS_PAGE` parents and `PARENTS_PAGE_BYTES` of results, or one parent however
  large), read once per run and kept.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

PROGRESS_INTERVAL = 0.5  # seconds between two progress messages of one job
MAX_PROGRESS_MESSAGE = 500  # characters of a progress message: longer ones are cut
MAX_STEPS = 1000  # durable steps recorded per job, over all its runs
MAX_STEP_NAME = 200  # bytes of a step's name (UTF-8)
MAX_STEP_BYTES = 64 * 1024  # a step's result, as compact JSON
# all of a job's step results together: they live in its record, and each claim of the
# job reads them all (a claim takes up to 32 jobs)
MAX_STEPS_BYTES = 1 << 20
# a handler's own retry (`Retry`) and its throttle of its queue or group: the delays the
# channel carries at most (a throttle is further capped by its queue's `max_throttle`)
MAX_SNOOZE_MS = 30 * 24 * 3600 * 1000
MAX_THROTTLE_MS = 24 * 3600 * 1000
# a page of a job's parents' results, as the supervisor answers `Channel.parents`
PARENTS_PAGE = 500
PARENTS_PAGE_BYTES = 1 << 20


class LeaseLost(BaseException):  # noqa: N818 — not an error of the handler's: a stop
    """This run no longer holds the job's lease (another supervisor reclaimed it): the
    handler must stop at once. A BaseException, so ``except Exception`` in handler code
    does not swallow it; the child then ends without a result, which is dropped."""


class ParentResult(NamedTuple):
    """One parent of a job (a job of its `depends_on`, or a member of the batch whose
    callback it is) as `current().parents()` reads it."""

    id: str
    queue: str
    state: str  # succeeded, dead, cancelled (or another, if requeued since); "expired":
    # its record is gone (its result_ttl passed, or it was purged)
    result: Any  # its result when it succeeded, else None
    reason: str  # why it did not succeed ("" when it did)


class ParentsExpired(LookupError):
    """A batch callback's batch is gone (its record expired): its members are unknown."""


class StepError(Exception):
    """A step's result cannot be recorded (not JSON, too large, too many steps): every
    run would meet it again, so the job goes to dead (fatal, like `NonRetryable`)."""


def check_progress(value: Any, message: Any) -> tuple[float, str]:
    """A progress value (0..1) and message, or a ValueError/TypeError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"progress must be a number from 0 to 1, got {type(value).__name__}")
    if not 0 <= value <= 1:  # NaN fails this too
        raise ValueError(f"progress must be from 0 to 1, got {value!r}")
    if not isinstance(message, str):
        raise TypeError(f"progress message must be a string, got {type(message).__name__}")
    return float(value), message[:MAX_PROGRESS_MESSAGE]


def check_step_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"step name must be a non-empty string, got {name!r}"[:200])
    if len(name.encode(errors="surrogatepass")) > MAX_STEP_NAME:
        raise ValueError(f"step name {name[:40]!r}… is over {MAX_STEP_NAME} bytes")
    return name


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"


class Channel:
    """fd 3 of a job's child, as the handler's `current()` uses it."""

    def __init__(self, fd: int, steps: Mapping[str, str] | None = None, *,
                 interval: float = PROGRESS_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fd = fd
        self.steps: dict[str, str] = dict(steps or {})  # name -> result JSON, recorded
        self.interval = interval
        self.clock = clock
        self._unsent: tuple[float, str] | None = None
        self._sent_at = float("-inf")
        self._buf = bytearray()
        self._parents: list[ParentResult] | None = None  # read once per run

    # -- progress ---------------------------------------------------------------------

    def progress(self, value: float, message: str = "") -> None:
        self._unsent = check_progress(value, message)
        if self.clock() - self._sent_at >= self.interval:
            self.flush()

    def flush(self) -> None:
        """Send the latest progress not yet sent (when the handler ends, before its result)."""
        if self._unsent is None:
            return
        value, message = self._unsent
        self._unsent = None
        self._sent_at = self.clock()
        self._write(_encode({"t": "progress", "progress": value, "message": message}))

    # -- steps --------------------------------------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        check_step_name(name)
        if name in self.steps:
            return json.loads(self.steps[name])
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(f"step {name!r}: {getattr(fn, '__qualname__', fn)!r} returned an "
                            f"awaitable; in an async handler use `await current().astep(...)`")
        return self.record(name, result)

    async def astep(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        check_step_name(name)
        if name in self.steps:
            return json.loads(self.steps[name])
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return self.record(name, result)

    def record(self, name: str, result: Any) -> Any:
        """Send the step's result and wait until the parent says Redis holds it; returns
        the result as a later run will get it (decoded from its JSON)."""
        try:
            result_json = json.dumps(result, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise StepError(f"step {name!r}: result is not JSON-serialisable: {exc}") from None
        if len(result_json) > MAX_STEP_BYTES:
            raise StepError(f"step {name!r}: result of {len(result_json)} bytes, over the "
                            f"{MAX_STEP_BYTES}-byte limit of a step")
        if len(self.steps) >= MAX_STEPS:
            raise StepError(f"step {name!r}: a job records at most {MAX_STEPS} steps")
        if sum(map(len, self.steps.values())) + len(result_json) > MAX_STEPS_BYTES:
            raise StepError(f"step {name!r}: a job's step results total at most "
                            f"{MAX_STEPS_BYTES} bytes")
        if self.fd >= 0:
            try:
                self.flush()  # what the handler said before the step, in order
                self._write(('{"t":"step","name":' + json.dumps(name) + ',"result":'
                             + result_json + "}\n").encode())
            except OSError:
                raise LeaseLost(f"step {name!r} not recorded: the supervisor is gone") from None
            answer = self._answer(name)
            if answer != "ok":
                raise LeaseLost(f"step {name!r} not recorded: the job's lease is lost")
        self.steps[name] = result_json
        return json.loads(result_json)

    def _answer(self, name: str) -> str:
        """Block until the parent answers the step (one JSON line)."""
        message = self._message(f"step {name!r} not recorded")
        return str(message.get("answer")) if message.get("step") == name else "lost"

    def _message(self, what: str) -> dict[str, Any]:
        """The parent's next answer, one JSON object on a line ({} if it is not one)."""
        while b"\n" not in self._buf:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except InterruptedError:
                continue
            if not chunk:
                raise LeaseLost(f"{what}: the supervisor is gone")
            self._buf += chunk
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        try:
            message = json.loads(line)
        except ValueError:
            return {}
        return message if isinstance(message, dict) else {}

    # -- parents ------------------------------------------------------------------------

    def parents(self, job_id: str = "") -> list[ParentResult]:
        """The job's parents and their results (in the order of its `depends_on`, or of
        its batch's members), read from the supervisor page by page, once per run."""
        if self._parents is None:
            self._parents = self._read_parents(job_id) if self.fd >= 0 else []
        return list(self._parents)

    def _read_parents(self, job_id: str) -> list[ParentResult]:
        found: list[ParentResult] = []
        while True:
            try:
                self.flush()
                self._write(b'{"t":"parents"}\n')
            except OSError:
                raise LeaseLost("parents not read: the supervisor is gone") from None
            message = self._message("parents not read")
            page = message.get("parents")
            if message.get("answer") == "expired":
                raise ParentsExpired(f"job {job_id}: its batch's record is gone (expired), so "
                                     "its members and their results are unknown")
            if not isinstance(page, list):
                raise LeaseLost("parents not read: the job's lease is lost")
            found.extend(_parent(entry) for entry in page)
            if not message.get("more"):
                return found

    def _write(self, data: bytes) -> None:
        if self.fd < 0:
            return
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]


def _parent(entry: Any) -> ParentResult:
    """One parent as the supervisor sends it: [queue, id, state, result JSON, reason]."""
    queue, job_id, state, result, reason = (list(entry) + [""] * 5)[:5]
    value = None
    if state == "succeeded":
        try:
            value = json.loads(result) if result else None
        except ValueError:
            value = result  # not JSON (written by hand in Redis): as it is
    return ParentResult(str(job_id), str(queue), str(state or "expired"), value,
                        str(reason or ""))


def parents_answer(entries: list[list[str]] | None, more: bool = False,
                   status: str = "ok") -> bytes:
    """The parent's answer to a page of parents: entries (results as their JSON text),
    or, with none, "lost" or "expired"."""
    if entries is None:
        return _encode({"parents": None, "answer": status})
    return _encode({"parents": entries, "more": more})


def answer(name: str, ok: bool) -> bytes:
    """The parent's answer to a step, one line."""
    return _encode({"step": name, "answer": "ok" if ok else "lost"})
