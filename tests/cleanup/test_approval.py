"""Approval (approve = true): a run stops after its checks with an audited
preview and deletes nothing until someone approves it; then exactly the
expired rows go (the oracle: the rows the test inserted, by their offsets). A
changed policy invalidates an approval; a run not approved in time finishes
without deleting anything."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from expiry.app import App
from expiry.cleanup import approval
from expiry.config import parse_config
from expiry.errors import ConfigError

from ._support import (
    POLICY,
    Db,
    assert_run_clean,
    claim_plan,
    cli,
    config_data,
    doomed,
    drain,
    run_worker,
    standard_rows,
    write_config,
)

Apps = Callable[..., App]
Rows = list[tuple[int, float, bool]]
APPROVE = {"approve": True, "nice_ratio": 0}


def previewed(db: Db, apps: Apps, n: int, policy: dict[str, Any]) -> tuple[Rows, App, str]:
    """The standard sessions (``n`` rows), an App with ``policy`` and a run of it
    opened and taken by a worker once (with approve = true: previewed, awaiting)."""
    db.create_sessions()
    rows = standard_rows(n)
    db.insert_sessions(rows)
    app = apps(db.url, policy)
    assert app.cleanup is not None
    rid = app.cleanup.open_run(POLICY["name"]).run_id
    run_worker(app)
    return rows, app, rid


def awaiting(db: Db, app: App, run_id: str) -> approval.Approval:
    found = approval.of_run(app.engine, run_id)
    assert found is not None
    return found


def test_a_run_deletes_nothing_until_approved_then_exactly_the_expired_rows(
    db: Db, apps: Apps
) -> None:
    db.create_sessions()
    rows = standard_rows(600)
    db.insert_sessions(rows)
    app = apps(db.url, APPROVE)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY["name"])
    rid = opened.run_id

    run_worker(app)  # the planning job previews, then waits
    assert db.ids() == {i for i, _, _ in rows}
    assert db.windows(rid) == []
    found = awaiting(db, app, rid)
    assert found.state == approval.AWAITING
    assert found.preview["candidates"] == len(doomed(rows))
    assert found.preview["sample"] and {int(k) for k in found.preview["sample"]} <= doomed(rows)
    assert found.config_hash == approval.policy_hash(app.cleanup.policy(POLICY["name"]))
    plan = app.queue.get(f"{rid}:plan")
    assert plan is not None and plan.state == "scheduled", plan
    assert plan.wait_reason is not None and "awaiting approval" in plan.wait_reason
    assert db.run_state(rid) == "planning"

    app.engine.job_wake(f"{rid}:plan")  # looked at again (its recheck), not approved
    run_worker(app)
    assert db.ids() == {i for i, _, _ in rows}
    assert db.audit("run.awaiting_approval") == 1  # the same preview is not audited twice

    done = app.cleanup.approve(rid, actor="api:alice")
    assert done["state"] == approval.APPROVED and done["approved_by"] == "api:alice"
    assert done["woken"] is True
    drain(app)
    assert db.ids() == {i for i, _, _ in rows} - doomed(rows)
    assert_run_clean(db, rid)
    assert db.audit("run.approved") == 1
    again = app.cleanup.approve  # a finished run has nothing to approve
    with pytest.raises(ConfigError, match="finished"):
        again(rid, actor="api:alice")


def test_a_changed_policy_invalidates_the_approval(db: Db, apps: Apps) -> None:
    rows, first, rid = previewed(db, apps, 300, APPROVE)
    before = awaiting(db, first, rid)

    # The policy changes (a hold-like where: only even ids) before the approval.
    changed = apps(db.url, {**APPROVE, "where": "revoked_at is null and id % 2 = 0"})
    assert changed.cleanup is not None
    with pytest.raises(ConfigError, match="another version"):
        changed.cleanup.approve(rid, actor="api:bob")
    first.cleanup.approve(rid, actor="api:alice")  # approves the old preview
    run_worker(changed)  # the planner reads the policy as it is now: previews again
    assert db.ids() == {i for i, _, _ in rows}
    after = awaiting(db, changed, rid)
    assert after.state == approval.AWAITING
    assert after.config_hash != before.config_hash
    even = {i for i in doomed(rows) if i % 2 == 0}
    assert after.preview["candidates"] == len(even)

    changed.cleanup.approve(rid, actor="api:bob")
    drain(changed)
    assert db.ids() == {i for i, _, _ in rows} - even
    assert_run_clean(db, rid)


def test_a_run_not_approved_in_time_finishes_without_deleting(db: Db, apps: Apps) -> None:
    rows, app, rid = previewed(db, apps, 200, {**APPROVE, "approve_within": "2s"})
    found = awaiting(db, app, rid)
    assert found.state == approval.AWAITING
    plan = app.queue.get(f"{rid}:plan")
    assert plan is not None and plan.run_at <= found.since + timedelta(seconds=3)
    time.sleep(2.1)  # its wait runs out (its recheck is due by then)
    app.engine.job_wake(f"{rid}:plan")
    drain(app)
    assert db.ids() == {i for i, _, _ in rows}
    assert db.windows(rid) == []
    assert awaiting(db, app, rid).state == approval.EXPIRED
    assert db.audit("run.approval_expired") == 1
    assert db.run_state(rid) == "finished"
    with pytest.raises(ConfigError, match="finished"):
        app.cleanup.approve(rid, actor="api:alice")


def test_approve_within_of_zero_is_refused_with_the_fix(db: Db) -> None:
    with pytest.raises(ConfigError, match=r"expired-sessions.*approve_within.*24h"):
        parse_config(config_data(db.url, {**APPROVE, "approve_within": "0s"}))


def test_approving_a_run_of_a_policy_without_approval_is_refused(db: Db, apps: Apps) -> None:
    db.create_sessions()
    db.insert_sessions(standard_rows(50))
    app = apps(db.url, {"nice_ratio": 0})
    assert app.cleanup is not None
    rid = app.cleanup.open_run(POLICY["name"]).run_id
    with pytest.raises(ConfigError, match="awaits no approval"):
        app.cleanup.approve(rid, actor="api:alice")
    with pytest.raises(ConfigError, match="no run"):
        app.cleanup.approve("nope:1", actor="api:alice")


def test_a_run_awaiting_approval_is_not_stalled_before_its_approval_could_expire(db: Db) -> None:
    plain = parse_config(config_data(db.url, {"schedule": "0 * * * *"})).policy[0]
    approving = parse_config(
        config_data(db.url, {"schedule": "0 * * * *", **APPROVE, "approve_within": "2d"})
    ).policy[0]
    assert approving.stall_seconds == plain.stall_seconds + 2 * 86_400
    fixed = parse_config(config_data(db.url, {**APPROVE, "stall_after": "30m"})).policy[0]
    assert fixed.stall_seconds == 1800  # as the policy says


def test_expiry_runs_approve_on_the_command_line(db: Db, apps: Apps, tmp_path: Path) -> None:
    """`expiry runs show` says the run awaits approval, with its preview;
    `expiry runs approve` (audited with --actor) lets it go on; a second
    approval of the finished run exits 2 with the reason, no traceback."""
    rows, app, rid = previewed(db, apps, 300, APPROVE)
    config = write_config(tmp_path / "expiry.toml", db.url, APPROVE)

    shown = cli("--config", str(config), "runs", "show", rid)
    assert shown.returncode == 0, shown.stderr
    assert "awaiting approval" in shown.stdout
    assert f"{len(doomed(rows)):,} candidates" in shown.stdout, shown.stdout
    status = cli("--config", str(config), "status")
    assert status.returncode == 0, status.stderr
    assert f"AWAITING APPROVAL: {POLICY['name']}: run {rid}" in status.stdout, status.stdout
    done = cli("--config", str(config), "runs", "approve", rid, "--actor", "dpo", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["approval"]["approved_by"] == "dpo"
    drain(app)
    assert db.ids() == {i for i, _, _ in rows} - doomed(rows)
    again = cli("--config", str(config), "runs", "approve", rid)
    assert again.returncode == 2 and "nothing to approve" in again.stderr
    assert "Traceback" not in again.stderr


def test_a_later_run_supersedes_one_awaiting_approval_and_awaits_its_own(
    db: Db, apps: Apps
) -> None:
    """A run awaiting approval never blocks the policy: the next run (a later
    cutoff) supersedes it, previews afresh and awaits its own approval; the
    superseded run cannot be approved any more."""
    rows, app, first = previewed(db, apps, 200, APPROVE)
    assert awaiting(db, app, first).state == approval.AWAITING
    time.sleep(1.1)  # a run's cutoff is to the second: the next run's must differ
    second = app.cleanup.open_run(POLICY["name"]).run_id
    assert second != first
    run_worker(app)
    assert db.run_state(first) == "finished"
    summary = app.runs.summary(first)
    assert summary is not None and summary["outcome"] == f"superseded by {second}", summary
    assert summary["approval"]["state"] == approval.CLOSED
    assert awaiting(db, app, second).state == approval.AWAITING
    assert db.ids() == {i for i, _, _ in rows}
    with pytest.raises(ConfigError, match=f"superseded by '{second}'"):
        app.cleanup.approve(first, actor="api:alice")
    app.cleanup.approve(second, actor="api:alice")
    drain(app)
    assert db.ids() == {i for i, _, _ in rows} - doomed(rows)


def test_a_policy_changed_after_its_runs_approval_stops_the_run_before_any_window(
    db: Db, apps: Apps
) -> None:
    """Approved and planned under a where that keeps the odd ids; the where is
    then removed: the run's windows do not delete under a policy nobody
    approved. The run is cancelled (audited) and not one row goes."""
    db.create_sessions()
    rows = standard_rows(300)
    db.insert_sessions(rows)
    narrow = {**APPROVE, "where": "revoked_at is null and id % 2 = 0"}
    first = apps(db.url, narrow)
    assert first.cleanup is not None
    rid = first.cleanup.open_run(POLICY["name"]).run_id
    run_worker(first)
    first.cleanup.approve(rid, actor="api:alice")
    claim_plan(first)  # planned under the approved policy: its windows are queued
    assert [j for j in db.jobs(run_id=rid) if j["handler"] == "expiry.window"]

    wider = apps(db.url, {**APPROVE, "where": None})
    drain(wider)
    assert db.ids() == {i for i, _, _ in rows}
    summary = wider.runs.summary(rid)
    assert summary is not None and summary["outcome"] == "cancelled", summary
    assert summary["cancelled_by"] == "expiry"


def test_an_approval_after_its_deadline_or_of_a_cancelled_run_is_refused(
    db: Db, apps: Apps
) -> None:
    rows, app, late = previewed(db, apps, 100, {**APPROVE, "approve_within": "2s"})
    time.sleep(2.1)  # no worker looked again: the run still reads awaiting
    with pytest.raises(ConfigError, match="not approved by"):
        app.cleanup.approve(late, actor="api:alice")
    drain(app)
    assert db.ids() == {i for i, _, _ in rows}
    assert awaiting(db, app, late).state == approval.EXPIRED

    time.sleep(1.1)  # the next run's cutoff must differ
    cancelled = app.cleanup.open_run(POLICY["name"]).run_id
    run_worker(app)
    app.runs.cancel(cancelled, actor="ops")
    with pytest.raises(ConfigError, match="cancelled"):
        app.cleanup.approve(cancelled, actor="api:alice")


def test_two_windows_running_when_the_policy_changed_both_end_and_the_run_finishes(
    db: Db, apps: Apps
) -> None:
    """Two windows of an approved run were claimed together when the policy
    changed: the first to look cancels the run, the second (running then, so not
    cancelled with the waiting ones) ends too; the run finishes, nothing deleted."""
    rows, first, rid = previewed(db, apps, 600, APPROVE)
    first.cleanup.approve(rid, actor="api:alice")
    claim_plan(first)
    wider = apps(db.url, {**APPROVE, "where": None})
    jobs = wider.queue.claim(2, 60, owner="test", queues=wider.worked_queues())
    assert [j.handler for j in jobs] == ["expiry.window", "expiry.window"], jobs
    worker = wider.worker()
    for job in jobs:
        worker.process(job)
    drain(wider)
    assert db.ids() == {i for i, _, _ in rows}
    states = {j["state"] for j in db.jobs(run_id=rid) if j["handler"] == "expiry.window"}
    assert states == {"cancelled"}, states
    assert db.run_state(rid) == "finished"


def test_a_run_never_approved_leaves_an_approved_run_that_started_alone(db: Db, apps: Apps) -> None:
    """An approved run started and only waits (its windows backing off); a later
    run previews and is never approved: it ends without a window and the earlier
    run keeps its windows (a run never approved cancels nothing begun)."""
    rows, app, first = previewed(db, apps, 200, {**APPROVE, "approve_within": "2s"})
    app.cleanup.approve(first, actor="api:alice")
    claim_plan(app)
    waiting = app.queue.claim(100, 60, owner="test", queues=app.worked_queues())
    assert waiting and {j.handler for j in waiting} == {"expiry.window"}
    for job in waiting:
        assert app.engine.job_fail(job, "lock timeout", "lock_timeout", 3600) is not None
    time.sleep(1.1)  # the next run's cutoff must differ
    assert app.cleanup is not None
    second = app.cleanup.open_run(POLICY["name"]).run_id
    run_worker(app)  # the second run previews and waits; the first's windows back off
    assert awaiting(db, app, second).state == approval.AWAITING
    time.sleep(2.1)
    app.engine.job_wake(f"{second}:plan")
    run_worker(app)
    assert awaiting(db, app, second).state == approval.EXPIRED
    assert db.run_state(second) == "finished"
    one = app.runs.summary(first)
    assert one is not None and one["superseded_by"] is None, one
    assert one["jobs_by_state"] == {"retryable": len(waiting)}, one
    assert db.ids() == {i for i, _, _ in rows}
