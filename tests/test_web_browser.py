"""The dashboard in a real browser: Debian's Chromium driven by Selenium through Debian's chromedriver (``make
browser`` installs both; nothing is downloaded at run time: Selenium Manager is made to fail should it run). On
the test server, ``bucketq web`` serves real data (tests.test_web.fill); the browser logs in, requeues the dead
letters and pauses the queue, each through its confirmation page, and the effects are read back from MongoDB;
before that, some traffic gives the charts something to draw.
Screenshots go to a folder under pytest's temporary directory, or to ``$BUCKETQ_SCREENSHOTS`` (``docs/img``
refreshes the README's)."""

from __future__ import annotations

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

import bucketq
from tests.helpers import answers, eventually, free_port
from tests.test_web import TOKEN, fill

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


def click(driver: Any, how: str, what: str) -> None:
    element = WebDriverWait(driver, PATIENCE_S).until(lambda d: d.find_element(how, what))
    element.click()


def text_of(driver: Any, element_id: str) -> str:
    return WebDriverWait(driver, PATIENCE_S).until(lambda d: d.find_element(By.ID, element_id)).text


def drawn_samples(driver: Any) -> int:
    """How many samples the queue page's first chart draws (the points of its first line), after a reload."""
    driver.refresh()
    lines = driver.find_elements(By.CSS_SELECTOR, "svg.chart polyline")
    return len(lines[0].get_attribute("points").split()) if lines else 0


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


async def test_a_browser_requeues_dead_letters_and_pauses_a_queue(mongo_uri: str, db_name: str, adb: Any,
                                                                  sync_db: Any, dashboard: str, browser: Any,
                                                                  screenshots: Path) -> None:
    await fill(adb, sync_db)
    queue = bucketq.Queue(adb, name="orders")
    try:
        browser.get(dashboard + "/")
        assert "/login" in browser.current_url  # a token is set: every page asks for it
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        click(browser, By.ID, "login")
        WebDriverWait(browser, PATIENCE_S).until(lambda d: d.find_elements(By.ID, "queues"))
        assert "orders" in browser.find_element(By.ID, "queues").text
        assert "events" in browser.find_element(By.ID, "streams").text

        click(browser, By.LINK_TEXT, "orders")
        WebDriverWait(browser, PATIENCE_S, poll_frequency=0.5).until(lambda d: drawn_samples(d) >= 2)
        await work_while_sampled(browser, adb, rounds=8)
        before = await queue.stats()
        assert (before["dead"], before["quarantined"]) == (3, 1)
        browser.refresh()
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart polyline")) == 5  # pending, ready, dead, in, out
        assert "card declined" in browser.find_element(By.ID, "dead").text
        assert "undecodable" in browser.find_element(By.ID, "quarantine").text
        browser.save_screenshot(str(screenshots / "dashboard.png"))

        click(browser, By.ID, "action-requeue-dead")
        assert "Put the 3 dead letter(s) of queue 'orders' back" in text_of(browser, "question")
        browser.save_screenshot(str(screenshots / "confirm-requeue.png"))
        click(browser, By.ID, "confirm")
        assert text_of(browser, "message") == "requeued 3 dead letter(s) of queue 'orders'"
        after = await queue.stats()
        assert (after["dead"], after["ready"]) == (0, before["ready"] + 3)

        click(browser, By.ID, "back")
        assert not await queue.paused()
        click(browser, By.ID, "action-pause")
        assert "Pause queue 'orders'?" in text_of(browser, "question")
        click(browser, By.ID, "confirm")
        assert text_of(browser, "message") == "paused queue 'orders'"
        assert await queue.paused()  # read from the server
        click(browser, By.ID, "back")
        assert "(paused)" in browser.find_element(By.TAG_NAME, "h2").text
        browser.save_screenshot(str(screenshots / "paused.png"))

        browser.get(dashboard + "/streams/events")
        assert "audit" in text_of(browser, "groups")
        browser.save_screenshot(str(screenshots / "stream.png"))
    finally:
        await queue.close()
    assert {p.name for p in screenshots.iterdir()} >= {"dashboard.png", "confirm-requeue.png", "paused.png",
                                                       "stream.png"}
