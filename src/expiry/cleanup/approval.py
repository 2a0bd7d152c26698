"""Approval of a run before it deletes (``approve = true`` on a policy).

A run of such a policy plans as any other up to its checks (its turn, the
column's storage, the sample check), then stops before its first partition or
window: its preview (the candidates at the run's cutoff, a sample of their
keys, the rows each hold keeps, the partitions it would remove, the policy's
hash) is audited as run.awaiting_approval, and its planning job waits, snoozed
("awaiting approval"), its attempts unspent. Someone approves the run by the
CLI (`expiry runs approve RUN`), the HTTP API (``POST /v1/runs/approve``, scope
cleanup:approve) or the dashboard; the approval is audited as run.approved
with who and the hash of the policy it approved, and wakes the planning job,
which then plans the run as any other, at the run's own cutoff.

Everything is read from the audit log, the one record:

* a policy changed since the preview (its hash differs: another retain, where,
  hold...) invalidates an approval: the run previews again and waits for an
  approval of that preview;
* a run not approved within the policy's ``approve_within`` of its first
  preview finishes without a window (run.approval_expired);
* a later run of the policy supersedes one still awaiting (its cutoff covers
  it), as it supersedes any run that only waits.

Every window still applies the predicate when it runs: the approval lets a run
go on, it never widens what a window may delete.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .. import defaults
from ..config import Policy
from ..engines import Engine
from ..errors import ConfigError, Snooze
from ..times import format_time
from ..types import AuditAction, AuditEvent

log = logging.getLogger("expiry.cleanup")

AWAITING = "awaiting"
APPROVED = "approved"
EXPIRED = "expired"
CLOSED = "closed"
"""A run summary's word for a run that awaited approval and was superseded or
cancelled meanwhile (never in the audit)."""

SAMPLE_KEYS = 10
"""Keys of candidate rows shown in a preview."""


def policy_hash(policy: Policy) -> str:
    """The policy as configured, with the holds on its table and the database's
    zone for naive times: the first 16 hex digits of a SHA-256 of their
    settings. An approval holds for this hash only: every job of an approved
    run carries it and goes on only while the policy still has it."""
    settings = {
        "policy": policy.model_dump(mode="json"),
        "holds": [hold.model_dump(mode="json") for hold in policy.holds],
        "database_zone": policy.database_zone,  # how naive times are read
    }
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Approval:
    """Where a run stands with its approval, read from its audited events."""

    state: str
    """AWAITING, APPROVED (of the latest preview) or EXPIRED."""
    since: datetime
    """The first preview: the wait's start (approve_within counts from it)."""
    preview: dict[str, Any]
    """The latest preview (candidates, sample, held, partitions, config_hash)."""
    approved_by: str | None = None
    approved_at: datetime | None = None

    @property
    def config_hash(self) -> str:
        return str(self.preview.get("config_hash", ""))

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "since": format_time(self.since),
            "preview": self.preview,
            "approved_by": self.approved_by,
            "approved_at": format_time(self.approved_at) if self.approved_at else None,
        }


def read(events: Sequence[AuditEvent]) -> Approval | None:
    """The run's approval from its approval events, oldest first (None: the run
    never awaited one). An approval counts for the preview it followed only
    when it approved that preview's hash."""
    previews = [e for e in events if e.action == AuditAction.RUN_AWAITING_APPROVAL]
    if not previews:
        return None
    latest = previews[-1]
    if any(e.action == AuditAction.RUN_APPROVAL_EXPIRED for e in events):
        return Approval(EXPIRED, previews[0].at, latest.detail)
    approvals = [
        e
        for e in events
        if e.action == AuditAction.RUN_APPROVED
        and e.id > latest.id
        and e.detail.get("config_hash") == latest.detail.get("config_hash")
    ]
    if approvals:
        first = approvals[0]
        return Approval(APPROVED, previews[0].at, latest.detail, first.actor, first.at)
    return Approval(AWAITING, previews[0].at, latest.detail)


def of_run(engine: Engine, run_id: str, *, conn: Any | None = None) -> Approval | None:
    return read(engine.audit_approvals(run_id, conn=conn))


def gate(
    engine: Engine,
    policy: Policy,
    run_id: str,
    preview: Callable[[], dict[str, Any]],
    tx: Any,
) -> bool:
    """In a run's first planning job, before anything is removed: True when the
    run may go on (approved under the policy as it is now); False when its wait
    ran out (audited in ``tx``: the caller finishes the run without a window).
    Otherwise raises Snooze: the job waits for an approval, and a new preview
    (``preview()``, read only then, the policy's hash added) is audited once it
    is back in the queue, unless the latest one was made under the same hash."""
    digest = policy_hash(policy)
    approval = of_run(engine, run_id, conn=tx)
    if approval is not None and approval.config_hash == digest and approval.state == APPROVED:
        return True
    now = engine.now(tx)
    deadline = (approval.since if approval else now) + timedelta(seconds=policy.approve_within)
    if approval is not None and now >= deadline:
        engine.audit_append(
            tx,
            AuditAction.RUN_APPROVAL_EXPIRED,
            actor="planner",
            policy=policy.name,
            run_id=run_id,
            detail={
                "since": format_time(approval.since),
                "approve_within_seconds": policy.approve_within,
            },
        )
        log.warning(
            "run was not approved within %ss: it finishes without deleting anything",
            policy.approve_within,
            extra={"policy": policy.name, "run": run_id},
        )
        return False
    wait = min(defaults.APPROVAL_RECHECK_SECONDS, (deadline - now).total_seconds())
    fresh = approval is None or approval.config_hash != digest
    detail = (
        {**preview(), "config_hash": digest, "approve_by": format_time(deadline)} if fresh else {}
    )

    def then() -> None:
        """Once the job waits: the new preview; and an approval that landed
        while this job ran (its wake found the job running) wakes it now."""
        latest = of_run(engine, run_id)
        if fresh and (latest is None or latest.config_hash != digest):
            engine.audit_append(
                None,
                AuditAction.RUN_AWAITING_APPROVAL,
                actor="planner",
                policy=policy.name,
                run_id=run_id,
                detail=detail,
            )
            log.info(
                "run awaits approval: %s candidates (expiry runs approve %s)",
                detail.get("candidates"),
                run_id,
                extra={"policy": policy.name, "run": run_id},
            )
            return
        if latest is not None and latest.state == APPROVED and latest.config_hash == digest:
            engine.job_wake(f"{run_id}:plan")

    raise Snooze(
        max(1.0, wait),
        f"awaiting approval until {format_time(deadline)}: expiry runs approve {run_id}",
        then=then,
    )


def holds_for(policy: Policy, payload: dict[str, Any]) -> bool:
    """Whether a job of a run (its payload) may go on under ``policy`` as it is
    now: always without ``approve``; else only when the run's approval was given
    for this very policy (the hash its planning job stamped on every job)."""
    return not policy.approve or payload.get("approved") == policy_hash(policy)


def approve(engine: Engine, policy: Policy, run_id: str, actor: str) -> dict[str, Any]:
    """Approve run ``run_id``'s latest preview, made under the policy as it is
    now, and wake its planning job. ConfigError (with what to do) when the run
    is finished, awaits no approval, or its preview was made under another
    version of the policy. Approving an approved run again changes nothing."""
    run = engine.run_get(run_id)
    if run is None:
        raise ConfigError(f"no run {run_id!r}")
    approval = of_run(engine, run_id)
    if run.superseded_by is not None:
        raise ConfigError(
            f"run {run_id!r} was superseded by {run.superseded_by!r}: approve that run"
        )
    if run.cancelled_at is not None:
        raise ConfigError(f"run {run_id!r} is cancelled: there is nothing to approve")
    if run.state == "finished":
        raise ConfigError(f"run {run_id!r} is finished: there is nothing to approve")
    if approval is None:
        raise ConfigError(
            f"run {run_id!r} awaits no approval (policy {policy.name!r} has "
            f"approve = {str(policy.approve).lower()}, or its preview is not made yet)"
        )
    digest = policy_hash(policy)
    if approval.config_hash != digest:
        raise ConfigError(
            f"run {run_id!r} was previewed under another version of policy "
            f"{policy.name!r} (hash {approval.config_hash}, now {digest}): it previews "
            f"again within {defaults.APPROVAL_RECHECK_SECONDS:.0f}s; approve that preview"
        )
    deadline = approval.since + timedelta(seconds=policy.approve_within)
    if approval.state == EXPIRED or (approval.state == AWAITING and engine.now() >= deadline):
        raise ConfigError(
            f"run {run_id!r} was not approved by {format_time(deadline)} (approve_within "
            f"{policy.approve_within:g}s): it finishes without deleting; approve the next run"
        )
    if approval.state == AWAITING:
        engine.audit_append(
            None,
            AuditAction.RUN_APPROVED,
            actor=actor,
            policy=policy.name,
            run_id=run_id,
            detail={"config_hash": digest, "candidates": approval.preview.get("candidates")},
        )
        log.info("run approved by %s", actor, extra={"policy": policy.name, "run": run_id})
    woken = engine.job_wake(f"{run_id}:plan")
    approved = of_run(engine, run_id)
    assert approved is not None
    return {"run_id": run_id, "woken": woken, **approved.as_dict()}
