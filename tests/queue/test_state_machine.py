"""Random walks through the job state machine, checked against a Python model.

Hypothesis drives, on each engine, enqueue, claim, heartbeat, complete, fail, release, redrive,
discard and rescue on a real engine; after every step the database must hold
exactly the states, attempts and lease tokens the model predicts. Jobs only
become due when a rule says so (the model cannot guess a random backoff):
a transient failure's run_at is checked against the backoff ceiling and then
moved into the past, and "time_passes" makes delayed jobs due.

    scheduled ─┐
    available ─┼─ claim ─► running ─ complete ─► completed
    retryable ─┘              │ fail (transient, attempts left) ─► retryable
                              │ fail (permanent or exhausted)   ─► dead ─ redrive ─► available
                              │ release ─► available (the attempt is given back)
                              └ lease expired ─► rescue ─► retryable (or dead if exhausted)
    scheduled/available/retryable/dead ─ discard ─► cancelled
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from _support import execute, expire_leases, make_due
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from expiry.engines import Engine, open_engine
from expiry.errors import LeaseLost
from expiry.queue import retry
from expiry.queue.jobs import Queue
from expiry.types import FINAL_STATES, WAITING_STATES, Job, JobState

KEYS = [f"k{i}" for i in range(5)]
SETTINGS = settings(max_examples=50, stateful_step_count=40, deadline=None, database=None)
"""No example database: one machine runs on each engine, in parallel processes
(make test), and an example saved by one was replayed by another mid-write."""
S = JobState


@dataclass
class Modelled:
    state: JobState
    attempt: int
    max_attempts: int
    due: bool
    token: str | None = None


# Which claimed Job a lease rule acts on: (stale?, index). Half the draws take a
# Job whose lease is current, half one that lost it (completed, failed,
# released, rescued...), so both the success and the refusal paths run often.
PICK = st.tuples(st.booleans(), st.integers(0, 10**6))
has_leases = precondition(lambda self: bool(self.leases))


class QueueMachine(RuleBasedStateMachine):
    def __init__(self, engine: Engine, teardown: Callable[[], None]) -> None:
        super().__init__()
        self.engine = engine
        self.queue = Queue(engine, rng=random.Random(0))
        self.model: dict[str, Modelled] = {}
        self.leases: list[Job] = []
        """Every Job a claim returned, current or stale, as a worker would hold it."""
        self._teardown = teardown

    def teardown(self) -> None:
        try:
            self.counts_match_model()
        finally:
            self._teardown()

    def counts_match_model(self) -> None:
        """What the dashboard shows agrees with the model (checked once per run)."""
        stats = self.queue.stats()
        assert stats.dead == sum(m.state is S.DEAD for m in self.model.values())
        unfinished = sum(m.state not in FINAL_STATES for m in self.model.values())
        assert self.queue.pending() == unfinished

    def current(self, job: Job) -> bool:
        """Does ``job`` (as claimed, maybe long ago) still hold its lease?"""
        known = self.model[job.key]
        return known.state is S.RUNNING and known.token == job.lease_token

    def pick(self, choice: tuple[bool, int]) -> Job:
        stale, index = choice
        current = [job for job in self.leases if self.current(job)]
        others = [job for job in self.leases if not self.current(job)]
        pool = (others or current) if stale else (current or others)
        return pool[index % len(pool)]

    def due(self) -> set[str]:
        return {k for k in self.waiting() if self.model[k].due}

    def waiting(self) -> list[str]:
        return [k for k, m in self.model.items() if m.state in WAITING_STATES]

    def having(self, state: JobState) -> list[str]:
        return [k for k, m in self.model.items() if m.state is state]

    # -- rules -----------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), delayed=st.booleans(), max_attempts=st.integers(1, 3))
    def enqueue(self, key: str, delayed: bool, max_attempts: int) -> None:
        result = self.queue.enqueue(
            "sm", {"key": key}, 3600 if delayed else None, key, max_attempts=max_attempts
        )
        assert result.enqueued == (key not in self.model)
        if result.enqueued:
            state = S.SCHEDULED if delayed else S.AVAILABLE
            self.model[key] = Modelled(state, 0, max_attempts, due=not delayed)

    # Preconditions keep each step useful: claiming from an empty queue or
    # rescuing when nothing runs is covered by the conformance suite.
    @precondition(lambda self: self.due())
    @rule(n=st.integers(1, 3))
    def claim(self, n: int) -> None:
        due = self.due()
        jobs = self.queue.claim(n, lease=600)
        keys = [job.key for job in jobs]
        assert len(keys) == len(set(keys)) == min(n, len(due))
        assert set(keys) <= due
        for job in jobs:
            known = self.model[job.key]
            known.attempt += 1
            assert job.attempt == known.attempt
            assert job.state is S.RUNNING and job.lease_token
            known.state, known.token = S.RUNNING, job.lease_token
        self.leases.extend(jobs)

    @has_leases
    @rule(choice=PICK)
    def heartbeat(self, choice: tuple[bool, int]) -> None:
        job = self.pick(choice)
        assert self.queue.heartbeat(job, 600) == self.current(job)

    @has_leases
    @rule(choice=PICK)
    def complete(self, choice: tuple[bool, int]) -> None:
        job = self.pick(choice)
        if self.current(job):
            self.queue.complete(job)
            known = self.model[job.key]
            known.state, known.token = S.COMPLETED, None
        else:
            with pytest.raises(LeaseLost):
                self.queue.complete(job)

    @has_leases
    @rule(choice=PICK, transient=st.booleans())
    def fail(self, choice: tuple[bool, int], transient: bool) -> None:
        job = self.pick(choice)
        current = self.current(job)
        before = self.engine.now()
        state = self.queue.fail(job, "boom", transient=transient)
        after = self.engine.now()
        if not current:
            assert state is None
            return
        known = self.model[job.key]
        expected = S.RETRYABLE if transient and known.attempt < known.max_attempts else S.DEAD
        assert state is expected
        known.state, known.token = expected, None
        if expected is S.RETRYABLE:
            stored = self.queue.get(job.key)
            assert stored is not None
            ceiling = timedelta(seconds=retry.ceiling(known.attempt))
            assert before <= stored.run_at <= after + ceiling
            make_due(self.engine, [job.key])
            known.due = True

    @has_leases
    @rule(choice=PICK)
    def release(self, choice: tuple[bool, int]) -> None:
        job = self.pick(choice)
        current = self.current(job)
        assert self.queue.release(job) == current
        if current:
            known = self.model[job.key]
            known.state, known.token, known.due = S.AVAILABLE, None, True
            known.attempt -= 1

    @precondition(lambda self: self.having(S.DEAD))
    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=3, unique=True), everything=st.booleans())
    def redrive(self, keys: list[str], everything: bool) -> None:
        dead = {k for k, m in self.model.items() if m.state is S.DEAD}
        expected = dead if everything else dead & set(keys)
        assert set(self.queue.redrive(keys, all=everything)) == expected
        for key in expected:
            known = self.model[key]
            known.state, known.attempt, known.due = S.AVAILABLE, 0, True

    @precondition(lambda self: self.model)
    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
    def discard(self, keys: list[str]) -> None:
        expected = {
            k for k in keys if k in self.model and self.model[k].state in (*WAITING_STATES, S.DEAD)
        }
        assert set(self.queue.discard(keys)) == expected
        for key in expected:
            self.model[key].state = S.CANCELLED

    @precondition(lambda self: self.having(S.RUNNING))
    @rule()
    def expire_and_rescue(self) -> None:
        running = self.having(S.RUNNING)
        expire_leases(self.engine)
        assert self.queue.rescue() == len(running)
        for key in running:
            known = self.model[key]
            exhausted = known.attempt >= known.max_attempts
            known.state, known.token, known.due = (S.DEAD if exhausted else S.RETRYABLE), None, True

    @precondition(lambda self: any(not self.model[k].due for k in self.waiting()))
    @rule()
    def time_passes(self) -> None:
        make_due(self.engine)
        for key in self.waiting():
            self.model[key].due = True

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def database_matches_model(self) -> None:
        rows = execute(self.engine, "select key, state, attempt, lease_token from expiry.jobs")
        actual = {r["key"]: (S(r["state"]), r["attempt"], r["lease_token"]) for r in rows}
        expected = {k: (m.state, m.attempt, m.token) for k, m in self.model.items()}
        assert actual == expected


def test_state_machine_sqlite(tmp_path: Path) -> None:
    counter = itertools.count()

    def fresh() -> QueueMachine:
        engine = open_engine(f"sqlite:///{tmp_path / f'example-{next(counter)}.db'}")
        engine.migrate()
        return QueueMachine(engine, engine.close)

    run_state_machine_as_test(fresh, settings=SETTINGS)


def test_state_machine_postgres(pg_url: str) -> None:
    engine = open_engine(pg_url)

    def fresh() -> QueueMachine:
        execute(engine, "truncate expiry.jobs, expiry.job_keys restart identity")
        return QueueMachine(engine, lambda: None)

    try:
        run_state_machine_as_test(fresh, settings=SETTINGS)
    finally:
        engine.close()


def test_state_machine_mysql(mysql_url: str) -> None:
    engine = open_engine(mysql_url)

    def fresh() -> QueueMachine:
        execute(engine, "delete from expiry.jobs")
        execute(engine, "alter table expiry.jobs auto_increment = 1")
        return QueueMachine(engine, lambda: None)

    try:
        run_state_machine_as_test(fresh, settings=SETTINGS)
    finally:
        engine.close()
