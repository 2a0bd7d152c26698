"""Cron over HTTP: targets that the scheduler calls with a signed POST.

A target is created with a name, an http_url, a schedule and a time zone; its
secret is returned once. At each fire the scheduler enqueues a call job keyed
``cron:NAME:FIRE_TIME`` (so racing schedulers call once per fire); the job
makes the call outside any transaction, records its outcome (status, duration,
the first 64 KiB of the response) in its own, and retries with backoff while
the target fails.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import webhooks
from .cleanup import format_time, parse_time
from .cron import check_expression
from .errors import ConfigError, TransientError
from .queue import new_job
from .types import CronCall, CronTarget, Job

if TYPE_CHECKING:
    from .app import App

log = logging.getLogger("expiry.crons")

CALL = "expiry.http_call"
CALL_ATTEMPTS = 5
CALL_TIMEOUT_SECONDS = 10.0


class Crons:
    def __init__(self, app: App) -> None:
        self.app = app
        self._results: dict[int, webhooks.CallResult] = {}
        self._lock = threading.Lock()

    @property
    def allowed_hosts(self) -> list[str]:
        return list(self.app.config.http.allowed_hosts) if self.app.config else []

    def create(
        self, name: str, http_url: str, schedule: str, timezone: str = "UTC"
    ) -> dict[str, Any]:
        """Validate and store a target; returns it with its secret (shown once)."""
        try:
            check_expression(schedule)
        except ValueError as exc:
            raise ConfigError(f"schedule: {exc}") from None
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"timezone: {timezone!r} is not an IANA time zone") from None
        try:
            webhooks.resolve(http_url, self.allowed_hosts)
        except webhooks.UnsafeTarget as exc:
            raise ConfigError(f"http_url: {exc}") from None
        secret = webhooks.new_secret()
        engine = self.app.engine
        with engine.transaction() as conn:
            if not engine.cron_insert(name, http_url, schedule, timezone, secret, conn=conn):
                raise ConfigError(f"a cron target named {name!r} exists already")
            engine.audit_append(
                conn, "cron.created", actor="api", detail={"name": name, "http_url": http_url}
            )
        target = self.get(name)
        assert target is not None
        return {**target, "secret": secret}

    @staticmethod
    def _shape(target: CronTarget) -> dict[str, Any]:
        last = target.last_fire_at
        return {
            "name": target.name,
            "http_url": target.http_url,
            "schedule": target.schedule,
            "timezone": target.timezone,
            "paused": target.paused,
            "last_fire_at": format_time(last) if last is not None else None,
            "created_at": format_time(target.created_at),
        }

    def targets(self) -> list[dict[str, Any]]:
        return [self._shape(t) for t in self.app.engine.cron_list()]

    def stored(self) -> list[CronTarget]:
        """Every target as stored, secrets included (the scheduler fires them)."""
        return self.app.engine.cron_list()

    def get(self, name: str) -> dict[str, Any] | None:
        target = self.app.engine.cron_get(name)
        return self._shape(target) if target else None

    def delete(self, name: str) -> bool:
        return self.app.engine.cron_delete(name)

    def set_paused(self, name: str, paused: bool) -> bool:
        return self.app.engine.cron_set_paused(name, paused)

    def calls(self, name: str, limit: int = 50) -> list[dict[str, Any]]:
        return [self._call(c) for c in self.app.engine.cron_calls(name, limit)]

    @staticmethod
    def _call(call: CronCall) -> dict[str, Any]:
        return {
            "fire_time": format_time(call.fire_time),
            "attempt": call.attempt,
            "status": call.status,
            "duration_ms": call.duration_ms,
            "response": call.response,
            "error": call.error,
            "at": format_time(call.at),
        }

    # -- firing (called by the scheduler) -------------------------------------------

    def fire(self, target: CronTarget, fire_time: datetime, conn: Any) -> bool:
        """Claim ``fire_time`` for a target and enqueue its call, in ``conn``."""
        engine = self.app.engine
        if not engine.cron_advance(target, fire_time, conn=conn):
            return False
        job = new_job(
            CALL,
            {"name": target.name, "fire_time": format_time(fire_time)},
            key=f"cron:{target.name}:{format_time(fire_time)}",
            max_attempts=CALL_ATTEMPTS,
        )
        engine.job_insert_many([job], conn)
        return True

    # -- the call job ---------------------------------------------------------------

    def before_call(self, job: Job) -> None:
        """Make the call outside any transaction and record it durably."""
        engine = self.app.engine
        target = engine.cron_get(job.payload["name"])
        if target is None:
            return
        body = json.dumps(
            {"name": target.name, "fire_time": job.payload["fire_time"], "attempt": job.attempt}
        ).encode()
        msg_id = f"msg_{uuid.uuid5(uuid.NAMESPACE_URL, job.key).hex}"
        stamp = int(engine.now().timestamp())
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": webhooks.sign(target.secret, msg_id, stamp, body),
            "User-Agent": "expiry-cron",
        }
        result = webhooks.post(
            target.http_url,
            body,
            headers,
            allowed_hosts=self.allowed_hosts,
            timeout=CALL_TIMEOUT_SECONDS,
        )
        engine.cron_call_insert(
            target.name,
            parse_time(job.payload["fire_time"]),
            job.attempt,
            status=result.status,
            duration_ms=result.duration_ms,
            response=result.response,
            error=result.error,
        )
        with self._lock:
            self._results[job.id] = result

    def call(self, job: Job, tx: Any) -> int | None:
        with self._lock:
            result = self._results.pop(job.id, None)
        if result is None:
            return None  # the target was deleted
        if result.error:
            raise TransientError(f"cron target {job.payload['name']!r}: {result.error}")
        return result.status


def register_crons(app: App) -> Crons:
    crons = Crons(app)
    app.handler(CALL, before=crons.before_call)(crons.call)
    return crons
