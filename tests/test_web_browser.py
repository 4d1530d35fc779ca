"""The dashboard in a real browser: Debian's Chromium driven by Selenium through Debian's chromedriver (``make
browser`` installs both; nothing is downloaded at run time: Selenium Manager is made to fail should it run). On
the test server, ``bucketq web`` serves real data (tests.dashboard_data.fill); after some traffic gives the charts
something to draw, the browser logs in, checks the legends' colours, watches the queue's page refresh itself (and
keep what was typed in a form, and stop when paused), sees who holds a bucket, requeues the dead
letters a filter selects, opens one message and retries it, pages through the dead letters and pauses the
queue, each action through its confirmation page, and the effects are read back from MongoDB.
Screenshots go to a folder under pytest's temporary directory, or to ``$BUCKETQ_SCREENSHOTS``
(``BUCKETQ_SCREENSHOTS=docs/images`` refreshes the docs')."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from bson import ObjectId

import bucketq
from bucketq.core.claims import owner_name
from bucketq.web.charts import SERIES_COLORS
from devtools.testserver import free_port
from tests.dashboard_data import TOKEN, fill
from tests.helpers import answers, eventually, utc_now

pytestmark = [pytest.mark.browser]
ROOT = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# As root, Chromium needs --no-sandbox; without the background-networking flags it keeps calling home, and this
# closed network refuses those connections.
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1280,900")
PATIENCE_S = 30

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip(f"{CHROMIUM} or {CHROMEDRIVER} is missing: `make browser` installs them (make test does)",
                allow_module_level=True)

from selenium import webdriver  # noqa: E402  (after the skip: the module is of no use without the browser)
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.selenium_manager import SeleniumManager  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("BUCKETQ_SCREENSHOTS")
    return Path(folder) if folder else tmp_path_factory.mktemp("screenshots")


@pytest.fixture
async def dashboard(mongo_uri: str, db_name: str) -> Any:
    """``bucketq web`` in a subprocess on a free loopback port, actions allowed; its URL. Stopped by PID."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bucketq.cli", "web", "--uri", mongo_uri, "--db", db_name, "--port", str(port),
         "--allow-actions", "--interval", "1s"],
        cwd=ROOT, env={**os.environ, "BUCKETQ_WEB_TOKEN": TOKEN}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        await eventually(lambda: answers(port) or server.poll() is not None, PATIENCE_S, "the dashboard to listen")
        assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
        yield f"http://127.0.0.1:{port}"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(PATIENCE_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if server.stderr:
            server.stderr.close()


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Headless Chromium through chromedriver, both Debian's; chromedriver and every browser process it started
    are ended by PID afterwards."""
    def no_download(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Selenium Manager ran: it would look for (and download) a browser or driver")

    monkeypatch.setattr(SeleniumManager, "binary_paths", no_download)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(options=options, service=service)
    assert service.process is not None
    processes = [psutil.Process(service.process.pid)]
    processes += processes[0].children(recursive=True)
    try:
        yield driver
    finally:
        driver.quit()
        for process in processes:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                process.kill()
        psutil.wait_procs(processes, timeout=PATIENCE_S)
        shutil.rmtree(tmp_path / "profile", ignore_errors=True)


def wait_for(driver: Any, condition: Any, what: str) -> Any:
    """``condition(driver)`` once true. The live pages replace their parts every second: an element replaced
    between its finding and its use is found again."""
    return WebDriverWait(driver, PATIENCE_S, poll_frequency=0.2,
                         ignored_exceptions=[StaleElementReferenceException]).until(condition, what)


def click(driver: Any, how: str, what: str) -> None:
    def clicked(d: Any) -> bool:
        d.find_element(how, what).click()
        return True
    wait_for(driver, clicked, f"{what} to be clicked")


def text_of(driver: Any, element_id: str) -> str:
    return wait_for(driver, lambda d: d.find_element(By.ID, element_id).text, element_id)


def texts(driver: Any, css: str) -> list[str]:
    """The text of every element ``css`` selects, read at once (in the page's script: no refresh in between)."""
    return driver.execute_script("return [...document.querySelectorAll(arguments[0])].map(e => e.textContent.trim())",
                                 css)


def rgb(hex_colour: str) -> str:
    """``#dc2626`` as the browser reports a computed colour: ``rgb(220, 38, 38)``."""
    return "rgb({}, {}, {})".format(*(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)))


def legend_colours(driver: Any) -> dict[str, set[str]]:
    """Each chart legend's series name -> the colours the browser draws it in (after the stylesheet)."""
    found: dict[str, set[str]] = {}
    for name, colour in driver.execute_script("return [...document.querySelectorAll('svg.chart text.legend')]"
                                              ".map(e => [e.textContent, getComputedStyle(e).fill])"):
        found.setdefault(name, set()).add(colour)
    return found


def save_page(driver: Any, path: Path) -> None:
    """A screenshot of the whole page, below the window's fold too (Chromium's DevTools capture)."""
    width, height = driver.execute_script("const e = document.documentElement; return [e.scrollWidth, e.scrollHeight]")
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
        "x": 0, "y": 0, "width": width, "height": height, "scale": 1}})
    path.write_bytes(base64.b64decode(shot["data"]))


def counts(driver: Any) -> list[str]:
    """The queue page's counts (pending, ready, ...) as the page shows them now, without reloading it."""
    return texts(driver, "#counts td")


def drawn_samples(driver: Any) -> int:
    """How many samples the queue page's first chart draws (the points of its first line), after a reload."""
    driver.refresh()
    return driver.execute_script("const line = document.querySelector('svg.chart polyline');"
                                 "return line ? line.getAttribute('points').split(' ').length : 0")


async def work_while_sampled(driver: Any, db: Any, rounds: int) -> None:
    """Traffic for the charts: each round pushes 40 messages to ``orders`` and acks 25, then waits for the
    dashboard's next sample (one a second) to be drawn."""
    async with bucketq.Queue(db, name="orders", bucket_max_wait=0.005) as worker:
        for n in range(rounds):
            await worker.push_many([{"order": 100 * n + i} for i in range(40)])
            for message in await worker.reserve_many(25, timeout=2):
                await message.ack()
            await worker.flush()
            seen = drawn_samples(driver)
            WebDriverWait(driver, PATIENCE_S, poll_frequency=0.5).until(lambda d, seen=seen: drawn_samples(d) > seen)


async def test_a_browser_drives_every_page_and_action(mongo_uri: str, db_name: str, adb: Any, sync_db: Any,
                                                      dashboard: str, browser: Any, screenshots: Path) -> None:
    await fill(adb, sync_db)
    queue = bucketq.Queue(adb, name="orders", bucket_max_wait=0.005)
    try:
        browser.get(dashboard + "/")
        assert "/login" in browser.current_url  # a token is set: every page asks for it
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        click(browser, By.ID, "login")
        wait_for(browser, lambda d: d.find_elements(By.ID, "queues"), "the overview")
        assert "orders" in text_of(browser, "queues") and "events" in text_of(browser, "streams")

        click(browser, By.LINK_TEXT, "orders")
        wait_for(browser, lambda d: drawn_samples(d) >= 2, "two samples drawn")
        await work_while_sampled(browser, adb, rounds=6)
        before = await queue.stats()
        assert (before["dead"], before["quarantined"]) == (3, 1)
        browser.refresh()
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart polyline")) == 5  # pending, ready, dead, in, out
        assert "card declined" in text_of(browser, "dead") and "undecodable" in text_of(browser, "quarantine")
        # one colour per series, drawn in its legend, the same on every page
        on_queue = legend_colours(browser)
        browser.get(dashboard + "/")
        on_overview = legend_colours(browser)
        for series in ("pending", "ready", "dead", "in", "out"):
            assert on_queue[series] == {rgb(SERIES_COLORS[series])}, (series, on_queue)
        assert on_overview["pending"] == on_queue["pending"] and on_overview["dead"] == on_queue["dead"]
        save_page(browser, screenshots / "dashboard-overview.png")

        # the queue's page refreshes itself, keeps what is typed in a form, and stops when paused
        click(browser, By.LINK_TEXT, "orders")
        browser.find_element(By.ID, "dead-error").send_keys("warehouse")
        shown = counts(browser)
        await queue.push_many([{"late": i} for i in range(5)])
        wait_for(browser, lambda d: counts(d) != shown, "the counts to refresh by themselves")
        assert browser.find_element(By.ID, "dead-error").get_attribute("value") == "warehouse"
        click(browser, By.ID, "refresh-toggle")
        assert browser.find_element(By.ID, "refresh-toggle").text == "Resume auto-refresh"
        shown, stamp = counts(browser), text_of(browser, "updated")
        await queue.push_many([{"later": i} for i in range(5)])
        await asyncio.sleep(2.5)  # over two refresh intervals (the dashboard samples every second)
        assert (counts(browser), text_of(browser, "updated")) == (shown, stamp)
        click(browser, By.ID, "refresh-toggle")
        wait_for(browser, lambda d: counts(d) != shown, "the counts to refresh once resumed")

        # who holds what: a bucket of orders, by the holder its lease records (groups: tests/test_web.py)
        held = await queue.reserve(timeout=5)
        assert held is not None
        wait_for(browser, lambda d: owner_name() in text_of(d, "held"), "the holder shown")
        save_page(browser, screenshots / "dashboard-queue.png")
        await held.nack(0)

        # requeue the dead letters the filter selects, not all of them
        click(browser, By.ID, "dead-filter-apply")
        wait_for(browser, lambda d: "1 of 3" in text_of(d, "dead-title"), "the filter applied")
        click(browser, By.ID, "action-requeue-dead")
        assert "Put the 1 dead letter(s) whose error contains 'warehouse'" in text_of(browser, "question")
        save_page(browser, screenshots / "dashboard-confirm.png")
        click(browser, By.ID, "confirm")
        assert text_of(browser, "message") == ("requeued 1 dead letter(s) whose error contains 'warehouse' of "
                                               "queue 'orders'")
        assert sorted(e["error"] for e in await queue.dead_letters()) == ["address unknown", "card declined"]

        # one message: its page, and a retry of it alone
        click(browser, By.ID, "back")
        message_id = browser.execute_script("return [...document.querySelectorAll('#dead tr')].find(row => row"
                                            ".textContent.includes(arguments[0])).querySelector('a').textContent",
                                            "card declined")
        click(browser, By.LINK_TEXT, message_id)
        assert text_of(browser, "error") == "card declined"
        assert '"order"' in text_of(browser, "payload") and text_of(browser, "tries") == "1"
        save_page(browser, screenshots / "dashboard-message.png")
        click(browser, By.ID, "message-retry")
        assert f"Retry message '{message_id}'" in text_of(browser, "question")
        click(browser, By.ID, "confirm")
        assert text_of(browser, "message") == f"retried message '{message_id}' of queue 'orders'"
        assert [e["error"] for e in await queue.dead_letters()] == ["address unknown"]
        browser.get(f"{dashboard}/queues/orders/messages/{message_id}")
        assert "pending" in browser.find_element(By.TAG_NAME, "h2").text  # back in the queue, its id kept

        # paging: 60 more dead letters make two pages of 50
        start = utc_now() - dt.timedelta(hours=1)
        sync_db["orders.dead"].insert_many([
            {"_id": f"old:{i}", "enc": "json", "p": f'{{"n": {i}}}', "h": None, "k": None, "tries": 3,
             "error": "boom", "at": start + dt.timedelta(seconds=i), "enqueued_at": start,
             "origin": {"bucket": ObjectId(), "slot": 0}, "pt": 0} for i in range(60)])
        browser.get(dashboard + "/queues/orders")
        assert "rows 1–50 of 61" in text_of(browser, "dead-pager")
        click(browser, By.ID, "dead-next")
        wait_for(browser, lambda d: "rows 51–61 of 61" in text_of(d, "dead-pager"), "page 2")
        ids = texts(browser, "#dead td a")
        # oldest first: the last ten of the hour-old ones, then the newest, the dead letter fill made
        assert ids[:10] == [f"old:{i}" for i in range(50, 60)] and len(ids) == 11 and not ids[10].startswith("old:")

        # a queue-wide action, through its confirmation
        click(browser, By.ID, "action-pause")
        assert "Pause queue 'orders'?" in text_of(browser, "question")
        click(browser, By.ID, "confirm")
        assert text_of(browser, "message") == "paused queue 'orders'"
        assert await queue.paused()  # read from the server
        click(browser, By.ID, "back")
        assert "(paused)" in text_of(browser, "title")

        browser.get(dashboard + "/streams/events")
        assert "audit" in text_of(browser, "groups")
        assert len({c for cs in legend_colours(browser).values() for c in cs}) == 2  # a colour per reader group
        save_page(browser, screenshots / "dashboard-stream.png")
    finally:
        await queue.close()
    assert {p.name for p in screenshots.iterdir()} >= {"dashboard-overview.png", "dashboard-queue.png",
                                                       "dashboard-message.png", "dashboard-confirm.png",
                                                       "dashboard-stream.png"}
