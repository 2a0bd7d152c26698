"""Drill 8: the target cannot be written.

1. The worker's role lost DELETE on the table: every window fails with
   insufficient_privilege and is dead-lettered with the database's reason (no
   number of retries would fix it); after GRANT and a redrive, all complete.
2. The database turns read-only mid-run (``default_transaction_read_only = on``
   and its sessions cut, as in a failover to a read-only node): workers back off
   and retry; once the setting is restored they finish on their own, without a
   restart and without losing or repeating a window.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cleanup._support import cli, drain, grant_expiry_tables, run_worker, write_config
from expiry.app import App

from ._harness import connect, job_states, load_sessions, pending, scale, wait_until
from ._invariants import Target, check, record_expected

ROWS = scale(20_000, 500_000)
B = Target(policy="expired-sessions-b", table="sessions_b")
POLICY_A = {"window": 1000}
POLICY_B = {
    "name": B.policy,
    "table": B.table,
    "window": 500,
    "max_rows_per_second": scale(3000, 20000),
}


def admin_conninfo(url: str) -> str:
    return make_conninfo(url, dbname="postgres")


@pytest.fixture
def worker_role(pg_url: str) -> Iterator[str]:
    """A login role that may use expiry's tables and read and update (not delete)
    the target table; yields its URL."""
    role = f"drill_worker_{os.getpid()}"
    with connect(pg_url) as conn:
        conn.execute(f"drop role if exists {role}")
        conn.execute(f"create role {role} login")
        grant_expiry_tables(conn, role)
    params = conninfo_to_dict(pg_url)
    url = f"postgresql://{role}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/{params['dbname']}"
    yield url
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"drop owned by {role}")
    with psycopg.connect(admin_conninfo(pg_url), autocommit=True) as admin:
        admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity where usename = %s", (role,)
        )
        admin.execute(f"drop role if exists {role}")


def test_revoked_delete_dead_letters_with_reason_then_redrive_completes(
    pg_url: str, worker_role: str, apps: Callable[..., App], tmp_path: Path
) -> None:
    load_sessions(pg_url, ROWS)
    role = conninfo_to_dict(worker_role)["user"]
    with connect(pg_url) as conn:
        conn.execute(f"grant select, update on sessions to {role}")
    record_expected(pg_url)
    app = apps(worker_role, POLICY_A)
    assert app.cleanup is not None
    opened = app.cleanup.open_run("expired-sessions")
    run_worker(app, concurrency=2)
    dead = app.runs.summary(opened.run_id)
    assert dead is not None and dead["state"] == "finished" and dead["jobs_dead"] > 0

    with connect(pg_url) as conn:
        windows = conn.execute(
            "select state, attempt, last_error_kind, last_error from expiry.jobs"
            " where handler = 'expiry.window'"
        ).fetchall()
    assert windows and len(windows) >= ROWS // 1000 // 2
    for state, attempt, kind, error in windows:
        assert (state, attempt, kind) == ("dead", 1, "insufficient_privilege"), windows[0]
        assert "permission denied for table sessions" in error
    with connect(pg_url) as conn:
        others = conn.execute(
            "select state, count(*) from expiry.jobs where handler <> 'expiry.window' group by 1"
        ).fetchall()
    assert [state for state, _ in others] == ["completed"]  # the planning pages

    with connect(pg_url) as conn:
        conn.execute(f"grant delete on sessions to {role}")
    # The operator's redrive, by policy (it redrove nothing before the fix).
    config = write_config(tmp_path / "expiry.toml", pg_url, POLICY_A)
    redriven = cli(
        "dlq", "redrive", "--policy", "expired-sessions", "--json", "--config", str(config)
    )
    assert redriven.returncode == 0, redriven.stderr
    assert len(json.loads(redriven.stdout)["redriven"]) == len(windows)
    # Its run is open again while the redriven windows wait, and the redrives
    # are audited with their policy and run (the run's audit view finds them).
    reopened = app.runs.summary(opened.run_id)
    assert reopened is not None
    assert (reopened["state"], reopened["finished_at"]) == ("running", None)
    with connect(pg_url) as conn:
        audited = conn.execute(
            "select policy, run_id from expiry.audit where action = 'job.redriven'"
        ).fetchall()
    assert audited and set(audited) == {("expired-sessions", opened.run_id)}
    drain(app, concurrency=2)
    report = check(pg_url)
    assert set(report.jobs) == {"completed"}
    # Its figures after the redrive: finished again, later, every window done
    # once (no redelivery: no lease was lost), each retried once.
    done = app.runs.summary(opened.run_id)
    assert done is not None and done["state"] == "finished"
    assert done["finished_at"] > dead["finished_at"]
    assert done["outcome"] == "finished"
    assert done["jobs_done"] == done["jobs_total"] == len(windows)
    assert (done["redelivered"], done["retries"]) == (0, len(windows))


# The drill terminates every backend of the database while workers hold
# connections; a connection object dropped in that storm may be finalized while
# still marked open. Known, tracked in the closing note; the invariants below
# are what this drill asserts.
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <function BaseConnection.__del__"
    ":pytest.PytestUnraisableExceptionWarning"
)
def test_database_turning_read_only_mid_run_recovers_without_restart(
    pg_url: str, apps: Callable[..., App]
) -> None:
    load_sessions(pg_url, ROWS, table=B.table)
    record_expected(pg_url, [B])
    app = apps(pg_url, POLICY_B)
    assert app.cleanup is not None
    dbname = conninfo_to_dict(pg_url)["dbname"]
    worker = app.worker(concurrency=2, lease=2.0, poll=0.05, rescue_every=0.5, name="drill-ro")
    runner = threading.Thread(target=worker.run)
    runner.start()
    admin = psycopg.connect(admin_conninfo(pg_url), autocommit=True)
    try:
        opened = app.cleanup.open_run(B.policy)

        def some_done() -> bool:
            with connect(pg_url) as conn:
                row = conn.execute("select count(*) from expiry.ledger").fetchone()
            return bool(row and row[0] >= 5)

        wait_until(some_done, 60, "the first windows")
        admin.execute(f'alter database "{dbname}" set default_transaction_read_only = on')
        admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity"
            " where datname = %s and pid <> pg_backend_pid()",
            (dbname,),
        )
        time.sleep(3.0)
        with connect(pg_url) as conn:
            assert conn.execute("show default_transaction_read_only").fetchone() == ("on",)
            stalled = conn.execute(
                "select count(*) from expiry.jobs where state <> 'completed'"
            ).fetchone()
        assert stalled and stalled[0] > 0, "the run ended before the database turned read-only"
        admin.execute(f'alter database "{dbname}" reset default_transaction_read_only')
        restored = time.monotonic()

        wait_until(
            lambda: pending(pg_url) == 0,
            scale(90, 900),
            "the run to finish after the database became writable again",
            every=0.5,
            on_timeout=lambda: str(job_states(pg_url)),
        )
        print(
            f"finished {time.monotonic() - restored:.1f}s after writes were allowed again;"
            f" {job_states(pg_url)}"
        )
    finally:
        admin.execute(f'alter database "{dbname}" reset default_transaction_read_only')
        admin.close()
        worker.stop()
        runner.join(30)
    report = check(pg_url, [B])
    assert set(report.jobs) == {"completed"}
    assert opened.run_id
