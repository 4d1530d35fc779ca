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

from bucketq.errors import MessageHeld
from bucketq.queue import internals
from bucketq.shell.connection import unreachable
from bucketq.shell.redaction import redact
from bucketq.shell.text_views import (
    DEAD,
    QUARANTINE,
    Kind,
    age,
    count_matching,
    entries_page,
    entry_view,
    one_line,
    pretty_json,
    preview,
    relative,
)
from bucketq.web.charts import SERIES_COLORS, group_colors, line_chart
from bucketq.web.dashboard import ACTIONS, ENTRY_ROWS, NEXT_ROWS, QUEUE_ACTIONS, RESETS, Dashboard, which
from bucketq.web.messages import PLACES, VERBS, find_message
from bucketq.web.security import SESSION_COOKIE, Guard

MIN_SPAN_S = 60.0
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.filters.update(age=age, preview=preview, pretty=pretty_json,
                             utc=lambda at: f"{at:%Y-%m-%d %H:%M:%S} UTC" if isinstance(at, dt.datetime) else "-")
templates.env.globals.update(colors=SERIES_COLORS)


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
        Route("/queues/{name}/messages/{id:path}", pages.message, name="message"),
        Route("/queues/{name}/message-{verb}/{id:path}", pages.message_action, methods=["GET", "POST"],
              name="message_action"),
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
            "csrf": self.guard.csrf(request), "now": self.dashboard.clock.now(), "relative": relative,
            "refresh_s": None, **context})

    def render_live(self, request: Request, template: str, **context: Any) -> Response:
        """A page that refreshes its ``data-live`` parts in place every sampling interval (base.html's script)."""
        return self.render(request, template, refresh_s=self.dashboard.history.interval_s, **context)

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

    def charts(self, kind: str, name: str, series: dict[str, str], colors: dict[str, str],
               unit: str = "") -> dict[str, Any]:
        """A chart of the series (field: label) of one queue or stream: ``svg``, and ``covers``, what the samples
        span ("last 4 min"; "last hour" once an hour is sampled), for its title."""
        now = time.time()
        history = self.dashboard.history
        lines = {label: history.points((kind, name, field), now) for field, label in series.items()}
        # until an hour is sampled, the chart spans what is (a minute at least): not a sliver at its right edge
        oldest = min((points[0][0] for points in lines.values() if points), default=None)
        sampled = 0.0 if oldest is None else now - oldest
        span = min(history.span_s, max(MIN_SPAN_S, sampled))
        # a full hour once the oldest sample kept is within an interval of an hour old (a minute at most)
        full = sampled >= history.span_s - min(history.interval_s, MIN_SPAN_S)
        covers = "no samples yet" if oldest is None else "last hour" if full else f"last {age(sampled)}"
        return {"svg": line_chart(lines, colors=colors, now=now, span_s=span, unit=unit), "covers": covers}

    # -- pages ---------------------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        self.require_reader(request)
        await self.dashboard.sync_clock()
        queues = await self.dashboard.queue_rows()
        streams = await self.dashboard.stream_rows()
        backlog = {name: self.charts("queue", name, {"pending": "pending", "dead": "dead"}, SERIES_COLORS)
                   for name in queues}
        return self.render_live(request, "overview.html", queues=queues, streams=streams, backlog=backlog)

    async def found(self, request: Request, kind: str) -> tuple[str, Any]:
        """The queue or stream (``kind``) the path names, for a reader allowed in; else an HTTP error."""
        self.require_reader(request)
        await self.dashboard.sync_clock()
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
        listings = {kind.command: await self.listing(request, queue, kind, row) for kind in (DEAD, QUARANTINE)}
        return self.render_live(
            request, "queue.html", name=name, row=row, listings=listings, actions=ACTIONS,
            queue_actions=QUEUE_ACTIONS, next_up=await queue.peek(NEXT_ROWS), held=await self.dashboard.held(queue),
            backlog=self.charts("queue", name, {"pending": "pending", "ready": "ready", "dead": "dead"},
                                SERIES_COLORS),
            throughput=self.charts("queue", name, {"in_per_s": "in", "out_per_s": "out"}, SERIES_COLORS, "/s"),
            measures_rates=self.dashboard.measures_rates)

    async def listing(self, request: Request, queue: Any, kind: Kind, row: dict[str, Any]) -> dict[str, Any]:
        """One page of a queue's dead letters or quarantine (``?dead_page=2&dead_error=timeout``): its rows, how
        many match the error filter, and the links to the pages before and after it."""
        error = request.query_params.get(f"{kind.command}_error", "").strip() or None
        total = row["dead" if kind is DEAD else "quarantined"]
        matching = total if error is None else await count_matching(internals(queue), kind, error_contains=error)
        pages = max(1, -(-matching // ENTRY_ROWS))
        try:
            page = min(pages, max(1, int(request.query_params.get(f"{kind.command}_page", "1"))))
        except ValueError:
            raise HTTPException(400, f"{kind.command}_page must be a page number") from None
        rows = await entries_page(internals(queue), kind, skip=(page - 1) * ENTRY_ROWS, limit=ENTRY_ROWS,
                                  error_contains=error)

        def page_url(n: int) -> str:
            return str(request.url.include_query_params(**{f"{kind.command}_page": n}))

        return {"error": error or "", "total": total, "matching": matching, "page": page, "pages": pages,
                "first": (page - 1) * ENTRY_ROWS + 1, "rows": [entry_view(e) for e in rows],
                "previous": page_url(page - 1) if page > 1 else None,
                "next": page_url(page + 1) if page < pages else None}

    async def queue_action(self, request: Request) -> Response:
        name, queue = await self.found(request, "queue")
        verb = request.path_params["action"]
        action = ACTIONS.get(verb)
        if action is None:
            raise HTTPException(404, f"no action {verb!r} on a queue")
        source = request.query_params if request.method == "GET" else await self.checked_form(request)
        # the error filter of the dead letters or quarantine an action takes; the queue's own actions take none
        error = (source.get("error", "").strip() or None) if action.entries else None
        covers = which(action.entries, error) if action.entries else ""
        if request.method == "GET":
            self.offer_actions()
            matching = 0
            if action.entries:
                matching = await count_matching(internals(queue), action.entries, error_contains=error)
            question = action.question.format(name=name, matching=matching, which=covers, **await queue.stats())
            return self.render(request, "confirm.html", title=action.label, question=question,
                               back=request.url_for("queue", name=name), fields={"error": error} if error else None)
        self.confirmed(dict(source))
        n = await action.run(queue, error)
        return self.render(request, "message.html", title=action.label, back=request.url_for("queue", name=name),
                           message=action.done.format(name=name, n=n, which=covers))

    async def found_message(self, request: Request) -> tuple[str, Any, dict[str, Any]]:
        """The queue, its handle and the message the path names; else an HTTP error."""
        name, queue = await self.found(request, "queue")
        message_id = request.path_params["id"]
        message = await find_message(queue, message_id)
        if message is None:
            raise HTTPException(404, f"no message {message_id!r} in queue {name!r}: not a dead letter, not in "
                                "quarantine and not pending (finished, or never pushed)")
        return name, queue, message

    async def message(self, request: Request) -> Response:
        name, _, message = await self.found_message(request)
        return self.render(request, "message_view.html", name=name, message=message, place=PLACES[message["where"]],
                           verbs=VERBS[message["where"]])

    async def message_action(self, request: Request) -> Response:
        name, queue, message = await self.found_message(request)
        verb, message_id, where = request.path_params["verb"], request.path_params["id"], message["where"]
        if verb not in VERBS[where]:
            raise HTTPException(404, f"no {verb!r} of a message that is {PLACES[where]}")
        label, run = VERBS[where][verb]
        back = request.url_for("queue", name=name)
        if request.method == "GET":
            self.offer_actions()
            question = (f"{label} message {message_id!r} of queue {name!r}, {PLACES[where]}? " + (
                "It goes back in the queue, ready now with its tries reset." if verb == "retry" else
                "It is deleted for good: no consumer will get it."))
            return self.render(request, "confirm.html", title=f"{label} message", question=question,
                               back=request.url_for("message", name=name, id=message_id))
        self.confirmed(await self.checked_form(request))
        try:
            done = await run(queue, message_id)
        except MessageHeld as exc:
            raise HTTPException(409, str(exc)) from None
        past = "retried" if verb == "retry" else "deleted"
        text = (f"{past} message {message_id!r} of queue {name!r}" if done
                else f"message {message_id!r} of queue {name!r} was gone already: nothing {past}")
        return self.render(request, "message.html", title=f"{label} message", message=text, back=back)

    async def stream(self, request: Request) -> Response:
        name, stream = await self.found(request, "stream")
        row = await stream.stats()
        lag = self.charts("stream", name, {group: group for group in row["groups"]}, group_colors(row["groups"]))
        return self.render_live(request, "stream.html", name=name, row=row, lag=lag, resets=RESETS)

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
