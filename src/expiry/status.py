"""What operators read: runs, policies and the queue, as plain dicts for the
CLI's tables, its --json output and (later) the HTTP API."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from .durations import format_duration

if TYPE_CHECKING:
    from .app import App


def _time(value: datetime | None) -> str | None:
    if value is None:
        return None
    from .cleanup import format_time

    return format_time(value)


def run_summary(app: App, run_id: str) -> dict[str, Any] | None:
    engine = app.engine
    with engine.transaction() as conn:
        run = engine.run_get(run_id, conn=conn)
        if run is None:
            return None
        jobs = engine.run_jobs(run_id, conn=conn)
        ledger = engine.run_ledger(run_id, conn=conn)
        duplicates = engine.run_duplicates(run_id, conn=conn)
    windows = [j for j in jobs if j.handler == "expiry.window"]
    by_state = {j.state: j.n for j in windows}
    total = sum(by_state.values())
    return {
        "id": run.id,
        "policy": run.policy,
        "cutoff": _time(run.cutoff),
        "opened_by": run.opened_by,
        "state": run.state,
        "windows_planned": run.windows_planned,
        "jobs_total": total,
        "jobs_done": by_state.get("completed", 0),
        "jobs_dead": by_state.get("dead", 0),
        "jobs_by_state": by_state,
        "windows_applied": ledger.windows,
        "rows_affected": ledger.rows,
        "duplicates_skipped": duplicates,
        "retries": sum(j.failures for j in windows),
        "redelivered": sum(
            j.attempts - j.n - j.failures for j in windows if j.state == "completed"
        ),
        "opened_at": _time(run.opened_at),
        "planned_at": _time(run.planned_at),
        "finished_at": _time(run.finished_at),
    }


def runs(app: App, policy: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    found = app.engine.run_list(policy, limit)
    return [s for r in found if (s := run_summary(app, r.id)) is not None]


def policies(app: App) -> list[dict[str, Any]]:
    from .cleanup import format_time
    from .scheduler import Scheduler, next_fire

    out = []
    cleanup = app.cleanup
    scheduler = Scheduler(app)
    schedules = scheduler.states()
    now = app.engine.now()
    for policy in cleanup.policies if cleanup else []:
        last = runs(app, policy.name, 1)
        assert cleanup is not None
        watermark = cleanup.watermark(policy.name)
        out.append(
            {
                "name": policy.name,
                "table": policy.table,
                "action": policy.action,
                "retain": format_duration(policy.retain),
                "schedule": policy.schedule,
                "timezone": policy.timezone,
                "paused": policy.name in schedules and schedules[policy.name].paused,
                "next_fire": format_time(next_fire(policy, now)) if policy.schedule else None,
                "watermark_seconds": round(watermark, 3),
                "watermark": format_duration(round(watermark)),
                "last_run": last[0] if last else None,
            }
        )
    return out


def queue(app: App) -> dict[str, Any]:
    stats = app.queue.stats()
    return {
        "jobs_by_queue_and_state": stats.by_state,
        "oldest_due_seconds": {q: round(a, 3) for q, a in stats.oldest_due_seconds.items()},
        "running": [
            {"queue": q, "job": k, "held_seconds": round(h, 3)} for q, k, h in stats.running
        ],
        "retries_by_kind": stats.retries_by_kind,
        "dead": stats.dead,
    }
