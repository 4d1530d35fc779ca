"""The dashboard (bucketq.web) without a browser: its pages, the token, sessions and CSRF, read-only mode, the
confirmation every action needs, the loopback rule, the autoscaling endpoint, passwords kept out of pages; on the
in-memory database through Starlette's TestClient (the browser test, tests/test_web_browser.py, uses the server).
And ``bucketq stats --json``'s ``pending`` and the README's mount example, on the test server."""

from __future__ import annotations

import asyncio
import datetime as dt
import html
import importlib.util
import itertools
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from bson import ObjectId
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

import bucketq
from bucketq.cli import cli
from bucketq.core.claims import owner_name
from bucketq.core.holdings import UNKNOWN_HOLDER, by_holder
from bucketq.errors import InvalidOption
from bucketq.web import check_bind, create_app
from bucketq.web.charts import SERIES_COLORS, line_chart
from bucketq.web.history import History
from bucketq.web.security import SESSION_COOKIE
from tests.dashboard_data import TOKEN, fill
from tests.helpers import eventually, step_local_clock, utc_now

ROOT = Path(__file__).resolve().parent.parent
# The TestClient serves the app from a loop in a thread of its own, which the test waits for: real time.
pytestmark = pytest.mark.real_time
CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@pytest.fixture
def open_app(memory_db: Any) -> Iterator[Callable[..., TestClient]]:
    """``open_app(**create_app options)``: a TestClient on the dashboard of ``memory_db`` filled by ``fill``,
    its lifespan running."""
    clients: list[TestClient] = []

    def make(**options: Any) -> TestClient:
        client = TestClient(create_app(memory_db, interval_s=3600, **options), follow_redirects=False)
        client.__enter__()
        clients.append(client)
        if len(clients) == 1:
            client.portal.call(fill, memory_db, memory_db.sync)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def call(client: TestClient, coroutine: Callable[..., Any], *args: Any) -> Any:
    """Run a coroutine on the app's event loop (where the in-memory database is used)."""
    return client.portal.call(coroutine, *args)


async def is_paused(db: Any, name: str) -> bool:
    async with bucketq.Queue(db, name=name) as queue:
        return await queue.paused()


def logged_in(client: TestClient) -> str:
    """Log in with the token; the CSRF field of the session's forms."""
    response = client.post("/login", data={"token": TOKEN, "next": "/"})
    assert response.status_code == 303 and response.headers["location"] == "/"
    assert SESSION_COOKIE in response.cookies
    return CSRF.search(client.get("/").text).group(1)  # type: ignore[union-attr]


# -- pages ---------------------------------------------------------------------------------------------------

def test_pages_show_counts_reasons_and_reader_groups(open_app) -> None:
    client = open_app()
    overview = client.get("/")
    assert overview.status_code == 200
    orders_row = re.search(r'<a href="[^"]*/queues/orders">orders</a>.*?</tr>', overview.text, re.DOTALL).group()
    # pending, ready, scheduled, in flight, dead, quarantined
    assert re.findall(r"<td>([\d,]+)</td>", orders_row)[:6] == ["17", "17", "0", "0", "3", "1"]
    emails_row = re.search(r'<a href="[^"]*/queues/emails">emails</a>.*?</tr>', overview.text, re.DOTALL).group()
    assert re.findall(r"<td>([\d,]+)</td>", emails_row)[:4] == ["5", "5", "5", "0"]
    assert re.search(r'/streams/events">events</a></td>\s*<td>\d+</td><td>2</td>\s*<td>30</td>', overview.text)

    orders = html.unescape(client.get("/queues/orders").text)
    for reason in ("card declined", "address unknown", "timeout calling the warehouse", "undecodable"):
        assert reason in orders
    assert "whole bucket, 1 messages" in orders
    assert 'id="action-' not in orders  # read-only: no action offered

    events = client.get("/streams/events").text
    assert re.search(r"<td>audit</td><td>[^<]*</td><td>30</td>", events)
    assert re.search(r"<td>billing</td><td>[^<]*</td><td>0</td>", events)
    assert client.get("/queues/nope").status_code == 404
    assert client.get("/streams/nope").status_code == 404


def test_what_the_data_holds_is_shown_as_text_never_as_markup(open_app, memory_db) -> None:
    client = open_app()

    async def dead_letter_with_markup() -> None:
        async with bucketq.Queue(memory_db, name="orders") as orders:
            message = await orders.reserve(timeout=2)
            assert message is not None
            await message.dead_letter(error="<script>alert(1)</script>", wait=True)
    call(client, dead_letter_with_markup)
    page = client.get("/queues/orders").text
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_charts_draw_the_samples(open_app) -> None:
    client = open_app()
    dashboard = client.app.state.dashboard  # type: ignore[attr-defined]
    assert "no samples yet" in client.get("/queues/orders").text
    call(client, dashboard.sample)
    call(client, dashboard.sample)
    page = client.get("/queues/orders").text
    assert page.count("<polyline") >= 3  # pending, ready and dead; in/out need change streams on the first sample
    chart = page.split("<svg", 1)[1].split("</svg>", 1)[0]
    assert "<script" not in chart and "http" not in chart  # drawn on the server, nothing fetched
    stream = client.get("/streams/events").text
    assert stream.count("<polyline") == 2  # one line per reader group


# -- read-only, token, sessions, CSRF, confirmation ----------------------------------------------------------

def test_read_only_refuses_every_post(open_app, memory_db) -> None:
    for options in ({}, {"token": TOKEN}):  # no token; a token but no --allow-actions
        client = open_app(**options)
        if options:
            csrf = logged_in(client)
            assert client.get("/queues/orders/pause").status_code == 403  # no confirmation page either
        else:
            csrf = ""
        response = client.post("/queues/orders/pause", data={"confirm": "yes", "csrf": csrf})
        assert response.status_code == 403 and "read-only" in response.text
        response = client.post("/streams/events/reset", data={"confirm": "yes", "csrf": csrf, "group": "audit",
                                                               "to": "end"})
        assert response.status_code == 403
    assert call(client, is_paused, memory_db, "orders") is False


def test_actions_need_a_token() -> None:
    with pytest.raises(InvalidOption, match="token"):
        create_app(bucketq.memory.MemoryClient()["db"], allow_actions=True)
    result = CliRunner().invoke(cli, ["web", "--allow-actions", "--uri", "mongodb://127.0.0.1:1/db"],
                                env={"BUCKETQ_WEB_TOKEN": ""})
    assert result.exit_code == 2 and "needs a token" in result.output


def test_with_a_token_every_page_asks_for_it(open_app) -> None:
    client = open_app(token=TOKEN)
    response = client.get("/queues/orders")
    assert response.status_code == 303 and response.headers["location"].endswith("/login?next=%2Fqueues%2Forders")
    assert client.get("/api/pending").status_code == 401
    wrong = client.post("/login", data={"token": "guess", "next": "/"})
    assert wrong.status_code == 401 and SESSION_COOKIE not in wrong.cookies
    assert client.get("/api/pending", headers={"Authorization": "Bearer guess"}).status_code == 401
    assert client.get("/api/pending", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # a forged cookie is no session
    client.cookies.set(SESSION_COOKIE, "abc.def")
    assert client.get("/").status_code == 303
    client.cookies.clear()
    # log-in sends nobody to another site
    response = client.post("/login", data={"token": TOKEN, "next": "//evil.example/x"})
    assert response.headers["location"] == "http://testserver/"
    assert client.get("/").status_code == 200


def test_every_post_checks_token_csrf_origin_and_confirmation(open_app, memory_db) -> None:
    client = open_app(token=TOKEN, allow_actions=True)
    assert client.post("/queues/orders/pause", data={"confirm": "yes"}).status_code == 401  # no session
    csrf = logged_in(client)
    refused = [
        client.post("/queues/orders/pause", data={"confirm": "yes"}),  # no CSRF field
        client.post("/queues/orders/pause", data={"confirm": "yes", "csrf": "0" * 64}),  # a wrong one
        client.post("/queues/orders/pause", data={"confirm": "yes", "csrf": csrf},
                    headers={"Origin": "http://evil.example"}),  # another site's page
    ]
    assert [r.status_code for r in refused] == [403, 403, 403]
    unconfirmed = client.post("/queues/orders/pause", data={"csrf": csrf})
    assert unconfirmed.status_code == 400 and "not confirmed" in unconfirmed.text
    assert call(client, is_paused, memory_db, "orders") is False

    question = client.get("/queues/orders/pause")
    assert question.status_code == 200 and 'name="confirm" value="yes"' in question.text
    done = client.post("/queues/orders/pause", data={"confirm": "yes", "csrf": csrf},
                       headers={"Origin": "http://testserver"})
    assert done.status_code == 200 and "paused queue" in done.text
    assert call(client, is_paused, memory_db, "orders") is True
    # a script: the bearer header stands for session and CSRF field, the confirmation is still needed
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    client.cookies.clear()
    assert client.post("/queues/orders/resume", headers=bearer).status_code == 400
    assert client.post("/queues/orders/resume", data={"confirm": "yes"}, headers=bearer).status_code == 200
    assert call(client, is_paused, memory_db, "orders") is False
    # a session ends when the token changes: the cookie was signed with the old one
    other = open_app(token="another-token", allow_actions=True)
    other.cookies.set(SESSION_COOKIE, client.post("/login", data={"token": TOKEN}).cookies[SESSION_COOKIE])
    assert other.post("/queues/orders/pause", data={"confirm": "yes", "csrf": csrf}).status_code == 401


def test_requeue_dead_letters_and_reset_a_reader_group(open_app, memory_db) -> None:
    client = open_app(token=TOKEN, allow_actions=True)
    csrf = logged_in(client)
    question = html.unescape(client.get("/queues/orders/requeue-dead").text)
    assert "Put the 3 dead letter(s) of queue 'orders' back" in question
    done = client.post("/queues/orders/requeue-dead", data={"confirm": "yes", "csrf": csrf})
    assert "requeued 3 dead letter(s)" in done.text

    async def counts() -> dict[str, Any]:
        async with bucketq.Queue(memory_db, name="orders") as queue:
            return await queue.stats()
    row = call(client, counts)
    assert (row["dead"], row["ready"]) == (0, 17 + 3)

    question = html.unescape(client.get("/streams/events/reset?group=billing&to=beginning").text)
    assert "Move reader group 'billing'" in question
    client.post("/streams/events/reset", data={"confirm": "yes", "csrf": csrf, "group": "billing",
                                                "to": "beginning"})

    async def lag() -> int:
        async with bucketq.Stream(memory_db, name="events") as events:
            return (await events.stats())["groups"]["billing"]["lag_messages"]
    assert call(client, lag) == 30


def test_logout_ends_the_session(open_app) -> None:
    client = open_app(token=TOKEN)
    csrf = logged_in(client)
    assert client.post("/logout", data={}).status_code == 403  # CSRF-checked like any POST
    response = client.post("/logout", data={"csrf": csrf})
    assert response.status_code == 303
    client.cookies.clear()  # what the browser does with the expired cookie
    assert client.get("/").status_code == 303


# -- binding -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_needs_no_token(host: str) -> None:
    check_bind(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "dashboard.example"])
def test_other_addresses_need_a_token(host: str) -> None:
    with pytest.raises(InvalidOption, match="without a token"):
        check_bind(host, None)
    check_bind(host, TOKEN)
    result = CliRunner().invoke(cli, ["web", "--host", host, "--uri", "mongodb://127.0.0.1:1/db"],
                                env={"BUCKETQ_WEB_TOKEN": ""})
    assert result.exit_code == 2 and f"refusing to serve the dashboard on {host!r} without a token" in result.output


# -- credentials, autoscaling ------------------------------------------------------------------------------

@pytest.mark.parametrize("server", ["refusing", "silent"])
def test_no_page_or_log_line_shows_the_password(server: str, closed_port: int, everything_logged) -> None:
    """A server that refuses at once, or one that never answers (pymongo then says "No servers found yet", naming
    the server only in its topology's tuples: the log line used to lack ``host:port`` then, a flaky failure under
    load even for the refusing one): the dashboard's page and log line name it as the URI does, redacted."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # accepts connections and never answers
        port = closed_port if server == "refusing" else silent.getsockname()[1]
        uri = f"mongodb://alice:Pa55word@127.0.0.1:{port}/shop?serverSelectionTimeoutMS=200"
        with TestClient(create_app(uri, interval_s=3600)) as client:
            page = client.get("/")
            client.portal.call(eventually, lambda: "dashboard sample failed" in everything_logged())
    assert page.status_code == 503 and "MongoDB error" in page.text
    # as the CLI says it: the URI names the server, pymongo's topology description is left out
    assert f"cannot reach MongoDB at mongodb://***@127.0.0.1:{port}/shop?" in page.text
    assert "Topology" not in page.text and "Pa55word" not in page.text and "alice" not in page.text
    assert f"127.0.0.1:{port}" in everything_logged() and "Pa55word" not in everything_logged()


def test_pending_endpoint_counts_messages_that_need_a_worker(open_app) -> None:
    client = open_app()
    assert client.get("/api/pending/orders").json() == {"queue": "orders", "pending": 17, "ready": 17,
                                                        "in_flight": 0, "scheduled": 0}
    assert client.get("/api/pending/emails").json()["pending"] == 5  # the 5 scheduled ones need no worker yet
    every = client.get("/api/pending").json()
    assert every["pending"] == 22 and set(every["queues"]) == {"orders", "emails"}
    missing = client.get("/api/pending/nope")
    assert missing.status_code == 404 and missing.json()["error"].startswith("no queue 'nope'")


async def test_stats_json_adds_pending_and_keeps_its_keys(mongo_uri: str, db_name: str, sync_db) -> None:
    async with bucketq.Queue(mongo_uri, db=db_name, name="events", bucket_max_wait=0.005) as queue:
        await queue.push_many(list(range(12)))
        await queue.push_many(list(range(4)), delay=3600)
        held = await queue.reserve(timeout=2)  # its bucket of 12 goes in flight
        assert held is not None
        result = await asyncio.to_thread(CliRunner().invoke, cli, ["stats", "events", "--json", "--uri", mongo_uri,
                                                                   "--db", db_name])
        await held.nack(0)
    row = json.loads(result.output)
    assert {"ready", "scheduled", "in_flight", "dead", "quarantined", "buckets", "oldest_ready_age_s",
            "groups"} < set(row)
    assert (row["pending"], row["in_flight"], row["scheduled"]) == (12, 12, 4)


def test_pages_count_ages_by_the_server_clock_and_show_levels(mongo_uri: str, db_name: str, sync_db,
                                                              monkeypatch) -> None:
    due = utc_now() - dt.timedelta(hours=2, minutes=30)  # by the server's clock: the test server runs on this host
    bucket = {"v": 1, "enc": "json", "created": due, "due": due, "n": 1, "done": [], "c": 0, "lease": None}
    sync_db["events"].insert_many([{**bucket, "_id": ObjectId(), "p": ['"top"'], "pr": 7},
                                   {**bucket, "_id": ObjectId(), "p": ['"plain"']}])
    sync_db["events.dead"].insert_one({"_id": "dead:0", "enc": "json", "p": '"dead"', "h": None, "k": None,
                                       "tries": 5, "error": "boom", "at": due, "enqueued_at": due, "origin": {},
                                       "pr": 4})
    step_local_clock(monkeypatch, 3600)  # this host's wall clock, then, an hour ahead of the server's
    with TestClient(create_app(mongo_uri, db=db_name, interval_s=3600)) as client:
        page = client.get("/queues/events").text
        message = client.get("/queues/events/messages/dead:0").text
    next_up = re.search(r'<table id="next-up">.*?</table>', page, re.DOTALL).group()  # type: ignore[union-attr]
    assert sorted(re.findall(r"<td>(\d+)h \d+m ago</td>\s*<td>0</td><td>(\d)</td>\s*<td[^>]*>&#34;(\w+)&#34;",
                             next_up)) == [("2", "0", "plain"), ("2", "7", "top")], next_up
    assert "ready by priority: 7: 1, 0: 1" in page
    dead = re.search(r'<table id="dead">.*?</table>', page, re.DOTALL).group()  # type: ignore[union-attr]
    assert re.findall(r"<td>(\d+)h \d+m ago</td>", dead) == ["2"], dead
    assert re.search(r"<dt>died</dt><dd>2h \d+m ago", message) and "<dt>priority</dt><dd>4</dd>" in message


def test_the_readme_mount_example_serves_the_dashboard(mongo_uri: str, db_name: str, monkeypatch) -> None:
    scheme_hosts, _, query = mongo_uri.partition("/?")
    monkeypatch.setenv("BUCKETQ_MONGODB_URI", f"{scheme_hosts.rstrip('/')}/{db_name}" + (f"?{query}" if query else ""))
    spec = importlib.util.spec_from_file_location("dashboard_mount", ROOT / "examples" / "dashboard_mount.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with TestClient(module.app) as client:
        assert client.post("/orders", json={"order": 1}).status_code == 202
        page = client.get("/bucketq/")
        assert page.status_code == 200 and 'href="http://testserver/bucketq/queues/orders"' in page.text
        assert client.get("/bucketq/api/pending/orders").json()["pending"] == 1


# -- the charts' history and drawing -------------------------------------------------------------------------

@given(samples=st.lists(st.tuples(st.floats(0, 2000), st.one_of(st.none(), st.floats(0, 1e9))), max_size=400),
       interval=st.sampled_from([1.0, 10.0, 60.0]))
def test_history_keeps_the_last_hour_and_the_chart_stays_in_its_box(samples, interval: float) -> None:
    history = History(interval)
    times = list(itertools.accumulate(step for step, _ in samples)) or [0.0]
    for at, (_, value) in zip(times, samples, strict=False):
        history.add(("queue", "q", "pending"), at, value)
    now = times[-1]
    points = history.points(("queue", "q", "pending"), now)
    kept = [(at, float(value)) for at, (_, value) in zip(times, samples, strict=False)
            if value is not None and now - at <= history.span_s]
    assert len(points) <= 3600 / interval + 1
    assert points == kept[len(kept) - len(points):]  # the newest, oldest first
    svg = ElementTree.fromstring(str(line_chart({"pending": points}, colors=SERIES_COLORS, now=now,
                                                   span_s=history.span_s)))
    width, height = (float(n) for n in svg.get("viewBox", "").split()[2:])
    lines = list(svg.iter("polyline"))
    assert len(lines) == (len(points) >= 2)
    for line in lines:
        for x, y in (map(float, pair.split(",")) for pair in line.get("points", "").split()):
            assert 0 <= x <= width and 0 <= y <= height


# -- colours, chart titles, refreshing ------------------------------------------------------------------------

def legend(svg: ElementTree.Element) -> dict[str, str]:
    """A chart's legend: series name -> the colour its text is drawn in (its inline style, which the page's
    stylesheet cannot override), checked against its swatch's."""
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t for t in svg.iter() if t.tag in ("text", f"{ns}text") and t.get("class") == "legend"]
    swatches = [r for r in svg.iter() if r.tag in ("rect", f"{ns}rect") and r.get("class") == "swatch"]
    assert len(texts) == len(swatches)
    colours = {t.text or "": (t.get("style") or "").removeprefix("fill:") for t in texts}
    assert [(r.get("style") or "").removeprefix("fill:") for r in swatches] == list(colours.values())
    return colours


def charts_of(page: str) -> list[ElementTree.Element]:
    return [ElementTree.fromstring(svg) for svg in re.findall(r"<svg.*?</svg>", page, re.DOTALL)]


def test_each_series_has_one_colour_on_every_page_and_its_legend_shows_it(open_app) -> None:
    client = open_app()
    dashboard = client.app.state.dashboard  # type: ignore[attr-defined]
    call(client, dashboard.sample)
    call(client, dashboard.sample)
    seen: dict[str, set[str]] = {}
    for path in ("/", "/queues/orders", "/queues/emails"):
        page = client.get(path).text
        for svg in charts_of(page):
            lines = {line.get("stroke") for line in svg.iter("polyline")}
            for name, colour in legend(svg).items():
                seen.setdefault(name, set()).add(colour)
                assert colour in lines or not lines  # the legend's colour is its line's
        # a table header of a charted series wears its colour too
        for name, colour in re.findall(r'<th><span class="swatch" style="background:(#[0-9a-f]{6})"></span>(\w+)',
                                       page):
            seen.setdefault(colour and name, set()).add(name and colour)
    assert {"pending", "ready", "dead"} <= set(seen)
    assert all(len(colours) == 1 for colours in seen.values()), seen  # red is dead letters wherever it appears
    assert len({colours.pop() for colours in seen.values()}) == len(seen)  # and no two series share one
    groups = legend(charts_of(client.get("/streams/events").text)[0])
    assert set(groups) == {"audit", "billing"} and len(set(groups.values())) == 2
    assert not set(groups.values()) & set(SERIES_COLORS.values())


def test_chart_titles_say_what_the_samples_cover(open_app) -> None:
    client = open_app()
    history = client.app.state.dashboard.history = History(10.0)  # type: ignore[attr-defined]
    assert "messages, no samples yet" in client.get("/queues/orders").text
    now = time.time()
    for field in ("pending", "ready", "dead"):
        history.add(("queue", "orders", field), now - 300, 1)
        history.add(("queue", "orders", field), now, 2)
    page = client.get("/queues/orders").text
    assert re.search(r"messages, last 5m [0-9]s</div>", page) and "last hour" not in page
    history = client.app.state.dashboard.history = History(10.0)  # type: ignore[attr-defined]
    history.add(("queue", "orders", "pending"), now - history.span_s + 5, 1)  # as old as a sample kept can be
    history.add(("queue", "orders", "pending"), now, 1)
    assert "messages, last hour</div>" in client.get("/queues/orders").text


def test_live_pages_refresh_their_counts_and_never_a_form(open_app) -> None:
    """The script that refreshes a page swaps its ``data-live`` parts; a form inside one would lose what was typed
    in it (the browser test watches it happen)."""
    client = open_app()
    for path in ("/", "/queues/orders", "/streams/events"):
        page = client.get(path).text
        assert 'id="refresh-toggle"' in page and "const every = 3600000" in page  # the sampling interval
        live = re.findall(r'<(\w+) [^>]*data-live[^>]*>', page)
        assert live and all('id="' in tag for tag in re.findall(r"<\w+ [^>]*data-live[^>]*>", page))
        for tag in set(live):  # no live part holds a form
            for part in re.findall(rf"<{tag} [^>]*data-live.*?</{tag}>", page, re.DOTALL):
                assert "<form" not in part and "<input" not in part
    assert 'id="refresh-toggle"' not in client.get("/queues/nope").text  # pages that are not live do not reload


# -- one message: its page, retry, delete ----------------------------------------------------------------------

async def dead_letter_ids(db: Any, name: str = "orders", error: str | None = None) -> list[str]:
    async with bucketq.Queue(db, name=name) as queue:
        return [e["_id"] for e in await queue.dead_letters(limit=1000, error_contains=error)]


def test_a_message_page_shows_payload_headers_tries_and_the_error_kept(open_app, memory_db) -> None:
    client = open_app()
    [declined] = call(client, dead_letter_ids, memory_db, "orders", "card declined")
    page = html.unescape(client.get(f"/queues/orders/messages/{declined}").text)
    assert "a dead letter" in page and re.search(r'id="error">card declined<', page)
    assert re.search(r'id="tries">1<', page) and '"order":' in page
    assert "last error only" in page

    async def pushed_with_headers() -> str:
        async with bucketq.Queue(memory_db, name="emails", bucket_max_wait=0.005) as emails:
            return await emails.push({"to": "ada"}, headers={"trace": "t-1"})
    pending = call(client, pushed_with_headers)
    page = html.unescape(client.get(f"/queues/emails/messages/{pending}").text)
    assert ", pending" in page and '"trace": "t-1"' in page and '"to": "ada"' in page
    assert re.search(r'id="tries">0 deliveries so far<', page) and re.search(r'id="held-by">no one<', page)

    quarantined = re.search(r'/queues/orders/messages/([0-9a-f]{24})"', client.get("/queues/orders").text)
    assert quarantined is not None
    page = html.unescape(client.get(f"/queues/orders/messages/{quarantined.group(1)}").text)
    assert "in quarantine" in page and "a whole bucket" in page and "undecodable" in page
    missing = client.get("/queues/orders/messages/000000000000000000000000:0")
    assert missing.status_code == 404 and "not a dead letter" in html.unescape(missing.text)


def test_one_message_is_retried_or_deleted_through_its_confirmation(open_app, memory_db) -> None:
    client = open_app(token=TOKEN, allow_actions=True)
    csrf = logged_in(client)
    declined, unknown, timeout = (call(client, dead_letter_ids, memory_db, "orders", error)[0]
                                  for error in ("card declined", "address unknown", "warehouse"))
    question = html.unescape(client.get(f"/queues/orders/message-retry/{declined}").text)
    assert f"Retry message '{declined}' of queue 'orders', a dead letter?" in question
    assert client.post(f"/queues/orders/message-retry/{declined}", data={"csrf": csrf}).status_code == 400
    assert client.post(f"/queues/orders/message-retry/{declined}", data={"confirm": "yes"}).status_code == 403
    assert call(client, dead_letter_ids, memory_db) == [declined, unknown, timeout]  # not confirmed: nothing done
    done = client.post(f"/queues/orders/message-retry/{declined}", data={"csrf": csrf, "confirm": "yes"})
    assert done.status_code == 200 and f"retried message '{declined}'" in html.unescape(done.text)
    assert call(client, dead_letter_ids, memory_db) == [unknown, timeout]  # the one message, not the others
    assert ", pending" in client.get(f"/queues/orders/messages/{declined}").text  # back in the queue, same id

    done = client.post(f"/queues/orders/message-delete/{unknown}", data={"csrf": csrf, "confirm": "yes"})
    assert f"deleted message '{unknown}'" in html.unescape(done.text)
    assert call(client, dead_letter_ids, memory_db) == [timeout]
    # a pending message has no retry, and is deleted unless a consumer holds it
    assert client.get(f"/queues/orders/message-retry/{declined}").status_code == 404

    async def held_then_released() -> Any:
        async with bucketq.Queue(memory_db, name="orders") as orders:
            message = await orders.reserve(timeout=2)
            assert message is not None
            refused = await asyncio.to_thread(client.post, f"/queues/orders/message-delete/{message.id}",
                                              data={"csrf": csrf, "confirm": "yes"})
            await message.nack(0)
            return message.id, refused
    held_id, refused = call(client, held_then_released)
    assert refused.status_code == 409 and "holds until" in html.unescape(refused.text)
    done = client.post(f"/queues/orders/message-delete/{held_id}", data={"csrf": csrf, "confirm": "yes"})
    assert done.status_code == 200
    assert client.get(f"/queues/orders/messages/{held_id}").status_code == 404  # gone: finished like an ack

    read_only = open_app(token=TOKEN)
    logged_in(read_only)
    assert read_only.get(f"/queues/orders/message-delete/{timeout}").status_code == 403
    assert 'id="message-delete"' not in read_only.get(f"/queues/orders/messages/{timeout}").text


# -- filtered requeue and purge, paging --------------------------------------------------------------------------

def test_requeue_and_purge_take_the_clis_error_filter(open_app, memory_db) -> None:
    client = open_app(token=TOKEN, allow_actions=True)
    csrf = logged_in(client)
    listing = html.unescape(client.get("/queues/orders?dead_error=WAREHOUSE").text)
    assert "Dead letters (1 of 3 whose error contains “WAREHOUSE”)" in listing  # case-insensitive, as the CLI's
    assert "timeout calling the warehouse" in listing and "card declined" not in listing
    assert "/queues/orders/requeue-dead?error=WAREHOUSE" in listing

    question = html.unescape(client.get("/queues/orders/requeue-dead?error=WAREHOUSE").text)
    assert "Put the 1 dead letter(s) whose error contains 'WAREHOUSE' of queue 'orders' back" in question
    assert 'name="error" value="WAREHOUSE"' in question  # the POST carries the filter the question named
    done = client.post("/queues/orders/requeue-dead", data={"csrf": csrf, "confirm": "yes", "error": "WAREHOUSE"})
    assert "requeued 1 dead letter(s) whose error contains 'WAREHOUSE'" in html.unescape(done.text)
    left = call(client, dead_letter_ids, memory_db)
    assert len(left) == 2 and not call(client, dead_letter_ids, memory_db, "orders", "warehouse")

    done = client.post("/queues/orders/purge-dead", data={"csrf": csrf, "confirm": "yes", "error": "card"})
    assert "purged 1 dead letter(s) whose error contains 'card'" in html.unescape(done.text)
    assert len(call(client, dead_letter_ids, memory_db, "orders", "address unknown")) == 1
    assert len(call(client, dead_letter_ids, memory_db)) == 1
    question = html.unescape(client.get("/queues/orders/purge-quarantined?error=nothing+like+it").text)
    assert "Delete the 0 quarantined entries whose reason contains 'nothing like it'" in question


def test_dead_letters_and_quarantine_are_paged(open_app, memory_db) -> None:
    client = open_app()
    start = utc_now() - dt.timedelta(hours=1)
    memory_db.sync["orders.dead"].insert_many([
        {"_id": f"bulk:{i}", "enc": "json", "p": f'{{"n": {i}}}', "h": None, "k": None, "tries": 5,
         "error": "boom" if i % 2 else "bang", "at": start + dt.timedelta(seconds=i), "enqueued_at": start,
         "origin": {"bucket": ObjectId(), "slot": i}, "pt": 0} for i in range(120)])

    def ids_on(query: str) -> list[str]:
        page = client.get(f"/queues/orders?{query}").text
        table = re.search(r'<table id="dead">.*?</table>', page, re.DOTALL)
        return re.findall(r'/messages/([^"]+)">', table.group()) if table else []

    first = client.get("/queues/orders").text
    assert "Dead letters (123)" in first and "rows 1–50 of 123 · page 1 of 3" in html.unescape(first)
    pages = [ids_on(f"dead_page={n}") for n in (1, 2, 3)]
    assert [len(p) for p in pages] == [50, 50, 23]
    everyone = [i for p in pages for i in p]
    assert len(set(everyone)) == 123  # no row twice, none left out
    assert everyone[:120] == [f"bulk:{i}" for i in range(120)]  # oldest first (the 3 from fill died last)
    assert ids_on("dead_page=99") == pages[2]  # past the end: the last page
    assert client.get("/queues/orders?dead_page=x").status_code == 400
    booms = ids_on("dead_error=boom&dead_page=2")
    assert booms == [f"bulk:{i}" for i in range(101, 120, 2)]  # the filter's 60 matches, from the 51st
    assert 'href="http://testserver/queues/orders?dead_error=boom&amp;dead_page=1"' in \
        client.get("/queues/orders?dead_error=boom&dead_page=2").text  # a page's links keep the filter


# -- who holds what ------------------------------------------------------------------------------------------------

def test_the_holders_of_leases_and_groups_are_shown_by_the_owner_their_lease_records(open_app, memory_db) -> None:
    client = open_app()
    assert "No consumer holds a bucket or a group now." in client.get("/queues/orders").text

    async def hold_and_look() -> str:
        async with bucketq.Queue(memory_db, name="carts", bucket_max_wait=0.005) as carts:
            await asyncio.gather(*(carts.push_nowait({"step": step}, group="cart-7") for step in range(3)))
            message = await carts.reserve(timeout=2)  # its bucket, and the group's turn
            assert message is not None
            page = await asyncio.to_thread(client.get, "/queues/carts")
            await message.nack(0)
            return page.text
    page = html.unescape(call(client, hold_and_look))
    holders = re.search(r'<table id="holders">.*?</table>', page, re.DOTALL)
    assert holders is not None
    row = re.search(rf"<tr><td>{re.escape(owner_name())}</td><td>(\d+)</td><td>(\d+)</td>.*?</tr>", holders.group(),
                    re.DOTALL)
    assert row is not None and (row.group(1), row.group(2)) == ("1", "3")
    assert "cart-7 (lock in" in row.group()


def test_a_group_lock_whose_bucket_is_no_longer_held_is_shown_without_a_holder() -> None:
    """A lock names its bucket's lease token, not a holder: a lock outliving its lease (a consumer that crashed: the
    lock lasts up to one lease longer) has no lease to name its holder."""
    until = utc_now() + dt.timedelta(seconds=30)
    held = [{"lease": {"token": "t1", "owner": "web-1:42"}, "due": until, "n": 5, "done": [0, 1]},
            {"lease": {"token": "t2", "owner": "web-1:42"}, "due": until - dt.timedelta(seconds=5), "n": 2, "done": []}]
    locks = [{"_id": "cart-7", "token": "t1", "until": until}, {"_id": "cart-9", "token": "gone", "until": until}]
    assert by_holder(held, locks) == {
        UNKNOWN_HOLDER: {"buckets": 0, "messages": 0, "until": None, "groups": [{"group": "cart-9", "until": until}]},
        "web-1:42": {"buckets": 2, "messages": 5, "until": until, "groups": [{"group": "cart-7", "until": until}]}}
