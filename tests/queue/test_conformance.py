"""The queue conformance suite: every test runs once on SQLite and once on PostgreSQL.

Each test gets a fresh migrated database (tests/conftest.py). Time is moved by
SQL on expiry's own tables (tests/queue/_support.py), never by faking a clock:
the queue's times all come from the database.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from _support import age_finished, execute, expire_leases, make_due, seconds, sql

from expiry.engines import Engine, open_engine
from expiry.errors import LeaseLost, MigrationError, PayloadTooLarge
from expiry.queue import retry
from expiry.queue.jobs import Queue, new_job
from expiry.types import Job, JobState

T = TypeVar("T")


def state_of(queue: Queue, key: str) -> JobState:
    job = queue.get(key)
    assert job is not None, f"job {key} is missing"
    return job.state


def job_count(engine: Engine) -> int:
    return int(execute(engine, "select count(*) as n from expiry.jobs")[0]["n"])


# -- enqueue ---------------------------------------------------------------------


def test_enqueue_same_key_twice_adds_one_row(queue: Queue, engine: Engine) -> None:
    first = queue.enqueue("noop", {"v": 1}, None, "dup")
    second = queue.enqueue("noop", {"v": 2}, None, "dup")

    assert (first.key, first.enqueued) == ("dup", True)
    assert (second.key, second.enqueued) == ("dup", False)
    assert job_count(engine) == 1
    job = queue.get("dup")
    assert job is not None and job.payload == {"v": 1}


def test_queues_of_names_each_jobs_queue_by_id(queue: Queue, engine: Engine) -> None:
    queue.enqueue("noop", {}, None, "a", queue="billing")
    queue.enqueue("noop", {}, None, "b", queue="orders.x")
    a, b = queue.get("a"), queue.get("b")
    assert a is not None and b is not None
    gone = Job(**{**vars(a), "id": a.id + b.id + 1000})
    assert queue.queues_of([a, b, gone]) == {a.id: "billing", b.id: "orders.x"}
    assert engine.job_queues([]) == {}


def test_pending_by_queue_counts_unfinished_application_jobs_and_their_bytes(
    queue: Queue, engine: Engine
) -> None:
    queue.enqueue("noop", {"n": 1}, None, "a", queue="billing")
    queue.enqueue("noop", {"text": "x" * 100}, None, "b", queue="billing")
    queue.enqueue("noop", {}, None, "c", queue="orders.x")
    queue.enqueue("noop", {}, None, "d", queue="expiry.policy.p")  # expiry's own: not counted
    [claimed] = queue.claim(1, 30, queues=("orders.x",))
    assert claimed.key == "c"
    counts = engine.job_pending_by_queue()
    assert set(counts) == {"billing", "orders.x"}
    n, size = counts["billing"]
    assert n == 2 and 110 <= size <= 140, counts  # as stored: {"n": 1}, {"text": "xx..."}
    assert counts["orders.x"][0] == 1  # running counts: it is not final
    queue.complete(claimed)
    assert set(engine.job_pending_by_queue()) == {"billing"}


def test_enqueue_many_5000_with_duplicates_in_batch_and_in_table(
    queue: Queue, engine: Engine
) -> None:
    queue.enqueue("noop", {"old": True}, None, "k-00010")
    queue.enqueue("noop", {"old": True}, None, "k-04999")
    batch = [new_job("noop", {"i": i}, None, f"k-{i:05d}") for i in range(4_900)]
    # 100 repeats of keys earlier in the same batch, and one key repeated last.
    batch += [new_job("noop", {"repeat": i}, None, f"k-{i:05d}") for i in range(100)]
    batch[-1] = new_job("noop", {"i": 4999}, None, "k-04999")
    assert len(batch) == 5_000

    results = queue.enqueue_many(batch)

    assert [r.key for r in results] == [j.key for j in batch]
    enqueued = [r.key for r in results if r.enqueued]
    assert len(enqueued) == len(set(enqueued)) == 4_899  # 4,900 new keys minus k-00010
    assert "k-00010" not in enqueued and "k-04999" not in enqueued
    assert not any(r.enqueued for r in results[4_900:])
    assert job_count(engine) == 4_901
    # The row that already existed keeps its payload; within the batch the first wins.
    assert queue.get("k-00010").payload == {"old": True}  # type: ignore[union-attr]
    assert queue.get("k-00050").payload == {"i": 50}  # type: ignore[union-attr]
    assert queue.enqueue_many([]) == []


def test_a_batch_is_claimed_in_the_order_it_was_enqueued(queue: Queue) -> None:
    keys = ["m", "c", "x", "a", "q"]
    queue.enqueue_many([new_job("noop", {}, None, k) for k in keys])

    assert [job.key for job in queue.claim(5)] == keys


def test_payload_over_256_kib_is_refused(queue: Queue, engine: Engine) -> None:
    with pytest.raises(PayloadTooLarge, match="256 KiB"):
        queue.enqueue("noop", {"blob": "x" * (256 * 1024)}, None, "big")
    with pytest.raises(PayloadTooLarge, match="256 KiB"):
        queue.enqueue_many([new_job("noop", {}, None, "ok"), new_job("noop", {"b": "x" * 300_000})])
    # Non-ASCII text is stored escaped (6 bytes a character here): counted as stored.
    with pytest.raises(PayloadTooLarge, match="300008 bytes"):
        queue.enqueue("noop", {"b": "é" * 50_000}, None, "wide")

    assert job_count(engine) == 0
    assert queue.enqueue("noop", {"blob": "x" * (200 * 1024)}, None, "fits").enqueued


# -- delays and order --------------------------------------------------------------


def test_delayed_jobs_are_not_claimable_until_due(queue: Queue, engine: Engine) -> None:
    queue.enqueue("noop", {}, 2, "seconds")
    queue.enqueue("noop", {}, timedelta(seconds=2), "timedelta")
    queue.enqueue("noop", {}, engine.now() + timedelta(seconds=2), "datetime")
    queue.enqueue("noop", {}, None, "now")

    assert [j.key for j in queue.claim(10)] == ["now"]
    assert queue.claim(10) == []
    for key in ("seconds", "timedelta", "datetime"):
        assert state_of(queue, key) is JobState.SCHEDULED

    time.sleep(2.2)

    claimed = queue.claim(10)
    assert sorted(j.key for j in claimed) == ["datetime", "seconds", "timedelta"]
    assert all(j.state is JobState.RUNNING and j.attempt == 1 for j in claimed)


def test_lower_priority_value_first_then_earlier_run_at(queue: Queue, engine: Engine) -> None:
    now = engine.now()
    queue.enqueue("noop", {}, now - timedelta(seconds=60), "p5-oldest", priority=5)
    queue.enqueue("noop", {}, now - timedelta(seconds=5), "p1-newer", priority=1)
    queue.enqueue("noop", {}, now - timedelta(seconds=10), "p1-older", priority=1)
    queue.enqueue("noop", {}, now - timedelta(seconds=1), "p0", priority=0)

    order = [job.key for _ in range(4) for job in queue.claim(1)]

    assert order == ["p0", "p1-older", "p1-newer", "p5-oldest"]


def test_claim_returns_at_most_n_in_claim_order(queue: Queue) -> None:
    queue.enqueue_many(new_job("noop", {}, None, f"j{i}", priority=9 - i) for i in range(10))

    first = queue.claim(3)
    assert [j.key for j in first] == ["j9", "j8", "j7"]
    assert len({j.lease_token for j in first}) == 3  # one token per claim, never shared
    assert len(queue.claim(5)) == 5
    assert len(queue.claim(5)) == 2
    assert queue.claim(5) == []


def test_a_fair_share_claim_takes_at_most_half_of_what_is_due(queue: Queue) -> None:
    """A worker's claim near the end of a backlog leaves half for the others."""
    queue.enqueue_many(new_job("noop", {}, None, f"j{i:02}") for i in range(40))

    assert len(queue.claim(16, fair_share=True)) == 16  # 40 due: a full batch
    assert len(queue.claim(16, fair_share=True)) == 12  # 24 due: half
    assert [j.key for j in queue.claim(16, fair_share=True)] == [f"j{i}" for i in range(28, 34)]
    assert [len(queue.claim(16, fair_share=True)) for _ in range(4)] == [3, 2, 1, 0]
    assert queue.claim(16, fair_share=True) == []


def test_a_fair_share_claim_counts_every_named_queue(queue: Queue) -> None:
    queue.enqueue_many(
        new_job("noop", {}, None, f"{q}{i}", queue=q) for q in ("a", "b") for i in range(3)
    )

    # Six due over the two queues: half of them, the queues taking turns.
    assert [j.key for j in queue.claim(16, queues=("a", "b"), fair_share=True)] == [
        "a0",
        "b0",
        "a1",
    ]
    assert [j.key for j in queue.claim(16, queues=("a",), fair_share=True)] == ["a2"]
    assert [j.key for j in queue.claim(16, queues=("b",), fair_share=True)] == ["b1"]


def test_queues_take_turns_so_one_backlog_does_not_hold_back_another(
    queue: Queue, engine: Engine
) -> None:
    """Ten old jobs of one queue and two new ones of another: the claim takes
    the first of each queue before the second of any (one policy's windows
    do not hold back another policy's plan), priority still first."""
    now = engine.now()
    queue.enqueue_many(
        new_job("noop", {}, now - timedelta(seconds=60 - i), f"old{i}", queue="backlog")
        for i in range(10)
    )
    queue.enqueue_many(new_job("noop", {}, None, f"new{i}", queue="fresh") for i in range(2))
    queue.enqueue("noop", {}, None, "urgent", queue="backlog", priority=-1)

    claimed = [j.key for j in queue.claim(6, queues=("backlog", "fresh"))]

    assert claimed == ["urgent", "new0", "old0", "new1", "old1", "old2"]


def test_a_claim_takes_no_more_than_a_queues_limit(queue: Queue) -> None:
    queue.enqueue_many(new_job("noop", {}, None, f"p{i}", queue="paced") for i in range(5))
    queue.enqueue_many(new_job("noop", {}, None, f"f{i}", queue="free") for i in range(5))

    claimed = queue.claim(8, queues=("paced", "free"), limits={"paced": 1})

    assert sorted(j.key for j in claimed) == ["f0", "f1", "f2", "f3", "f4", "p0"]
    assert [j.key for j in queue.claim(8, queues=("paced",), limits={"paced": 1})] == ["p1"]
    assert [j.key for j in queue.claim(8, queues=("paced",), limits={"paced": 2})] == ["p2", "p3"]


def test_claim_counts_the_attempt_and_takes_only_named_queues(queue: Queue) -> None:
    queue.enqueue("noop", {}, None, "a")
    queue.enqueue("noop", {}, None, "b", queue="other")

    [job] = queue.claim(5, 30, owner="w1")
    assert (job.key, job.attempt, job.state, job.lease_owner) == ("a", 1, JobState.RUNNING, "w1")
    assert job.lease_token and job.lease_expires_at is not None and job.attempted_at is not None
    assert queue.get("a").attempt == 1  # type: ignore[union-attr]
    assert [j.key for j in queue.claim(5, 30, queues=("other",))] == ["b"]


def test_claim_across_queues_takes_the_best_n_of_all_of_them(queue: Queue, engine: Engine) -> None:
    now = engine.now()
    queue.enqueue("noop", {}, now - timedelta(seconds=30), "a-p2", priority=2, queue="a")
    queue.enqueue("noop", {}, now - timedelta(seconds=20), "a-p0", priority=0, queue="a")
    queue.enqueue("noop", {}, now - timedelta(seconds=40), "b-p1-old", priority=1, queue="b")
    queue.enqueue("noop", {}, now - timedelta(seconds=10), "b-p1-new", priority=1, queue="b")
    queue.enqueue("noop", {}, now - timedelta(seconds=50), "c-p0", priority=0, queue="c")
    queue.enqueue("noop", {}, now + timedelta(hours=1), "b-later", priority=0, queue="b")

    first = queue.claim(3, queues=("a", "b"))
    assert [j.key for j in first] == ["a-p0", "b-p1-old", "b-p1-new"]
    assert [j.key for j in queue.claim(3, queues=("a", "b"))] == ["a-p2"]
    # Rows a claim looked at but did not take stay claimable.
    assert queue.claim(3, queues=("a", "b")) == []
    assert [j.key for j in queue.claim(3, queues=("b", "c"))] == ["c-p0"]


# -- leases ------------------------------------------------------------------------


def test_only_the_current_lease_token_may_heartbeat_complete_or_fail(
    queue: Queue, engine: Engine
) -> None:
    queue.enqueue("noop", {}, None, "k", max_attempts=5)
    [stale] = queue.claim(1, lease=0.2)
    assert queue.heartbeat(stale, 0.2)
    time.sleep(0.35)

    assert queue.rescue() == 1
    rescued = queue.get("k")
    assert rescued is not None and rescued.state is JobState.RETRYABLE
    # Rescued but not yet re-claimed: the old token is already worthless.
    assert not queue.heartbeat(stale)
    with pytest.raises(LeaseLost):
        queue.complete(stale)

    [fresh] = queue.claim(1, lease=30)
    assert fresh.attempt == 2 and fresh.lease_token != stale.lease_token
    assert not queue.heartbeat(stale)
    with pytest.raises(LeaseLost):
        queue.complete(stale)
    assert queue.fail(stale, "late failure") is None
    assert queue.release(stale) is False
    assert state_of(queue, "k") is JobState.RUNNING

    assert queue.heartbeat(fresh, 30)
    queue.complete(fresh)
    done = queue.get("k")
    assert done is not None and done.state is JobState.COMPLETED and done.finished_at is not None
    with pytest.raises(LeaseLost):
        queue.complete(fresh)  # completing twice is refused too


def test_heartbeat_keeps_a_claim_from_being_rescued(queue: Queue) -> None:
    queue.enqueue("noop", {}, None, "k")
    [job] = queue.claim(1, lease=0.3)

    assert queue.heartbeat(job, 60)
    time.sleep(0.45)

    assert queue.rescue() == 0
    kept = queue.get("k")
    assert kept is not None and kept.state is JobState.RUNNING
    assert kept.lease_expires_at is not None and job.lease_expires_at is not None
    assert kept.lease_expires_at > job.lease_expires_at
    queue.complete(job)


def test_transient_failure_retries_within_the_backoff_ceiling(queue: Queue, engine: Engine) -> None:
    queue.enqueue("noop", {}, None, "k", max_attempts=8)
    for attempt in (1, 2, 3):
        make_due(engine)
        [job] = queue.claim(1)
        assert job.attempt == attempt
        before = engine.now()
        assert queue.fail(job, f"boom {attempt}") is JobState.RETRYABLE
        after = engine.now()
        failed = queue.get("k")
        assert failed is not None and failed.state is JobState.RETRYABLE
        assert before <= failed.run_at <= after + timedelta(seconds=retry.ceiling(attempt))
        assert (failed.last_error, failed.last_error_kind) == (f"boom {attempt}", "transient")
        assert failed.lease_token is None and failed.finished_at is None
    assert [e["attempt"] for e in failed.errors] == [1, 2, 3]
    assert [e["error"] for e in failed.errors] == ["boom 1", "boom 2", "boom 3"]


def test_permanent_failure_goes_straight_to_dead(queue: Queue) -> None:
    queue.enqueue("noop", {}, None, "k", max_attempts=8)
    [job] = queue.claim(1)

    assert queue.fail(job, "no such thing", transient=False) is JobState.DEAD

    dead = queue.get("k")
    assert dead is not None and dead.state is JobState.DEAD and dead.attempt == 1
    assert (dead.last_error, dead.last_error_kind) == ("no such thing", "permanent")
    assert dead.finished_at is not None
    assert [j.key for j in queue.dead()] == ["k"]
    assert queue.claim(1) == []


def test_exhausting_max_attempts_dead_letters(queue: Queue, engine: Engine) -> None:
    queue.enqueue("noop", {}, None, "k", max_attempts=3)
    states = []
    for _ in range(3):
        make_due(engine)
        [job] = queue.claim(1)
        states.append(queue.fail(job, f"try {job.attempt}", kind="lock_timeout"))

    assert states == [JobState.RETRYABLE, JobState.RETRYABLE, JobState.DEAD]
    dead = queue.get("k")
    assert dead is not None and dead.attempt == 3 and dead.last_error == "try 3"
    make_due(engine)
    assert queue.claim(1) == []
    assert queue.stats().retries_by_kind == {"lock_timeout": 1}


def test_rescue_returns_an_expired_claim_to_the_queue(queue: Queue) -> None:
    queue.enqueue("noop", {}, None, "k", max_attempts=3)
    queue.enqueue("noop", {}, None, "held", max_attempts=3)
    [job] = queue.claim(1, lease=0.2, owner="crashed")
    [held] = queue.claim(1, lease=60, owner="alive")
    assert queue.rescue() == 0  # nothing has expired yet
    time.sleep(0.35)

    assert queue.rescue() == 1

    rescued = queue.get(job.key)
    assert rescued is not None and rescued.state is JobState.RETRYABLE
    assert rescued.last_error_kind == "lease_expired" and "crashed" in (rescued.last_error or "")
    assert rescued.lease_token is None and rescued.errors[-1]["kind"] == "lease_expired"
    assert state_of(queue, held.key) is JobState.RUNNING
    [again] = queue.claim(1)
    assert again.key == job.key and again.attempt == 2


def test_a_lease_that_expires_on_the_last_attempt_is_dead(queue: Queue) -> None:
    queue.enqueue("noop", {}, None, "k", max_attempts=1)
    queue.claim(1, lease=0.1)
    time.sleep(0.25)

    assert queue.rescue() == 1

    dead = queue.get("k")
    assert dead is not None and dead.state is JobState.DEAD and dead.attempt == 1
    assert dead.last_error_kind == "lease_expired" and dead.finished_at is not None
    assert queue.claim(1) == []


def test_release_gives_a_job_back_without_spending_its_attempt(
    queue: Queue, engine: Engine
) -> None:
    queue.enqueue("noop", {}, None, "k")
    [job] = queue.claim(1)

    assert queue.release(job)

    back = queue.get("k")
    assert back is not None and back.state is JobState.AVAILABLE and back.attempt == 0
    [again] = queue.claim(1)
    assert again.attempt == 1
    assert queue.release(again, delay=3600)
    assert state_of(queue, "k") is JobState.SCHEDULED
    assert queue.claim(1) == []


def test_a_snooze_keeps_its_reason_and_when_the_wait_began_until_released_otherwise(
    queue: Queue, engine: Engine
) -> None:
    queue.enqueue("noop", {}, None, "k")
    [job] = queue.claim(1)
    assert queue.release(job, delay=0.01, reason="waiting for run p:1")

    first = queue.get("k")
    assert first is not None and first.state is JobState.SCHEDULED and first.attempt == 0
    assert first.wait_reason == "waiting for run p:1" and first.waiting_since is not None
    make_due(engine, ["k"])
    [again] = queue.claim(1)
    assert queue.release(again, delay=0.01, reason="waiting for run p:2")
    second = queue.get("k")
    assert second is not None and second.wait_reason == "waiting for run p:2"
    assert second.waiting_since == first.waiting_since  # the wait goes on: its start stays
    make_due(engine, ["k"])
    [third] = queue.claim(1)
    assert queue.release(third)  # a shutdown: not a wait
    back = queue.get("k")
    assert back is not None and back.wait_reason is None and back.waiting_since is None


def test_wake_makes_a_snoozed_job_due_now_and_nothing_else(queue: Queue, engine: Engine) -> None:
    queue.enqueue("noop", {}, None, "snoozed")
    queue.enqueue("noop", {}, None, "retrying")
    for job in queue.claim(2):
        if job.key == "snoozed":
            assert queue.release(job, delay=3600, reason="later")
        else:
            assert queue.fail(job, "boom", transient=True) is JobState.RETRYABLE
    assert engine.job_wake("snoozed")
    assert not engine.job_wake("snoozed")  # due already
    assert not engine.job_wake("missing")
    assert [j.key for j in queue.claim(5) if j.key == "snoozed"] == ["snoozed"]


def _claim_due(queue: Queue, engine: Engine, key: str) -> Job:
    make_due(engine, [key])
    [job] = queue.claim(1)
    return job


def test_an_unspent_failure_gives_its_attempt_back_within_its_budget(
    queue: Queue, engine: Engine
) -> None:
    """A failure that is not the job's (the worker passes unspent_within: a
    database down, read-only or full; a window retried smaller) gives its
    attempt back while its streak is younger than the budget; any other
    failure spends one as before and ends the streak."""
    queue.enqueue("noop", {}, None, "k", max_attempts=2)
    for kind in ["connection_lost", "disk_full", "read_only", "admin_shutdown"] * 2:
        job = _claim_due(queue, engine, "k")
        state = engine.job_fail(job, f"{kind}!", kind, 0.0, unspent_within=3600)
        assert state is JobState.RETRYABLE, kind
        assert queue.get("k") is not None and queue.get("k").attempt == 0
    job = _claim_due(queue, engine, "k")
    assert engine.job_fail(job, "boom", "lock_timeout", 0.0) is JobState.RETRYABLE
    back = engine.job_get("k")
    assert back is not None and back.attempt == 1 and len(back.errors) == 9
    job = _claim_due(queue, engine, "k")  # the last attempt: an outage keeps it alive
    assert engine.job_fail(job, "down", "connection_lost", 0.0, unspent_within=3600) is (
        JobState.RETRYABLE
    )


def test_an_outage_past_its_budget_spends_attempts_again(queue: Queue, engine: Engine) -> None:
    queue.enqueue("noop", {}, None, "k", max_attempts=2)
    job = _claim_due(queue, engine, "k")
    assert engine.job_fail(job, "full", "disk_full", 0.0, unspent_within=60) is JobState.RETRYABLE
    execute(
        engine, f"update expiry.jobs set unspent_since = unspent_since - {seconds(engine, '120')}"
    )
    job = _claim_due(queue, engine, "k")
    assert engine.job_fail(job, "full", "disk_full", 0.0, unspent_within=60) is JobState.RETRYABLE
    assert queue.get("k") is not None and queue.get("k").attempt == 1
    job = _claim_due(queue, engine, "k")
    assert engine.job_fail(job, "full", "disk_full", 0.0, unspent_within=60) is JobState.DEAD
    # Without a budget (the HTTP API's nack), an outage's kind spends as any error.
    queue.enqueue("noop", {}, None, "n", max_attempts=1)
    job = _claim_due(queue, engine, "n")
    assert engine.job_fail(job, "down", "connection_lost", 0.0) is JobState.DEAD


# -- dead-letter review --------------------------------------------------------------


def kill(queue: Queue, *keys: str) -> None:
    for key in keys:
        queue.enqueue("noop", {"policy": "p" if key.startswith("p") else "q"}, None, key)
    for job in queue.claim(len(keys)):
        assert queue.fail(job, f"bad {job.key}", transient=False) is JobState.DEAD


def test_redrive_one_several_and_all(queue: Queue, engine: Engine) -> None:
    kill(queue, "a", "b", "c", "d", "e")
    queue.enqueue("noop", {}, None, "waiting")

    assert queue.redrive(["a"]) == ["a"]
    assert sorted(queue.redrive(["b", "c", "waiting", "missing"])) == ["b", "c"]
    assert sorted(queue.redrive(all=True)) == ["d", "e"]
    assert queue.redrive(all=True) == []

    for key in "abcde":
        job = queue.get(key)
        assert job is not None and job.state is JobState.AVAILABLE and job.attempt == 0
        assert job.finished_at is None
        assert [e["error"] for e in job.errors] == [f"bad {key}"]  # history kept
    assert len(queue.claim(10)) == 6
    actions = [event.action for event in engine.audit_list()]
    assert actions.count("job.redriven") == 5


def test_redrive_by_policy(queue: Queue) -> None:
    kill(queue, "p1", "p2", "q1")

    assert sorted(queue.redrive(all=True, policy="p")) == ["p1", "p2"]
    assert state_of(queue, "q1") is JobState.DEAD


def test_discard_cancels_dead_and_waiting_jobs_only(queue: Queue, engine: Engine) -> None:
    kill(queue, "dead")
    queue.enqueue("noop", {}, None, "running")
    [running] = queue.claim(1)
    queue.enqueue("noop", {}, None, "waiting")
    queue.enqueue("noop", {}, 3600, "scheduled")

    assert sorted(queue.discard(["dead", "running", "waiting", "scheduled", "nope"])) == [
        "dead",
        "scheduled",
        "waiting",
    ]

    for key in ("dead", "waiting", "scheduled"):
        job = queue.get(key)
        assert job is not None and job.state is JobState.CANCELLED and job.finished_at is not None
    assert state_of(queue, "running") is JobState.RUNNING
    assert queue.redrive(["dead"]) == []  # a cancelled job is not dead any more
    assert queue.claim(5) == []
    assert [event.job_key for event in engine.audit_list() if event.action == "job.discarded"]


def test_prune_deletes_only_old_completed_and_cancelled(queue: Queue, engine: Engine) -> None:
    kill(queue, "old-dead")
    for key in ("old-done-1", "old-done-2", "new-done"):
        queue.enqueue("noop", {}, None, key)
    for job in queue.claim(3):
        queue.complete(job)
    queue.enqueue("noop", {}, None, "old-cancelled")
    queue.discard(["old-cancelled"])
    queue.enqueue("noop", {}, None, "waiting")
    age_finished(engine, ["old-dead", "old-done-1", "old-done-2", "old-cancelled"], 7200)

    assert queue.prune(older_than=3600, batch=1) == 3

    left = {row["key"] for row in execute(engine, "select key from expiry.jobs")}
    assert left == {"old-dead", "new-done", "waiting"}
    assert queue.prune(older_than=3600) == 0
    time.sleep(0.01)
    assert queue.prune(older_than=0) == 1
    assert {row["key"] for row in execute(engine, "select key from expiry.jobs")} == {
        "old-dead",
        "waiting",
    }
    # A pruned job's key is free again; a kept job's key still is not.
    again = queue.enqueue_many([new_job("noop", {}, None, k) for k in ("old-done-1", "old-dead")])
    assert [(r.key, r.enqueued) for r in again] == [("old-done-1", True), ("old-dead", False)]
    assert queue.get("old-dead").state is JobState.DEAD  # type: ignore[union-attr]


def test_emptying_the_jobs_table_by_hand_frees_their_keys(queue: Queue, engine: Engine) -> None:
    """An operator who empties the queue by hand (TRUNCATE, or DELETE where
    there is no TRUNCATE) can queue the same keys again: none is skipped as a
    duplicate of a job that no longer exists (on PostgreSQL the keys live in
    expiry.job_keys, which TRUNCATE expiry.jobs empties with it: 0013)."""
    keys = ["window-1", "window-2"]
    queue.enqueue_many([new_job("noop", {}, None, k) for k in keys])
    if engine.dialect == "sqlite":
        execute(engine, "delete from expiry.jobs")
    else:
        execute(engine, "truncate expiry.jobs")
    assert job_count(engine) == 0

    again = queue.enqueue_many([new_job("noop", {"v": 2}, None, k) for k in keys])

    assert [(r.key, r.enqueued) for r in again] == [("window-1", True), ("window-2", True)]
    assert [job.key for job in queue.claim(5)] == keys
    if engine.dialect == "postgres":  # both named at once, as an operator may
        execute(engine, "truncate expiry.jobs, expiry.job_keys restart identity")
        assert queue.enqueue_many([new_job("noop", {}, None, "window-1")])[0].enqueued


# -- transactions ------------------------------------------------------------------


def test_complete_inside_the_callers_transaction_rolls_back_with_it(
    queue: Queue, engine: Engine
) -> None:
    execute(engine, "create table scratch (id integer primary key)")
    queue.enqueue("noop", {}, None, "k")
    [job] = queue.claim(1)
    insert = "insert into scratch (id) values (%s)"

    with pytest.raises(RuntimeError, match="handler blew up"):
        with engine.transaction() as tx:
            execute_in(engine, tx, insert, 1)
            queue.complete(job, tx)
            raise RuntimeError("handler blew up")

    assert state_of(queue, "k") is JobState.RUNNING
    assert execute(engine, "select id from scratch") == []

    with engine.transaction() as tx:
        execute_in(engine, tx, insert, 2)
        queue.complete(job, tx)

    assert state_of(queue, "k") is JobState.COMPLETED
    assert execute(engine, "select id from scratch") == [{"id": 2}]


def a_stale_and_a_fresh_lease(queue: Queue, engine: Engine) -> tuple[Job, Job]:
    """Job "k" claimed, its lease expired and rescued, then claimed again; and an
    empty table ``scratch`` for the effects."""
    execute(engine, "create table scratch (id integer primary key)")
    queue.enqueue("noop", {}, None, "k")
    [stale] = queue.claim(1, lease=30)
    expire_leases(engine)
    queue.rescue()
    [fresh] = queue.claim(1)
    return stale, fresh


def test_lease_lost_inside_the_callers_transaction_rolls_its_effect_back(
    queue: Queue, engine: Engine
) -> None:
    stale, fresh = a_stale_and_a_fresh_lease(queue, engine)

    with pytest.raises(LeaseLost):
        with engine.transaction() as tx:
            execute_in(engine, tx, "insert into scratch (id) values (%s)", 1)
            queue.complete(stale, tx)

    assert execute(engine, "select id from scratch") == []
    queue.complete(fresh)


def test_a_completing_transaction_commits_the_effect_with_the_completion(
    queue: Queue, engine: Engine
) -> None:
    execute(engine, "create table scratch (id integer primary key)")
    queue.enqueue("noop", {}, None, "k")
    [job] = queue.claim(1)

    with engine.transaction(completing=job) as tx:
        execute_in(engine, tx, "insert into scratch (id) values (%s)", 1)
        if engine.dialect != "sqlite":  # (SQLite's one connection a thread is inside it)
            assert state_of(queue, "k") is JobState.RUNNING  # not before the block ends

    assert state_of(queue, "k") is JobState.COMPLETED
    assert execute(engine, "select id from scratch") == [{"id": 1}]


def test_a_completing_transaction_that_raises_commits_nothing(queue: Queue, engine: Engine) -> None:
    execute(engine, "create table scratch (id integer primary key)")
    queue.enqueue("noop", {}, None, "k")
    [job] = queue.claim(1)

    with pytest.raises(RuntimeError, match="handler blew up"):
        with engine.transaction(completing=job) as tx:
            execute_in(engine, tx, "insert into scratch (id) values (%s)", 1)
            raise RuntimeError("handler blew up")

    assert state_of(queue, "k") is JobState.RUNNING
    assert execute(engine, "select id from scratch") == []
    queue.complete(job)  # the lease is still the caller's


def test_a_completing_transaction_whose_lease_moved_on_commits_nothing(
    queue: Queue, engine: Engine
) -> None:
    """The completion travels with the COMMIT on PostgreSQL (one round trip): a
    lost lease must still abort the transaction, not commit the effect alone."""
    stale, fresh = a_stale_and_a_fresh_lease(queue, engine)

    with pytest.raises(LeaseLost):
        with engine.transaction(completing=stale) as tx:
            execute_in(engine, tx, "insert into scratch (id) values (%s)", 1)

    assert execute(engine, "select id from scratch") == []
    assert state_of(queue, "k") is JobState.RUNNING  # the fresh lease's, untouched
    with engine.transaction(completing=fresh) as tx:  # the connection is fit for the next
        execute_in(engine, tx, "insert into scratch (id) values (%s)", 2)
    assert state_of(queue, "k") is JobState.COMPLETED
    assert execute(engine, "select id from scratch") == [{"id": 2}]


def test_a_completing_transaction_keeps_a_nested_block_inside_it(pg_url: str) -> None:
    """PostgreSQL writes the job's BEGIN out (to send its completion with the
    COMMIT): a handler's own ``with tx.transaction():`` must still be a savepoint
    inside it, not a transaction that commits its work ahead of the completion.
    (sqlite3 and PyMySQL connections have no nested transaction() to misuse.)"""
    engine = open_engine(pg_url)
    queue = Queue(engine)
    try:
        execute(engine, "create table scratch (id integer primary key)")
        queue.enqueue("noop", {}, None, "k")
        [job] = queue.claim(1)

        with pytest.raises(RuntimeError, match="after the savepoint"):
            with engine.transaction(completing=job) as tx:
                with tx.transaction():
                    execute_in(engine, tx, "insert into scratch (id) values (%s)", 1)
                raise RuntimeError("after the savepoint")

        assert execute(engine, "select id from scratch") == []
        assert state_of(queue, "k") is JobState.RUNNING
    finally:
        engine.close()


def elsewhere(fn: Callable[[], T]) -> T:
    """``fn()`` on another thread: outside the calling thread's pinned connection."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def test_chained_transactions_commit_each_job_with_its_effect(queue: Queue, engine: Engine) -> None:
    """Inside pinned(), a chained COMMIT commits its job (the next job's
    transaction only starts in the one it opened), and the last job, unchained,
    leaves the connection outside any transaction."""
    execute(engine, "create table scratch (id integer primary key)")
    queue.enqueue_many(new_job("noop", {}, None, f"c{i}") for i in range(3))
    jobs = sorted(queue.claim(3), key=lambda j: j.key)

    with engine.pinned():
        for i, job in enumerate(jobs):
            with engine.transaction(completing=job, chain=i < 2) as tx:
                execute_in(engine, tx, "insert into scratch (id) values (%s)", i)
            assert elsewhere(lambda key=job.key: state_of(queue, key)) is JobState.COMPLETED
            seen = elsewhere(lambda: execute(engine, "select id from scratch order by id"))
            assert seen == [{"id": n} for n in range(i + 1)]

    assert [state_of(queue, f"c{i}") for i in range(3)] == [JobState.COMPLETED] * 3


def test_a_chained_transaction_never_swallows_other_work(queue: Queue, engine: Engine) -> None:
    """After a chained COMMIT, a statement of another kind on the same thread (a
    failure's record, a release) must commit as its own, not run inside the
    empty transaction the chain left open and vanish with it."""
    queue.enqueue_many(new_job("noop", {}, None, f"s{i}") for i in range(2))
    first, second = sorted(queue.claim(2), key=lambda j: j.key)

    with engine.pinned():
        with engine.transaction(completing=first, chain=True):
            pass
        assert queue.release(second)  # an autocommitted statement on the pinned thread
        assert elsewhere(lambda: state_of(queue, "s1")) is JobState.AVAILABLE
        [again] = queue.claim(1)
        assert queue.fail(again, "boom", transient=False) is JobState.DEAD
        assert elsewhere(lambda: state_of(queue, "s1")) is JobState.DEAD

    assert state_of(queue, "s0") is JobState.COMPLETED


def test_a_chained_transaction_whose_job_raises_commits_only_the_job_before(
    queue: Queue, engine: Engine
) -> None:
    execute(engine, "create table scratch (id integer primary key)")
    queue.enqueue_many(new_job("noop", {}, None, f"r{i}") for i in range(2))
    first, second = sorted(queue.claim(2), key=lambda j: j.key)

    with engine.pinned():
        with engine.transaction(completing=first, chain=True) as tx:
            execute_in(engine, tx, "insert into scratch (id) values (%s)", 1)
        with pytest.raises(RuntimeError, match="second blew up"):
            with engine.transaction(completing=second, chain=True) as tx:
                execute_in(engine, tx, "insert into scratch (id) values (%s)", 2)
                raise RuntimeError("second blew up")
        with engine.transaction(completing=second) as tx:  # the connection is fit again
            execute_in(engine, tx, "insert into scratch (id) values (%s)", 3)

    assert execute(engine, "select id from scratch order by id") == [{"id": 1}, {"id": 3}]
    assert [state_of(queue, "r0"), state_of(queue, "r1")] == [JobState.COMPLETED] * 2


@pytest.mark.parametrize("server", ["postgres", "mysql"])
def test_work_begun_inside_a_pinned_transaction_takes_a_connection_of_its_own(
    server: str, request: pytest.FixtureRequest
) -> None:
    """A handler that enqueues without passing its tx gets a transaction of its
    own, as without pinned(): never the job's, busy on the pinned connection.
    (SQLite has one connection a thread and one writer: not for it.)"""
    engine = open_engine(request.getfixturevalue("pg_url" if server == "postgres" else "mysql_url"))
    queue = Queue(engine)
    try:
        queue.enqueue("noop", {}, None, "job")
        [job] = queue.claim(1)

        with engine.pinned():
            with pytest.raises(RuntimeError, match="handler blew up"):
                with engine.transaction(completing=job, chain=True):
                    queue.enqueue("noop", {}, None, "side")
                    raise RuntimeError("handler blew up")

        assert queue.get("side") is not None  # committed by itself
        assert state_of(queue, "job") is JobState.RUNNING
    finally:
        engine.close()


def test_a_job_transaction_after_a_stale_chain_starts_afresh(pg_url: str) -> None:
    """now() is a transaction's start: a job whose transaction would start in
    one chained long ago (the worker stopped between two jobs) gets a new one."""
    engine = open_engine(pg_url)
    queue = Queue(engine)
    try:
        queue.enqueue_many(new_job("noop", {}, None, f"t{i}") for i in range(2))
        first, second = sorted(queue.claim(2), key=lambda j: j.key)
        with engine.pinned():
            with engine.transaction(completing=first, chain=True) as tx:
                pid = tx.execute("select pg_backend_pid() as pid").fetchone()["pid"]
            time.sleep(0.3)
            with engine.transaction(completing=second) as tx:
                row = tx.execute(
                    "select pg_backend_pid() as pid,"
                    " extract(epoch from clock_timestamp() - now()) as age"
                ).fetchone()
        assert row["pid"] == pid  # the pinned connection
        assert row["age"] < 0.2  # not the chain's start, 0.3 s before
        assert state_of(queue, "t1") is JobState.COMPLETED
    finally:
        engine.close()


def test_ack_many_completes_the_held_jobs_and_leaves_a_moved_lease(
    queue: Queue, engine: Engine
) -> None:
    queue.enqueue_many(new_job("noop", {}, None, f"a{i}") for i in range(3))
    jobs = queue.claim(3, lease=30)
    [moved] = [j for j in jobs if j.key == "a1"]
    execute(engine, "update expiry.jobs set lease_token = %s where key = %s", ("theirs", "a1"))

    done = engine.job_ack_many(jobs)

    assert done == {j.id for j in jobs if j.key != "a1"}
    assert [state_of(queue, f"a{i}") for i in range(3)] == [
        JobState.COMPLETED,
        JobState.RUNNING,  # the new owner's
        JobState.COMPLETED,
    ]
    assert engine.job_ack_many(jobs) == set()  # spent leases complete nothing again
    assert [j.key for j in queue.ack_many([moved])] == []


def execute_in(engine: Engine, tx: object, statement: str, *params: object) -> None:
    tx.execute(sql(engine, statement), params)  # type: ignore[attr-defined]


# -- migrations --------------------------------------------------------------------


def drop_expiry_schema(engine: Engine) -> None:
    if engine.dialect == "postgres":
        execute(engine, "drop schema expiry cascade")
    elif engine.dialect == "mysql":
        tables = (
            "select table_name as name from information_schema.tables"
            " where table_schema = database() and table_name like 'expiry%%'"
        )
        for row in execute(engine, tables):
            execute(engine, f"drop table `{row['name']}`")
    else:
        tables = "select name from sqlite_master where type = 'table' and name like 'expiry%'"
        for row in execute(engine, tables):
            execute(engine, f'drop table "{row["name"]}"')


def enqueue_as_of_old(
    engine: Engine, handler: str, payload: dict[str, Any], key: str, queue: str = "default"
) -> None:
    """Queue a job as an expiry before PostgreSQL's 0012 did: a row in jobs
    alone (SQLite and MySQL still enqueue that way)."""
    if engine.dialect != "postgres":
        Queue(engine).enqueue(handler, payload, None, key, queue=queue)
        return
    execute(
        engine,
        "insert into expiry.jobs (queue, handler, key, payload) values (%s, %s, %s, %s)",
        (queue, handler, key, json.dumps(payload)),
    )


def test_migrate_twice_is_a_no_op(engine: Engine) -> None:
    version = engine.schema_version()
    assert version == engine.migrations[-1][0]
    assert engine.migrate() == []
    assert engine.migrate() == []
    assert engine.schema_version() == version


def test_migrate_from_empty_then_again(engine: Engine) -> None:
    drop_expiry_schema(engine)
    assert engine.schema_version() == 0

    assert engine.migrate() == [version for version, _ in engine.migrations]
    assert engine.migrate() == []
    assert Queue(engine).enqueue("noop", {}, None, "k").enqueued


def test_migration_0008_moves_expirys_own_queued_jobs_into_their_own_queues(
    engine: Engine,
) -> None:
    """Jobs queued by an earlier expiry in 'default' move to the policy's queue
    (planning, partition and window jobs) and to expiry.cron (cron calls); the
    application's jobs, and a look-alike outside 'default', stay."""
    drop_expiry_schema(engine)
    every = engine.migrations
    try:
        engine.migrations = [m for m in every if m[0] < 8]
        engine.migrate()
        enqueue_as_of_old(engine, "expiry.window", {"policy": "p", "run_id": "p:t"}, "p:t:0")
        enqueue_as_of_old(engine, "expiry.plan", {"policy": "p", "run_id": "p:t"}, "p:t:plan")
        enqueue_as_of_old(engine, "expiry.http_call", {"name": "n"}, "cron:n:t")
        enqueue_as_of_old(engine, "send_mail", {"policy": "p"}, "mail")
        enqueue_as_of_old(engine, "expiry.window", {"policy": "p"}, "elsewhere", queue="other")
    finally:
        engine.migrations = every
    assert engine.migrate() == [v for v, _ in every if v >= 8]

    queues = {r["key"]: r["queue"] for r in execute(engine, "select key, queue from expiry.jobs")}
    assert queues == {
        "p:t:0": "expiry.policy.p",
        "p:t:plan": "expiry.policy.p",
        "cron:n:t": "expiry.cron",
        "mail": "default",
        "elsewhere": "other",
    }


def test_migration_0012_keeps_the_keys_of_jobs_queued_before_it(bare_pg_url: str) -> None:
    """PostgreSQL keeps a job's key in expiry.job_keys from 0012 on: jobs
    queued before it keep their keys, found by key and not queued twice.
    (SQLite and MySQL keep the unique index on the jobs table.)"""
    engine = open_engine(bare_pg_url)
    every = engine.migrations
    try:
        engine.migrations = [m for m in every if m[0] < 12]
        engine.migrate()
        enqueue_as_of_old(engine, "noop", {"v": 1}, "before-1")
        enqueue_as_of_old(engine, "noop", {"v": 2}, "before-2")
        engine.migrations = every
        assert engine.migrate()[:2] == [12, 13]
        queue = Queue(engine)

        again = queue.enqueue_many([new_job("noop", {}, None, k) for k in ("before-1", "after")])
        assert [(r.key, r.enqueued) for r in again] == [("before-1", False), ("after", True)]
        assert queue.get("before-2").payload == {"v": 2}  # type: ignore[union-attr]
        assert queue.discard(["before-2"]) == ["before-2"]
        assert [job.key for job in queue.claim(5)] == ["before-1", "after"]
    finally:
        engine.migrations = every
        engine.close()


def test_a_database_from_a_newer_expiry_is_refused(db_url: str, engine: Engine) -> None:
    execute(
        engine, "insert into expiry.schema_migrations (version, applied_at) values (999, {now})"
    )

    with pytest.raises(MigrationError, match="999"):
        engine.migrate()

    other = open_engine(db_url)
    try:
        assert other.schema_version() == 999
        with pytest.raises(MigrationError, match="newer"):
            other.migrate()
    finally:
        other.close()


# -- stats ---------------------------------------------------------------------------


def test_stats_by_state_oldest_due_running_and_dead(queue: Queue, engine: Engine) -> None:
    kill(queue, "doomed")
    queue.enqueue("noop", {}, None, "run", priority=-1)
    [running] = queue.claim(1)
    assert running.key == "run"
    now = engine.now()
    queue.enqueue("noop", {}, now - timedelta(seconds=30), "old")
    queue.enqueue("noop", {}, None, "due")
    queue.enqueue("noop", {}, 3600, "later")
    queue.enqueue("noop", {}, None, "elsewhere", queue="other")

    stats = queue.stats()

    assert stats.by_state == {
        "default": {"available": 2, "scheduled": 1, "running": 1, "dead": 1},
        "other": {"available": 1},
    }
    # SQLite's julianday() keeps milliseconds: allow for its rounding.
    assert 29.99 <= stats.oldest_due_seconds["default"] < 60
    assert 0 <= stats.oldest_due_seconds["other"] < 30
    assert [(q, key) for q, key, _ in stats.running] == [("default", "run")]
    assert 0 <= stats.running[0][2] < 30
    assert stats.dead == 1
    assert stats.retries_by_kind == {"permanent": 1}
    assert queue.pending() == 5  # not final: 3 waiting, 1 running, 1 elsewhere
    assert queue.pending(due_only=True) == 4
    assert queue.pending("other") == 1


# -- hints -------------------------------------------------------------------------


def test_an_enqueue_elsewhere_wakes_the_wait_and_counts_one_hint(
    engine: Engine, db_url: str
) -> None:
    """PostgreSQL: a job enqueued on another connection wakes ``wait_for_jobs`` at
    once and moves ``hints_seen`` by one; a wait with nothing sent lasts its
    timeout and moves nothing. SQLite receives no hints (None): it waits its poll."""
    engine.listen()
    before = engine.hints_seen()
    other = open_engine(db_url)
    Queue(other).enqueue("noop", {}, None, "hinted")
    other.close()
    started = time.monotonic()
    engine.wait_for_jobs(5.0)
    woke_after = time.monotonic() - started
    if before is None:
        assert engine.hints_seen() is None
        return
    assert woke_after < 1.0
    assert engine.hints_seen() == before + 1
    started = time.monotonic()
    engine.wait_for_jobs(0.3)
    assert time.monotonic() - started >= 0.25
    assert engine.hints_seen() == before + 1
