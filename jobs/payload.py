"""Turn a producer's call into a job spec for the enqueue script, refusing bad input.

JSON only, never pickle: a writable Redis must not mean code execution in every
worker. Errors name the offending argument so the producer can fix the call.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, Literal

from forq.errors import PayloadError
from forq.store.keyed import keyed
from forq.store.policy import PER_JOB_POLICY, job_policy_options
from forq.tracing import current_traceparent, valid_traceparent
from forq.units import UnitError, parse_duration

DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
PRIORITY_LIMIT = 1000  # the pending score keeps priority * 2^42 exact in a double
MAX_GROUP_BYTES = 256  # a group key is part of Redis key names: keep them short

OPTIONS = frozenset({
    "args", "kwargs", "priority", "delay", "run_at", "key", "unique_for", "job_id",
    "idempotent", "group", "expires_in", "expire_at", "depends_on", "allow_failure", "lifo",
    "replace", "debounce", "key_scope",
    *(key.name.partition(".")[0] for key in PER_JOB_POLICY),
})
# the options a plain job may have: build_spec skips the checks of all the others
_PLAIN_OPTIONS = frozenset({"args", "kwargs", "priority", "job_id"})
MAX_DEPENDENCIES = 1000  # parents of one job (each is one read in the enqueue script)


def new_job_id() -> str:
    """80 random bits as hex: unguessable and short enough to type."""
    return secrets.token_hex(10)


def job_ids(block: int = 256) -> Iterator[str]:
    """`new_job_id`s, `block` from each read of the random source (a read a job was a
    tenth of enqueue_many's client time); one per call: a fork must not repeat them."""
    while True:
        text = os.urandom(10 * block).hex()
        yield from (text[start:start + 20] for start in range(0, len(text), 20))


_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_local = threading.local()


def _encode(value: Any) -> str:
    """`value` as compact JSON, as `json.dumps(value, separators=(",", ":"),
    allow_nan=False)` writes it, at half the cost for a job's arguments: json.dumps and
    JSONEncoder.encode build a new C encoder on every call, this keeps one per thread (its
    dict of the containers being encoded, the circular-reference check, its own)."""
    encoder = getattr(_local, "encoder", None)
    if encoder is None:
        if c_make_encoder is None:  # no C accelerator (another Python): the plain way
            return _JSON.encode(value)
        _local.markers = {}
        _local.encoder = encoder = c_make_encoder(
            _local.markers, _JSON.default, encode_basestring_ascii, None, ":", ",",
            False, False, False)
    try:
        return "".join(encoder(value, 0))
    except BaseException:
        _local.markers.clear()  # a refusal midway leaves its open containers marked
        raise


def _dumps(value: Any, where: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{where} is not JSON-serialisable: {exc}") from None


def _encode_args(task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, str]:
    if not isinstance(args, (list, tuple)):
        raise PayloadError(f"task {task!r}: args must be a list, got {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise PayloadError(f"task {task!r}: kwargs must be a mapping, got {type(kwargs).__name__}")
    for name in kwargs:
        if not isinstance(name, str):
            raise PayloadError(f"task {task!r}: kwargs key {name!r} is not a string")
    try:
        return (_encode(args if args.__class__ is list else list(args)) if args else "[]",
                _encode(kwargs if kwargs.__class__ is dict else dict(kwargs)) if kwargs else "{}")
    except (TypeError, ValueError):
        pass
    # encode once on the happy path; only a refusal walks the items to name the culprit
    for i, value in enumerate(args):
        _dumps(value, f"task {task!r}: args[{i}]")
    for name, value in kwargs.items():
        _dumps(value, f"task {task!r}: kwargs[{name!r}]")
    raise PayloadError(f"task {task!r}: arguments are not JSON-serialisable")


def _largest(task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    sizes = [(len(_dumps(v, "")), f"args[{i}]") for i, v in enumerate(args)]
    sizes += [(len(_dumps(v, "")), f"kwargs[{k!r}]") for k, v in kwargs.items()]
    size, name = max(sizes) if sizes else (0, "args")
    return f"{name} ({size} bytes)"


def group_problem(group: Any) -> str:
    """Why `group` is not a group key ("" if it is): a non-empty string of at most
    MAX_GROUP_BYTES bytes (UTF-8), since it names the group's keys in Redis."""
    if not isinstance(group, str):
        return f"must be a string, got {type(group).__name__}"
    if not group:
        return "must not be empty"
    try:
        size = len(group.encode())
    except UnicodeEncodeError:
        return "must be valid Unicode text (it has a lone surrogate)"
    if size > MAX_GROUP_BYTES:
        return f"is {size} bytes, over the {MAX_GROUP_BYTES}-byte cap"
    return ""


def checked_priority(priority: Any, where: str = "") -> int:
    """A job priority: an integer in [-PRIORITY_LIMIT, PRIORITY_LIMIT] (higher first)."""
    if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > PRIORITY_LIMIT:
        raise PayloadError(f"{where}priority must be an integer in [-{PRIORITY_LIMIT}, "
                           f"{PRIORITY_LIMIT}], got {priority!r}"[:300])
    return priority


def _expiry(task: str, options: Mapping[str, Any], spec: dict[str, Any]) -> None:
    """expires_in (a duration, from Redis's clock at enqueue) or expire_at (a datetime or
    Unix seconds): a job not started by then never runs (dead, "expired before start").
    Refused when not in the future, or not after the job's own delay / run_at."""
    expires_in: Any = options.get("expires_in")
    expire_at: Any = options.get("expire_at")
    if expires_in is None and expire_at is None:
        return
    if expires_in is not None and expire_at is not None:
        raise PayloadError(f"task {task!r}: give expires_in or expire_at, not both")
    now = time.time()
    if expires_in is not None:
        if isinstance(expires_in, bool):
            raise PayloadError(f"task {task!r}: expires_in must be a duration, got {expires_in!r}")
        left_ms = _ms(expires_in, "expires_in")
        if left_ms <= 0:
            raise PayloadError(f"task {task!r}: expires_in must be more than 0, got {expires_in!r}")
        spec["expires_in_ms"] = left_ms
        what = f"expires_in={expires_in!r}"
    else:
        when = expire_at.timestamp() if hasattr(expire_at, "timestamp") else expire_at
        if not isinstance(when, (int, float)) or isinstance(when, bool):
            raise PayloadError(f"task {task!r}: expire_at must be a datetime or Unix seconds, "
                               f"got {expire_at!r}")
        left_ms = int((when - now) * 1000)
        if left_ms <= 0:
            raise PayloadError(f"task {task!r}: expire_at {expire_at!r} is in the past")
        spec["expire_at_ms"] = int(when * 1000)
        what = f"expire_at={expire_at!r}"
    due_ms = spec.get("delay_ms") or (spec["run_at_ms"] - now * 1000 if "run_at_ms" in spec else 0)
    if due_ms >= left_ms:
        raise PayloadError(f"task {task!r}: {what} ends before the job is due (delay / run_at): "
                           "it could never run")


def _ms(value: Any, where: str) -> int:
    try:
        return int(round(parse_duration(value, where=where) * 1000))
    except UnitError as exc:
        raise PayloadError(str(exc)) from None


def build_spec(
    task: str,
    options: Mapping[str, Any],
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    traceparent: str | None | Literal["current"] = "current",
    new_id: Callable[[], str] = new_job_id,
) -> dict[str, Any]:
    """Validate one job and return the JSON-ready spec the enqueue script reads.
    `traceparent`: the producer's span context, "current" to read it now (`batch_specs`
    reads it once for all its jobs: reading it costs more than the rest of a plain job);
    `new_id` makes the job's id when the options name none."""
    if traceparent == "current":
        traceparent = current_traceparent()  # None unless the producer uses OpenTelemetry
    if not isinstance(task, str) or not task:
        raise PayloadError(f"task name must be a non-empty string, got {task!r}")
    if not OPTIONS.issuperset(options):
        unknown = set(options) - OPTIONS
        raise PayloadError(
            f"task {task!r}: unknown option(s) {', '.join(sorted(unknown))}; "
            f"pass handler keyword arguments as kwargs={{...}}"
        )
    args = options.get("args") or ()
    kwargs = options.get("kwargs") or {}
    if args or kwargs:
        args_json, kwargs_json = _encode_args(task, args, kwargs)
    else:
        args_json, kwargs_json = "[]", "{}"
    if len(args_json) + len(kwargs_json) > max_payload_bytes:
        raise PayloadError(
            f"task {task!r}: payload is {len(args_json) + len(kwargs_json)} bytes, over the "
            f"{max_payload_bytes}-byte limit; largest is {_largest(task, args, kwargs)}"
        )
    spec: dict[str, Any] = {
        "id": options.get("job_id") or new_id(),
        "task": task,
        "args": args_json,
        "kwargs": kwargs_json,
    }
    priority = options.get("priority", 0)
    spec["priority"] = priority if priority.__class__ is int and -PRIORITY_LIMIT <= priority <= \
        PRIORITY_LIMIT else checked_priority(priority, f"task {task!r}: ")
    if _PLAIN_OPTIONS.issuperset(options):
        if traceparent:
            spec["traceparent"] = traceparent
        return spec
    if options.get("lifo"):
        spec["lifo"] = 1  # the head of its priority when it becomes pending, not the tail
    if options.get("delay") is not None:
        spec["delay_ms"] = max(0, _ms(options["delay"], "delay"))
    if options.get("run_at") is not None:
        run_at = options["run_at"]
        if hasattr(run_at, "timestamp"):
            run_at = run_at.timestamp()
        if not isinstance(run_at, (int, float)):
            raise PayloadError(f"task {task!r}: run_at must be a datetime or Unix seconds")
        spec["run_at_ms"] = int(run_at * 1000)
    keyed(task, options, spec)
    _expiry(task, options, spec)
    job_policy_options(task, options, spec)
    if options.get("idempotent"):
        spec["idempotent"] = 1
    if options.get("group") is not None:
        problem = group_problem(options["group"])
        if problem:
            raise PayloadError(f"task {task!r}: group {problem}")
        spec["group"] = options["group"]
    if options.get("depends_on") is not None:
        spec["depends_on"] = _parents(task, options["depends_on"])
        if options.get("allow_failure"):
            spec["allow_failure"] = 1
    elif options.get("allow_failure"):
        raise PayloadError(f"task {task!r}: allow_failure needs depends_on")
    if traceparent:
        spec["traceparent"] = traceparent
    return spec


def _parents(task: str, depends_on: Any) -> list[str]:
    """depends_on as a list of distinct job ids (ids, or the `Job` handles enqueue returns)."""
    if isinstance(depends_on, (str, bytes)) or not isinstance(depends_on, (list, tuple)):
        raise PayloadError(f"task {task!r}: depends_on must be a list of job ids, got "
                           f"{type(depends_on).__name__}")
    ids: list[str] = []
    for i, parent in enumerate(depends_on):
        parent_id = getattr(parent, "id", parent)
        if not isinstance(parent_id, str) or not parent_id:
            raise PayloadError(f"task {task!r}: depends_on[{i}] must be a job id or a Job, "
                               f"got {parent!r}"[:300])
        if parent_id not in ids:
            ids.append(parent_id)
    if not ids:
        raise PayloadError(f"task {task!r}: depends_on is empty; leave it out for no dependencies")
    if len(ids) > MAX_DEPENDENCIES:
        raise PayloadError(f"task {task!r}: depends_on has {len(ids)} jobs, over the limit "
                           f"of {MAX_DEPENDENCIES}")
    return ids


# What a built spec may hold, and of what type: the enqueue script reads these fields.
# A follow-up spec comes back from a job's child, which is untrusted, so the parent
# checks it against this table (`check_followup`) before it reaches Redis.
_INT = (int,)
_NUM = (int, float)
SPEC_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,), "task": (str,), "args": (str,), "kwargs": (str,), "queue": (str,),
    "parent": (str,), "priority": _INT, "delay_ms": _INT, "run_at_ms": _INT, "key": (str,),
    "unique_ms": _INT, "idempotent": _INT, "traceparent": (str,), "group": (str,),
    "expires_in_ms": _INT, "expire_at_ms": _INT,
    "batch": (str,), "batch_queue": (str,), "lifo": _INT,
    **{key.field: _NUM if key.kind == "number" else _INT for key in PER_JOB_POLICY},
}
MAX_NAME = 200  # task names, queue names and idempotency keys
_QUEUE_NAME_BAD = frozenset("{}: \t\r\n")


def _check_shape(spec: Any, required: tuple[str, ...]) -> str:
    """Why `spec` is not a job spec `build_spec` could have built ("" if it is)."""
    if not isinstance(spec, dict):
        return f"must be an object, got {type(spec).__name__}"
    unknown = set(spec) - set(SPEC_FIELDS)
    if unknown:
        return f"unknown field(s) {', '.join(sorted(map(str, unknown)))}"[:300]
    for name in required:
        if name not in spec:
            return f"{name} is missing"
    for name, value in spec.items():
        types = SPEC_FIELDS[name]
        if not isinstance(value, types) or isinstance(value, bool):
            return f"{name} must be {' or '.join(t.__name__ for t in types)}, got {type(value).__name__}"
        if isinstance(value, (int, float)) and not (0 <= value < 2 ** 53 or name == "priority"):
            return f"{name} out of range: {value!r}"[:300]
    for name in ("task", "queue", "key"):
        if name in spec and not 0 < len(spec[name]) <= MAX_NAME:
            return f"{name} must be 1 to {MAX_NAME} characters"
    if "queue" in spec and _QUEUE_NAME_BAD & set(spec["queue"]):
        return f"queue name {spec['queue']!r} must be without braces, colons or spaces"[:300]
    if "group" in spec and group_problem(spec["group"]):
        return f"group {group_problem(spec['group'])}"[:300]
    if "traceparent" in spec and not valid_traceparent(spec["traceparent"]):
        return "traceparent must be a W3C traceparent (00-<trace id>-<span id>-<flags>)"
    if abs(spec.get("priority", 0)) > PRIORITY_LIMIT:
        return f"priority must be in [-{PRIORITY_LIMIT}, {PRIORITY_LIMIT}]"
    for name in ("max_attempts", "max_crashes"):
        if name in spec and spec[name] < 1:
            return f"{name} must be >= 1"
    if spec.get("lifo", 1) != 1:
        return "lifo must be 1 when given"
    try:
        args, kwargs = json.loads(spec["args"]), json.loads(spec["kwargs"])
    except (ValueError, RecursionError):
        return "args and kwargs must be JSON"
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return "args must be a JSON list and kwargs a JSON object"
    return ""


def check_followup(spec: Any, parent_id: str, n: int,
                   batch: tuple[str, str] | None = None) -> str:
    """Why `spec`, the `n`-th follow-up sent by job `parent_id`'s child, is not a spec
    that `JobContext.enqueue` could have built ("" if it is). With `batch` (the batch id
    and queue the job opened), the `n`-th member of that batch (`JobContext.batch`):
    a child can put jobs in its own batch only, never count in another."""
    problem = _check_shape(spec, ("id", "task", "args", "kwargs", "queue", "parent"))
    if problem:
        return problem
    if batch is None:
        if "batch" in spec or "batch_queue" in spec:
            return "batch fields are for the members of the batch the job opened"
        expected = f"{parent_id}-{n}"
    else:
        if spec.get("batch") != batch[0] or spec.get("batch_queue") != batch[1]:
            return f"batch must be {batch[0]} on queue {batch[1]}"[:300]
        expected = f"{batch[0]}-{n}"
    if spec["id"] != expected or spec["parent"] != parent_id:
        # ids derive from the parent's, so a re-run adds none and no job can be overwritten
        return f"id must be {expected} with parent {parent_id}"
    return ""


def check_callback(spec: Any, expected_id: str, batch_id: str) -> str:
    """Why `spec` is not the callback `JobContext.batch` built for batch `batch_id`
    under the id `expected_id` ("" if it is): on the batch's queue, kwargs naming it."""
    problem = _check_shape(spec, ("id", "task", "args", "kwargs"))
    if problem:
        return problem
    for name in ("queue", "parent", "batch", "batch_queue"):
        if name in spec:
            return f"a callback has no {name}"
    if spec["id"] != expected_id:
        return f"id must be {expected_id}"
    if json.loads(spec["kwargs"]).get("batch_id") != batch_id:
        return f"kwargs must carry batch_id {batch_id}"
    return ""


def call_spec(task: str, args: Sequence[Any], options: dict[str, Any],
              max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> tuple[dict[str, Any], bool | None]:
    """``enqueue(task, *args, **options)`` as (spec, durable): positional handler
    arguments or ``args=``, not both; ``durable`` is not part of the job."""
    if args:
        if "args" in options:
            raise TypeError("pass handler arguments positionally or as args=, not both")
        options["args"] = args
    durable = options.pop("durable", None)
    return build_spec(task, options, max_payload_bytes=max_payload_bytes), durable


def batch_specs(jobs: Iterable[Mapping[str, Any]],
                max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> list[dict[str, Any]]:
    """``enqueue_many``'s items (each a mapping with ``task`` and options) as specs, all
    validated before any is sent; an error names the item (``jobs[3]: ...``)."""
    specs = []
    traceparent = current_traceparent()  # one call, one span: read once for all its jobs
    new_id = job_ids().__next__
    for i, item in enumerate(jobs):
        options = dict(item)
        task = options.pop("task", None)
        try:
            specs.append(build_spec(task, options, max_payload_bytes=max_payload_bytes,
                                    traceparent=traceparent, new_id=new_id))
        except ValueError as exc:
            raise type(exc)(f"jobs[{i}]: {exc}") from None
    return specs
