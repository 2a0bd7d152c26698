"""Runs on every engine: open, read, list, plan, finish, and what a run applied.

Each test runs once on SQLite and once on PostgreSQL (the ``engine`` fixture).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from _conformance import claim, complete, enqueue, is_utc, set_time, utc

from expiry.engines import Engine
from expiry.types import RunJobs, RunTotals

CUTOFF = utc(2030, 1, 1)


def test_run_insert_then_get_returns_the_run_as_opened(engine: Engine) -> None:
    before = engine.now()
    assert engine.run_insert("p:1", "p", CUTOFF, "trigger") is True
    after = engine.now()

    run = engine.run_get("p:1")
    assert run is not None
    assert (run.id, run.policy, run.opened_by, run.state) == ("p:1", "p", "trigger", "planning")
    assert run.cutoff == CUTOFF and is_utc(run.cutoff)
    assert run.windows_planned == 0
    assert is_utc(run.opened_at) and before <= run.opened_at <= after
    assert run.planned_at is None and run.finished_at is None


def test_run_insert_of_an_existing_id_is_refused_and_changes_nothing(engine: Engine) -> None:
    assert engine.run_insert("p:1", "p", CUTOFF, "trigger") is True
    assert engine.run_insert("p:1", "q", CUTOFF + timedelta(days=1), "scheduler") is False

    run = engine.run_get("p:1")
    assert run is not None and (run.policy, run.cutoff, run.opened_by) == ("p", CUTOFF, "trigger")


def test_run_get_of_an_unknown_id_is_none(engine: Engine) -> None:
    assert engine.run_get("nope") is None


def test_run_insert_in_a_rolled_back_transaction_leaves_no_run(engine: Engine) -> None:
    with pytest.raises(RuntimeError), engine.transaction() as conn:
        assert engine.run_insert("p:1", "p", CUTOFF, "trigger", conn=conn)
        assert engine.run_get("p:1", conn=conn) is not None  # seen inside it
        raise RuntimeError("roll back")
    assert engine.run_get("p:1") is None


def test_transaction_or_joins_the_callers_transaction_or_commits_its_own(engine: Engine) -> None:
    with engine.transaction() as conn, engine.transaction_or(conn) as joined:
        assert joined is conn
    with engine.transaction_or(None) as own:
        engine.run_insert("p:1", "p", CUTOFF, "trigger", conn=own)
    assert engine.run_get("p:1") is not None


def test_run_list_is_newest_first_filtered_by_policy_and_limited(engine: Engine) -> None:
    opened = {"p:a": 3, "p:b": 1, "q:c": 2, "p:d": 1}  # p:b and p:d tie: id desc
    for rid, hour in opened.items():
        engine.run_insert(rid, rid[0], CUTOFF, "trigger")
        set_time(engine, "runs", "opened_at", utc(2030, 1, 2, hour), "id", rid)

    assert [r.id for r in engine.run_list()] == ["p:a", "q:c", "p:d", "p:b"]
    assert [r.id for r in engine.run_list("p")] == ["p:a", "p:d", "p:b"]
    assert [r.id for r in engine.run_list("p", 2)] == ["p:a", "p:d"]
    assert engine.run_list("none") == []
    assert engine.run_list("p")[0].opened_at == utc(2030, 1, 2, 3)


def test_run_add_windows_counts_pages_and_the_last_page_ends_planning(engine: Engine) -> None:
    engine.run_insert("p:1", "p", CUTOFF, "trigger")

    engine.run_add_windows("p:1", 16, done=False)
    engine.run_add_windows("p:1", 500, done=False)
    run = engine.run_get("p:1")
    assert run is not None and (run.windows_planned, run.state) == (516, "planning")
    assert run.planned_at is None

    engine.run_add_windows("p:1", 7, done=True)
    run = engine.run_get("p:1")
    assert run is not None and (run.windows_planned, run.state) == (523, "running")
    assert is_utc(run.planned_at)


def test_run_add_windows_to_a_cancelled_run_is_refused(engine: Engine) -> None:
    engine.run_insert("p:1", "p", CUTOFF, "trigger")
    assert engine.run_add_windows("p:1", 16, done=False) is True
    assert engine.run_cancel("p:1", "ops") == []

    assert engine.run_add_windows("p:1", 500, done=True) is False
    run = engine.run_get("p:1")
    assert run is not None and run.windows_planned == 16


def test_run_cancel_cancels_waiting_jobs_leaves_running_ones_and_ends_planning(
    engine: Engine,
) -> None:
    engine.run_insert("p:1", "p", CUTOFF, "trigger")
    engine.run_insert("p:2", "p", CUTOFF + timedelta(days=1), "trigger")
    done = complete(engine, "p:1:0", "p:1")
    enqueue(engine, "p:1:100", "p:1")
    enqueue(engine, "p:1:200", "p:1")
    running = claim(engine, "p:1:200")
    enqueue(engine, "p:2:0", "p:2")
    before = engine.now()

    assert engine.run_cancel("p:1", "ops") == ["p:1:100"]

    run = engine.run_get("p:1")
    assert run is not None and run.state == "running"  # planning is over
    assert run.cancelled_by == "ops" and run.cancelled_at is not None
    assert is_utc(run.cancelled_at) and before <= run.cancelled_at <= engine.now()
    states = {
        k: j.state.value
        for k in ("p:1:0", "p:1:100", "p:1:200", "p:2:0")
        if (j := engine.job_get(k)) is not None
    }
    assert states == {
        "p:1:0": "completed",
        "p:1:100": "cancelled",
        "p:1:200": "running",
        "p:2:0": "available",  # another run's job
    }
    assert done.state.value == "completed"
    assert engine.run_finish("p:1") is False  # its running job first
    engine.job_complete(running)
    assert engine.run_finish("p:1") is True
    assert engine.run_cancel("p:1", "ops") is None  # finished: nothing to cancel
    assert engine.run_cancel("nope", "ops") is None


def test_run_cancel_twice_cancels_once(engine: Engine) -> None:
    engine.run_insert("p:1", "p", CUTOFF, "trigger")
    assert engine.run_cancel("p:1", "ops") == []
    assert engine.run_cancel("p:1", "someone else") is None
    run = engine.run_get("p:1")
    assert run is not None and run.cancelled_by == "ops"


def test_run_finish_waits_for_planning_and_pending_jobs(engine: Engine) -> None:
    engine.run_insert("p:1", "p", CUTOFF, "trigger")
    first = complete(engine, "p:1:0", "p:1")
    enqueue(engine, "p:1:100", "p:1")

    assert engine.run_finish("p:1") is False  # still planning
    engine.run_add_windows("p:1", 2, done=True)
    assert engine.run_finish("p:1") is False  # a window is pending
    job = claim(engine, "p:1:100")
    assert engine.run_finish("p:1") is False  # ... and then running
    engine.job_complete(job)

    assert engine.run_finish("p:1") is True
    run = engine.run_get("p:1")
    last = engine.job_get("p:1:100")
    assert run is not None and last is not None and first.finished_at is not None
    assert run.state == "finished"
    assert run.finished_at == last.finished_at  # its last job's, not the sweep's time
    assert engine.run_finish("p:1") is False  # once


def test_job_redrive_opens_the_finished_runs_of_the_jobs_it_sends_back(engine: Engine) -> None:
    """A run finished with a dead job is open again once the job is redriven
    (finish time cleared), and finishes again after it; a cancelled run stays
    finished. The redrive says each job's policy (its payload's)."""
    for rid in ("p:1", "p:2"):
        engine.run_insert(rid, "p", CUTOFF, "trigger")
        enqueue(engine, f"{rid}:0", rid)
        job = claim(engine, f"{rid}:0")
        assert engine.job_fail(job, "boom", "error", None) is not None  # dead
        engine.run_add_windows(rid, 1, done=True)
        if rid == "p:2":
            assert engine.run_cancel(rid, "ops") == []
        assert engine.run_finish(rid) is True

    rows = engine.job_redrive(["p:1:0", "p:2:0"])
    assert sorted((r["key"], r["run_id"]) for r in rows) == [("p:1:0", "p:1"), ("p:2:0", "p:2")]
    reopened, cancelled = engine.run_get("p:1"), engine.run_get("p:2")
    assert reopened is not None and (reopened.state, reopened.finished_at) == ("running", None)
    assert cancelled is not None and cancelled.state == "finished"
    engine.job_complete(claim(engine, "p:1:0"))
    assert engine.run_finish("p:1") is True


def test_run_finish_of_a_run_without_jobs_uses_the_database_clock(engine: Engine) -> None:
    engine.run_insert("p:1", "p", CUTOFF, "trigger")
    engine.run_add_windows("p:1", 0, done=True)
    before = engine.now()

    assert engine.run_finish("p:1") is True
    run = engine.run_get("p:1")
    assert run is not None and run.finished_at is not None
    assert before <= run.finished_at <= engine.now()


def test_run_finish_idle_finishes_every_planned_run_with_nothing_pending(engine: Engine) -> None:
    for rid in ("p:done", "p:pending", "p:planning", "q:done"):
        engine.run_insert(rid, rid[0], CUTOFF, "trigger")
        complete(engine, f"{rid}:0", rid)
    enqueue(engine, "p:pending:1", "p:pending")
    for rid in ("p:done", "p:pending", "q:done"):
        engine.run_add_windows(rid, 1, done=True)

    assert sorted(engine.run_finish_idle()) == ["p:done", "q:done"]
    states = {r.id: r.state for r in engine.run_list()}
    assert states == {
        "p:done": "finished",
        "q:done": "finished",
        "p:pending": "running",
        "p:planning": "planning",
    }
    assert engine.run_finish_idle() == []


def test_run_jobs_counts_a_runs_jobs_by_handler_and_state(engine: Engine) -> None:
    engine.run_insert("p:1", "p", CUTOFF, "trigger")
    complete(engine, "p:1:plan", "p:1", "expiry.plan")
    complete(engine, "p:1:0", "p:1")
    complete(engine, "p:1:100", "p:1")
    enqueue(engine, "p:1:200", "p:1")
    failed = claim(engine, "p:1:200")
    assert engine.job_fail(failed, "lock timeout", "lock_timeout", 60.0) is not None
    enqueue(engine, "p:1:300", "p:1")
    complete(engine, "q:1:0", "q:1")  # another run's

    found = sorted(engine.run_jobs("p:1"), key=lambda j: (j.handler, j.state))
    assert found == [
        RunJobs("expiry.plan", "completed", n=1, attempts=1, failures=0),
        RunJobs("expiry.window", "available", n=1, attempts=0, failures=0),
        RunJobs("expiry.window", "completed", n=2, attempts=2, failures=0),
        RunJobs("expiry.window", "retryable", n=1, attempts=1, failures=1),
    ]
    assert engine.run_jobs("none") == []


def test_run_ledger_sums_the_runs_ledger_rows(engine: Engine) -> None:
    assert engine.run_ledger("p:1") == RunTotals(windows=0, rows=0)
    with engine.transaction() as conn:
        engine.ledger_insert(conn, "p:1:0", policy="p", run_id="p:1", rows=40)
        engine.ledger_insert(conn, "p:1:100", policy="p", run_id="p:1", rows=2)
        engine.ledger_insert(conn, "p:2:0", policy="p", run_id="p:2", rows=1000)

    assert engine.run_ledger("p:1") == RunTotals(windows=2, rows=42)


def test_run_duplicates_counts_the_runs_duplicate_deliveries_only(engine: Engine) -> None:
    assert engine.run_duplicates("p:1") == 0
    for run_id, action in [
        ("p:1", "window.duplicate"),
        ("p:1", "window.duplicate"),
        ("p:1", "run.opened"),
        ("p:2", "window.duplicate"),
    ]:
        engine.audit_append(None, action, actor="worker", policy="p", run_id=run_id)

    assert engine.run_duplicates("p:1") == 2


def test_run_turns_lists_open_runs_in_cutoff_order_with_started_and_pending(
    engine: Engine,
) -> None:
    later, earlier = CUTOFF + timedelta(hours=1), CUTOFF
    engine.run_insert("p:b", "p", later, "trigger")  # opened first, cut off later
    engine.run_insert("p:a", "p", earlier, "trigger")
    engine.run_insert("p:c", "p", later, "trigger")  # same cutoff as p:b: id decides
    engine.run_insert("q:1", "q", earlier, "trigger")
    enqueue(engine, "p:b:plan", "p:b", "expiry.plan")  # only its first planning job
    enqueue(engine, "p:a:plan", "p:a", "expiry.plan")
    claim(engine, "p:a:plan")  # running is pending too
    enqueue(engine, "p:a:0", "p:a")  # a window: p:a has started
    complete(engine, "p:a:100", "p:a")  # completed is not pending
    enqueue(engine, "q:1:plan", "q:1", "expiry.plan")
    enqueue(engine, "p:a:200", "p:a")  # pending, but waiting for its retry: not active
    assert engine.job_fail(claim(engine, "p:a:200"), "held", "lock_timeout", 3600) is not None

    turns = engine.run_turns("p")
    assert [(t.id, t.started, t.pending, t.active) for t in turns] == [
        ("p:a", True, 3, 2),
        ("p:b", False, 1, 1),
        ("p:c", False, 0, 0),
    ]
    assert turns[0].cutoff == earlier and is_utc(turns[0].cutoff)
    assert engine.run_turns("r") == []


def test_run_turns_leaves_out_finished_and_cancelled_runs_and_counts_planned_as_started(
    engine: Engine,
) -> None:
    for rid in ("p:1", "p:2", "p:3"):
        engine.run_insert(rid, "p", CUTOFF, "trigger")
    engine.run_add_windows("p:1", 0, done=True)  # planned, nothing queued: started
    engine.run_cancel("p:2", "operator")
    engine.run_add_windows("p:3", 0, done=True)
    engine.run_finish("p:3")

    assert [(t.id, t.started) for t in engine.run_turns("p")] == [("p:1", True)]


def test_run_cancel_superseded_by_records_the_later_run_and_finishes_like_a_cancel(
    engine: Engine,
) -> None:
    engine.run_insert("p:1", "p", CUTOFF, "trigger")
    enqueue(engine, "p:1:plan", "p:1", "expiry.plan")

    assert engine.run_cancel("p:1", "expiry", superseded_by="p:2") == ["p:1:plan"]
    assert engine.run_finish("p:1")
    run = engine.run_get("p:1")
    assert run is not None
    assert (run.superseded_by, run.cancelled_by, run.state) == ("p:2", "expiry", "finished")
    assert engine.run_cancel("p:1", "expiry", superseded_by="p:3") is None
    run = engine.run_get("p:1")
    assert run is not None and run.superseded_by == "p:2"


def test_run_mark_stalled_marks_each_open_run_past_the_bound_once(engine: Engine) -> None:
    for rid in ("p:1", "p:2", "p:3", "q:1"):
        engine.run_insert(rid, rid[0], CUTOFF, "trigger")
    old = engine.now() - timedelta(hours=2)
    for rid in ("p:1", "p:3", "q:1"):
        set_time(engine, "runs", "opened_at", old, "id", rid)
    engine.run_add_windows("p:3", 0, done=True)
    engine.run_finish("p:3")  # finished: never stalled

    marked = engine.run_mark_stalled("p", 3600)
    assert [(rid, is_utc(at)) for rid, at in marked] == [("p:1", True)]
    assert engine.run_mark_stalled("p", 3600) == []  # once
    run = engine.run_get("p:1")
    assert run is not None and run.stalled_at is not None and is_utc(run.stalled_at)
    fresh = engine.run_get("p:2")
    assert fresh is not None and fresh.stalled_at is None


def test_run_open_oldest_gives_each_policys_oldest_open_run(engine: Engine) -> None:
    for rid in ("p:1", "p:2", "q:1"):
        engine.run_insert(rid, rid[0], CUTOFF, "trigger")
    old = engine.now() - timedelta(hours=2)
    set_time(engine, "runs", "opened_at", old, "id", "p:2")
    set_time(engine, "runs", "opened_at", old - timedelta(hours=1), "id", "q:1")
    engine.run_add_windows("q:1", 0, done=True)
    engine.run_finish("q:1")

    oldest = engine.run_open_oldest()
    assert set(oldest) == {"p"}
    assert abs((oldest["p"] - old).total_seconds()) < 0.01 and is_utc(oldest["p"])


def test_run_waits_groups_pending_jobs_by_state_and_reason(engine: Engine) -> None:
    engine.run_insert("p:1", "p", CUTOFF, "trigger")
    for key in ("p:1:0", "p:1:100", "p:1:200", "p:1:300"):
        enqueue(engine, key, "p:1")
    complete(engine, "p:1:done", "p:1")  # not pending
    snoozed = claim(engine, "p:1:0")
    assert engine.job_release(snoozed, 60, reason="waiting for run p:0")
    failed = claim(engine, "p:1:100")
    assert engine.job_fail(failed, "lock timed out", "lock_timeout", 30) is not None
    claim(engine, "p:1:200")  # running

    waits = {(w.state, w.reason): w for w in engine.run_waits("p:1")}
    assert {k: w.n for k, w in waits.items()} == {
        ("scheduled", "waiting for run p:0"): 1,
        ("retryable", "lock_timeout"): 1,
        ("running", None): 1,
        ("available", None): 1,
    }
    retry = waits[("retryable", "lock_timeout")]
    assert retry.error == "lock timed out" and is_utc(retry.since) and is_utc(retry.next_at)
    assert retry.next_at > engine.now()
    assert engine.run_waits("p:2") == []
