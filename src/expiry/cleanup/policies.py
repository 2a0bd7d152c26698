"""A cleanup's policies and their tables, checked against the live schema once
per process; a policy that does not fit is quarantined (its jobs wait), the
others go on. The state every part of the Cleanup shares starts here."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from .. import defaults
from ..config import Config, Policy
from ..engines import Engine
from ..errors import ConfigError, SchemaError, Snooze
from . import approval
from .holds import record_holds
from .runs import Runs
from .target import Target

log = logging.getLogger("expiry.cleanup")


QUARANTINE_WAIT_SECONDS = 30.0  # a quarantined policy's jobs look again this often


class Policies:
    """The policies of the config, each with its checked Target."""

    def __init__(self, engine: Engine, config: Config, runs: Runs | None = None) -> None:
        self.engine = engine
        self.config = config
        self.runs = runs or Runs(engine)
        self._targets: dict[str, Target] = {}
        self._lock = threading.Lock()
        self.observer: Callable[[str, float], None] | None = None
        """Told (policy, seconds) after each window (the throttle's rate)."""
        self.broken: dict[str, str] = {}
        """Quarantined policies: name -> why its check failed. Each is checked
        again on its next use (a repaired table, a reloaded config): the others
        run meanwhile."""

    @property
    def policies(self) -> list[Policy]:
        return list(self.config.policy)

    def policy(self, name: str) -> Policy:
        policy: Policy = self.config.get_policy(name)
        return policy

    def reload(self, config: Config) -> None:
        """After a config reload: the new policies, each checked again on next
        use; the holds placed or lifted, audited."""
        self.config = config
        self.forget_targets()
        with self._lock:
            self.broken.clear()
        self.record_holds()

    def record_holds(self, actor: str = "config") -> list[str]:
        """Audit the holds placed or lifted since the log last said (holds.py).
        A failure is logged: the holds are in force from the config whatever
        the log says."""
        try:
            return record_holds(self.engine, self.config, actor)
        except Exception as exc:
            log.error("could not audit the config's holds: %s", exc)
            return []

    def target(self, name: str, conn: Any | None = None) -> Target:
        """The policy's table, checked against the live schema once per process."""
        with self._lock:
            target = self._targets.get(name)
        if target is None:
            target = Target(self.engine, self.policy(name))
            try:
                with self.engine.transaction_or(conn) as tx:
                    warnings = target.check(tx)
            except SchemaError as exc:
                self._quarantine(name, exc)
                raise
            for warning in warnings:
                log.warning(warning)
            self._repaired(name, target)
        return target

    def approval_stands(self, policy: Policy, payload: dict[str, Any], key: str) -> None:
        """Before a job of a run goes on (a planning page, a window, a
        partition): with ``approve = true``, only under the policy its approval
        was given for. Else the run stops: this job (``key``) waits (Snooze,
        nothing done) and, once it waits, the run is cancelled with its waiting
        jobs (audited), this one too, even when another job of the run, running
        beside it, cancelled the run first; the next run previews under the
        policy as it is now."""
        if approval.holds_for(policy, payload):
            return
        rid = payload["run_id"]
        why = (
            f"policy {policy.name!r} is not as its run {rid} was approved (approve = true): "
            "the run is cancelled; the next run previews again"
        )

        def cancel() -> None:
            try:
                self.runs.cancel(rid, actor="expiry")
                log.error(why, extra={"policy": policy.name, "run": rid})
            except ConfigError:  # cancelled already, by a job that ran beside this one
                self.engine.job_discard([key])
                self.runs.finish(rid)

        raise Snooze(defaults.APPROVAL_RECHECK_SECONDS, why, then=cancel)

    def usable(self, name: str, conn: Any | None = None) -> None:
        """Before a job of policy ``name``: its table checked (once per
        process). A quarantined policy's jobs wait (Snooze: no attempt spent)
        until it is repaired, rather than dying or stopping the others."""
        try:
            self.target(name, conn)
        except SchemaError as exc:
            raise Snooze(QUARANTINE_WAIT_SECONDS, f"policy quarantined: {exc}") from exc

    def _quarantine(self, name: str, exc: SchemaError, *, quiet: bool = False) -> None:
        """Mark the policy broken: its table is checked again at its next use
        (the check that passed before no longer holds)."""
        with self._lock:
            new = self.broken.get(name) != str(exc)
            self.broken[name] = str(exc)
            self._targets.pop(name, None)
        if new and not quiet:  # one line per change, not per use
            log.error("policy quarantined: %s", exc, extra={"policy": name})

    def _repaired(self, name: str, target: Target) -> None:
        """The policy's check passed: it is usable again (said once, if it was not)."""
        with self._lock:
            self._targets[name] = target
            was = self.broken.pop(name, None)
        if was is not None:
            log.info("policy repaired: its jobs run again", extra={"policy": name})

    @contextmanager
    def _drift(self, name: str, *, job: bool = True) -> Iterator[None]:
        """Around statements on the policy's table: a table or column that went
        missing under a running process (renamed, dropped, altered) quarantines
        the policy. A job then waits (Snooze: no attempt spent, nothing
        dead-lettered) until the table fits again; a reader (``job=False``)
        gets the SchemaError."""
        try:
            yield
        except Exception as exc:
            if not self.engine.schema_drift(exc):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            broken = SchemaError(f"policy {name!r}: its table changed under expiry: {first}")
            self._quarantine(name, broken)
            if not job:
                raise broken from exc
            raise Snooze(QUARANTINE_WAIT_SECONDS, f"policy quarantined: {broken}") from exc

    def forget_targets(self) -> None:
        """After a config reload: check each policy's table again on next use."""
        with self._lock:
            self._targets.clear()

    def check(self) -> list[str]:
        """Check every policy now; raises SchemaError naming every policy that
        does not fit (`expiry check` exits 2), after checking them all."""
        warnings, broken = self.check_all(quiet=True)  # the caller reports them
        if broken:
            raise SchemaError("; ".join(broken.values()))
        return warnings

    def check_all(self, *, quiet: bool = False) -> tuple[list[str], dict[str, str]]:
        """Check every policy now: the warnings of those that fit, and the
        reason of each that does not, which is quarantined (the worker, the
        scheduler and the server go on with the others)."""
        warnings: list[str] = []
        for policy in self.policies:
            target = Target(self.engine, policy)
            try:
                with self.engine.read_transaction() as conn:  # a check writes nothing
                    warnings += target.check(conn)
                    if target.fixed is None:  # the data decides: as a run would now
                        latest = self.engine.now(conn) - timedelta(seconds=policy.retain)
                        target.notes.insert(0, target.choose(conn, latest).describe() + " (now)")
            except SchemaError as exc:
                self._quarantine(policy.name, exc, quiet=quiet)
                continue
            self._repaired(policy.name, target)
        with self._lock:
            return warnings, dict(self.broken)
