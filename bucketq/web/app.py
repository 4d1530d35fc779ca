"""The dashboard's ASGI app (Starlette, Jinja2 templates): pages, the confirmation forms of the write actions,
the log-in form, and ``/api/pending`` for autoscalers."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pymongo.errors import PyMongoError, ServerSelectionTimeoutError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from bucketq.cli.common import one_line
from bucketq.cli.entries import entry_view
from bucketq.cli.output import age, preview, relative
from bucketq.connection import unreachable
from bucketq.redaction import redact
from bucketq.web.charts import line_chart
from bucketq.web.dashboard import ACTIONS, ENTRY_ROWS, RESETS, Dashboard
from bucketq.web.security import SESSION_COOKIE, Guard

MIN_SPAN_S = 60.0
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.filters.update(age=age, preview=preview)


def create_app(target: Any, *, db: str | None = None, token: str | None = None, allow_actions: bool = False,
               interval_s: float = 10.0) -> Starlette:
    """The dashboard of one database, as an ASGI app to serve (``bucketq web``) or mount in a service of yours.

    ``target`` and ``db`` are what ``Queue`` takes (a URI, a client, a database). Read-only unless
    ``allow_actions`` is set, which needs ``token`` too. With a token every page asks for it. The charts are
    sampled every ``interval_s`` seconds while the app's lifespan runs (mounted, run it from your app's
    lifespan: docs/operations/dashboard.md) and kept in memory for an hour."""
    guard = Guard(token, allow_actions)  # first: a refused option opens no client
    dashboard = Dashboard(target, db=db, interval_s=interval_s)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        dashboard.start()
        try:
            yield
        finally:
            await dashboard.close()

    pages = Pages(dashboard, guard)
    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/queues/{name}", pages.queue, name="queue"),
        Route("/queues/{name}/{action}", pages.queue_action, methods=["GET", "POST"], name="queue_action"),
        Route("/streams/{name}", pages.stream, name="stream"),
        Route("/streams/{name}/reset", pages.stream_reset, methods=["GET", "POST"], name="stream_reset"),
        Route("/login", pages.login, methods=["GET", "POST"], name="login"),
        Route("/logout", pages.logout, methods=["POST"], name="logout"),
        Route("/api/pending", pages.pending, name="pending"),
        Route("/api/pending/{name}", pages.pending, name="pending_queue"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: pages.error, PyMongoError: pages.failed})
    app.state.dashboard = dashboard
    return app


class Pages:
    """The request handlers: every page checks who may read it, every POST goes through ``Guard.refuse_post``."""

    def __init__(self, dashboard: Dashboard, guard: Guard) -> None:
        self.dashboard = dashboard
        self.guard = guard

    # -- helpers -------------------------------------------------------------------------------------------

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        where = redact(self.dashboard.uri) if self.dashboard.uri else ""
        return templates.TemplateResponse(request, template, status_code=status, context={
            "database": self.dashboard.database.name, "server": where, "guard": self.guard,
            "csrf": self.guard.csrf(request), "now": dt.datetime.now(dt.timezone.utc), "relative": relative,
            **context})

    def require_reader(self, request: Request) -> None:
        if not self.guard.may_read(request):
            raise HTTPException(401, "log in with the dashboard's token")

    async def checked_form(self, request: Request, *, action: bool = True) -> dict[str, str]:
        """The POSTed form, after ``Guard.refuse_post`` let it through (else an HTTP error)."""
        form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
        refusal = self.guard.refuse_post(request, form, action=action)
        if refusal is not None:
            raise HTTPException(*refusal)
        return form

    @staticmethod
    def confirmed(form: dict[str, str]) -> None:
        if form.get("confirm") != "yes":
            raise HTTPException(400, "not confirmed: the form must carry confirm=yes (use the confirmation page)")

    async def error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if request.url.path.startswith(request.url_for("pending").path):  # the API answers in JSON
            return JSONResponse({"error": exc.detail}, exc.status_code)
        if exc.status_code == 401 and request.method == "GET":
            return RedirectResponse(request.url_for("login").include_query_params(next=request.url.path), 303)
        return self.render(request, "message.html", exc.status_code, title=f"{exc.status_code}",
                           message=exc.detail)

    async def failed(self, request: Request, exc: Exception) -> Response:
        """A server error as one line, its credentials hidden (a message of pymongo's may quote the URI); a server
        that did not answer as the CLI and the dashboard's log say it, without pymongo's topology description."""
        text = one_line(unreachable(self.dashboard.uri, exc) if isinstance(exc, ServerSelectionTimeoutError)
                        else redact(f"{type(exc).__name__}: {exc}", self.dashboard.uri))
        return self.render(request, "message.html", 503, title="MongoDB error", message=text)

    def charts(self, kind: str, name: str, series: dict[str, str], unit: str = "") -> Any:
        now = time.time()
        history = self.dashboard.history
        lines = {label: history.points((kind, name, field), now) for field, label in series.items()}
        # until an hour is sampled, the chart spans what is (a minute at least): not a sliver at its right edge
        oldest = min((points[0][0] for points in lines.values() if points), default=now)
        span = min(history.span_s, max(MIN_SPAN_S, now - oldest))
        return line_chart(lines, now=now, span_s=span, unit=unit)

    # -- pages ---------------------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        self.require_reader(request)
        queues = await self.dashboard.queue_rows()
        streams = await self.dashboard.stream_rows()
        backlog = {name: self.charts("queue", name, {"pending": "pending", "dead": "dead"}) for name in queues}
        return self.render(request, "overview.html", queues=queues, streams=streams, backlog=backlog)

    async def found(self, request: Request, kind: str) -> tuple[str, Any]:
        """The queue or stream (``kind``) the path names, for a reader allowed in; else an HTTP error."""
        self.require_reader(request)
        name = request.path_params["name"]
        handle = await (self.dashboard.queue(name) if kind == "queue" else self.dashboard.stream(name))
        if handle is None:
            raise HTTPException(404, f"no {kind} {name!r} in database {self.dashboard.database.name!r}")
        return name, handle

    def offer_actions(self) -> None:
        """A confirmation page is shown only where the action could then be done."""
        if not self.guard.actions:
            raise HTTPException(403, "the dashboard is read-only: start it with --allow-actions and a token")

    async def queue(self, request: Request) -> Response:
        name, queue = await self.found(request, "queue")
        row = {**await queue.stats(), "paused": await queue.paused()}
        dead = [entry_view(e) for e in await queue.dead_letters(limit=ENTRY_ROWS)]
        quarantined = [entry_view(e) for e in await queue.quarantined(limit=ENTRY_ROWS)]
        return self.render(
            request, "queue.html", name=name, row=row, dead=dead, quarantined=quarantined, actions=ACTIONS,
            backlog=self.charts("queue", name, {"pending": "pending", "ready": "ready", "dead": "dead"}),
            throughput=self.charts("queue", name, {"in_per_s": "in", "out_per_s": "out"}, "/s"),
            measures_rates=self.dashboard.measures_rates)

    async def queue_action(self, request: Request) -> Response:
        name, queue = await self.found(request, "queue")
        verb = request.path_params["action"]
        action = ACTIONS.get(verb)
        if action is None:
            raise HTTPException(404, f"no action {verb!r} on a queue")
        if request.method == "GET":
            self.offer_actions()
            question = action.question.format(name=name, **await queue.stats())
            return self.render(request, "confirm.html", title=action.label, question=question,
                               back=request.url_for("queue", name=name))
        form = await self.checked_form(request)
        self.confirmed(form)
        n = await action.run(queue)
        return self.render(request, "message.html", title=action.label, message=action.done.format(name=name, n=n),
                           back=request.url_for("queue", name=name))

    async def stream(self, request: Request) -> Response:
        name, stream = await self.found(request, "stream")
        row = await stream.stats()
        lag = self.charts("stream", name, {group: group for group in row["groups"]})
        return self.render(request, "stream.html", name=name, row=row, lag=lag, resets=RESETS)

    async def stream_reset(self, request: Request) -> Response:
        name, stream = await self.found(request, "stream")
        source = request.query_params if request.method == "GET" else await self.checked_form(request)
        group, to = source.get("group", ""), source.get("to", "")
        if to not in RESETS or not group:
            raise HTTPException(400, f"a reset needs a group and to= one of {', '.join(RESETS)}")
        if request.method == "GET":
            self.offer_actions()
            return self.render(request, "confirm.html", title="Reset reader group", back=request.url_for(
                "stream", name=name), question=f"Move reader group {group!r} of stream {name!r} to its {to}? "
                "Its readers drop what they hold and read on from there.", fields={"group": group, "to": to})
        self.confirmed(dict(source))
        start = await stream.reset(group, to)
        return self.render(request, "message.html", title="Reset reader group", message=f"group {group!r} of stream "
                           f"{name!r} now reads from {start}", back=request.url_for("stream", name=name))

    async def login(self, request: Request) -> Response:
        if self.guard.token is None:
            return RedirectResponse(request.url_for("overview"), 303)
        target = request.query_params.get("next", "")
        if request.method == "GET":
            return self.render(request, "login.html", next=target)
        form = await request.form()
        given, target = str(form.get("token", "")), str(form.get("next", ""))
        if not self.guard.token_matches(given):
            return self.render(request, "login.html", 401, next=target, failed=True)
        # only a path of this app: an absolute or protocol-relative URL would make the form an open redirect
        safe = target if target.startswith("/") and not target.startswith("//") else str(request.url_for("overview"))
        response = RedirectResponse(safe, 303)
        response.set_cookie(SESSION_COOKIE, self.guard.new_session(), httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path=request.scope.get("root_path") or "/")
        return response

    async def logout(self, request: Request) -> Response:
        await self.checked_form(request, action=False)
        response = RedirectResponse(request.url_for("login"), 303)
        response.delete_cookie(SESSION_COOKIE, path=request.scope.get("root_path") or "/")
        return response

    async def pending(self, request: Request) -> Response:
        """The autoscaling signal as JSON: ``{"pending": n, "ready", "in_flight", "scheduled"}`` for one queue,
        ``{"queues": {name: {...}}, "pending": total}`` for all (KEDA metrics-api: valueLocation "pending")."""
        self.require_reader(request)
        name = request.path_params.get("name")
        fields = ("pending", "ready", "in_flight", "scheduled")
        if name is not None:
            _, queue = await self.found(request, "queue")
            row = await queue.stats()
            return JSONResponse({"queue": name, **{f: row[f] for f in fields}})
        rows = await self.dashboard.queue_rows()
        return JSONResponse({"queues": {n: {f: row[f] for f in fields} for n, row in rows.items()},
                             "pending": sum(row["pending"] for row in rows.values())})
