"""The HTTP API over a real socket: uvicorn in a background thread, httpx clients.

``LiveServer`` serves the app as ``expiry serve`` does (``server_config``) on
127.0.0.1 with an ephemeral port (the kernel picks it; nothing races for a
guessed port). The database is a real
one (the session fixtures' PostgreSQL or SQLite file); ``Db`` is a plain driver
connection used to arrange target tables and read what the database holds.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import uvicorn

from dialects import dialect, dialect_of
from expiry.app import App
from expiry.config import parse_config
from expiry.http.serving import server_config

POLICY: dict[str, Any] = {
    "name": "expired-sessions",
    "table": "sessions",
    "key": "id",
    "timestamp": "expires_at",
    "window": 100,
}


def config_data(
    url: str,
    *,
    http: dict[str, Any] | None = None,
    policies: Iterable[dict[str, Any]] = ({},),
    holds: Iterable[dict[str, Any]] = (),
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "database": {"url": url},
        "policy": [{**POLICY, **p} for p in policies],
        "hold": list(holds),
    }
    # Each scrape reads the database afresh (the tests compare scrapes), and
    # the tests' many refused requests from one address are not slowed down
    # (test_http_auth sets these limits where it tests them).
    data["http"] = {
        "metrics_cache": "0s",
        "anonymous_rate_limit_burst": 100_000,
        **(http or {}),
    }
    return data


def make_app(url: str, **kwargs: Any) -> App:
    return App(config=parse_config(config_data(url, **kwargs)))


class Db:
    """A plain autocommit driver connection to the test database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = dialect_of(url)
        self.conn: Any
        if self.dialect == "postgres":
            self.conn = psycopg.connect(url, autocommit=True)
        elif self.dialect == "mysql":
            from cleanup._support import MySQLConn

            self.conn = MySQLConn(url)
        else:
            self.conn = sqlite3.connect(
                url.removeprefix("sqlite:///"), isolation_level=None, timeout=30
            )

    def close(self) -> None:
        self.conn.close()

    def sql(self, statement: str) -> str:
        return dialect(self.dialect).translate(statement)

    def execute(self, statement: str, params: Iterable[Any] = ()) -> None:
        self.conn.execute(self.sql(statement), tuple(params))

    def scalar(self, statement: str, params: Iterable[Any] = ()) -> Any:
        row = self.conn.execute(self.sql(statement), tuple(params)).fetchone()
        return None if row is None else row[0]

    def create_sessions(self, table: str = "sessions") -> None:
        kind = dialect(self.dialect).time_type
        key = "integer" if self.dialect == "sqlite" else "bigint"
        self.execute(
            f"create table {table} (id {key} primary key, expires_at {kind} not null, note text)"
        )
        self.execute(f"create index {table}_expires_at on {table} (expires_at)")

    def insert_sessions(self, expired: int, live: int = 0, table: str = "sessions") -> None:
        """ids 1..expired expired an hour ago, then ``live`` rows that expire in a day."""
        total = expired + live
        if self.dialect == "postgres":
            self.execute(
                f"insert into {table} (id, expires_at, note)"
                " select g, case when g <= %s then now() - interval '1 hour'"
                " else now() + interval '1 day' end, 'row ' || g"
                " from generate_series(1, %s) as g",
                (expired, total),
            )
            return
        if self.dialect == "mysql":
            self.conn.executemany(
                f"insert into {table} (id, expires_at, note) values"
                " (%s, utc_timestamp(6) + interval %s second, %s)",
                [(i, -3600 if i <= expired else 86400, f"row {i}") for i in range(1, total + 1)],
            )
            return
        self.conn.execute("begin")
        self.conn.executemany(
            self.sql(f"insert into {table} (id, expires_at, note) values (%s, {{now}} + %s, %s)"),
            [(i, -3600.0 if i <= expired else 86400.0, f"row {i}") for i in range(1, total + 1)],
        )
        self.conn.execute("commit")

    def count(self, table: str = "sessions") -> int:
        return int(self.scalar(f"select count(*) from {table}"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    """``expiry serve``'s HTTP server over ``app`` in a daemon thread on an ephemeral port."""

    def __init__(self, app: App) -> None:
        self.app = app
        # As `expiry serve` configures it (its request-head deadline, its proxies).
        self.server = uvicorn.Server(
            # The pool must hold several requests blocked on purpose at once.
            server_config(app, "127.0.0.1", 0, ws="none", limit_concurrency=None)
        )
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.url = ""
        self._clients: list[httpx.Client] = []

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn exited during startup"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def client(self, key: str | None = None, **headers: str) -> httpx.Client:
        """An httpx client for this server, with ``Authorization: Bearer KEY``."""
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        client = httpx.Client(base_url=self.url, headers=headers, timeout=30)
        self._clients.append(client)
        return client

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        self.server.should_exit = True
        self.thread.join(10)
        assert not self.thread.is_alive(), "uvicorn did not stop"


@dataclass
class Live:
    """A running server: its App, the database, an API key and a client using it."""

    app: App
    server: LiveServer
    db: Db
    key: str
    client: httpx.Client
    url: str = field(init=False)

    def __post_init__(self) -> None:
        self.url = self.server.url

    def new_client(self, key: str | None = None, **headers: str) -> httpx.Client:
        return self.server.client(key, **headers)


Serve = Callable[..., Live]


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> str:
    """The response is the API's JSON error with ``status`` (and ``code``); returns
    its message."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message"}, body
    assert body["error"]["message"], body
    if code is not None:
        assert body["error"]["code"] == code, body
    return str(body["error"]["message"])


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "it") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- a local webhook receiver ------------------------------------------------------


class Receiver:
    """An http.server on 127.0.0.1 in a thread that records every POST it gets."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.calls: list[tuple[dict[str, str], bytes]] = []
        received = self.calls
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                payload = json.dumps({"ok": True}).encode()
                self.send_response(owner.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


# -- `expiry serve` as a subprocess ------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def write_config(path: Path, data: dict[str, Any]) -> Path:
    lines = ["[database]", f"url = {toml_value(data['database']['url'])}", ""]
    for section in ("http", "worker"):
        if section in data:
            lines += [f"[{section}]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in data[section].items()]
            lines += [""]
    for policy in data.get("policy", []):
        lines += ["[[policy]]", *(f"{k} = {toml_value(v)}" for k, v in policy.items()), ""]
    path.write_text("\n".join(lines))
    return path


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    return env


def expiry_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "expiry", *args]
