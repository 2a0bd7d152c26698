"""The partition job: a whole expired partition dropped or detached in one
statement, under its own short lock timeout; a partition the application
holds is tried again soon, no attempt spent."""

from __future__ import annotations

import logging
from typing import Any

from .. import defaults
from ..config import Policy
from ..errors import PermanentError, SchemaError, TransientError
from ..times import format_duration, parse_time
from ..types import Job, Partition
from .jobs import WindowResult, storage_of
from .policies import Policies
from .window import database_words

log = logging.getLogger("expiry.cleanup")


class Partitions(Policies):
    """The partition job's handler."""

    def apply_partition(self, job: Job, tx: Any) -> WindowResult:
        """Detach (and drop) one whole expired partition, booked in the ledger in
        the same transaction with the rows it held, counted under the removal's
        lock (never the planner's estimate: the ledger is the evidence), under
        the policy's lock_timeout. The partition is read again from the catalog
        first: one no longer attached, or whose range no longer ends by the
        cutoff, is booked with nothing taken."""
        with self._drift(job.payload["policy"]):
            return self._apply_partition(job, tx)

    def _apply_partition(self, job: Job, tx: Any) -> WindowResult:
        p = job.payload
        self.usable(p["policy"], tx)
        policy, target = self.policy(p["policy"]), self.target(p["policy"], tx)
        self.approval_stands(policy, p, job.key)
        cutoff, storage = parse_time(p["cutoff"]), storage_of(p, target)
        part = p["partition"]
        name = f"{part['schema']}.{part['name']}"
        found = target.expired_partitions(tx, cutoff, storage, only=part["name"])
        current = next((x for x in found if x.schema == part["schema"]), None)
        rows = None if current is None else self._remove(job, policy, current, name, tx)
        # Booked after the removal, strictly: a concurrent delivery that removed
        # it first owns the key, and this transaction (its removal) rolls back.
        booked = self.engine.ledger_insert(
            tx,
            job.key,
            strict=rows is not None,
            policy=policy.name,
            run_id=p["run_id"],
            action=p["mode"],
            worker=job.lease_owner,
            bounds=f"partition {name}"
            + (" (rows counted)" if rows is not None else ": no longer an expired partition"),
            rows=rows or 0,
        )
        if not booked:
            return WindowResult(policy.name, None)
        return WindowResult(policy.name, rows or 0)

    def _remove(
        self, job: Job, policy: Policy, current: Partition, name: str, tx: Any
    ) -> int | None:
        """Drop or detach the partition under its short lock timeout: its rows,
        counted exactly under the removal's lock (the evidence), or None when
        it is no longer a partition (a concurrent removal committed first). A
        lock wait that ran out is retried soon, no attempt spent."""
        try:
            return self.engine.partition_remove(
                tx,
                policy.table,
                current,
                drop=job.payload["mode"] == "drop",
                lock_timeout_ms=int(policy.partition_lock_timeout * 1000),
            )
        except SchemaError as exc:
            raise PermanentError(str(exc)) from exc
        except Exception as exc:
            if self.engine.classify(exc)[1] != "lock_timeout":
                raise
            raise _partition_held(job, policy, name, exc) from exc


def _partition_held(job: Job, policy: Policy, name: str, exc: Exception) -> TransientError:
    """A partition's removal waited out partition_lock_timeout behind the
    application's own transactions on the table: tried again within 2, 4, 8 ...
    seconds (at most PARTITION_LOCK_RETRY_CAP_SECONDS), each try stalling the
    table's traffic for at most that timeout, and no attempt spent for
    UNSPENT_PARTITION_LOCK_SECONDS of such tries."""
    streak = 1
    for error in reversed(job.errors):
        if error.get("kind") != "lock_timeout":
            break
        streak += 1
    within = min(
        defaults.PARTITION_LOCK_RETRY_CAP_SECONDS,
        defaults.SHRINK_RETRY_SECONDS * 2.0 ** min(streak, 30),
    )
    return TransientError(
        f"partition {name}: {database_words(exc)} (partition_lock_timeout "
        f"{format_duration(policy.partition_lock_timeout)}; the table is in use: "
        "tried again soon, no attempt spent)",
        kind="lock_timeout",
        retry_within=within,
        spend=False,
        unspent_for=defaults.UNSPENT_PARTITION_LOCK_SECONDS,
    )
