"""Crashes, with real processes on PostgreSQL: a worker SIGKILLed before its
window commits changes nothing, though the COMMIT was sent with the window (the
server notices the client is gone and rolls back); one killed after the commit
leaves the ledger proving completion, and a redelivery of that window has no
second effect."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from expiry.app import App

from ._support import (
    Db,
    assert_run_clean,
    cli_env,
    expiry_cmd,
    run_worker,
    wait_for,
    write_config,
)

Apps = Callable[..., App]
POLICY = "expired-sessions"
# The window waits on a row lock for a minute: long enough to be killed in the act.
PATIENT = {"where": None, "lock_timeout": "60s", "statement_timeout": "120s"}
WORKER = {"lease": "2s", "concurrency": 1}


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `expiry ...` subprocesses; any still running at the end are killed."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, cwd: Path = tmp_path, **env: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"process-{len(started)}.log").open("wb")
        proc = subprocess.Popen(
            expiry_cmd(*args), cwd=cwd, env=cli_env(**env), stdout=log, stderr=log
        )
        log.close()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def window_of(db: Db, run_id: str, key: int) -> dict[str, Any]:
    [window] = [w for w in db.windows(run_id) if w["payload"]["lo"] < key <= w["payload"]["hi"]]
    return window


def blocked_delete(db: Db, worker: subprocess.Popen[bytes], log: Path) -> int | None:
    """The pid of a backend whose DELETE waits on a row lock, if there is one."""
    assert worker.poll() is None, log.read_text()
    pid = db.scalar(
        "select pid from pg_stat_activity where datname = current_database()"
        " and wait_event_type = 'Lock' and query ilike '%delete from%'"
    )
    return None if pid is None else int(pid)


def test_worker_killed_before_commit_changes_nothing(
    pg_db: Db, apps: Apps, processes: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    db = pg_db
    db.create_sessions()
    db.insert_sessions([(i, -3600.0, False) for i in range(1, 301)])  # windows of 100 keys
    before = db.table()
    config = write_config(tmp_path / "expiry.toml", db.url, PATIENT, worker=WORKER)
    app = apps(db.url, PATIENT)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)

    # Live traffic holds a row of the first window.
    locker = psycopg.connect(db.url)
    locker.execute("select id from sessions where id = 50 for update")
    try:
        worker = processes("--config", str(config), "worker")
        log = tmp_path / "process-0.log"
        backend = wait_for(
            lambda: blocked_delete(db, worker, log), timeout=30, what="the blocked window"
        )
        window = window_of(db, opened.run_id, 50)
        assert window["state"] == "running" and window["attempt"] == 1
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(10) == -signal.SIGKILL

        # Killed mid-transaction: nothing of the window (or any other) changed.
        assert db.table() == before
        assert db.ledger() == []

        # The COMMIT went with the window's statements, but the orphaned backend
        # checks its client: it ends while still blocked (well before its 60 s
        # lock_timeout), its transaction rolled back, before the row is released.
        wait_for(
            lambda: (
                not db.scalar("select count(*) from pg_stat_activity where pid = %s", [backend])
            ),
            timeout=15,
            what="the orphaned backend to notice its client is gone",
        )
    finally:
        locker.rollback()
        locker.close()
    assert db.table() == before
    assert db.ledger() == []

    # The claim is abandoned: the lease expires, the job comes back and runs again.
    run_worker(app, lease=2)
    retried = window_of(db, opened.run_id, 50)
    assert retried["state"] == "completed"
    assert retried["attempt"] == 2
    assert retried["kind"] == "lease_expired"
    assert db.ids() == set()
    assert [row["key"] for row in db.ledger() if row["key"] == window["key"]] == [window["key"]]
    assert sum(row["rows"] for row in db.ledger()) == 300
    assert_run_clean(db, opened.run_id)


CRASH_APP = """
import dataclasses
import os
import signal

from expiry import App

app = App.from_config(os.environ["CRASH_CONFIG"])
window = app.handlers["expiry.window"]


def die(job, result, seconds):
    # After the window's transaction committed, before any bookkeeping.
    os.kill(os.getpid(), signal.SIGKILL)


app.handlers["expiry.window"] = dataclasses.replace(window, after=die)
"""


def test_worker_killed_after_commit_is_not_applied_twice(
    pg_db: Db, apps: Apps, processes: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    db = pg_db
    db.create_sessions()
    policy = {"where": None, "window": 1000}  # one window holds every expired row
    db.insert_sessions([(i, -3600.0, False) for i in range(1, 251)])
    db.insert_sessions([(i, 86400.0, False) for i in range(251, 301)])
    config = write_config(tmp_path / "expiry.toml", db.url, policy, worker=WORKER)
    (tmp_path / "crashapp.py").write_text(CRASH_APP)
    app = apps(db.url, policy)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)

    worker = processes("worker", "--app", "crashapp:app", CRASH_CONFIG=str(config))
    assert worker.wait(30) == -signal.SIGKILL
    log = (tmp_path / "process-0.log").read_text()
    assert "Traceback" not in log, log

    # The commit happened: the ledger proves it and the job is completed.
    [window] = db.windows(opened.run_id)
    assert window["state"] == "completed" and window["attempt"] == 1
    [entry] = db.ledger()
    assert entry["key"] == window["key"] and entry["rows"] == 250
    assert db.ids() == set(range(251, 301))
    # Its bookkeeping never ran, so the run is still open until a worker's sweep.
    assert db.run_state(opened.run_id) == "running"
    assert app.cleanup.finish_idle_runs() == 1
    assert db.run_state(opened.run_id) == "finished"

    # A row of the window expires anew; a second application would delete it.
    db.insert_sessions([(7, -60.0, False)])
    table = db.table()
    db.redeliver(window["key"])
    run_worker(app)

    assert db.table() == table
    assert db.ledger() == [entry]
    assert db.audit("window.duplicate", window["key"]) == 1
    [again] = db.windows(opened.run_id)
    assert again["state"] == "completed" and again["attempt"] == 2
    assert_run_clean(db, opened.run_id)
