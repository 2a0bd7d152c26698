"""Fixtures for the drills: Apps on the test database, closed when the test ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cleanup._support import make_app
from expiry.app import App


@pytest.fixture(params=["postgres", "mysql"])
def server_url(request: pytest.FixtureRequest) -> str:
    """A fresh migrated database on each server engine (the drills that run on
    both: the crash drill and the duplicate storm)."""
    return str(request.getfixturevalue({"postgres": "pg_url", "mysql": "mysql_url"}[request.param]))


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
