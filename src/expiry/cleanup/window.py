"""The window job: one transaction deletes (or archives) the window's expired
rows, books its ledger row and completes the job. A window that meets a held
or referenced row, or times out, takes a part and queues the rest, down to
one row kept and booked as blocked: never left to die."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import defaults
from ..config import Config, Policy
from ..engines import Engine
from ..errors import ForeignKeyBlocked, PermanentError, SchemaError, TransientError
from ..times import format_duration, parse_time
from ..timestamps import Storage
from ..types import Job
from .jobs import WindowResult, rest_job, span_job, storage_of
from .pacing import MIN_CHUNK, Pacing
from .runs import Runs
from .target import Target
from .windows import BLOCKS, KEY, Span, address

log = logging.getLogger("expiry.cleanup")


@dataclass(frozen=True)
class _Part:
    """The part of a window job's span that this attempt takes, the rest that
    it queues as a continuation (None: all of it), and the candidates the part
    held when it was cut (None: not counted)."""

    span: Span
    rest: Span | None = None
    rows: int | None = None
    held: str | None = None
    """The rest follows a row another transaction holds (the database's words for
    the lock wait): it probes first (_around_held)."""


HELD_RETRY = ": retried around the rows another transaction holds"
HALVED_RETRY = ": retried with half the rows"
"""How a window's lock wait that ran out is recorded (the database's words
first): its next attempt cuts the window around the held rows (_around_held)."""


def lock_words(job: Job) -> str:
    """The database's words for the lock wait a window met: carried by a rest
    cut around a held row, else read back from its last attempt's error."""
    carried = job.payload.get("held")
    if isinstance(carried, str) and carried:
        return carried
    error = str(job.errors[-1].get("error", "")) if job.errors else ""
    words = error.split(": ", 1)[-1].removesuffix(HELD_RETRY)
    return words if error.endswith(HELD_RETRY) and words else "lock wait timed out"


def database_words(exc: BaseException) -> str:
    """An error's message as the database wrote it: its first line (PyMySQL's
    errors carry (errno, message) as their arguments)."""
    args = exc.args
    if len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], str):
        return args[1]
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _log_blocked(job: Job, reason: str, *, split: bool, timed_out: bool) -> None:
    """One line for a window split or a row kept, by a foreign key or a timeout."""
    if timed_out:
        message = "window timed out: split" if split else "window timed out on one row: row kept"
    else:
        message = "window split around a referenced row" if split else "referenced row kept"
    log.warning(
        message,
        extra={
            "policy": job.payload["policy"],
            "run": job.payload["run_id"],
            "job": job.key,
            "attempt": job.attempt,
            "reason": reason,
        },
    )


class Windows(Pacing):
    """The window job's handler and what it does when a window cannot go whole."""

    def __init__(self, engine: Engine, config: Config, runs: Runs | None = None) -> None:
        super().__init__(engine, config, runs)
        self._probes_refused: set[str] = set()
        self._referenced: set[str] = set()
        """Policies a window of which met rows that other tables reference:
        their windows leave such rows out from the start in this process."""

    def apply_window(self, job: Job, tx: Any) -> WindowResult:
        """Delete or archive, booked in the ledger with its rows, and complete the
        job: on PostgreSQL one statement, its own transaction (the worker's
        statement mode). A window cut short by pacing, or after its attempts
        timed out (_paced), enqueues its rest in the same transaction, opened
        for the two. The ledger row is the window's record (range, rows, worker,
        time); only a duplicate delivery is audited. A window a foreign key
        refuses is split (_blocked); so is one that times out at its last
        chance (_timed_out)."""
        with self._drift(job.payload["policy"]):
            return self._apply_window(job, tx)

    def _apply_window(self, job: Job, tx: Any) -> WindowResult:
        p = job.payload
        policy, target = self.policy(p["policy"]), self.target(p["policy"], tx)
        self.approval_stands(policy, p, job.key)
        cutoff, storage, span = parse_time(p["cutoff"]), storage_of(p, target), Span.of(p)
        try:
            halvings = self._halvings(job)
            part, probed = _Part(span), False
            try:
                if self._probes_held(job):
                    probed = True
                    around = self._around_held(job, tx, span, cutoff, storage)
                    if around is not None:
                        return around
                part = self._paced(target, span, cutoff, tx, storage, halvings)
                taken = self._take(job, tx, part, cutoff, storage, halvings)
            except Exception as exc:
                if self.engine.classify(exc)[1] not in self.engine.window_shrinks:
                    raise
                return self._after_timeout(job, tx, exc, part, halvings, probed)
        except ForeignKeyBlocked as exc:
            reason = str(exc).splitlines()[0]
            around = self._around_referenced(job, tx, span, cutoff, storage)
            if around is not None:
                return around
            return self._blocked(job, tx, span, cutoff, storage, reason)
        except SchemaError as exc:
            raise PermanentError(str(exc)) from exc
        return WindowResult(policy.name, taken)

    def _after_timeout(
        self, job: Job, tx: Any, exc: Exception, part: _Part, halvings: int, probed: bool
    ) -> WindowResult:
        """The window's statement ran out of its lock or statement timeout: the
        next attempt, smaller or cut around a held row, comes soon without
        spending an attempt; at its last chance (_timed_out) the part is booked
        as blocked and its rest queued. A lock wait names whom it waited behind."""
        kind = self.engine.classify(exc)[1]
        words = database_words(exc)
        if kind == "lock_timeout":
            words += self._behind(self.policy(job.payload["policy"]))
        reason = self._timed_out(job, part, halvings, exc, words)
        if reason is None:  # the next attempt, smaller or cut, comes soon
            again = HELD_RETRY if kind == "lock_timeout" and not probed else HALVED_RETRY
            raise TransientError(
                words + again,
                kind=kind,
                retry_within=defaults.SHRINK_RETRY_SECONDS,
                spend=False,
            ) from exc
        p = job.payload
        cutoff, storage = parse_time(p["cutoff"]), storage_of(p, self.target(p["policy"], tx))
        return self._blocked(
            job,
            tx,
            part.span,
            cutoff,
            storage,
            reason,
            rest=part.rest,
            timed_out=True,
            halvings=halvings,
        )

    def _take(
        self, job: Job, tx: Any, part: _Part, cutoff: datetime, storage: Storage, halvings: int
    ) -> int | None:
        """Apply ``part`` of the window under the job's key, completing the job,
        and queue its rest: the rows taken, or None for a duplicate delivery.
        A part taken after ``halvings`` timeouts hands its rest one halving
        fewer (rest_job)."""
        p = job.payload
        policy, target = self.policy(p["policy"]), self.target(p["policy"], tx)
        skip = policy.name in self._referenced and target.skips_referenced
        with self.engine.atomic(tx) if part.rest is not None or skip else nullcontext():
            taken = target.apply(
                tx,
                cutoff,
                part.span,
                key=job.key,
                run_id=p["run_id"],
                worker=job.lease_owner,
                job=job,  # completed in the same statement (PostgreSQL) or transaction
                storage=storage,
                unreferenced=skip,
            )
            if skip and taken is not None:
                self._book_referenced(job, tx, target, part.span, cutoff, storage)
            # The delivery that booked the window's first part enqueues the rest.
            if part.rest is not None and taken is not None:
                rest = rest_job(policy, p, part.rest, halvings, held=part.held)
                self.engine.job_insert_many([rest], tx)
        return taken

    def _halvings(self, job: Job) -> int:
        """How many times this attempt halves the window: the halvings its
        parent handed it (rest_job), and one for each of its own last
        attempts, one after another, that ended in a timeout of its statement
        (statement_timeout, lock_timeout: the engine's window_shrinks)."""
        count = int(job.payload.get("halvings", 0))
        for error in reversed(job.errors):
            if error.get("kind") not in self.engine.window_shrinks:
                break
            count += 1
        return count

    def window_failed(self, job: Job, kind: str) -> None:
        """A window's attempt failed: one a Galera cluster refused for its write
        set's size (over wsrep_max_ws_rows at its statement, or wsrep_max_ws_size
        at its COMMIT) fits the policy's next windows under it (_fit_write_set)
        before another is claimed; its retry is halved too (_halvings)."""
        if kind == "write_set_limit":
            self._fit_write_set(self.policy(job.payload["policy"]), self._halvings(job))

    def _fit_write_set(self, policy: Policy, halvings: int) -> None:
        """A Galera cluster refused a window's write set: the policy's keys per
        transaction in this process stay under half of what that attempt tried
        (the pace's ceiling, until a config reload: they never grow back past
        it), so that the following windows fit. Half of the tried size, not of
        the pace now: windows refused together (several threads) lower it once."""
        pace = self._pace(policy)
        with pace.lock:
            tried = min(pace.ceiling or policy.window, policy.window >> min(halvings, 62))
            pace.ceiling = max(1, min(pace.ceiling or policy.window, tried // 2))
            pace.chunk = min(pace.chunk, pace.ceiling)

    def _probes_held(self, job: Job) -> bool:
        """Whether this attempt first asks which of its rows another transaction
        holds (_around_held): its last attempt waited out the policy's
        lock_timeout, or it is the rest of a window cut around a held row. Not
        after an attempt whose cut waited out the lock again: that one halves,
        as after any timeout, so that the window ends whatever the locks."""
        if "lock_timeout" not in self.engine.window_shrinks:
            return False  # no row locks (SQLite: one writer at a time)
        if job.errors:
            last = job.errors[-1]
            return last.get("kind") == "lock_timeout" and str(last.get("error", "")).endswith(
                HELD_RETRY
            )
        return bool(job.payload.get("held"))

    def _around_held(
        self, job: Job, tx: Any, span: Span, cutoff: datetime, storage: Storage
    ) -> WindowResult | None:
        """After a lock wait ran out: cut the window at once around the first
        candidate another transaction holds, where halving would wait out one
        lock_timeout a halving (log2(window) of them for each held row, and a
        run as long as the lock). The free candidates before it are taken; a
        held first candidate is kept and booked as blocked, without another
        wait; the rest of the window follows as a job that probes again. The
        probe's row locks end with it (engine.scratch), so no live transaction
        waits on the rest of the window meanwhile (InnoDB keeps them to the
        commit); a row locked between the probe and the delete costs one more
        lock wait, then halving. None when nothing is held now, or when the
        role may not lock the table's rows (SELECT ... FOR UPDATE needs the
        UPDATE privilege on PostgreSQL): the attempt goes on as the halving
        would."""
        policy = self.policy(job.payload["policy"])
        words = lock_words(job)
        with self.engine.atomic(tx):
            probe = self._probe(job, tx, span, cutoff, storage)
            if probe is None or not probe[1]:
                return None
            order, held, locked = probe
            first = order.index(held[0])
            if first == 0:
                part, rest = (span, None) if held[0] == span.hi else span.split(held[0])
                limit = format_duration(policy.lock_timeout)
                whose = (
                    "held by another transaction"
                    if held[0] in locked
                    else "next to a row another transaction holds"
                )
                reason = f"{words} (lock_timeout {limit}; {whose})"
                return self._blocked(
                    job, tx, part, cutoff, storage, reason, rest=rest, timed_out=True, held=words
                )
            part, rest = span.split(order[first - 1])
            taken = self._take(job, tx, _Part(part, rest, first, held=words), cutoff, storage, 0)
        return WindowResult(policy.name, taken, timed_out=True)

    def _probe(
        self, job: Job, tx: Any, span: Span, cutoff: datetime, storage: Storage
    ) -> tuple[list[Any], list[Any], set[Any]] | None:
        """Which of the window's candidates another transaction holds, read
        under the policy's limits: (the candidates in order, those that would
        wait, those locked). On MariaDB the row before a held one waits on it
        too (next-key locks). None when the role may not lock the rows."""
        policy = self.policy(job.payload["policy"])
        target = self.target(policy.name, tx)
        self.engine.session_limits(
            tx,
            f"{int(policy.lock_timeout * 1000)}ms",
            f"{int(policy.statement_timeout * 1000)}ms",
        )
        try:
            with self.engine.scratch(tx):
                order, held = target.held(tx, cutoff, span, storage)
        except Exception as exc:
            if self.engine.classify(exc)[1] != "insufficient_privilege":
                raise
            self._probe_refused(job, exc)
            return None
        locked = set(held)
        if self.engine.next_key_reads:  # the row before a held one waits on it too
            marked = {i for i, p in enumerate(order) if p in locked}
            held = [p for i, p in enumerate(order) if i in marked or i + 1 in marked]
        return order, held, locked

    def _around_referenced(
        self, job: Job, tx: Any, span: Span, cutoff: datetime, storage: Storage
    ) -> WindowResult | None:
        """After a foreign key refused the window's delete: apply it again at
        once without the rows other tables reference (one statement more, not
        a split into two jobs a halving, 2,000 jobs a run for 1,000 such rows),
        and count those kept in its ledger row. The policy's later windows in
        this process leave them out from the start. None when the table has no
        such reference (a reference to itself), or the delete is refused
        again (a reference added meanwhile): then the window is split."""
        policy, target = self.policy(job.payload["policy"]), self.target(job.payload["policy"])
        if not target.skips_referenced:
            return None
        first = policy.name not in self._referenced
        self._referenced.add(policy.name)
        try:
            taken = self._take(job, tx, _Part(span), cutoff, storage, 0)
        except ForeignKeyBlocked:
            return None
        if first:
            log.warning(
                "window met rows that other tables reference: they are kept and counted, "
                "and the policy's windows leave them out from now on",
                extra={"policy": policy.name, "run": job.payload["run_id"], "job": job.key},
            )
        return WindowResult(policy.name, taken)

    def _book_referenced(
        self, job: Job, tx: Any, target: Target, span: Span, cutoff: datetime, storage: Storage
    ) -> None:
        """Count on the window's ledger row the expired rows its delete left out
        (other tables reference them), in the same transaction."""
        kept = target.count_span(tx, cutoff, span, storage)
        if kept:
            tables = ", ".join(sorted({ref.table for ref in target.restricting}))
            self.engine.ledger_keep(
                tx,
                job.key,
                kept,
                f"{kept} {'row' if kept == 1 else 'rows'} kept: referenced by rows of {tables}",
            )

    def _probe_refused(self, job: Job, exc: Exception) -> None:
        """Say once a process that a policy's role may not lock its rows, so
        its windows halve around held rows (a lock wait a halving)."""
        name = job.payload["policy"]
        if name in self._probes_refused:
            return
        self._probes_refused.add(name)
        log.warning(
            "this role may not lock the table's rows (%s): windows behind rows that other "
            "transactions hold are halved, one lock wait a halving, not cut around them at "
            "once (fix: grant update on the table to the role)",
            database_words(exc),
            extra={"policy": name, "run": job.payload["run_id"], "job": job.key},
        )

    def _behind(self, policy: Policy) -> str:
        """Whom a lock wait on the policy's table waited behind, as the error
        says it: " (behind pid 4242: psql, idle in transaction, open 12.3 s:
        update sessions ...)"; nothing when none can be read (SQLite, or a
        failed read: the lock wait's own record matters more)."""
        try:
            holders = self.engine.lock_holders(policy.table)
        except Exception as exc:
            log.info("could not read who holds locks on %s: %s", policy.table, exc)
            return ""
        if not holders:
            return ""
        said = []
        for h in holders[:3]:
            opened = "" if h.seconds is None else f", transaction open {h.seconds:.1f} s"
            query = f": {h.query[:120]}" if h.query else ""
            said.append(f"pid {h.pid} ({h.application or '?'}, {h.state or '?'}{opened}){query}")
        more = f" and {len(holders) - 3} more" if len(holders) > 3 else ""
        return f" (behind {'; '.join(said)}{more})"

    def _timed_out(
        self, job: Job, part: _Part, halvings: int, exc: Exception, words: str
    ) -> str | None:
        """After the window's delete failed with ``exc`` (in ``words``): None to
        let the worker retry it (any other error; a timeout that the next,
        smaller attempt may pass), else why its rows are to be split or kept
        now: the part was one row already, or this was the job's last attempt.
        A statement timeout also halves the policy's keys per transaction, so
        the following windows start smaller (a write set refused: window_failed)."""
        kind = self.engine.classify(exc)[1]
        if kind not in self.engine.window_shrinks:
            return None
        policy = self.policy(job.payload["policy"])
        if kind == "statement_timeout":  # a size problem; a held row is not one
            pace = self._pace(policy)
            with pace.lock:
                pace.chunk = min(
                    max(MIN_CHUNK, min(pace.chunk, policy.window) // 2),
                    pace.ceiling or policy.window,
                )
        alone = halvings > 0 and part.rows is not None and part.rows <= 1
        if not alone and job.attempt < job.max_attempts:
            return None
        if kind == "write_set_limit":
            return f"{words} (write_set_limit)"
        limit = policy.lock_timeout if kind == "lock_timeout" else policy.statement_timeout
        return f"{words} ({kind} {format_duration(limit)})"

    def _paced(
        self,
        target: Target,
        span: Span,
        cutoff: datetime,
        tx: Any,
        storage: Storage,
        halvings: int = 0,
    ) -> _Part:
        """The part of ``span`` this transaction takes, and the rest: by the
        policy's current keys (or rows) per transaction; after ``halvings``
        timeouts of the window in a row, the first 1/2**halvings of its
        candidates (at least one)."""
        if halvings:
            return self._shrunk(target, span, cutoff, tx, storage, halvings)
        chunk = self._pace(target.policy).chunk
        if chunk >= target.policy.window:
            return _Part(span)
        if span.strategy == KEY:
            upto = min(span.hi, span.lo + chunk)
            return _Part(span) if upto >= span.hi else _Part(*span.split(upto))
        middle = target.nth(tx, cutoff, span, chunk - 1, storage)
        if middle is None or middle == span.hi:
            return _Part(span)
        return _Part(*span.split(middle))

    def _shrunk(
        self, target: Target, span: Span, cutoff: datetime, tx: Any, storage: Storage, halvings: int
    ) -> _Part:
        """The first 1/2**halvings of ``span``'s candidates (rounded up), at most
        the pace's ceiling (a write set the cluster refused), and the rest."""
        n = target.count_span(tx, cutoff, span, storage)
        rows = max(1, -(-n // 2 ** min(halvings, 62)))
        ceiling = self._pace(target.policy).ceiling
        if ceiling is not None:
            rows = min(rows, ceiling)
        upto = target.nth(tx, cutoff, span, rows - 1, storage) if rows < n else None
        if upto is None or upto == span.hi:
            return _Part(span, None, n)
        part, rest = span.split(upto)
        return _Part(part, rest, rows)

    def _blocked(
        self,
        job: Job,
        tx: Any,
        span: Span,
        cutoff: datetime,
        storage: Storage,
        reason: str,
        *,
        rest: Span | None = None,
        timed_out: bool = False,
        halvings: int = 0,
        held: str | None = None,
    ) -> WindowResult:
        """A foreign key refused the window's delete, or it timed out one last
        time (_timed_out); nothing was taken. Its good rows are not thrown
        away: ``span`` is split in two halves of its candidates, queued (with
        ``rest``, a paced window's continuation) in the same transaction as its
        booking and its job's completion, each with attempts of its own, until
        the row at fault stands alone; that row is then kept and booked as
        blocked, with the reason (a later run tries it again)."""
        p, engine = job.payload, self.engine
        policy, target = self.policy(p["policy"]), self.target(p["policy"])
        with engine.atomic(tx):
            n = target.count_span(tx, cutoff, span, storage)
            middle = target.nth(tx, cutoff, span, (n + 1) // 2 - 1, storage) if n > 1 else None
            halves = span.split(middle) if middle is not None and middle != span.hi else None
            if halves is not None:
                booked = self._book_split(job, tx, span, halves)
            else:
                booked = self._book_kept(job, tx, span, cutoff, storage, reason if n else None)
            if booked and rest is not None:
                engine.job_insert_many([rest_job(policy, p, rest, halvings, held=held)], tx)
            engine.job_complete(job, tx)
        _log_blocked(job, reason, split=halves is not None, timed_out=timed_out)
        return WindowResult(policy.name, 0 if booked else None, timed_out)

    def _book_split(self, job: Job, tx: Any, span: Span, halves: tuple[Span, Span]) -> bool:
        """Book the window as split and queue its halves (unless its run was
        cancelled); False when its key was booked before."""
        p, engine = job.payload, self.engine
        policy = self.policy(p["policy"])
        booked = engine.ledger_insert(
            tx,
            job.key,
            policy=policy.name,
            run_id=p["run_id"],
            worker=job.lease_owner,
            action="split",
            bounds=span.describe(),
        )
        if booked and engine.run_add_windows(p["run_id"], 1, done=False, conn=tx):
            jobs = [span_job(policy, p, half, half.part_key) for half in halves]
            engine.job_insert_many(jobs, tx)
        return booked

    def _book_kept(
        self,
        job: Job,
        tx: Any,
        span: Span,
        cutoff: datetime,
        storage: Storage,
        reason: str | None,
    ) -> bool:
        """Book the window, whose one candidate is kept (``reason`` None: it holds
        none now), with nothing taken; False when its key was booked before."""
        p = job.payload
        policy, target = self.policy(p["policy"]), self.target(p["policy"])
        blocked = None
        if reason is not None:
            row = target.nth(tx, cutoff, span, 0, storage)
            if span.strategy == KEY:
                shown = f"{policy.key} {row}"
            elif span.strategy == BLOCKS and row is not None:
                shown = f"row at {address(row)}"
            else:
                shown = f"row at {row}"
            blocked = f"{shown}: {reason}"
        return self.engine.ledger_insert(
            tx,
            job.key,
            policy=policy.name,
            run_id=p["run_id"],
            worker=job.lease_owner,
            action=policy.action,
            bounds=span.describe(),
            blocked=blocked,
            kept=0 if blocked is None else 1,
        )
