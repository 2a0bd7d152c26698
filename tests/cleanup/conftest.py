"""Fixtures for the cleanup tests: a direct connection to the test database and
Apps that are closed when the test ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from expiry.app import App

from ._support import Db, make_app


@pytest.fixture
def db(db_url: str) -> Iterator[Db]:
    conn = Db(db_url)
    yield conn
    conn.close()


@pytest.fixture
def pg_db(pg_url: str) -> Iterator[Db]:
    conn = Db(pg_url)
    yield conn
    conn.close()


@pytest.fixture
def apps() -> Iterator[Callable[..., App]]:
    """``apps(url, policy_overrides...)``: an App on ``url``, closed after the test."""
    made: list[App] = []

    def build(url: str, *policies: dict[str, Any], pool_size: int = 8) -> App:
        app = make_app(url, *policies, pool_size=pool_size)
        made.append(app)
        return app

    yield build
    for app in made:
        app.close()
