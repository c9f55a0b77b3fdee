"""The dashboard's ASGI app: server-rendered pages, live fragments over server-sent
events, and the operator's actions as CSRF-checked POSTs.

Pages are plain `def` endpoints (Starlette runs them in its thread pool, where the
blocking Redis calls belong); the event streams are async and read Redis in a thread.
A live view is rendered at most once per refresh period however many browsers watch
it, so ten open tabs cost Redis what one does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

import anyio
import jinja2
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from forq import Queue, units
from forq.errors import ForqError, JobNotFound, JobStateError, PayloadError
from forq.fleet import code_status
from forq.schedules import ScheduleNotFound
from forq.web import data, filters
from forq.web.actions import Actions, HTTPError, queue_name
from forq.web.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    TOKEN_COOKIE,
    Auth,
    csrf_ok,
    new_csrf_token,
    same_origin,
)

HERE = Path(__file__).resolve().parent
MAX_FORM_BYTES = 256 * 1024  # a form with a page of selected ids fits many times over
LIVE_VIEWS = ("overview", "running")


def _bytes(n: Any) -> str:
    try:
        n = float(n)
    except (TypeError, ValueError):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["age"] = units.age
    env.filters["when"] = units.when
    env.filters["when_ms"] = units.when_ms
    env.filters["bytes"] = _bytes
    env.filters["rate"] = units.rate
    env.filters["code_status"] = code_status  # a heartbeat's handler code, checked
    env.globals["LISTS"] = data.LISTS
    return env


class Dashboard:
    """One dashboard over one Redis client (thread-safe: redis-py pools connections)."""

    def __init__(self, client: redis.Redis, *, read_only: bool = False,
                 auth: Auth | None = None, refresh: float = 1.0) -> None:
        self.client = client
        self.read_only = read_only
        self.auth = auth or Auth()
        self.refresh = refresh
        self.env = _environment()
        self._live: dict[str, tuple[float, str]] = {}
        self._live_lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------

    def app(self) -> Starlette:
        acts = Actions(self.client)
        routes = [
            Route("/", self.page(self.overview)),
            Route("/running", self.page(self.running)),
            Route("/schedules", self.page(self.schedules)),
            Route("/search", self.page(self.search)),
            Route("/dead", self.page(self.dead_queues)),
            Route("/queues/{queue}", self.page(self.queue_home)),
            Route("/queues/{queue}/{state}", self.page(self.job_list)),
            Route("/events/{view}", self.events),
            Route("/queues/{queue}/limits", self.action(acts.set_limits), methods=["POST"]),
            Route("/queues/{queue}/pause", self.action(acts.pause), methods=["POST"]),
            Route("/queues/{queue}/resume", self.action(acts.resume), methods=["POST"]),
            Route("/queues/{queue}/dead/{verb}", self.action(acts.dead_action),
                  methods=["POST"]),
            Route("/queues/{queue}/selected/{action}", self.action(acts.selected),
                  methods=["POST"]),
            Route("/queues/{queue}/bulk/{action}", self.action(acts.bulk), methods=["POST"]),
            Route("/schedules/add", self.action(acts.schedule_add), methods=["POST"]),
            Route("/schedules/{name}/{verb}", self.action(acts.schedule_change),
                  methods=["POST"]),
            # a job id is the producer's choice and may hold a "/": the rest of the path
            *(Route(f"/jobs/{{queue}}/{{job_id:path}}/{verb}", self.action(handler),
                    methods=["POST"])
              for verb, handler in (("cancel", acts.cancel), ("promote", acts.promote),
                                    ("priority", acts.set_priority),
                                    ("reschedule", acts.reschedule))),
            Route("/jobs/{queue}/{job_id:path}", self.page(self.job)),
            Route("/batches/{queue}/{batch_id:path}", self.page(self.batch)),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        app = Starlette(routes=routes)
        return _AuthGate(app, self.auth)  # type: ignore[return-value]

    def render(self, request: Request, template: str, status: int = 200, *,
               title: str = "forq", **context: Any) -> HTMLResponse:
        token = request.cookies.get(CSRF_COOKIE) or new_csrf_token()
        html = self.env.get_template(template).render(
            request=request, read_only=self.read_only, csrf_field=CSRF_FIELD, csrf=token,
            path=request.url.path, done=request.query_params.get("done"), title=title,
            **context)
        response = HTMLResponse(html, status_code=status)
        if request.cookies.get(CSRF_COOKIE) != token:
            response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict")
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'")
        return response

    def page(self, handler: Callable[..., Response]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                return handler(request)
            except HTTPError as exc:
                return self.render(request, "error.html", exc.status, message=str(exc))
            except (JobNotFound, ScheduleNotFound) as exc:
                return self.render(request, "error.html", 404, message=str(exc))
            except JobStateError as exc:  # the job is not in a state the action applies to
                return self.render(request, "error.html", 409, message=str(exc))
            except (PayloadError, ForqError) as exc:  # a refused value, a refused change
                return self.render(request, "error.html", 400, message=str(exc))
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                return self.render(request, "error.html", 503,
                                   message=f"cannot reach Redis: {exc}")
            except redis.RedisError as exc:
                return self.render(request, "error.html", 500, message=f"Redis error: {exc}")
        return endpoint

    def action(self, handler: Callable[[Request, dict[str, list[str]]], str]
               ) -> Callable[[Request], Any]:
        """A POST: refused when read-only, without a matching CSRF token or from another
        origin; on success, back to the page it came from with what was done."""
        async def endpoint(request: Request) -> Response:
            if self.read_only:
                return Response("forq web runs read-only: actions are off\n", 403,
                                media_type="text/plain")
            if not same_origin(request.headers.get("origin"), request.headers.get("host")):
                return Response("refused: the request came from another site\n", 403,
                                media_type="text/plain")
            body = await request.body()
            if len(body) > MAX_FORM_BYTES:
                return Response("form too large\n", 413, media_type="text/plain")
            form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
            given = next(iter(form.get(CSRF_FIELD) or []), None)
            if not csrf_ok(request.cookies.get(CSRF_COOKIE), given):
                return Response("refused: missing or wrong CSRF token (reload the page and "
                                "try again)\n", 403, media_type="text/plain")
            page = self.page(lambda r: _redirect_back(r, form, handler(r, form)))
            return await anyio.to_thread.run_sync(page, request)
        return endpoint

    # -- live views -------------------------------------------------------------------

    def live_fragment(self, view: str) -> str:
        """The live part of a view, rendered at most once per half refresh period."""
        with self._live_lock:
            cached = self._live.get(view)
            if cached and time.monotonic() - cached[0] < self.refresh / 2:
                return cached[1]
            try:
                if view == "overview":
                    html = self.env.get_template("_overview_live.html").render(
                        o=data.overview(self.client))
                else:
                    html = self.env.get_template("_running_live.html").render(
                        r=data.running(self.client))
            except redis.RedisError as exc:
                html = self.env.get_template("_redis_down.html").render(error=str(exc))
            self._live[view] = (time.monotonic(), html)
            return html

    async def events(self, request: Request) -> Response:
        view = request.path_params["view"]
        if view not in LIVE_VIEWS:
            return Response("no such live view\n", 404, media_type="text/plain")

        async def stream() -> Any:
            yield f"retry: {int(self.refresh * 1000) + 500}\n\n"
            while True:
                html = await anyio.to_thread.run_sync(self.live_fragment, view)
                yield "event: update\ndata: " + html.replace("\n", "\ndata: ") + "\n\n"
                await anyio.sleep(self.refresh)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    # -- pages --------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", live=self.live_fragment("overview"),
                           title="Overview")

    def running(self, request: Request) -> Response:
        return self.render(request, "running.html", live=self.live_fragment("running"),
                           title="Running now")

    def schedules(self, request: Request) -> Response:
        return self.render(request, "schedules.html", s=data.schedules(self.client),
                           title="Schedules")

    def search(self, request: Request) -> Response:
        text = request.query_params.get("q", "").strip()
        hits = data.search(self.client, text) if text else []
        if len(hits) == 1:
            return RedirectResponse(f"/jobs/{hits[0]['queue']}/{quote(hits[0]['id'])}", 303)
        return self.render(request, "search.html", text=text, hits=hits, title="Search")

    def dead_queues(self, request: Request) -> Response:
        o = data.overview(self.client)
        return self.render(request, "dead_queues.html", o=o, title="Dead letters")

    def queue_home(self, request: Request) -> Response:
        return RedirectResponse(f"/queues/{queue_name(request)}/pending", 303)

    def job_list(self, request: Request) -> Response:
        name = queue_name(request)
        state = request.path_params["state"]
        if state not in data.LISTS:
            raise HTTPError(404, f"no list {state!r}: one of {', '.join(data.LISTS)}")
        offset = _int_param(request, "offset", 0)
        page = data.job_page(self.client, name, state, offset)
        given = filters.filters_of(request.query_params)
        found = None
        if given and state in filters.FILTERABLE:
            found = filters.filtered_page(self.client, name, state, given,
                                          request.query_params.get("cursor"))
        limits = Queue(name, redis=self.client).limits()
        per_ms = limits.get("rate")
        return self.render(request, "jobs.html", page=page, queue=name,
                           rate=units.rate(per_ms * 1000) if per_ms else "",
                           max_in_flight=int(limits["max_in_flight"])
                           if limits.get("max_in_flight") else "",
                           paused="paused" in limits, found=found, filters=given,
                           filter_query=filters.query_of(given),
                           filterable=state in filters.FILTERABLE,
                           title=f"{name}: {state}")

    def batch(self, request: Request) -> Response:
        name = queue_name(request)
        batch_id = request.path_params["batch_id"]
        page = data.batch_page(self.client, name, batch_id, _int_param(request, "offset", 0))
        return self.render(request, "batch.html", b=page, queue=name, title=f"batch {batch_id}")

    def job(self, request: Request) -> Response:
        name = queue_name(request)
        detail = data.job_detail(self.client, name, request.path_params["job_id"])
        now_ms = data.redis_now_ms(self.client)
        return self.render(request, "job.html", d=detail, queue=name, now_ms=now_ms,
                           title=f"job {detail['job'].id}")

def _redirect_back(request: Request, form: dict[str, list[str]], message: str) -> Response:
    back = (form.get("next") or ["/"])[0]
    if not back.startswith("/") or back.startswith("//"):
        back = "/"  # only our own pages: never an open redirect
    back = back.split("?", 1)[0]
    return RedirectResponse(f"{back}?{urlencode({'done': message})}", 303)


def _int_param(request: Request, name: str, default: int) -> int:
    try:
        return max(0, int(request.query_params.get(name, default)))
    except ValueError:
        raise HTTPError(400, f"{name} must be a whole number") from None


class _AuthGate:
    """ASGI wrapper: every request needs the token or the basic-auth password, when set.
    ``/?token=...`` signs a browser in (an HttpOnly cookie) and drops the token from
    the address bar."""

    def __init__(self, app: Any, auth: Auth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.auth.enabled:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = request.query_params.get("token")
        if given is not None and self.auth.token_matches(given):
            response: Response = RedirectResponse(scope["path"], 303)
            response.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="strict")
            await response(scope, receive, send)
            return
        if self.auth.allows(request.headers.get("authorization"),
                            request.cookies.get(TOKEN_COOKIE)):
            await self.app(scope, receive, send)
            return
        headers = {"WWW-Authenticate": 'Basic realm="forq"'} if self.auth.basic else {}
        response = Response("forq web: sign in (a token: /?token=..., or basic auth)\n", 401,
                            headers=headers, media_type="text/plain")
        await response(scope, receive, send)
