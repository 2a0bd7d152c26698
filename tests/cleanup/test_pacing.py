"""Pacing of window transactions, by the worker thread that ran them: keys per
transaction adapt toward target_transaction, max_rows_per_second spaces them,
and nice_ratio rests the thread after each one."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest

from expiry.app import App
from expiry.cleanup import MIN_CHUNK, WINDOW, WindowResult
from expiry.config import parse_config
from expiry.errors import ConfigError
from expiry.types import Job

from .support import Db, config_data, run_worker, standard_rows

Apps = Callable[..., App]
POLICY = "expired-sessions"


def window_job(app: App) -> Job:
    """A window job of the policy, as a worker holds it."""
    app.queue.enqueue(WINDOW, {"policy": POLICY, "run_id": f"{POLICY}:t", "lo": 0, "hi": 1})
    [job] = app.queue.claim(1, 60, owner="test")
    return job


def timed(fn: Callable[[], None]) -> float:
    began = time.monotonic()
    fn()
    return time.monotonic() - began


def test_nice_ratio_rests_the_thread_that_ran_the_window(db: Db, apps: Apps) -> None:
    db.create_sessions()
    nice, eager = apps(db.url, {"nice_ratio": 2}), apps(db.url, {"nice_ratio": 0})
    assert nice.cleanup is not None and eager.cleanup is not None
    job = window_job(nice)
    applied = WindowResult(POLICY, 500)

    rested = timed(lambda: nice.cleanup.after_window(job, applied, 0.1))  # type: ignore[union-attr]
    assert 0.2 <= rested < 1.0
    assert timed(lambda: eager.cleanup.after_window(job, applied, 0.1)) < 0.05  # type: ignore[union-attr]
    # A duplicate (no rows) took nothing from the database: no rest.
    nothing = WindowResult(POLICY, None)
    assert timed(lambda: nice.cleanup.after_window(job, nothing, 0.1)) < 0.05  # type: ignore[union-attr]


def test_max_rows_per_second_spaces_the_next_transaction(db: Db, apps: Apps) -> None:
    db.create_sessions()
    app = apps(db.url, {"max_rows_per_second": 1000, "nice_ratio": 0})
    assert app.cleanup is not None
    job = window_job(app)
    app.cleanup.after_window(job, WindowResult(POLICY, 300), 0.01)

    waited = timed(lambda: app.cleanup.before_window(job))  # type: ignore[union-attr]
    assert 0.2 <= waited < 0.6  # 300 rows at 1,000 rows/s


def test_keys_per_transaction_halve_when_slow_and_grow_back_when_fast(db: Db, apps: Apps) -> None:
    db.create_sessions()
    app = apps(db.url, {"window": 1000, "target_transaction": "100ms", "nice_ratio": 0})
    assert app.cleanup is not None
    job = window_job(app)
    chunk = app.cleanup._pace(app.cleanup.policy(POLICY))
    applied = WindowResult(POLICY, 50)

    app.cleanup.after_window(job, applied, 0.2)  # past 1.5x the target
    assert chunk.chunk == 500
    for _ in range(10):
        app.cleanup.after_window(job, applied, 0.2)
    assert chunk.chunk == MIN_CHUNK
    app.cleanup.after_window(job, applied, 0.1)  # within the target: unchanged
    assert chunk.chunk == MIN_CHUNK
    app.cleanup.after_window(job, applied, 0.01)  # well under it: doubles
    assert chunk.chunk == 2 * MIN_CHUNK
    for _ in range(10):
        app.cleanup.after_window(job, applied, 0.01)
    assert chunk.chunk == 1000  # never past the policy's window


def test_a_negative_nice_ratio_is_refused_naming_the_policy_and_field(db: Db) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(config_data(db.url, {"nice_ratio": -1}))
    message = str(refused.value)
    assert POLICY in message and "nice_ratio" in message


def test_a_resting_thread_does_not_heartbeat_the_window_it_finished(
    db: Db, apps: Apps, caplog: pytest.LogCaptureFixture
) -> None:
    db.create_sessions()
    db.insert_sessions(standard_rows(300))
    app = apps(db.url, {"nice_ratio": 100})  # rests far longer than a heartbeat period
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    caplog.set_level(logging.WARNING, logger="expiry")
    run_worker(app, lease=0.6)  # heartbeats every 0.2 s

    assert db.run_state(opened.run_id) == "finished"
    assert not [r for r in caplog.records if "lease lost" in r.getMessage()]
