"""The scheduler: turns each policy's cron schedule into runs, and never loses
a fire silently.

Each pass reads the database clock, and for every scheduled, unpaused policy
finds the fire times in (last_fire_at, now]. It claims a fire by moving
``last_fire_at`` forward with a compare-and-set in the same transaction that
opens the run, so any number of schedulers, on any number of hosts, open
exactly one run per fire time. Fires missed while the scheduler was down or
the policy paused follow the policy's ``catch_up``:

    latest  one run for the latest missed fire (its later cutoff covers the rest)
    all     a run for each missed fire, the newest ``max_catch_up`` of them
    none    no run for a fire more than a minute late

and every missed fire is recorded in the audit log either way.

Time zones and daylight saving follow Debian cron (cronsim). For a fixed-time
schedule (neither the minute nor the hour field starts with '*', e.g.
"30 2 * * *"), a time that does not exist (spring forward) fires once, at the
end of the gap (03:00 local for 02:30 in New York), and a time that occurs twice
(fall back) fires once, at its first occurrence. A schedule whose minute or
hour field starts with '*' (e.g. "30 * * * *", "*/20 2 * * *") gets no such
fix-up: times in the gap are skipped, and times in the repeated hour fire at
both occurrences. Fire times are handled in UTC, so each occurrence is a
distinct fire (and run), and cutoffs are fire time - retain in real time.

Between passes it sleeps until the next fire, waking at least every second to
notice pause/resume by other processes (a change of the schedules table) and
config reloads (SIGHUP).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .. import signals
from ..cleanup.service import Cleanup
from ..config import Policy
from ..crontab import choose, cron_next, fires_between, next_fire
from ..engines import Engine
from ..errors import SchemaError
from ..health.history import History
from ..times import format_time
from ..types import AuditAction, Schedule
from .targets import Crons

log = logging.getLogger("expiry.scheduler")


@dataclass(frozen=True)
class Fire:
    policy: str
    fire_time: datetime
    run_id: str | None
    """None when the fire was recorded as missed instead of run."""


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        cleanup: Cleanup | None,
        crons: Crons,
        *,
        clock: Callable[[], datetime] | None = None,
        reload: Callable[[], bool] | None = None,
        history: History | None = None,
    ) -> None:
        """``cleanup`` opens the policies' runs (None: no policies, cron targets
        only); ``reload`` re-reads the config on SIGHUP (False: the file was
        refused, the old config kept); ``clock`` replaces the database's (tests);
        ``history`` samples the policies each minute (with every worker down,
        the scheduler still keeps their history)."""
        self.engine = engine
        self.cleanup = cleanup
        self.crons = crons
        self.reload = reload
        self.history = history
        self.clock = clock
        self.stopping = threading.Event()
        self.reload_requested = threading.Event()

    def now(self, conn: Any | None = None) -> datetime:
        return self.clock() if self.clock else self.engine.now(conn)

    @property
    def scheduled(self) -> list[Policy]:
        cleanup = self.cleanup
        return [p for p in (cleanup.policies if cleanup else []) if p.schedule]

    def states(self) -> dict[str, Schedule]:
        return {s.policy: s for s in self.engine.schedule_list()}

    # -- one pass ------------------------------------------------------------------

    def tick(self) -> list[Fire]:
        """Fire every schedule that is due; returns what was run or recorded missed."""
        engine = self.engine
        now = self.now()
        with engine.transaction() as conn:
            for policy in self.scheduled:
                engine.schedule_register(policy.name, now, conn=conn)
        states = self.states()
        fired: list[Fire] = []
        for policy in self.scheduled:
            state = states.get(policy.name)
            if state is None or state.paused or state.last_fire_at is None:
                continue
            fires, total = fires_between(policy, state.last_fire_at, now)
            if fires:
                try:
                    fired += self._fire(policy, fires, total, now, state)
                except SchemaError:
                    # Quarantined (cleanup logged why): its fires wait, unclaimed,
                    # until the table is repaired; the other policies fire.
                    continue
        fired += self._fire_crons(now)
        if self.cleanup is not None:
            # Workers sweep too; with every worker down, this one still says it.
            try:
                self.cleanup.mark_stalled()
            except Exception as exc:  # never at the cost of the fires
                log.warning("could not check for stalled runs: %s", exc)
        if self.history is not None:
            try:
                self.history.sample()
            except Exception as exc:
                log.warning("could not sample the policies' history: %s", exc)
        return fired

    def _fire_crons(self, now: datetime) -> list[Fire]:
        """HTTP cron targets: the fires that called their target (Crons.fire_due)."""
        return [
            Fire(f"cron:{name}", fire_time, None)
            for name, fire_time, called in self.crons.fire_due(now)
            if called
        ]

    def _record_missed(
        self, policy: Policy, missed: list[datetime], unlisted: int, conn: Any
    ) -> list[Fire]:
        """Audit each missed fire, and how many older ones were not listed."""
        for fire in missed:
            self.engine.audit_append(
                conn,
                AuditAction.SCHEDULE_MISSED,
                actor="scheduler",
                policy=policy.name,
                detail={"fire_time": format_time(fire), "catch_up": policy.catch_up},
            )
        if unlisted > 0:
            self.engine.audit_append(
                conn,
                AuditAction.SCHEDULE_MISSED,
                actor="scheduler",
                policy=policy.name,
                detail={"older_fires_not_listed": unlisted, "catch_up": policy.catch_up},
            )
        return [Fire(policy.name, fire, None) for fire in missed]

    def _fire(
        self, policy: Policy, fires: list[datetime], total: int, now: datetime, state: Schedule
    ) -> list[Fire]:
        """Claim ``fires`` by moving last_fire_at from the value ``state`` read to
        the newest of them, and open their runs in the same transaction."""
        engine = self.engine
        to_run, missed = choose(policy, fires, now)
        newest = fires[-1]
        out: list[Fire] = []
        with engine.transaction() as conn:
            if not engine.schedule_advance(state, newest, conn=conn):
                return []  # another scheduler moved last_fire_at first: it took these fires
            out += self._record_missed(policy, missed, total - len(fires), conn)
            out += [self._open(policy, fire, conn) for fire in to_run]
        for done in out:
            if done.run_id:
                log.info("schedule fired", extra={"policy": done.policy, "run": done.run_id})
            else:
                log.warning(
                    "missed fire at %s recorded (catch_up=%s)",
                    format_time(done.fire_time),
                    policy.catch_up,
                    extra={"policy": done.policy},
                )
        return out

    def _open(self, policy: Policy, fire: datetime, conn: Any) -> Fire:
        """Open the run of one fire, audited, in ``conn``'s transaction. A fire is
        never later than the scheduler's now (the database's), so its cutoff is
        never later than now - retain: no check needed (and a test's fake clock
        may run ahead of the database's)."""
        cleanup = self.cleanup
        assert cleanup is not None
        cutoff = fire - timedelta(seconds=policy.retain)
        opened = cleanup.open_run(
            policy.name, cutoff, opened_by="scheduler", actor="scheduler", conn=conn, force=True
        )
        self.engine.audit_append(
            conn,
            AuditAction.SCHEDULE_FIRED,
            actor="scheduler",
            policy=policy.name,
            run_id=opened.run_id,
            detail={"fire_time": format_time(fire)},
        )
        return Fire(policy.name, fire, opened.run_id)

    def seconds_to_next_fire(self, now: datetime) -> float | None:
        """Until the nearest fire of a scheduled policy or of a cron target."""
        upcoming = [next_fire(p, now) for p in self.scheduled]
        for target in self.crons.stored():
            if target.paused or target.last_fire_at is None:
                continue
            try:
                upcoming.append(cron_next(target.schedule, target.timezone, target.last_fire_at))
            except ValueError:
                continue  # _fire_crons logs it
        return max(0.0, (min(upcoming) - now).total_seconds()) if upcoming else None

    def _version(self) -> tuple[datetime, int]:
        return self.engine.schedule_version()

    def _sleep_until_next_fire(self) -> None:
        """Sleep until the next fire; each second, look for pause/resume or SIGHUP."""
        version = self._version()
        remaining = self.seconds_to_next_fire(self.now())
        while not self.stopping.is_set() and not self.reload_requested.is_set():
            step = 1.0 if remaining is None else min(1.0, remaining)
            if self.stopping.wait(step):
                return
            if remaining is not None:
                remaining -= step
                if remaining <= 0:
                    return
            if self._version() != version:
                return

    # -- pause / resume ----------------------------------------------------------

    def set_paused(self, policy: str, paused: bool, *, actor: str) -> None:
        cleanup = self.cleanup
        assert cleanup is not None
        cleanup.policy(policy)  # refuses an unknown name with "did you mean"
        with self.engine.transaction() as conn:
            self.engine.schedule_set_paused(policy, paused, conn=conn)
            self.engine.audit_append(
                conn,
                AuditAction.POLICY_PAUSED if paused else AuditAction.POLICY_RESUMED,
                actor=actor,
                policy=policy,
            )

    # -- the loop ------------------------------------------------------------------

    def run(self) -> int:
        """Fire schedules until stopped: SIGTERM or SIGINT stop it, SIGHUP has
        the loop reload the config (signals.py; from the main thread, or in a
        process that listens already, as `expiry serve`)."""
        with signals.listening(stop=self.stopping.set, reload=self.reload_requested.set):
            return self._loop()

    def _loop(self) -> int:
        log.info("scheduler started: %d scheduled policies", len(self.scheduled))
        failures = 0
        while not self.stopping.is_set():
            try:
                self._reload()
                self.tick()
                self._sleep_until_next_fire()
                failures = 0
            except Exception as exc:  # database away: keep trying, with a cap
                failures += 1
                wait = min(30.0, 0.5 * 2**failures)
                log.warning("scheduler pass failed, retrying in %.1fs: %s", wait, exc)
                self.stopping.wait(wait)
        log.info("scheduler stopped")
        return 0

    def _reload(self) -> None:
        """Reload the config if asked (SIGHUP); a refused file keeps the old one."""
        if not self.reload_requested.is_set():
            return
        self.reload_requested.clear()
        if self.reload is not None and self.reload():
            log.info("config reloaded: %d scheduled policies", len(self.scheduled))
