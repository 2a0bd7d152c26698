"""What operators read: policies, the queue, runs and workers, as plain dicts for the
CLI's tables, its --json output, the HTTP API and the dashboard.

Status takes the services it reads (the engine, the queue, the runs, the
cleanup, the config's policies), not the App; the faces hand them over with
``Status.of(app)``. Runs are read by cleanup/runs.py; ``run_summary`` and
``runs`` are here for the HTTP layer and the dashboard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import defaults
from .crontab import next_fire
from .errors import SchemaError
from .health import roll
from .health.database import merge_throttles
from .queue.jobs import is_reserved, policy_queue
from .times import format_duration, format_time
from .types import Job, JobState, Schedule, WorkerSeen

if TYPE_CHECKING:
    from .app import App
    from .cleanup.runs import Runs
    from .cleanup.service import Cleanup
    from .config import Policy
    from .engines import Engine
    from .queue.jobs import Queue


class Status:
    """What operators read, from the services it is given: the engine, the
    queue, the runs, the cleanup (None without policies) and the config's
    policies. The faces build it from the App (``Status.of(app)``)."""

    def __init__(
        self,
        engine: Engine,
        queue: Queue,
        runs: Runs,
        cleanup: Cleanup | None,
        policies_of_config: Sequence[Policy],
    ) -> None:
        self._engine = engine
        self._queue = queue
        self._runs = runs
        self._cleanup = cleanup
        self._policies = list(policies_of_config)

    @classmethod
    def of(cls, app: App) -> Status:
        """The App's services, as the faces hand them over."""
        return cls(
            app.engine, app.queue, app.runs, app.cleanup, app.config.policy if app.config else []
        )

    def run_summary(self, run_id: str) -> dict[str, Any] | None:
        return self._runs.summary(run_id)

    def runs(self, policy: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        return self._runs.recent(policy, limit)

    def evidence(
        self, policy: str, since: datetime | None = None, limit: int = 100_000
    ) -> list[dict[str, Any]]:
        """``Runs.evidence``, each run with its policy's table as the config names
        it now (None for a policy no longer in the config)."""
        tables = {p.name: p.table for p in self._policies}
        found = self._runs.evidence(policy, since, limit)
        return [{**run, "table": tables.get(run["policy"])} for run in found]

    def policies(self) -> list[dict[str, Any]]:
        """Every policy of the config with its schedule, watermark, last run and
        open runs. A policy that cannot be read (its table gone, a query failing)
        is shown broken with the reason; the others are read as usual."""
        cleanup = self._cleanup
        if cleanup is None:
            return []
        schedules = {s.policy: s for s in self._engine.schedule_list()}
        now = self._engine.now()
        live = roll.alive(self._engine.worker_list())
        seen = _Readings(
            schedules=schedules,
            now=now,
            throttles=merge_throttles(live),
            unserved=roll.unserved([p.name for p in cleanup.policies], live, self._queue.stats()),
            unscheduled=roll.unscheduled(cleanup.policies, schedules, now),
            ages=cleanup.open_run_ages(),
            awaiting=cleanup.awaiting_approval(),
        )
        return [self._policy_status(cleanup, policy, seen) for policy in cleanup.policies]

    def _policy_status(self, cleanup: Cleanup, policy: Policy, seen: _Readings) -> dict[str, Any]:
        broken, watermark = _watermark(cleanup, policy.name)
        last = self._runs.recent(policy.name, 1)
        age = seen.ages.get(policy.name)
        late = seen.unscheduled.get(policy.name)
        schedule = seen.schedules.get(policy.name)
        return {
            "name": policy.name,
            "table": policy.table,
            "action": policy.action,
            "retain": format_duration(policy.retain),
            "keep_last": policy.keep_last,
            "holds": [h.name for h in policy.holds],
            "group_by": policy.group_by,
            "schedule": policy.schedule,
            "timezone": policy.timezone,
            "catch_up": policy.catch_up,
            "paused": schedule is not None and schedule.paused,
            "next_fire": format_time(next_fire(policy, seen.now)) if policy.schedule else None,
            "watermark_seconds": None if watermark is None else round(watermark, 3),
            "watermark": "unknown" if watermark is None else format_duration(round(watermark)),
            "last_run": last[0] if last else None,
            "oldest_open_run_seconds": None if age is None else round(age, 3),
            "stall_after": format_duration(policy.stall_seconds),
            "stalled": age is not None and age > policy.stall_seconds,
            "approve": policy.approve,
            "awaiting_approval": seen.awaiting.get(policy.name),
            "broken": broken,
            "throttle": seen.throttles.get(policy.name),
            "unserved_seconds": seen.unserved.get(policy.name),
            # No scheduler keeps its schedule: late by this long (None: never
            # registered by one). A quarantined policy's fires wait: said as broken.
            "unscheduled": policy.name in seen.unscheduled and not broken,
            "unscheduled_seconds": None if broken or late is None else round(late or 0.0, 3),
            "vacuum": None if broken else self.vacuum(policy.table),
        }

    def throttle_by_policy(self) -> dict[str, dict[str, Any]]:
        """Each policy's throttle as the live workers on the roll report it."""
        return merge_throttles(roll.alive(self._engine.worker_list()))

    def workers_alive(self) -> int:
        """The worker processes seen on the roll lately (roll.alive)."""
        return len(roll.alive(self._engine.worker_list()))

    def vacuum(self, table: str) -> dict[str, Any] | None:
        """The table's vacuum pressure (PostgreSQL): dead tuples, their share, the
        last (auto)vacuum and analyze."""
        try:
            with self._engine.transaction() as conn:
                stats = self._engine.table_vacuum_stats(conn, table)
        except Exception:  # a missing table is the quarantine's to report
            return None
        if stats is None:
            return None
        return {
            "live_tuples": stats.live_tuples,
            "dead_tuples": stats.dead_tuples,
            "dead_ratio": round(stats.dead_ratio, 4),
            "last_vacuum": format_time(stats.last_vacuum) if stats.last_vacuum else None,
            "last_analyze": format_time(stats.last_analyze) if stats.last_analyze else None,
        }

    def queue(self) -> dict[str, Any]:
        stats = self._queue.stats()
        return {
            "jobs_by_queue_and_state": stats.by_state,
            "oldest_due_seconds": {q: round(a, 3) for q, a in stats.oldest_due_seconds.items()},
            "running": [
                {"queue": q, "job": k, "held_seconds": round(h, 3)} for q, k, h in stats.running
            ],
            "retries_by_kind": stats.retries_by_kind,
            "dead": stats.dead,
        }

    def workers(self, limit: int = 5000) -> dict[str, Any]:
        """The live worker processes with the jobs each holds now (key, policy,
        attempt, held for, lease left); those not seen lately (``gone``: within the
        last hour; ``forgotten``: how many older); and the running jobs held by no
        worker on the roll (HTTP pull consumers, a worker gone)."""
        engine = self._engine
        now = engine.now()
        held: dict[str, list[dict[str, Any]]] = {}
        for job in engine.job_list(JobState.RUNNING, None, limit):
            held.setdefault(job.lease_owner or "", []).append(_held_job(job, now))
        roll = [
            {**self._worker_line(w), "jobs": held.pop(w.name, [])} for w in engine.worker_list()
        ]
        others = [{"owner": owner or None, **job} for owner, jobs in held.items() for job in jobs]
        live = [w for w in roll if not w["stale"]]
        gone = [w for w in roll if w["stale"] and w["seen_seconds_ago"] <= GONE_SHOWN_SECONDS]
        return {
            "workers": live,
            "gone": gone,
            "forgotten": len(roll) - len(live) - len(gone),
            "other_holders": others,
            "stale_after": STALE_AFTER_SECONDS,
        }

    def _worker_line(self, w: WorkerSeen) -> dict[str, Any]:
        """A worker on the roll, and why it rests each queue it leaves alone."""
        return {
            "name": w.name,
            "host": w.host,
            "pid": w.pid,
            "threads": w.threads,
            "queues": w.queues,
            "resting": w.resting,
            "resting_why": {q: self._why_resting(q, w.health) for q in w.resting},
            "started_at": format_time(w.started_at),
            "seen_seconds_ago": round(w.seen_seconds_ago, 3),
            "stale": w.seen_seconds_ago > STALE_AFTER_SECONDS,
        }

    def _why_resting(self, queue: str, health: dict[str, Any]) -> str:
        """Why a worker leaves a queue alone for now, in words: its policy's
        throttle (held or stopped, with the reading past its limit; its rate
        limit), or the policy's own pacing (max_rows_per_second, nice_ratio)."""
        policies = self._policies
        policy = next((p for p in policies if policy_queue(p.name) == queue), None)
        if policy is None:
            return "paced"
        throttle = health.get(policy.name) or {}
        if throttle.get("state") not in (None, "open"):
            said = "stopped by the throttle" if throttle["state"] == "critical" else "held"
            return f"{said}: {throttle.get('detail') or throttle.get('reason')}"
        if throttle.get("rate"):
            return f"the throttle's rate limit, {throttle['rate']:.2f} windows/s"
        if policy.max_rows_per_second:
            return f"max_rows_per_second {policy.max_rows_per_second:g}"
        if policy.nice_ratio:
            return f"nice_ratio {policy.nice_ratio:g}: rests {policy.nice_ratio:g}x its last window's time"
        return "paced"


@dataclass(frozen=True)
class _Readings:
    """What the policies' lines share, read once."""

    schedules: dict[str, Schedule]
    now: datetime
    throttles: dict[str, dict[str, Any]]
    unserved: dict[str, float]
    unscheduled: dict[str, float | None]
    ages: dict[str, float]
    awaiting: dict[str, str]


def _watermark(cleanup: Cleanup, name: str) -> tuple[str | None, float | None]:
    """(why the policy is broken, or None; its watermark). A broken policy's
    watermark is the one last read in this process, None if none was."""
    try:
        return None, cleanup.watermark(name)
    except SchemaError as exc:  # quarantined: shown with its reason, the others go on
        return str(exc), cleanup.last_watermark(name)
    except Exception as exc:  # the database failing this policy's reading alone
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first}", cleanup.last_watermark(name)


STALE_AFTER_SECONDS = defaults.WORKER_STALE_SECONDS
GONE_SHOWN_SECONDS = 3600.0
"""A worker not seen for longer than this (it crashed an hour ago, or was
moved) is only counted on the workers page; the roll forgets it after a day."""


def _held_job(job: Job, now: datetime) -> dict[str, Any]:
    """A running job as its holder's line shows it."""
    return {
        "key": job.key,
        "queue": job.queue,
        "policy": job.payload.get("policy") if is_reserved(job.queue) else None,
        "attempt": job.attempt,
        "held_seconds": _seconds(now, job.attempted_at),
        "lease_left_seconds": -_seconds(now, job.lease_expires_at),
    }


def _seconds(now: datetime, then: datetime | None) -> float:
    """Seconds from ``then`` to ``now`` (0 when unknown)."""
    return 0.0 if then is None else round((now - then).total_seconds(), 3)
