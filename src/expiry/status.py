"""What operators read: policies, the queue and runs, as plain dicts for the
CLI's tables, its --json output, the HTTP API and the dashboard.

Runs are read by runs.py; ``run_summary`` and ``runs`` stay here, taking the
App, for the HTTP layer and the dashboard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cron import next_fire
from .durations import format_duration
from .errors import SchemaError
from .times import format_time

if TYPE_CHECKING:
    from .app import App


def run_summary(app: App, run_id: str) -> dict[str, Any] | None:
    return app.runs.summary(run_id)


def runs(app: App, policy: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    return app.runs.recent(policy, limit)


def policies(app: App) -> list[dict[str, Any]]:
    """Every policy of the config with its schedule, watermark and last run."""
    cleanup = app.cleanup
    if cleanup is None:
        return []
    recent = app.runs.recent
    schedules = {s.policy: s for s in app.engine.schedule_list()}
    now = app.engine.now()
    out = []
    for policy in cleanup.policies:
        last = recent(policy.name, 1)
        broken = None
        try:
            watermark = cleanup.watermark(policy.name)
        except SchemaError as exc:  # quarantined: shown with its reason, the others go on
            broken, watermark = str(exc), 0.0
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
                "broken": broken,
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
