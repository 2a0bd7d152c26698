"""The jobs a run puts on the queue, each with its deterministic key: its
planning pages, its windows (planned, the rest of a paced one, a half around
a held or referenced row) and its whole partitions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..config import Policy
from ..queue.jobs import new_job, policy_queue
from ..times import format_time
from ..timestamps import Storage
from ..types import NewJob, Partition
from .runs import PARTITION, PLAN, WINDOW
from .target import Target
from .windows import Span, position_name


def run_fields(run: dict[str, Any]) -> dict[str, Any]:
    """What every job of a run carries of it: the policy, the run, its cutoff,
    the storage its planner read, and (approve = true) the hash of the policy
    its approval was given for (cleanup/approval.py)."""
    fields = {k: run[k] for k in ("policy", "run_id", "cutoff", "storage")}
    if "approved" in run:
        fields["approved"] = run["approved"]
    return fields


def first_plan_job(policy: Policy, rid: str, cutoff: datetime) -> NewJob:
    """A run's first planning job, keyed by the run."""
    return new_job(
        PLAN,
        {"policy": policy.name, "run_id": rid, "cutoff": format_time(cutoff)},
        key=f"{rid}:plan",
        max_attempts=policy.max_attempts,
        priority=policy.priority,
        queue=policy_queue(policy.name),
    )


def plan_job(policy: Policy, run: dict[str, Any], cursor: dict[str, Any]) -> NewJob:
    """A run's next planning page, keyed by where it starts."""
    after = cursor["after"]
    named = position_name(tuple(after)) if isinstance(after, list) else after
    return new_job(
        PLAN,
        {**run, **cursor},
        key=f"{run['run_id']}:plan:{named}",
        max_attempts=policy.max_attempts,
        priority=policy.priority,
        queue=policy_queue(policy.name),
    )


def window_job(policy: Policy, run: dict[str, Any], span: Span) -> NewJob:
    """A planned window, keyed policy:cutoff:<lower bound>."""
    return span_job(policy, run, span, span.job_key)


def span_job(
    policy: Policy,
    run: dict[str, Any],
    span: Span,
    key: Callable[[str], str],
    *,
    halvings: int = 0,
    held: str | None = None,
) -> NewJob:
    """A window job for ``span`` of the run (with the storage its planner read),
    keyed by ``key`` of the run id: a planned window, the rest of a paced one,
    or a half of one split around a referenced row; ``halvings``: the times
    its first attempt halves it (_halvings)."""
    fields = run_fields(run)
    shrunk = {"halvings": halvings} if halvings else {}
    probe = {"held": held} if held else {}
    return new_job(
        WINDOW,
        {**fields, **span.payload(), **shrunk, **probe},
        key=key(run["run_id"]),
        max_attempts=policy.max_attempts,
        priority=policy.priority,
        queue=policy_queue(policy.name),
    )


def rest_job(
    policy: Policy, run: dict[str, Any], rest: Span, halvings: int, *, held: str | None = None
) -> NewJob:
    """The continuation of a window whose part was taken (or kept) after
    ``halvings`` timeouts: it starts one halving fewer, as the part's success
    says the rows just past it are likely good, and doubles back to full size
    one success at a time. Started at full size, each continuation of a window
    around a held row timed out again from the top: O(log² n) timeouts where
    O(log n) suffice."""
    return span_job(policy, run, rest, rest.job_key, halvings=max(0, halvings - 1), held=held)


def partition_job(policy: Policy, run: dict[str, Any], part: Partition, mode: str) -> NewJob:
    """A whole expired partition of the run, keyed policy:cutoff:partition:<name>."""
    fields = run_fields(run)
    return new_job(
        PARTITION,
        {**fields, "mode": mode, "partition": {"schema": part.schema, "name": part.name}},
        key=f"{run['run_id']}:partition:{part.schema}.{part.name}",
        max_attempts=policy.max_attempts,
        priority=policy.priority,
        queue=policy_queue(policy.name),
    )


def storage_of(payload: dict[str, Any], target: Target) -> Storage:
    """The storage a run's planner read, carried by its jobs (jobs queued before
    runs carried it use the storage of the process's check)."""
    token = payload.get("storage")
    return Storage.from_token(token) if token else target.storage


@dataclass(frozen=True)
class WindowResult:
    """A window job's result: the rows it took, or None when its key was booked
    before and this delivery changed nothing."""

    policy: str
    taken: int | None
    timed_out: bool = False
    """Its delete timed out and the window was split, or its row kept, instead
    (the policy's keys per transaction were halved then)."""

    @property
    def rows(self) -> int:
        return self.taken or 0

    @property
    def duplicate(self) -> bool:
        """Booked before: this delivery changed nothing."""
        return self.taken is None
