"""The seam's part for schedules and cron over HTTP: each policy's schedule,
cron targets and their calls."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ...types import (
    CronCall,
    CronTarget,
    Schedule,
)
from ..common import Row
from .primitives import Primitives


class CronSeam(Primitives):
    """Schedules, cron targets and their calls."""

    def schedule_register(self, policy: str, now: datetime, *, conn: Any | None = None) -> None:
        """First sight of a policy's schedule: fires count from ``now``. A schedule
        known already is left as it is."""
        params = {"policy": policy, "now": self.time_param(now)}
        self._tx_rows(conn, "schedule_register", params)

    def schedule_list(self, *, conn: Any | None = None) -> list[Schedule]:
        """Every schedule's state, by policy name."""
        return [
            Schedule(
                policy=row["policy"],
                paused=bool(row["paused"]),
                last_fire_at=self._maybe_time(row["last_fire_at"]),
                updated_at=self._time(row["updated_at"]),
                last_fire_stored=row["last_fire_at"],
                paused_by=row["paused_by"],
            )
            for row in self._tx_rows(conn, "schedule_list")
        ]

    def schedule_advance(
        self, schedule: Schedule, fire: datetime, *, conn: Any | None = None
    ) -> bool:
        """Claim the fire times after ``schedule.last_fire_at``, up to ``fire``: a
        compare-and-set on the last fire as read. False when another scheduler
        moved it first, when the schedule is paused, or when ``fire`` is not later."""
        params = {
            "policy": schedule.policy,
            "last": schedule.last_fire_stored,
            "fire": self.time_param(fire),
        }
        return bool(self._tx_rows(conn, "schedule_advance", params))

    def schedule_set_paused(
        self, policy: str, paused: bool, *, by: str | None = None, conn: Any | None = None
    ) -> None:
        """Pause or resume a policy's schedule (registering it when unknown);
        ``by`` says who paused it ("throttle": a critical reading, whose stop holds
        the policy's windows too). Resuming clears it."""
        params = {"policy": policy, "paused": paused, "by": by if paused else None}
        self._tx_rows(conn, "schedule_set_paused", params)

    def schedule_version(self, *, conn: Any | None = None) -> tuple[datetime, int]:
        """(the latest change, how many schedules and cron targets): different once
        another process pauses, resumes or registers a schedule, or creates,
        deletes, pauses or fires a cron target."""
        row = self._one(conn, "schedule_version")
        assert row is not None  # an aggregate: always one row
        return self._time(row["version"]), int(row["n"])

    def cron_insert(
        self,
        name: str,
        http_url: str,
        schedule: str,
        timezone: str,
        secret: str,
        *,
        owner: str | None = None,
        timeout: float | None = None,
        conn: Any | None = None,
    ) -> bool:
        """Create a cron target whose fires count from now, belonging to the key
        ``owner`` (None: to admin keys only), its calls' deadline ``timeout``
        seconds (None: [http] call_timeout); False when ``name`` exists."""
        params = {
            "owner": owner,
            "timeout": timeout,
            "name": name,
            "http_url": http_url,
            "schedule": schedule,
            "timezone": timezone,
            "secret": secret,
        }
        return bool(self._tx_rows(conn, "cron_insert", params))

    def cron_list(self, *, conn: Any | None = None) -> list[CronTarget]:
        """Every cron target, by name."""
        return [self._as_cron_target(row) for row in self._tx_rows(conn, "cron_list")]

    def cron_get(self, name: str, *, conn: Any | None = None) -> CronTarget | None:
        row = self._one(conn, "cron_get", {"name": name})
        return self._as_cron_target(row) if row else None

    def _as_cron_target(self, row: Row) -> CronTarget:
        return CronTarget(
            name=row["name"],
            http_url=row["http_url"],
            schedule=row["schedule"],
            timezone=row["timezone"],
            secret=row["secret"],
            paused=bool(row["paused"]),
            last_fire_at=self._maybe_time(row["last_fire_at"]),
            created_at=self._time(row["created_at"]),
            updated_at=self._time(row["updated_at"]),
            last_fire_stored=row["last_fire_at"],
            owner=row["owner"],
            timeout=None if row["timeout_seconds"] is None else float(row["timeout_seconds"]),
        )

    def cron_delete(self, name: str, *, conn: Any | None = None) -> bool:
        """Delete a cron target (its calls stay); False when there was none."""
        return self._one(conn, "cron_delete", {"name": name}) is not None

    def cron_set_paused(self, name: str, paused: bool, *, conn: Any | None = None) -> bool:
        """Pause or resume a cron target; False when there is none of that name."""
        return self._one(conn, "cron_set_paused", {"name": name, "paused": paused}) is not None

    def cron_update(
        self,
        name: str,
        http_url: str,
        schedule: str,
        timezone: str,
        *,
        timeout: float | None = None,
        conn: Any | None = None,
    ) -> bool:
        """Set a cron target's URL, schedule, time zone and call timeout (None:
        [http] call_timeout); False when there is none of that name. Its
        secret, owner and fires so far stay."""
        params = {
            "name": name,
            "http_url": http_url,
            "schedule": schedule,
            "timezone": timezone,
            "timeout": timeout,
        }
        return self._one(conn, "cron_update", params) is not None

    def cron_advance(self, target: CronTarget, fire: datetime, *, conn: Any | None = None) -> bool:
        """Claim ``fire`` for a target: a compare-and-set on its last fire as read
        (as schedule_advance)."""
        params = {
            "name": target.name,
            "fire": self.time_param(fire),
            "last": target.last_fire_stored,
        }
        return bool(self._tx_rows(conn, "cron_advance", params))

    def cron_call_insert(
        self,
        name: str,
        fire_time: datetime,
        attempt: int,
        *,
        status: int | None,
        duration_ms: float | None,
        response: str | None,
        error: str | None,
        conn: Any | None = None,
    ) -> None:
        """Record one call's outcome."""
        params = {
            "name": name,
            "fire_time": self.time_param(fire_time),
            "attempt": attempt,
            "status": status,
            "duration_ms": duration_ms,
            "response": response,
            "error": error,
        }
        self._tx_rows(conn, "cron_call_insert", params)

    def cron_calls(self, name: str, limit: int = 50, *, conn: Any | None = None) -> list[CronCall]:
        """A target's newest ``limit`` calls, newest first."""
        return [
            CronCall(
                id=int(row["id"]),
                name=row["name"],
                fire_time=self._time(row["fire_time"]),
                attempt=int(row["attempt"]),
                status=row["status"],
                duration_ms=row["duration_ms"],
                response=row["response"],
                error=row["error"],
                at=self._time(row["at"]),
            )
            for row in self._tx_rows(conn, "cron_calls", {"name": name, "limit": limit})
        ]
