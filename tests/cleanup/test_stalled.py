"""A wait that does not end is a failure someone sees: a run open longer than
its policy's stall_after is stalled, in status, the run's summary, /metrics
and the audit log (once), and an idle `worker --until-idle` exits 1 while one
is, never 0."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from expiry.app import App
from expiry.health.metrics import render
from expiry.status import Status

from ._support import Db, make_app, standard_rows

Apps = Callable[..., App]
POLICY = {"name": "slow", "stall_after": "1h", "where": None}


def _age_runs(db: Db, seconds: int) -> None:
    db.execute(f"update expiry.runs set opened_at = opened_at - {db.seconds(str(seconds))}")


def test_a_run_open_past_stall_after_is_stalled_everywhere_and_audited_once(
    db: Db, apps: Apps, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="expiry")
    db.create_sessions()
    db.insert_sessions(standard_rows(50))
    app = apps(db.url, POLICY)
    assert app.cleanup is not None
    opened = app.cleanup.open_run("slow")
    assert app.cleanup.mark_stalled() == []  # young: not stalled
    assert 'expiry_run_stalled{policy="slow"} 0.0' in render(app)[0].decode()

    _age_runs(db, 3601)  # no worker ran for an hour

    assert app.cleanup.mark_stalled() == [opened.run_id]
    assert app.cleanup.mark_stalled() == []  # once
    assert db.audit("run.stalled") == 1
    assert any(
        "run stalled" in r.getMessage() and "1 job due, waiting for a worker" in r.getMessage()
        for r in caplog.records
    )
    text = render(app)[0].decode()
    assert 'expiry_run_stalled{policy="slow"} 1.0' in text
    age = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith('expiry_oldest_open_run_age_seconds{policy="slow"}')
    )
    assert 3600 < age < 3700
    view = next(p for p in Status.of(app).policies() if p["name"] == "slow")
    assert view["stalled"] and view["stall_after"] == "1h"
    summary = app.runs.summary(opened.run_id)
    assert summary is not None and summary["stalled"]
    assert [w["why"] for w in summary["waiting"]] == ["1 job due, waiting for a worker"]


def test_an_idle_worker_exits_1_while_a_run_it_serves_is_stalled(db: Db, apps: Apps) -> None:
    db.create_sessions()
    db.insert_sessions(standard_rows(50))
    app = apps(db.url, POLICY)
    assert app.cleanup is not None
    app.cleanup.open_run("slow")
    [plan] = app.queue.claim(1, 60, owner="test", queues=app.worked_queues())
    app.queue.release(plan, 3600, reason="held for the test")  # nothing due
    _age_runs(db, 3601)

    assert app.worker(until_idle=True, poll=0.05).run() == 1

    other = make_app(db.url, {"name": "other"})
    try:  # a worker of another policy's queue is not held by it
        worker = other.worker(until_idle=True, poll=0.05, queues=["expiry.policy.other"])
        assert worker.run() == 0
    finally:
        other.close()


def test_the_stall_bound_is_three_periods_of_the_schedule_at_least_ten_minutes() -> None:
    from expiry.config import parse_config

    def bound(**fields: object) -> float:
        data = {"name": "p", "table": "t", "key": "id", "timestamp": "ts", **fields}
        config = parse_config({"database": {"url": "sqlite:///x.db"}, "policy": [data]})
        return config.policy[0].stall_seconds

    assert bound() == 3600  # no schedule: an hour
    assert bound(schedule="*/15 * * * *") == 2700
    assert bound(schedule="* * * * *") == 600  # three minutes would be noise
    assert bound(schedule="@daily", stall_after="2h") == 7200
