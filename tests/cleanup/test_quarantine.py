"""One broken policy never stops the others (issue #19, point 1): a policy
whose table is missing is quarantined; the worker cleans the good one, the
scheduler fires it, `status` and /metrics show the broken one with its reason,
`check` still exits 2, and a repaired table brings it back."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from expiry.app import App
from expiry.errors import SchemaError
from expiry.health.metrics import render
from expiry.status import Status

from ._support import Db, cli, doomed, drain, run_worker, standard_rows, write_config

Apps = Callable[..., App]
GOOD = {"name": "good", "where": None, "window": 100}
BROKEN = {"name": "broken", "table": "no_such_table", "where": None}


def test_a_broken_policy_is_quarantined_and_the_good_one_is_cleaned(
    db: Db, apps: Apps, tmp_path: Path
) -> None:
    db.create_sessions()
    rows = standard_rows(300)
    db.insert_sessions(rows)
    gone = {i for i, off, _ in rows if off < 0}  # every expired row: the policy has no where
    assert gone and gone == doomed([(i, off, False) for i, off, _ in rows])
    app = apps(db.url, GOOD, BROKEN)
    assert app.cleanup is not None

    warnings, broken = app.cleanup.check_all()
    assert list(broken) == ["broken"]
    assert "table 'no_such_table' does not exist" in broken["broken"]
    with pytest.raises(SchemaError, match="no_such_table"):
        app.cleanup.check()  # `expiry check` still fails
    with pytest.raises(SchemaError, match="no_such_table"):
        app.cleanup.open_run("broken")

    opened = app.cleanup.open_run("good")
    drain(app)
    assert db.ids() == {i for i, _, _ in rows} - gone
    assert db.run_state(opened.run_id) == "finished"

    views = {p["name"]: p for p in Status.of(app).policies()}
    assert views["good"]["broken"] is None
    assert "no_such_table" in views["broken"]["broken"]
    text = render(app)[0].decode()
    assert 'expiry_policy_quarantined{policy="broken"} 1.0' in text
    assert 'expiry_policy_quarantined{policy="good"} 0.0' in text

    # Repaired: the table exists now, and the policy is back on its next use.
    db.create_sessions("no_such_table")
    later = app.cleanup.open_run("broken")
    assert "broken" not in app.cleanup.broken
    drain(app)
    assert db.run_state(later.run_id) == "finished"


def test_the_cli_keeps_going_around_a_broken_policy(db: Db, tmp_path: Path) -> None:
    db.create_sessions()
    rows = standard_rows(200)
    db.insert_sessions(rows)
    gone = {i for i, off, _ in rows if off < 0}
    config = write_config(tmp_path / "expiry.toml", db.url, GOOD, BROKEN)
    run = lambda *args: cli("--config", str(config), *args, cwd=tmp_path)  # noqa: E731

    checked = run("check")
    assert checked.returncode == 2 and "no_such_table" in checked.stderr
    shown = run("--json", "status")
    assert shown.returncode == 0, shown.stderr
    views = {p["name"]: p for p in json.loads(shown.stdout)["policies"]}
    assert "no_such_table" in views["broken"]["broken"] and views["good"]["broken"] is None
    assert "quarantined" in run("status").stdout.lower()

    assert run("trigger", "good").returncode == 0
    worked = run("worker", "--until-idle")
    assert worked.returncode == 0, worked.stderr
    assert "policy quarantined" in worked.stderr
    assert db.ids() == {i for i, _, _ in rows} - gone


def test_the_scheduler_fires_the_good_policy_past_a_broken_one(db: Db, apps: Apps) -> None:
    db.create_sessions()
    app = apps(db.url, {**BROKEN, "schedule": "* * * * *"}, {**GOOD, "schedule": "* * * * *"})
    now = app.engine.now()
    clock = [now]
    scheduler = app.scheduler(clock=lambda: clock[0])
    scheduler.tick()  # registers both schedules
    clock[0] = now + timedelta(minutes=1)
    fired = scheduler.tick()
    assert [f.policy for f in fired] == ["good"]
    assert "broken" in (app.cleanup.broken if app.cleanup else {})


def _rename(db: Db, old: str, new: str) -> None:
    db.execute(f"alter table {old} rename to {new}")


def test_a_table_renamed_mid_run_quarantines_the_policy_and_its_return_resumes_the_run(
    db: Db, apps: Apps
) -> None:
    """A table renamed under running processes: the planned windows wait (no
    attempt spent, none dead), status and /metrics say why without failing
    (the watermark keeps its series), and once the table is back the same
    jobs finish the run, with no redrive."""
    db.create_sessions()
    rows = standard_rows(300)
    db.insert_sessions(rows)
    app = apps(db.url, GOOD)
    assert app.cleanup is not None
    before = app.cleanup.watermark("good")  # a reading to keep
    opened = app.cleanup.open_run("good")
    jobs = app.queue.claim(1, 60, owner="test", queues=app.worked_queues())
    app.worker().process(jobs[0])  # the plan: its windows wait
    windows = [w["key"] for w in db.windows(opened.run_id)]
    assert windows

    _rename(db, "sessions", "sessions_moved")
    worker = app.worker()
    for job in app.queue.claim(100, 60, owner=worker.name, queues=app.worked_queues()):
        worker.process(job)

    waiting = [app.queue.get(key) for key in windows]
    assert all(j is not None and j.state.value == "scheduled" for j in waiting), waiting
    assert all(j is not None and j.attempt == 0 for j in waiting)
    assert all(
        j is not None and j.wait_reason and "policy quarantined" in j.wait_reason for j in waiting
    )
    assert db.scalar("select count(*) from expiry.jobs where state = 'dead'") == 0
    views = {p["name"]: p for p in Status.of(app).policies()}  # no exception: shown broken
    assert views["good"]["broken"] and "sessions" in views["good"]["broken"]
    assert views["good"]["watermark_seconds"] == pytest.approx(before, abs=5)
    text = render(app)[0].decode()
    assert 'expiry_policy_quarantined{policy="good"} 1.0' in text
    assert 'expiry_watermark_seconds{policy="good"}' in text

    _rename(db, "sessions_moved", "sessions")
    db.execute("update expiry.jobs set run_at = {now} where state = 'scheduled'")
    drain(app)

    assert db.ids() == {i for i, off, _ in rows if off > 0}
    assert db.run_state(opened.run_id) == "finished"
    assert {w["state"] for w in db.windows(opened.run_id)} == {"completed"}
    views = {p["name"]: p for p in Status.of(app).policies()}
    assert views["good"]["broken"] is None and views["good"]["watermark_seconds"] == 0


def test_a_worker_that_starts_while_the_table_is_missing_leaves_the_run_waiting(
    db: Db, apps: Apps
) -> None:
    """A run opened, then its table renamed before any worker ran: a worker
    process that starts now fails its first check of the table. The run's jobs
    wait (no attempt spent, none dead-lettered, the reason said) and, once the
    table is back, finish the run with no redrive."""
    db.create_sessions()
    rows = standard_rows(300)
    db.insert_sessions(rows)
    first = apps(db.url, GOOD)
    assert first.cleanup is not None
    opened = first.cleanup.open_run("good")
    _rename(db, "sessions", "sessions_moved")

    fresh = apps(db.url, GOOD)  # a worker process started now: nothing checked yet
    run_worker(fresh)
    jobs = db.jobs(run_id=opened.run_id)
    assert jobs and {j["state"] for j in jobs} == {"scheduled"}, jobs
    assert all(j["attempt"] == 0 for j in jobs)
    assert db.scalar("select count(*) from expiry.jobs where state = 'dead'") == 0
    assert fresh.cleanup is not None and "good" in fresh.cleanup.broken
    reasons = db.rows("select wait_reason from expiry.jobs where state = 'scheduled'")
    assert all("policy quarantined" in r[0] for r in reasons)

    _rename(db, "sessions_moved", "sessions")
    db.execute("update expiry.jobs set run_at = {now} where state = 'scheduled'")
    drain(fresh)
    assert db.ids() == {i for i, off, _ in rows if off > 0}
    assert db.run_state(opened.run_id) == "finished"
