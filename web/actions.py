"""The operator's actions, each a CSRF-checked POST (`Dashboard.action` checks the token,
the origin and read-only before any of these runs): a queue's limits and pause, one job
changed (cancel, promote, priority, reschedule), jobs acted on in bulk (selected ones, or
every match of the list's filters) and schedules (add, pause, resume, trigger, remove).

Each handler takes the request and its parsed form and returns what it did in a few
words (shown on the page it came from), or raises `HTTPError` / a forq error the page
wrapper turns into an error page. Every value is checked by the API it is handed to.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import redis
from starlette.requests import Request

from forq import Queue
from forq.errors import JobNotFound, JobStateError
from forq.schedules import Schedules, definition
from forq.store.finder import ACTIONS
from forq.store.keys import QueueKeys
from forq.units import UnitError, parse_rate
from forq.web.filters import filters_of

Form = dict[str, list[str]]
BULK_LIMIT = 10_000  # matches one bulk POST acts on (press again for more)
SELECTED_LIMIT = 1000  # ids one "selected" POST acts on
PAST = {"requeue": "requeued", "purge": "purged", "cancel": "cancelled", "promote": "promoted"}


class HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def queue_name(request: Request) -> str:
    name = request.path_params["queue"]
    try:
        QueueKeys(name)
    except ValueError as exc:
        raise HTTPError(404, str(exc)) from None
    return name


def field(form: Form, name: str) -> str:
    return (form.get(name) or [""])[0].strip()


def _plural(n: int, noun: str = "job") -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class Actions:
    """Every POST handler of one dashboard, over its Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def _queue(self, request: Request) -> Queue:
        return Queue(queue_name(request), redis=self.client)

    # -- a queue ----------------------------------------------------------------------

    def set_limits(self, request: Request, form: Form) -> str:
        queue = self._queue(request)
        changes: dict[str, Any] = {}
        rate = field(form, "rate")
        if rate.lower() in ("", "none"):
            changes["rate"] = None
        else:
            try:
                changes["rate"] = parse_rate(rate, where="rate")
            except UnitError as exc:
                raise HTTPError(400, str(exc)) from None
        mif = field(form, "max_in_flight")
        if mif.lower() in ("", "none"):
            changes["max_in_flight"] = None
        else:
            if not mif.isdigit() or int(mif) < 1:
                raise HTTPError(400, f'max_in_flight: expected an integer >= 1 or "none", '
                                     f"got {mif!r}")
            changes["max_in_flight"] = int(mif)
        queue.set_limits(**changes)
        return f"limits of {queue.name}: rate {rate or 'none'}, max_in_flight {mif or 'none'}"

    def pause(self, request: Request, form: Form) -> str:
        queue = self._queue(request)
        if not queue.pause():
            return f"{queue.name} was paused already"
        return f"paused {queue.name}: no supervisor claims from it; running jobs go on"

    def resume(self, request: Request, form: Form) -> str:
        queue = self._queue(request)
        if not queue.resume():
            return f"{queue.name} was not paused"
        return f"resumed {queue.name}: supervisors claim from it again"

    # -- one job ----------------------------------------------------------------------

    def cancel(self, request: Request, form: Form) -> str:
        queue, job_id = self._queue(request), request.path_params["job_id"]
        outcome = queue.cancel(job_id)
        if outcome == "missing":
            raise JobNotFound(f"no job {job_id} in queue {queue.name}")
        return {"cancelled": f"cancelled job {job_id}",
                "cancelling": f"cancelling job {job_id}: its supervisor stops it within one "
                              "lease extension"}.get(outcome, f"job {job_id} already {outcome}")

    def promote(self, request: Request, form: Form) -> str:
        queue, job_id = self._queue(request), request.path_params["job_id"]
        queue.promote(job_id)
        return f"promoted job {job_id}: pending now, it runs at the next free slot"

    def set_priority(self, request: Request, form: Form) -> str:
        queue, job_id = self._queue(request), request.path_params["job_id"]
        text = field(form, "priority")
        try:
            priority = int(text)
        except ValueError:
            raise HTTPError(400, f"priority: expected an integer, got {text!r}"[:200]) from None
        state = queue.set_priority(job_id, priority)
        return f"job {job_id}: priority {priority} ({state})"

    def reschedule(self, request: Request, form: Form) -> str:
        queue, job_id = self._queue(request), request.path_params["job_id"]
        delay, at = field(form, "in"), field(form, "at")
        if bool(delay) == bool(at):
            raise HTTPError(400, "give the new time as a delay (in) or a time (at), one of them")
        if at:
            try:
                when = dt.datetime.fromisoformat(at)
            except ValueError:
                raise HTTPError(400, f"at: expected an ISO 8601 time, got {at!r}"[:200]) from None
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.timezone.utc)  # the page says: UTC
            state = queue.reschedule(job_id, when)
        else:
            state = queue.reschedule(job_id, delay=delay)
        return f"rescheduled job {job_id}: {state}"

    # -- many jobs ----------------------------------------------------------------------

    def dead_action(self, request: Request, form: Form) -> str:
        queue = self._queue(request)
        verb = request.path_params["verb"]
        if verb not in ("requeue", "purge"):
            raise HTTPError(404, f"no dead-letter action {verb!r}")
        scope = field(form, "scope") or "selected"
        act = queue.requeue_dead if verb == "requeue" else queue.purge_dead
        if scope == "selected":
            ids = list(dict.fromkeys(form.get("id") or []))[:SELECTED_LIMIT]
            if not ids:
                raise HTTPError(400, "no dead jobs were selected")
            count, what = act(ids)[0], f"{len(ids)} selected"
        elif scope == "task":
            task = field(form, "task")
            if not task:
                raise HTTPError(400, "say which task's dead jobs")
            count, what = queue.bulk(verb, "dead", task=task, limit=BULK_LIMIT).done, f"every {task}"
        elif scope == "all":
            # in batches, never more rounds than the set had: a requeued job that dies
            # again at once is not chased forever
            count, what = 0, "every"
            for _ in range(self.client.zcard(queue.keys.dead) // 10000 + 1):
                n, _ = act(None, limit=10000)
                count += n
                if n < 10000:
                    break
        else:
            raise HTTPError(400, f"scope must be selected, task or all, not {scope!r}"[:200])
        return f"{PAST[verb]} {count} dead job{'s' if count != 1 else ''} ({what}) of {queue.name}"

    def selected(self, request: Request, form: Form) -> str:
        """cancel or promote the jobs ticked on a list (each its own atomic call)."""
        queue = self._queue(request)
        action = request.path_params["action"]
        ids = list(dict.fromkeys(form.get("id") or []))[:SELECTED_LIMIT]
        if action not in ("cancel", "promote"):
            raise HTTPError(404, f"no action {action!r} on selected jobs")
        if not ids:
            raise HTTPError(400, "no jobs were selected")
        done = 0
        for job_id in ids:
            if action == "cancel":
                done += queue.cancel(job_id) in ("cancelled", "cancelling")
            else:
                try:
                    queue.promote(job_id)
                    done += 1
                except (JobNotFound, JobStateError):
                    pass  # it changed since the page was drawn: counted as left alone
        left = len(ids) - done
        return (f"{PAST[action]} {done} of {_plural(len(ids))} selected in {queue.name}"
                + (f"; {left} had changed and were left alone" if left else ""))

    def bulk(self, request: Request, form: Form) -> str:
        """An action on every job of the list's filters (at most BULK_LIMIT a press)."""
        queue = self._queue(request)
        action, state = request.path_params["action"], field(form, "state")
        if action not in ACTIONS:
            raise HTTPError(404, f"no bulk action {action!r}")
        filters = filters_of({name: field(form, name) for name in form})
        result = queue.bulk(action, state, limit=BULK_LIMIT, **filters)
        said = (f"{PAST[action]} {result.done} of {_plural(result.matched)} matching in "
                f"{queue.name}")
        if result.skipped:
            said += f" ({result.skipped} had changed and were left alone)"
        if result.more:
            said += f"; stopped at {BULK_LIMIT:,}: press again for the rest"
        return said

    # -- schedules ------------------------------------------------------------------------

    def schedule_add(self, request: Request, form: Form) -> str:
        try:
            args = json.loads(field(form, "args") or "[]")
            kwargs = json.loads(field(form, "kwargs") or "{}")
        except ValueError as exc:
            raise HTTPError(400, f"args and kwargs must be JSON: {exc}"[:200]) from None
        try:
            max_catch_up = int(field(form, "max_catch_up") or 100)
        except ValueError:
            raise HTTPError(400, "max_catch_up must be an integer") from None
        found = definition(field(form, "name"), field(form, "cron"), queue=field(form, "queue"),
                           task=field(form, "task"), args=args, kwargs=kwargs,
                           timezone=field(form, "timezone") or "UTC",
                           catch_up=field(form, "catch_up") or "latest",
                           max_catch_up=max_catch_up, overlap=field(form, "overlap") or "allow")
        name, cron = found.pop("name"), found.pop("cron")
        outcome = Schedules(self.client).add(name, cron, replace=field(form, "replace") == "1",
                                             **found)
        return f"{outcome} schedule {name}: every supervisor runs it within a second"

    def schedule_change(self, request: Request, form: Form) -> str:
        name, verb = request.path_params["name"], request.path_params["verb"]
        schedules = Schedules(self.client)
        if verb == "trigger":
            done = schedules.trigger(name, force=field(form, "force") == "1")
            if done.job_id is None:
                return (f"schedule {name} not triggered: its last run, job {done.skipped_for}, "
                        f"is still {done.skipped_state} (overlap = skip)")
            return f"triggered schedule {name}: job {done.job_id}"
        if verb == "remove":
            schedules.remove(name)
            return f"removed schedule {name}"
        if verb == "pause":
            return (f"paused schedule {name}" if schedules.pause(name)
                    else f"schedule {name} was paused already")
        if verb == "resume":
            return (f"resumed schedule {name}" if schedules.resume(name)
                    else f"schedule {name} was not paused")
        raise HTTPError(404, f"no schedule action {verb!r}")
