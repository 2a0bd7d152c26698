"""The handler model: what runs a job, and how its outcome is recorded.

One public model. ``@app.handler(name)`` runs ``fn(job, tx)`` inside the
job's transaction, and the worker completes the job in that same transaction:
the handler's effect and the job's completion commit together.
``transactional=False`` runs ``fn(job)`` outside any transaction (an HTTP
call, a cache purge): the worker records the outcome afterwards, in a
transaction of its own, so such a job may run again if the process dies between
the two (at least once); with ``batched_ack=True`` those completions are
written in batches, one transaction for many jobs. ``group_commit=True`` lets neighbouring jobs of the
handler share one transaction and one commit.

The built-in window job uses three private modes of the same model
(``completes_job``, ``pipelined``, ``statement``): its one statement deletes,
books the ledger and completes the job (cleanup/window.py, cleanup/target.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..types import Job

HandlerFn = Callable[..., Any]
"""``fn(job, tx)``; ``fn(job)`` when not transactional."""


@dataclass(frozen=True)
class Handler:
    name: str
    fn: HandlerFn
    before: Callable[[Job], None] | None = None
    """Called before the job's transaction opens (pacing; never inside a transaction)."""
    after: Callable[[Job, Any, float], None] | None = None
    """Called after commit with the handler's result and the transaction's seconds."""
    failed: Callable[[Job, str], None] | None = None
    """Called after an attempt failed (its failure recorded, or not: a lease
    lost meanwhile), with the failure's kind (the engine's ``classify``),
    outside any transaction: for a
    handler that adapts what its next jobs do (a window refused for its size:
    cleanup/window.py)."""
    after_batch: Callable[[list[Job]], None] | None = None
    """Called once the worker has run a claimed batch, with the batch's jobs of this
    handler whatever their outcome, outside any transaction: for a check that only
    matters once they are all done (a Worker.process call is a batch of one)."""
    transactional: bool = True
    """False: ``fn(job)`` runs outside any transaction and the worker completes
    the job afterwards in its own (at least once, not exactly once)."""
    batched_ack: bool = False
    """With ``transactional=False``: the worker acknowledges the jobs in batches,
    one transaction for up to a claim's worth, at most ``[worker] ack_delay``
    after the first of them finished (queue/acks.py). Until its batch commits a job is
    still leased, so a crash runs it again: at least once, as without batching,
    but a crash repeats up to two batches of jobs (2 x claim_batch), not one."""
    group_commit: bool = False
    """Jobs of this handler claimed together may run in one transaction that
    completes them all (one commit for many short jobs). Any failure rolls the
    group back and each job runs again alone (``before`` hooks run again too).
    ``after`` and the job-duration metric get the whole group's seconds."""
    completes_job: bool = False
    """Private mode: the handler completes its own job inside its transaction
    (``queue.complete(job, tx)``, or an engine call that completes it along with
    other work), so that the completion shares a round trip with its last
    statement; the worker then does not complete it."""
    pipelined: bool = False
    """Private mode: the job's transaction runs pipelined where the engine can
    (PostgreSQL's pipeline mode): statements are sent when a result is read,
    BEGIN with the first of them and COMMIT with the last. The handler must read
    every result it depends on; an unread statement's error surfaces at commit."""
    statement: bool = False
    """Private mode: the job runs outside any transaction where the engine can
    (PostgreSQL's autocommit), so a handler whose work and completion are one
    statement costs one round trip; work of several statements goes in
    ``engine.atomic(tx)``. Requires ``completes_job``."""

    @property
    def chains(self) -> bool:
        """Runs alone in a transaction of the worker's that completes its job (no
        private mode, no group): such a job's COMMIT may open the next one's."""
        return self.transactional and not (
            self.group_commit or self.completes_job or self.pipelined or self.statement
        )

    def __post_init__(self) -> None:
        if self.group_commit and (self.completes_job or not self.transactional):
            raise ConfigError(
                f"handler {self.name!r}: a group commit completes its jobs together in "
                "one transaction, so the handler must be transactional and must not "
                "complete its own job"
            )
        if self.batched_ack and self.transactional:
            raise ConfigError(
                f"handler {self.name!r}: batched_ack acknowledges jobs after their "
                "handler returned, outside its transaction: register it with "
                "transactional=False (a transactional job completes in its own "
                "transaction; group_commit=True batches those)"
            )
        if self.statement and (self.pipelined or not self.completes_job):
            raise ConfigError(
                f"handler {self.name!r}: in statement mode each statement is its own "
                "transaction, so the handler must complete its job itself "
                "(completes_job=True), in the statement or engine.atomic() block "
                "that does its work; and it is not pipelined"
            )
        if not self.transactional and (self.completes_job or self.pipelined or self.statement):
            raise ConfigError(
                f"handler {self.name!r}: a handler without a transaction cannot "
                "complete its own job or choose a transaction mode"
            )
