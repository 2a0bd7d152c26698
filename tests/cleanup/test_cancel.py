"""Cancelling a run: its waiting windows and planning pages are cancelled, a
planning page that was already running queues nothing, a window running at
the cancel finishes, and the run ends "cancelled"; the rows gone are exactly
the expired rows of the windows that ran (checked against the data)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from expiry.app import App
from expiry.cleanup.runs import PLAN, WINDOW
from expiry.errors import ConfigError

from ._support import Db, claim_plan, cli, doomed, standard_rows, write_config

Apps = Callable[..., App]
POLICY = "expired-sessions"
ROWS = 5000  # window 100: about 50 windows, more than a run's first planning page


def test_a_cancelled_run_stops_and_deletes_only_what_its_windows_took(db: Db, apps: Apps) -> None:
    db.create_sessions()
    rows = standard_rows(ROWS)
    db.insert_sessions(rows)
    app = apps(db.url, {"nice_ratio": 0})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    claim_plan(app)  # the first page: 16 windows and the next page's job
    queues = app.worked_queues()
    worker = app.worker()
    first, second, held = app.queue.claim(3, 60, owner="test", queues=queues, limits={})
    assert {first.handler, second.handler, held.handler} <= {WINDOW, PLAN}
    for job in (first, second):
        worker.process(job)

    cancelled = app.runs.cancel(opened.run_id, actor="ops")

    assert cancelled["outcome"] == "cancelling"  # a job it holds is still running
    assert cancelled["jobs_cancelled"] > 10
    worker.process(held)  # the job running at the cancel finishes
    summary = app.runs.summary(opened.run_id)
    assert summary is not None and summary["outcome"] == "cancelled"
    assert summary["state"] == "finished" and summary["cancelled_by"] == "ops"
    assert app.queue.pending() == 0
    applied = [w for w in db.ledger(opened.run_id)]
    taken = {i for i in doomed(rows) if any(w["lo"] < i <= w["hi"] for w in applied)}
    assert db.ids() == {i for i, _, _ in rows} - taken  # no more, no less
    assert 0 < len(taken) < len(doomed(rows))
    assert db.audit("run.cancelled") == 1


def test_a_planning_page_running_at_the_cancel_queues_nothing(db: Db, apps: Apps) -> None:
    db.create_sessions()
    db.insert_sessions(standard_rows(ROWS))
    app = apps(db.url, {"nice_ratio": 0})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    claim_plan(app)
    planned = app.runs.summary(opened.run_id)
    assert planned is not None
    queued = app.queue.claim(100, 60, owner="test", queues=app.worked_queues(), limits={})
    [page] = [j for j in queued if j.handler == PLAN]

    app.runs.cancel(opened.run_id, actor="ops")
    app.worker().process(page)  # claimed before the cancel, run after it

    after = app.runs.summary(opened.run_id)
    assert after is not None and after["windows_planned"] == planned["windows_planned"]
    assert not [j for j in db.jobs(run_id=opened.run_id) if j["state"] == "available"]


def test_a_finished_or_unknown_run_cannot_be_cancelled(db: Db, apps: Apps) -> None:
    db.create_sessions()
    app = apps(db.url)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)  # nothing expired: finished at its first page
    app.worker(until_idle=True, poll=0.05).run()
    with pytest.raises(ConfigError, match="finished: nothing to cancel"):
        app.runs.cancel(opened.run_id, actor="ops")
    with pytest.raises(ConfigError, match="no run"):
        app.runs.cancel("expired-sessions:nope", actor="ops")


def test_expiry_runs_cancel_on_the_command_line(db: Db, apps: Apps, tmp_path: Path) -> None:
    db.create_sessions()
    db.insert_sessions(standard_rows(500))
    app = apps(db.url)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    config = write_config(tmp_path / "expiry.toml", db.url)

    done = cli("--config", str(config), "runs", "cancel", opened.run_id, "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["outcome"] == "cancelled" and shown["jobs_cancelled"] == 1  # its plan job

    again = cli("--config", str(config), "runs", "cancel", opened.run_id)
    assert again.returncode == 2 and "nothing to cancel" in again.stderr
    assert "Traceback" not in again.stderr
