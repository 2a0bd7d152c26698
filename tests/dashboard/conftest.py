"""A real dashboard in a real browser: uvicorn serving create_app(app) on a
socket on 127.0.0.1 in a background thread, and Debian's headless Chromium
driven by selenium through /usr/bin/chromedriver. Nothing downloads a browser.

Each test gets a fresh database (SQLite and PostgreSQL, from the suite's
fixtures) with a ``sessions`` table, an App whose one policy cleans it, an API
key, and a server; the browser is shared by the whole session.
"""

from __future__ import annotations

import re
import socket
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from expiry.app import App
from expiry.config import parse_config
from expiry.http import create_app
from expiry.keys import Keys

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "dashboard"

POLICY: dict[str, Any] = {
    "name": "expired-sessions",
    "table": "sessions",
    "key": "id",
    "timestamp": "expires_at",
    "window": 100,
    "schedule": "*/15 * * * *",
    "watermark_warn": "10m",
    "watermark_alert": "1h",
}


def make_sessions(app: App, expired: int, live: int) -> None:
    """A sessions table: ids 1..expired expired 2 h ago and more, then ``live`` rows
    that expire in a day."""
    engine = app.engine
    with engine.transaction() as conn:
        if engine.dialect == "postgres":
            conn.execute(
                "create table sessions (id bigint primary key, expires_at timestamptz not null)"
            )
            conn.execute(
                "insert into sessions select i, now() - make_interval(secs => 7200 + i)"
                " from generate_series(1, %s::int) as i",
                (expired,),
            )
            conn.execute(
                "insert into sessions select i, now() + interval '1 day'"
                " from generate_series(%s::int, %s::int) as i",
                (expired + 1, expired + live),
            )
        elif engine.dialect == "mysql":
            conn.execute(
                "create table sessions (id bigint primary key, expires_at datetime(6) not null)"
            )
            rows = [
                f"({i}, utc_timestamp(6) - interval {7200 + i} second)"
                for i in range(1, expired + 1)
            ]
            rows += [
                f"({i}, utc_timestamp(6) + interval 1 day)"
                for i in range(expired + 1, expired + live + 1)
            ]
            if rows:
                conn.execute("insert into sessions values " + ", ".join(rows))
        else:
            now = "((julianday('now') - 2440587.5) * 86400.0)"
            conn.execute("create table sessions (id integer primary key, expires_at real not null)")
            conn.executemany(
                f"insert into sessions values (?, {now} - 7200 - ?)",
                [(i, i) for i in range(1, expired + 1)],
            )
            conn.executemany(
                f"insert into sessions values (?, {now} + 86400)",
                [(i,) for i in range(expired + 1, expired + live + 1)],
            )
        conn.execute("create index sessions_expires_at on sessions (expires_at)")


@dataclass
class Dashboard:
    app: App
    base: str
    key: str
    key_name: str
    server: Server | None = None
    """The uvicorn serving it (a test may stop it; the fixture's end stops it too)."""

    def url(self, path: str) -> str:
        return self.base + path

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, follow_redirects=False, timeout=10)

    @contextmanager
    def signed_in_client(self) -> Iterator[httpx.Client]:
        """An HTTP client holding the session cookie that signing in sets."""
        with self.client() as client:
            answer = post_login(client, self.key)
            assert answer.status_code == 303, answer.text
            yield client

    def job_state(self, key: str) -> str:
        """The job's state as the database holds it, read on a connection of its own."""
        url = str(self.app.url)
        if url.startswith("sqlite:///"):
            with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as lite:
                row = lite.execute("select state from expiry_jobs where key = ?", (key,)).fetchone()
        elif url.startswith("mysql://"):
            from cleanup._support import MySQLConn

            mysql = MySQLConn(url)
            row = mysql.execute("select state from expiry_jobs where `key` = %s", (key,)).fetchone()
            mysql.close()
        else:
            with psycopg.connect(url) as pg:
                row = pg.execute("select state from expiry.jobs where key = %s", (key,)).fetchone()
        assert row is not None, f"no job {key!r}"
        return str(row[0])


class Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # a background thread cannot
        pass


@pytest.fixture
def dashboard(db_url: str, request: pytest.FixtureRequest) -> Iterator[Dashboard]:
    """The dashboard over a real socket; ``@pytest.mark.dashboard_config(...)``
    adds config sections ([[hold]] entries, say)."""
    marker = request.node.get_closest_marker("dashboard_config")
    config = parse_config(
        {
            "database": {"url": db_url},
            "http": {"allowed_hosts": ["127.0.0.1:*"]},
            "policy": [POLICY],
            **(marker.kwargs if marker is not None else {}),
        }
    )
    app = App(config=config)
    make_sessions(app, expired=450, live=50)
    key = Keys(app.engine).create("ops")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = Server(
        uvicorn.Config(
            create_app(app), log_level="warning", lifespan="off", timeout_graceful_shutdown=1
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield Dashboard(app, f"http://127.0.0.1:{port}", key, "ops", server)
    server.should_exit = True
    thread.join(10)
    sock.close()
    app.close()


@pytest.fixture(scope="session")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.TemporaryDirectory(prefix="expiry-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        f"--user-data-dir={profile.name}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()
    profile.cleanup()


@pytest.fixture
def page(browser: webdriver.Chrome, dashboard: Dashboard) -> webdriver.Chrome:
    """The browser, signed out, at the dashboard's sign-in page."""
    browser.get(dashboard.url("/login"))
    browser.delete_all_cookies()
    return browser


def sign_in(browser: webdriver.Chrome, dashboard: Dashboard, key: str | None = None) -> None:
    browser.get(dashboard.url("/"))
    assert "/login" in browser.current_url
    field = browser.find_element(By.ID, "key")
    field.send_keys(key or dashboard.key)
    browser.find_element(By.CSS_SELECTOR, "form[action='/login'] button[type=submit]").click()
    WebDriverWait(browser, 10).until(
        lambda b: "Signed in as" in b.page_source or "signin-error" in b.page_source
    )


def screenshot(browser: webdriver.Chrome, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    width = browser.execute_script("return document.documentElement.scrollWidth")
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(max(1400, int(width)), min(max(800, int(height) + 140), 4000))
    path = ARTIFACTS / f"{name}.png"
    browser.save_screenshot(str(path))
    browser.set_window_size(1400, 1000)
    print(f"screenshot: {path}")
    return path


def post_login(client: httpx.Client, key: str, next: str = "/") -> httpx.Response:
    """Sign in as a browser does: the form's page (its token and cookie), then the form."""
    form = client.get("/login", params={"next": next})
    return client.post("/login", data={"key": key, "next": next, "csrf": csrf_of(form.text)})


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)
