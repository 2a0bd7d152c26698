"""Fixtures for the HTTP tests: a live server on a real socket over a real database.

``serve(url, http=..., policies=...)`` builds an App from a config, makes the
``sessions`` target table, starts uvicorn in a thread and returns a ``Live``
with the server's App, its base URL, an API key and a ready httpx client.
Everything is stopped and closed when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _http_live import Db, Live, LiveServer, Serve, make_app

from expiry.app import App
from expiry.keys import Keys


@pytest.fixture
def serve() -> Iterator[Serve]:
    started: list[tuple[LiveServer, App, Db]] = []

    def build(
        url: str,
        *,
        http: dict[str, Any] | None = None,
        policies: tuple[dict[str, Any], ...] = ({},),
        holds: tuple[dict[str, Any], ...] = (),
        table: bool = True,
    ) -> Live:
        db = Db(url)
        if table:
            db.create_sessions()
        app = make_app(url, http=http, policies=policies, holds=holds)
        app.migrate()
        server = LiveServer(app).start()
        started.append((server, app, db))
        key = Keys(app.engine).create("tests")
        return Live(app, server, db, key, server.client(key))

    yield build
    for server, app, db in started:
        server.stop()
        app.close()
        db.close()


@pytest.fixture
def live(db_url: str, serve: Serve) -> Live:
    """A live server on each engine (SQLite and PostgreSQL)."""
    return serve(db_url)


@pytest.fixture
def pg_live(pg_url: str, serve: Serve) -> Live:
    """A live server on PostgreSQL."""
    return serve(pg_url)


@pytest.fixture
def sqlite_live(sqlite_url: str, serve: Serve) -> Live:
    """A live server on SQLite."""
    return serve(sqlite_url)
