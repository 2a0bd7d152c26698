"""Drill: a streaming replica falls behind mid-run.

The test makes its own primary and hot standby (tests/clusters.py: initdb and
pg_basebackup in temporary folders, their own ports). A policy with
``max_replica_lag = "1s"`` cleans a table on the primary; mid-run the standby's
replay is paused (``pg_wal_replay_pause()``). Within 2 s the worker starts no
new window, and it starts none while the lag stays over the limit; once replay
resumes it goes on, and the run finishes with every invariant of
docs/drills.md holding. The lag is read on the primary (pg_stat_replication),
and in a second form from the standby itself (``[[replica]]``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from clusters import Cluster, primary_and_standby
from expiry.app import App
from expiry.config import parse_config

from ._harness import connect, load_sessions, scale
from ._invariants import check, record_expected

ROWS = scale(120_000, 1_000_000)
POLICY = {
    "name": "expired-sessions",
    "table": "sessions",
    "key": "id",
    "timestamp": "expires_at",
    "where": "revoked_at is null",
    "window": 1000,
    "nice_ratio": 0,
    "max_rows_per_second": 8000,  # about 12 s of windows: room to pause mid-run
    "max_replica_lag": "1s",
    "health_interval": "200ms",
}


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[Cluster, Cluster]]:
    with primary_and_standby() as pair:
        yield pair


def starts(url: str, run_id: str) -> list[datetime]:
    """When each window of the run was applied (the ledger, the primary's clock)."""
    with connect(url) as conn:
        rows = conn.execute(
            "select applied_at from expiry.ledger where run_id = %s order by applied_at", (run_id,)
        ).fetchall()
    return [r[0] for r in rows]


def db_now(url: str) -> datetime:
    with connect(url) as conn:
        row = conn.execute("select now()").fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize("read_from", ["primary", "replica"])
def test_a_lagging_replica_holds_new_windows_and_the_run_still_finishes(
    clusters: tuple[Cluster, Cluster], read_from: str
) -> None:
    primary, standby = clusters
    url = primary.url
    with connect(url) as conn:
        conn.execute("drop schema if exists expiry cascade")
        conn.execute("drop table if exists sessions")
        for side in ("drill_survivors", "drill_baseline"):
            conn.execute(f"drop table if exists {side}")
    load_sessions(url, ROWS)
    record_expected(url)
    config = {"database": {"url": url}, "policy": [POLICY]}
    if read_from == "replica":
        config["replica"] = [{"url": standby.url}]
    app = App(config=parse_config(config))
    app.migrate()
    standby.wait_caught_up(primary)
    assert app.cleanup is not None
    opened = app.cleanup.open_run("expired-sessions")
    worker = app.worker(concurrency=2, poll=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(starts(url, opened.run_id)) < 15:  # mid-run
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.05)
        standby.pause_replay()
        paused_at = db_now(url)
        time.sleep(5.0)  # the lag passes 1 s within a second; then 4 s more held
        held_until = db_now(url)
        during = [t for t in starts(url, opened.run_id) if t > paused_at]
        standby.resume_replay()
        resumed_at = db_now(url)
        summary = app.runs.wait(opened.run_id, timeout=120)
    finally:
        worker.stop()
        thread.join(60)
        app.close()

    late = [t for t in during if t > paused_at + timedelta(seconds=2) and t < held_until]
    assert not late, f"windows started {len(late)} times while the replica lagged: {late[:3]}"
    assert summary["state"] == "finished", summary
    after = [t for t in starts(url, opened.run_id) if t > resumed_at]
    assert after, "nothing ran after the replay resumed"
    check(url)
    with connect(url) as conn:
        roll = conn.execute("select count(*) from expiry.audit where action = 'policy.paused'")
        assert roll.fetchone() == (0,)  # held, never stopped: no critical limit was set
