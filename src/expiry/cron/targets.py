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
import uuid
from collections.abc import Callable
from datetime import datetime
from types import EllipsisType
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .. import defaults
from ..crontab import check_expression, cron_fires, cron_next
from ..engines import Engine
from ..errors import ConfigError, QuotaExceeded, TransientError
from ..queue.handlers import Handler
from ..queue.jobs import CRON_QUEUE, new_job
from ..times import format_time, parse_time
from ..types import UNFINISHED_STATES, AuditAction, CronCall, CronTarget, Job
from . import webhooks

log = logging.getLogger("expiry.crons")

CALL = "expiry.http_call"
CALL_ATTEMPTS = 5
SUPERSEDE_WITHIN_SECONDS = 3600.0
"""A call that fails at its last attempt while its target's next fire is this
close gives way to that fire (recorded, audited as cron.failed); a target that
fires less often dead-letters it, for an operator to redrive."""
OVERDUE_AFTER_SECONDS = 60.0
"""A fire still unclaimed this long after its time shows as overdue."""
SCAN_LIMIT = 10_000


class Crons:
    def __init__(
        self,
        engine: Engine,
        allowed_hosts: list[str],
        *,
        call_timeout: float = defaults.CALL_TIMEOUT_SECONDS,
        max_per_owner: int = defaults.MAX_CRON_TARGETS_PER_KEY,
    ) -> None:
        self.engine = engine
        self.max_per_owner = max_per_owner
        """The most targets one API key may own ([http] max_cron_targets_per_key)."""
        self.allowed_hosts = allowed_hosts
        """Non-global host:port pairs that targets may call ([http] allowed_hosts)."""
        self.call_timeout = call_timeout
        """One call's whole deadline ([http] call_timeout)."""

    def create(
        self,
        name: str,
        http_url: str,
        schedule: str,
        timezone: str = "UTC",
        *,
        actor: str = "api",
        owner: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Validate and store a target, belonging to the API key ``owner`` (None:
        an operator's, seen by admin keys only), its calls' deadline
        ``timeout`` seconds (None: [http] call_timeout); returns it with its
        secret (shown once)."""
        self._check(http_url, schedule, timezone, timeout)
        secret = webhooks.new_secret()
        engine = self.engine
        with engine.transaction() as conn:
            if owner is not None:
                self._check_quota(owner, conn)
            created = engine.cron_insert(
                name, http_url, schedule, timezone, secret, owner=owner, timeout=timeout, conn=conn
            )
            if not created:
                raise ConfigError(f"a cron target named {name!r} exists already")
            engine.audit_append(
                conn,
                AuditAction.CRON_CREATED,
                actor=actor,
                detail={"name": name, "http_url": http_url}
                | ({"timeout_seconds": timeout} if timeout is not None else {}),
            )
        target = self.get(name)
        assert target is not None
        return {**target, "secret": secret}

    def update(
        self,
        name: str,
        *,
        http_url: str | None = None,
        schedule: str | None = None,
        timezone: str | None = None,
        timeout: float | None | EllipsisType = ...,
        actor: str = "api",
    ) -> dict[str, Any] | None:
        """Point a target at another URL, schedule, time zone or call timeout
        (each checked as at create; what is not given stays, and a timeout of
        None goes back to [http] call_timeout), audited with what changed;
        None when there is no such target. The next call (a retry too) reads it."""
        engine = self.engine
        with engine.transaction() as conn:
            target = engine.cron_get(name, conn=conn)
            if target is None:
                return None
            url = target.http_url if http_url is None else http_url
            when = target.schedule if schedule is None else schedule
            zone = target.timezone if timezone is None else timezone
            limit = target.timeout if isinstance(timeout, EllipsisType) else timeout
            self._check(url, when, zone, limit)
            engine.cron_update(name, url, when, zone, timeout=limit, conn=conn)
            changed = {
                field: {"from": old, "to": new}
                for field, old, new in (
                    ("http_url", target.http_url, url),
                    ("schedule", target.schedule, when),
                    ("timezone", target.timezone, zone),
                    ("timeout_seconds", target.timeout, limit),
                )
                if old != new
            }
            engine.audit_append(
                conn, AuditAction.CRON_UPDATED, actor=actor, detail={"name": name, **changed}
            )
        return self.get(name)

    def _check(
        self, http_url: str, schedule: str, timezone: str, timeout: float | None = None
    ) -> None:
        """ConfigError naming the field, for a schedule, zone, URL or timeout a
        target may not have (the URL checked against the SSRF rules of
        cron/webhooks.py)."""
        low, high = defaults.CALL_TIMEOUT_RANGE
        if timeout is not None and not low <= timeout <= high:
            raise ConfigError(
                f"timeout_seconds {timeout:g}: a call's deadline is from {low:g} to {high:g} "
                "seconds (leave it out for [http] call_timeout)"
            )
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

    def _check_quota(self, owner: str, conn: Any) -> None:
        owned = sum(1 for t in self.engine.cron_list(conn=conn) if t.owner == owner)
        if owned >= self.max_per_owner:
            raise QuotaExceeded(
                f"key {owner!r} owns {owned} cron targets, the most "
                f"[http] max_cron_targets_per_key = {self.max_per_owner} allows: delete one "
                "first (DELETE /v1/cron/NAME), or an operator raises the limit"
            )

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
            "owner": target.owner,
            "timeout_seconds": target.timeout,
        }

    def targets(self) -> list[dict[str, Any]]:
        return [self._shape(t) for t in self.engine.cron_list()]

    def stored(self) -> list[CronTarget]:
        """Every target as stored, secrets included (the scheduler fires them)."""
        return self.engine.cron_list()

    def get(self, name: str) -> dict[str, Any] | None:
        target = self.engine.cron_get(name)
        return self._shape(target) if target else None

    def delete(self, name: str, *, actor: str = "api") -> bool:
        """Delete a target, audited with who did it; False when there is none."""
        with self.engine.transaction() as conn:
            done = self.engine.cron_delete(name, conn=conn)
            if done:
                self.engine.audit_append(
                    conn, AuditAction.CRON_DELETED, actor=actor, detail={"name": name}
                )
        return done

    def set_paused(self, name: str, paused: bool, *, actor: str = "api") -> bool:
        """Pause or resume a target, audited with who did it; False when there is none."""
        with self.engine.transaction() as conn:
            done = self.engine.cron_set_paused(name, paused, conn=conn)
            if done:
                self.engine.audit_append(
                    conn,
                    AuditAction.CRON_PAUSED if paused else AuditAction.CRON_RESUMED,
                    actor=actor,
                    detail={"name": name},
                )
        return done

    def calls(self, name: str, limit: int = 50) -> list[dict[str, Any]]:
        return [self._call(c) for c in self.engine.cron_calls(name, limit)]

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

    def timing(self, target: dict[str, Any], now: datetime) -> dict[str, Any]:
        """When a target fires next, and how late that is (for the cron page):
        overdue when its next fire passed more than OVERDUE_AFTER ago unclaimed
        (the scheduler is down or behind); nothing for a paused target."""
        last = target["last_fire_at"]
        if target["paused"] or last is None:
            return {"next_fire": None, "overdue_seconds": None}
        try:
            upcoming = cron_next(target["schedule"], target["timezone"], parse_time(last))
        except ValueError:
            return {"next_fire": None, "overdue_seconds": None}
        late = (now - upcoming).total_seconds()
        return {
            "next_fire": format_time(upcoming),
            "overdue_seconds": late if late > OVERDUE_AFTER_SECONDS else None,
        }

    def call_now(self, name: str, now: datetime, *, actor: str) -> bool:
        """Queue one call of the target now, outside its schedule (the "call now"
        of the dashboard); audited. False when there is no such target."""
        if self.engine.cron_get(name) is None:
            return False
        job = new_job(
            CALL,
            {"name": name, "fire_time": format_time(now)},
            key=f"cron:{name}:now:{format_time(now)}",
            max_attempts=CALL_ATTEMPTS,
            queue=CRON_QUEUE,
        )
        with self.engine.transaction() as conn:
            self.engine.job_insert_many([job], conn)
            self.engine.audit_append(
                conn, AuditAction.CRON_CALLED, actor=actor, detail={"name": name}
            )
        return True

    # -- firing (called by the scheduler) -------------------------------------------

    def fire_due(self, now: datetime) -> list[tuple[str, datetime, bool]]:
        """Fire every target due at ``now``: (name, fire time, called) for each.

        One call per latest due fire (catch_up = latest; the older ones are
        audited as missed). A target whose previous call has not finished
        (waiting, retrying or running) is not called again: the fire is audited
        as missed, so a slow or failing target holds at most one call. Calls are
        shared fairly across owners: a call's priority is how many calls of its
        owner's targets are unfinished before it, so one key's many targets wait
        behind another key's first call instead of ahead of it."""
        targets = [t for t in self.stored() if not t.paused and t.last_fire_at is not None]
        if not targets:
            return []
        unfinished = self.unfinished()
        owner_of = {t.name: t.owner for t in targets}
        ahead: dict[str | None, int] = {}
        for name, n in unfinished.items():
            owner = owner_of.get(name)
            ahead[owner] = ahead.get(owner, 0) + n
        out = []
        for target in targets:
            if target.last_fire_at is None:
                continue
            try:
                fires = cron_fires(target.schedule, target.timezone, target.last_fire_at, now)
            except ValueError as exc:
                log.error("cron target %s: %s", target.name, exc)
                continue
            if not fires:
                continue
            priority = ahead.get(target.owner, 0)
            called = self._fire_latest(target, fires, unfinished.get(target.name, 0), priority)
            if called:
                ahead[target.owner] = priority + 1
            if called is not None:
                out.append((target.name, fires[-1], called))
        return out

    def _fire_latest(
        self, target: CronTarget, fires: list[datetime], unfinished: int, priority: int
    ) -> bool | None:
        """Call ``target`` for its latest due fire, auditing the older ones as
        missed: True when called; False when its previous call has not
        finished (every fire missed); None when another scheduler took them."""
        with self.engine.transaction() as conn:
            if unfinished > 0:
                if not self.engine.cron_advance(target, fires[-1], conn=conn):
                    return None
                self._missed(conn, target.name, fires, "the previous call has not finished")
                return False
            if not self.fire(target, fires[-1], conn, priority=priority):
                return None  # another scheduler fired it
            self._missed(conn, target.name, fires[:-1], "a later fire was called")
        return True

    def fire(
        self, target: CronTarget, fire_time: datetime, conn: Any, *, priority: int = 0
    ) -> bool:
        """Claim ``fire_time`` for a target and enqueue its call, in ``conn``
        (False: another scheduler claimed it first)."""
        if not self.engine.cron_advance(target, fire_time, conn=conn):
            return False
        job = new_job(
            CALL,
            {"name": target.name, "fire_time": format_time(fire_time)},
            key=f"cron:{target.name}:{format_time(fire_time)}",
            max_attempts=CALL_ATTEMPTS,
            queue=CRON_QUEUE,
            priority=priority,
        )
        self.engine.job_insert_many([job], conn)
        return True

    def unfinished(self) -> dict[str, int]:
        """Calls not finished yet (waiting, retrying or running), by target name."""
        out: dict[str, int] = {}
        for state in UNFINISHED_STATES:  # a call not finished holds its target's next fire back
            for job in self.engine.job_list(state, CRON_QUEUE, SCAN_LIMIT):
                name = str(job.payload.get("name"))
                out[name] = out.get(name, 0) + 1
        return out

    def _missed(self, conn: Any, name: str, fires: list[datetime], reason: str) -> None:
        for missed in fires:
            self.engine.audit_append(
                conn,
                AuditAction.CRON_MISSED,
                actor="scheduler",
                detail={"name": name, "fire_time": format_time(missed), "reason": reason},
            )

    # -- the call job ---------------------------------------------------------------

    def call(self, job: Job) -> int | None:
        """Make the call, outside any transaction, and record its outcome durably;
        a failed call raises TransientError, so the job retries with backoff,
        except at its last attempt when the target fires again soon (_next_soon).
        The worker completes the job afterwards (a transactional=False handler)."""
        engine = self.engine
        target = engine.cron_get(job.payload["name"])
        if target is None:
            return None  # the target was deleted
        result = self._post(target, job)
        engine.cron_call_insert(
            target.name,
            parse_time(job.payload["fire_time"]),
            job.attempt,
            status=result.status,
            duration_ms=result.duration_ms,
            response=result.response,
            error=result.error,
        )
        if result.error:
            if job.attempt >= job.max_attempts and self._next_soon(target, job, result.error):
                return result.status
            raise TransientError(f"cron target {job.payload['name']!r}: {result.error}")
        return result.status

    def _post(self, target: CronTarget, job: Job) -> webhooks.CallResult:
        """POST the fire to the target, signed as Standard Webhooks say (its
        id, derived from the job's key, is the same on every attempt)."""
        body = json.dumps(
            {"name": target.name, "fire_time": job.payload["fire_time"], "attempt": job.attempt}
        ).encode()
        msg_id = f"msg_{uuid.uuid5(uuid.NAMESPACE_URL, job.key).hex}"
        stamp = int(self.engine.now().timestamp())
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": webhooks.sign(target.secret, msg_id, stamp, body),
            "User-Agent": "expiry-cron",
        }
        return webhooks.post(
            target.http_url,
            body,
            headers,
            allowed_hosts=self.allowed_hosts,
            timeout=self.call_timeout if target.timeout is None else target.timeout,
        )

    def _next_soon(self, target: CronTarget, job: Job, error: str) -> bool:
        """After the last attempt failed: when the target's next fire comes within
        SUPERSEDE_WITHIN_SECONDS (and it is not paused), the call gives way to it,
        audited as cron.failed; otherwise it is dead-lettered."""
        if target.paused:
            return False
        now = self.engine.now()
        upcoming = cron_next(target.schedule, target.timezone, now)
        if (upcoming - now).total_seconds() > SUPERSEDE_WITHIN_SECONDS:
            return False
        self.engine.audit_append(
            None,
            AuditAction.CRON_FAILED,
            actor="worker",
            job_key=job.key,
            detail={
                "name": target.name,
                "fire_time": job.payload["fire_time"],
                "attempts": job.attempt,
                "error": error[:300],
                "next_fire": format_time(upcoming),
            },
        )
        log.warning(
            "cron call failed at its last attempt; the next fire calls again",
            extra={"job": job.key, "attempt": job.attempt, "next_fire": format_time(upcoming)},
        )
        return True


def handlers(crons: Callable[[], Crons]) -> list[Handler]:
    """The built-in cron call job, over the Crons that ``crons`` returns."""
    return [Handler(CALL, lambda job: crons().call(job), transactional=False)]
