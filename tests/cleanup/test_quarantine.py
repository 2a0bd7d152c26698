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

from expiry import status
from expiry.app import App
from expiry.errors import SchemaError
from expiry.metrics import render

from .support import Db, cli, doomed, drain, standard_rows, write_config

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

    views = {p["name"]: p for p in status.policies(app)}
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
