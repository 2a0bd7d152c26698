"""The worker against real databases: outcomes, retries, once(), graceful shutdown."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _support import execute, finish, make_due, placeholder, spawn, sql, wait_for

from expiry.app import App
from expiry.errors import PermanentError, TransientError
from expiry.queue.jobs import new_job
from expiry.queue.worker import Worker
from expiry.types import Job, JobState


def make_worker(app: App, **kwargs: Any) -> Worker:
    options: dict[str, Any] = {
        "until_idle": True,
        "poll": 0.05,
        "rescue_every": 0.2,
        "rng": random.Random(0),
    }
    return app.worker(**{**options, **kwargs})


def effects_table(app: App) -> None:
    execute(app.engine, "create table effects (id integer primary key, job text not null)")


def effects(app: App) -> list[tuple[int, str]]:
    rows = execute(app.engine, "select id, job from effects order by id")
    return [(row["id"], row["job"]) for row in rows]


def get(app: App, key: str) -> Job:
    job = app.queue.get(key)
    assert job is not None, f"job {key} is missing"
    return job


@pytest.mark.parametrize("concurrency", [1, 3])
def test_until_idle_runs_every_due_job_then_exits(app: App, concurrency: int) -> None:
    effects_table(app)
    mark = placeholder(app.engine)

    @app.handler("record")
    def record(job: Job, tx: Any) -> None:
        tx.execute(
            f"insert into effects (id, job) values ({mark}, {mark})", (job.payload["i"], job.key)
        )

    app.queue.enqueue_many(new_job("record", {"i": i}, None, f"r{i}") for i in range(40))
    app.queue.enqueue("record", {"i": 999}, 3600, "later")
    worker = make_worker(app, concurrency=concurrency, batch=4)

    assert worker.run() == 0

    assert worker.processed == 40
    assert [i for i, _ in effects(app)] == list(range(40))
    assert all(get(app, f"r{i}").state is JobState.COMPLETED for i in range(40))
    assert get(app, "later").state is JobState.SCHEDULED
    assert app.queue.pending(due_only=True) == 0


def test_until_idle_exits_soon_after_its_last_job_whatever_the_poll(app: App) -> None:
    """The loops that idle while another works (the cron calls' threads) must
    notice that the worker is done well within a poll (1 s): the last job sends
    no hint to wake them."""
    last: list[float] = []

    @app.handler("quick")
    def quick(job: Job, tx: Any) -> None:
        last.append(time.monotonic())

    app.queue.enqueue_many(new_job("quick", {}, None, f"q{i}") for i in range(20))
    worker = app.worker(until_idle=True, poll=1.0, rng=random.Random(0))

    assert worker.run() == 0

    assert len(last) == 20
    assert time.monotonic() - last[-1] < 0.5


@pytest.mark.parametrize("server", ["postgres", "mysql"])
def test_until_idle_claims_again_soon_when_another_claim_held_the_due_jobs(
    server: str, request: pytest.FixtureRequest
) -> None:
    """A claim that finds every due job locked by another claim in flight (SKIP
    LOCKED: the last jobs of a backlog two workers drain) comes back empty. Those
    jobs are still due: an --until-idle worker claims again after its short
    wait, and exits once they are done, not a poll (here 2 s) later.
    (SQLite's claims take the database's one write lock: none comes back empty
    while jobs are due.)"""
    app = App(request.getfixturevalue("pg_url" if server == "postgres" else "mysql_url"))
    try:
        ran: list[str] = []

        @app.handler("quick")
        def quick(job: Job, tx: Any) -> None:
            ran.append(job.key)

        app.queue.enqueue_many(new_job("quick", {}, None, f"q{i}") for i in range(3))
        locked, release = threading.Event(), threading.Event()

        def other_claim() -> None:  # holds the due jobs' rows, as a claim in flight does
            with app.engine.transaction() as tx:
                tx.execute(sql(app.engine, "select id from expiry.jobs for update"))
                locked.set()
                release.wait(10)

        holder = threading.Thread(target=other_claim)
        holder.start()
        assert locked.wait(10)
        worker = make_worker(app, poll=2.0)
        started = time.monotonic()
        threading.Timer(0.3, release.set).start()
        assert worker.run() == 0
        took = time.monotonic() - started
        holder.join(10)

        assert sorted(ran) == ["q0", "q1", "q2"]
        assert 0.3 <= took < 1.2, f"the worker ran {took:.2f}s for jobs freed after 0.3s"
    finally:
        app.close()


def test_until_idle_exits_soon_when_another_workers_last_job_ends_while_a_loop_reads(
    app: App,
) -> None:
    """A loop whose claim came back empty reads which queues still have jobs
    running or due. Another worker's last job can end during that reading (its
    batched ack lands): the loop decides on one reading a queue. Read twice, the
    queue looked busy to the idle test and idle to the next, the loop rested a
    whole poll (here 2 s) with all the work done, and so did every other loop.
    (Only PostgreSQL's loops rest between hints; the others poll.)"""

    @app.handler("quick")
    def quick(job: Job, tx: Any) -> None:
        pass

    app.queue.enqueue_many([new_job("quick", {}, None, "elsewhere")])
    theirs = app.queue.claim(1, 60, owner="another worker")
    assert [job.key for job in theirs] == ["elsewhere"]
    worker = make_worker(app, poll=2.0)
    others = {f"{q}-{i}" for q, n in worker.pools.items() for i in range(n)}
    read_by: set[str] = set()
    real = app.queue.pending
    ended = threading.Event()

    def pending(queue: str | None = None, *, due_only: bool = False) -> int:
        """The real count; the job loop's first reading of the busy queue is
        where the other worker's job ends, once every other loop has read it."""
        n = real(queue, due_only=due_only)
        me = threading.current_thread().name
        if queue == "default" and n:
            read_by.add(me)
            if me.startswith("job-") and not ended.is_set():
                wait_for(lambda: others <= read_by, timeout=5)
                app.queue.complete(theirs[0])
                ended.set()
        return n

    app.queue.pending = pending  # type: ignore[method-assign]
    started = time.monotonic()
    assert worker.run() == 0
    took = time.monotonic() - started

    assert ended.is_set(), "the job loop never read the busy queue"
    job = app.queue.get("elsewhere")
    assert job is not None and job.state is JobState.COMPLETED
    assert took < 1.0, f"the worker ran {took:.2f}s after the last job ended at once"


def test_a_batch_of_mixed_jobs_on_one_pinned_connection_gets_each_its_own_outcome(
    app: App,
) -> None:
    """One claim, one pinned connection, each plain job's COMMIT chained into the
    next one's transaction: failing jobs between good ones, one outside any
    transaction and one with an after hook must each end as they would alone,
    and only the good effects stay."""
    effects_table(app)
    mark = placeholder(app.engine)
    insert = f"insert into effects (id, job) values ({mark}, {mark})"
    after: list[str] = []

    @app.handler("record")
    def record(job: Job, tx: Any) -> None:
        tx.execute(insert, (job.payload["i"], job.key))

    @app.handler("boom")
    def boom(job: Job, tx: Any) -> None:
        tx.execute(insert, (job.payload["i"], job.key))
        raise ValueError("boom")

    @app.handler("outside", transactional=False)
    def outside(job: Job) -> None:
        after.append(f"ran {job.key}")

    @app.handler("hooked", after=lambda job, result, seconds: after.append(f"after {job.key}"))
    def hooked(job: Job, tx: Any) -> None:
        tx.execute(insert, (job.payload["i"], job.key))

    plan = ["record", "boom", "record", "boom", "record", "outside"]
    plan += ["record", "hooked", "record", "record"]
    app.queue.enqueue_many(
        new_job(name, {"i": i}, None, f"{i}-{name}", max_attempts=1) for i, name in enumerate(plan)
    )
    worker = make_worker(app, batch=len(plan), claim_hold=None)

    assert worker.run() == 0

    good = {i for i, name in enumerate(plan) if name in ("record", "hooked")}
    states = {i: get(app, f"{i}-{name}").state for i, name in enumerate(plan)}
    assert {i for i, state in states.items() if state is JobState.COMPLETED} == good | {5}
    assert states[1] is JobState.DEAD and states[3] is JobState.DEAD
    assert [i for i, _ in effects(app)] == sorted(good)
    assert after == ["ran 5-outside", "after 7-hooked"]
    assert worker.processed == len(plan)


def test_permanent_error_dead_letters_after_one_attempt_with_its_reason(app: App) -> None:
    effects_table(app)
    mark = placeholder(app.engine)
    calls: list[int] = []

    @app.handler("doomed")
    def doomed(job: Job, tx: Any) -> None:
        calls.append(job.attempt)
        tx.execute(f"insert into effects (id, job) values (1, {mark})", (job.key,))
        raise PermanentError("listing 42 has no owner")

    app.queue.enqueue("doomed", {}, None, "d", max_attempts=5)
    assert make_worker(app).run() == 0

    job = get(app, "d")
    assert calls == [1]
    assert job.state is JobState.DEAD and job.attempt == 1
    assert job.last_error == "PermanentError: listing 42 has no owner"
    assert job.last_error_kind == "PermanentError"
    assert effects(app) == []  # the handler's effect rolled back with the failure
    assert [j.key for j in app.queue.dead()] == ["d"]


def test_unknown_handler_is_dead_lettered(app: App) -> None:
    app.queue.enqueue("nobody_handles_this", {}, None, "orphan")

    assert make_worker(app).run() == 0

    job = get(app, "orphan")
    assert job.state is JobState.DEAD and "nobody_handles_this" in (job.last_error or "")


def test_plain_exception_retries_exactly_max_attempts_then_dead(app: App) -> None:
    calls: list[int] = []

    @app.handler("flaky")
    def flaky(job: Job, tx: Any) -> None:
        calls.append(job.attempt)
        raise ValueError(f"still broken on attempt {job.attempt}")

    app.queue.enqueue("flaky", {}, None, "f", max_attempts=3)
    for _ in range(6):  # bounded: three runs are needed, six would be a bug
        assert make_worker(app).run() == 0
        if get(app, "f").state is JobState.DEAD:
            break
        assert get(app, "f").state is JobState.RETRYABLE
        make_due(app.engine, ["f"])  # skip the backoff wait

    job = get(app, "f")
    assert calls == [1, 2, 3]
    assert job.state is JobState.DEAD and job.attempt == 3
    assert job.last_error == "ValueError: still broken on attempt 3"
    assert [e["kind"] for e in job.errors] == ["ValueError"] * 3
    make_due(app.engine)
    assert make_worker(app).run() == 0
    assert calls == [1, 2, 3]


def test_once_with_form_completes_a_repeated_operation_as_a_duplicate(app: App) -> None:
    effects_table(app)
    mark = placeholder(app.engine)
    ran: list[str] = []

    @app.handler("expire_listing")
    def expire_listing(job: Job, tx: Any) -> None:
        ran.append(job.key)
        with app.once(tx, f"expire-listing:{job.payload['id']}:revision-{job.payload['rev']}"):
            tx.execute(
                f"insert into effects (id, job) values ({mark}, {mark})",
                (job.payload["id"], job.key),
            )

    app.queue.enqueue("expire_listing", {"id": 7, "rev": 3}, None, "first")
    assert make_worker(app).run() == 0
    app.queue.enqueue("expire_listing", {"id": 7, "rev": 3}, None, "second")
    assert make_worker(app).run() == 0

    assert ran == ["first", "second"]
    assert effects(app) == [(7, "first")]  # no second effect
    for key in ("first", "second"):
        job = get(app, key)
        assert job.state is JobState.COMPLETED and job.attempt == 1 and job.errors == []
    ledger = app.engine.ledger_get("expire-listing:7:revision-3")
    assert ledger is not None and ledger.action == "once"


def test_once_if_form_guards_each_operation(app: App) -> None:
    effects_table(app)
    mark = placeholder(app.engine)

    @app.handler("purge")
    def purge(job: Job, tx: Any) -> None:
        for upload in job.payload["uploads"]:
            if app.once(tx, f"purge-upload:{upload}"):
                tx.execute(
                    f"insert into effects (id, job) values ({mark}, {mark})", (upload, job.key)
                )

    app.queue.enqueue("purge", {"uploads": [1, 2]}, None, "a")
    app.queue.enqueue("purge", {"uploads": [2, 3]}, None, "b")
    assert make_worker(app, batch=1).run() == 0

    assert effects(app) == [(1, "a"), (2, "a"), (3, "b")]
    assert get(app, "b").state is JobState.COMPLETED


def test_a_failing_after_hook_does_not_stop_the_worker(app: App) -> None:
    ran: list[str] = []

    def after(job: Job, result: Any, seconds: float) -> None:
        raise RuntimeError(f"metrics for {job.key} are down")

    @app.handler("hooked", after=after)
    def hooked(job: Job, tx: Any) -> None:
        ran.append(job.key)

    app.queue.enqueue_many(new_job("hooked", {}, None, f"h{i}", priority=i) for i in range(3))

    assert make_worker(app, batch=2).run() == 0

    assert ran == ["h0", "h1", "h2"]  # the hook ran after commit: the jobs stay completed
    assert all(get(app, f"h{i}").state is JobState.COMPLETED for i in range(3))


def test_run_restores_the_signal_handlers_it_replaced(app: App) -> None:
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))

    assert make_worker(app).run() == 0

    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_sigterm_finishes_the_job_in_hand_and_releases_the_rest(
    db_url: str, app: App, tmp_path: Path
) -> None:
    app.queue.enqueue_many(
        new_job("slow", {"seconds": 1.5}, None, f"s{i}", priority=i) for i in range(4)
    )
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = spawn("worker", db_url, "--batch", "4", "--lease", "60", "--marks", str(marks))
    try:
        wait_for(lambda: any(marks.iterdir()), what="the first job to start")
    except AssertionError:
        proc.kill()
        raise AssertionError(finish(proc)[1]) from None

    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)

    assert code == 0, err
    assert [p.name for p in marks.iterdir()] == ["s0.1.started"]
    done = get(app, "s0")
    assert done.state is JobState.COMPLETED and done.attempt == 1
    for key in ("s1", "s2", "s3"):
        job = get(app, key)
        assert job.state is JobState.AVAILABLE, key
        assert job.attempt == 0 and job.lease_token is None and job.errors == []


def test_run_returns_only_after_a_rescue_in_flight_has_finished(app: App) -> None:
    """The caller closes the engine once run() returns: no helper thread of the
    worker may still be inside the driver then."""
    rescuing, release = threading.Event(), threading.Event()
    rescue = app.queue.rescue

    def slow_rescue() -> int:
        rescuing.set()
        release.wait(5)
        return rescue()

    app.queue.rescue = slow_rescue  # type: ignore[method-assign]
    worker = make_worker(app, until_idle=False, rescue_every=0.05)
    before = set(threading.enumerate())
    runner = threading.Thread(target=worker.run)
    runner.start()
    assert rescuing.wait(10)
    worker.stop()
    time.sleep(0.5)
    assert runner.is_alive()  # waiting for the rescue in flight
    release.set()
    runner.join(10)
    assert not runner.is_alive()
    assert set(threading.enumerate()) <= before  # heartbeat and rescuer are gone


def test_a_job_longer_than_its_lease_keeps_it_by_heartbeats(app: App) -> None:
    """Heartbeats extend a running job's lease every third of it: the lease left,
    read off the database while the job runs three leases long, never falls
    below two thirds of it by much, and nobody takes the job over."""
    lease = 1.5
    left: list[float] = []

    @app.handler("long", transactional=False)
    def long(job: Job) -> None:
        deadline = time.monotonic() + 3 * lease
        while time.monotonic() < deadline:
            held = get(app, job.key)
            assert held.lease_expires_at is not None
            left.append((held.lease_expires_at - app.engine.now()).total_seconds())
            time.sleep(0.05)

    app.queue.enqueue_many([new_job("long", {}, None, "long-1")])
    assert make_worker(app, lease=lease).run() == 0
    done = get(app, "long-1")
    assert done.state is JobState.COMPLETED and done.attempt == 1, done
    print(f"lease left while running: min {min(left):.2f} s of {lease} s ({len(left)} readings)")
    assert min(left) > lease / 3, min(left)  # a heartbeat every lease would let it run out


def test_a_failure_hook_hears_each_failed_attempt_with_its_kind(app: App) -> None:
    """``failed(job, kind)`` runs after each failed attempt is recorded, with the
    engine's classification; a hook that raises stops nothing."""
    heard: list[tuple[str, int, str]] = []

    def failed(job: Job, kind: str) -> None:
        heard.append((job.key, job.attempt, kind))
        raise RuntimeError("the hook's own failure")

    @app.handler("flaky", failed=failed)
    def flaky(job: Job, tx: Any) -> None:
        if job.attempt < 3:
            raise TransientError("upstream busy", kind="busy")

    @app.handler("doomed", failed=failed)
    def doomed(job: Job, tx: Any) -> None:
        raise PermanentError("no owner")

    app.queue.enqueue("flaky", {}, None, "f", max_attempts=5)
    app.queue.enqueue("doomed", {}, None, "d", max_attempts=5)
    for _ in range(4):
        make_worker(app).run()
        make_due(app.engine)
    assert get(app, "f").state is JobState.COMPLETED
    assert get(app, "d").state is JobState.DEAD
    assert sorted(heard) == [("d", 1, "PermanentError"), ("f", 1, "busy"), ("f", 2, "busy")]
