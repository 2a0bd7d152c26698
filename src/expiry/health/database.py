"""The database's health, read every ``health_interval`` by each worker process,
and what it makes the worker hold back.

Each check reads, once for all policies: which policies a critical reading
stopped (paused by the throttle: their windows wait), and where a policy asks
for them, the replicas' replay lag and the active client backends; then per
policy its ``throttle_query``, ``pause_file``, ``canary`` and dead-tuple share.
The readings go to the policy's throttle.Controller; the worker's gates hold a
held or stopped policy's queue, and space a rate-limited policy's windows.

On a Galera cluster (MariaDB), max_flow_control reads the share of the
last interval the cluster stood paused for flow control (the growth of
wsrep_flow_control_paused_ns over the time between two checks: a node
falling behind on applying the others' writes pauses them all), and
max_recv_queue this node's write sets waiting to be applied.

Replica lag is read on the primary from pg_stat_replication: the larger of
its replay_lag and the age of the oldest WAL a standby has not replayed,
dated by this process's own samples of the primary's WAL position (a paused
replay keeps replay_lag where it was, while the unreplayed WAL grows old).
Each ``[[replica]]`` url is also asked its own replay lag. A standby whose
position cannot be read (no pg_monitor) reads as infinitely late: the policy
holds, and the log says which grant is missing.

A critical reading pauses the policy in the database (``schedule_set_paused``
by "throttle", audited as the throttle's), so every process holds its windows
until an operator runs ``expiry resume``. An operator's own pause stops the
schedule only: open runs go on.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..config import Config, Policy
from ..engines import Engine, open_engine
from ..queue.jobs import policy_queue
from ..types import AuditAction, FlowControl, Gates, WorkerSeen
from .throttle import CRITICAL, Controller

log = logging.getLogger("expiry.health")

WAL_HISTORY_SECONDS = 3600.0
"""How far back the primary's WAL positions are kept to date a standby's lag."""
RATE_WINDOW_SECONDS = 5.0
"""A policy's running rate is its windows over the last this many seconds."""
IDLE_AFTER_SECONDS = 2.0
"""A policy none of whose windows ended for this long is idle: its canary
samples then make its baseline."""
CANARY_RUNS = 5
"""Canary runs a check, each a transaction of its own and timed with its
commit: a canary that writes feels the WAL flush that a cleanup's deletes
slow down for the application's writes."""
SLOW_START_RATE = 1.0
"""Windows a second a policy with a latency budget begins at (slow start:
doubled each healthy second until the canary reads a breach)."""
STOPPED_BY = "throttle"
"""Who a critical reading's pause is by: such a pause holds the policy's
windows in every process until an operator resumes it."""
CANARY_FLOOR_SECONDS = 0.001
"""The least baseline a canary's ratio divides by: jitter under a
millisecond, which no user notices, never holds a policy."""
LATENCY_CHECKS = 10
"""The latency ratio read is over the canary's runs of this many checks (10
checks at a 100 ms interval: the last second, 50 runs)."""
BASELINE_QUANTILE = 0.9
"""The idle runs' quantile the baseline is at most."""
BASELINE_RUNS = 200
"""Idle runs the baseline's quantile is taken over (the latest)."""


def limits_of(policy: Policy) -> tuple[dict[str, float], dict[str, float]]:
    """The signals a policy holds on, and those that stop it, with their limits."""
    limits: dict[str, float] = {}
    critical: dict[str, float] = {}
    for name in ("replica_lag", "active_backends", "latency_ratio", "flow_control"):
        if (limit := getattr(policy, f"max_{name}")) is not None:
            limits[name] = float(limit)
        if (stop := getattr(policy, f"critical_{name}")) is not None:
            critical[name] = float(stop)
    if policy.max_recv_queue is not None:
        limits["recv_queue"] = float(policy.max_recv_queue)
    if policy.max_dead_tuple_ratio is not None:
        limits["dead_tuple_ratio"] = policy.max_dead_tuple_ratio
    if policy.throttle_query is not None:
        limits["throttle_query"] = 0.5  # true reads 1
    if policy.pause_file is not None:
        limits["pause_file"] = 0.5
    return limits, critical


@dataclass
class _Policy:
    """One policy's throttle state in this process."""

    controller: Controller
    ends: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
    last_start: float = -1e18
    """When its latest window started (monotonic)."""
    warm: bool = False
    """The canary ran once: a new connection's first runs (a cold plan and
    cache) never make the baseline."""
    idle: deque[float] = field(default_factory=lambda: deque(maxlen=BASELINE_RUNS))
    """The canary's latest runs while the policy was idle."""
    busy: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_CHECKS * CANARY_RUNS))
    """Its latest runs since, while windows ran."""
    readings: dict[str, float] = field(default_factory=dict)


class Health:
    def __init__(
        self,
        engine: Engine,
        config: Config,
        *,
        clock: Callable[[], float] = time.monotonic,
        open_replica: Callable[[str], Engine] = open_engine,
    ) -> None:
        self.engine, self.config, self.clock = engine, config, clock
        self._open_replica = open_replica
        self._replicas: dict[str, Engine] = {}
        self._wal: deque[tuple[float, int]] = deque()
        self._policies: dict[str, _Policy] = {}
        self._paused: set[str] = set()
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._foreground: tuple[float, int | None] = (-math.inf, None)
        """(when, the application's sessions at work then): the last reading."""
        self._flow: tuple[float, int, str] | None = None
        """(when, the Galera node's flow-control pause then in ns, the node): the last reading."""
        self.reload(config)

    def reload(self, config: Config) -> None:
        """A new config: each policy's limits again; what was measured stays."""
        with self._lock:
            self.config = config
            kept = self._policies
            self._policies = {}
            for policy in config.policy:
                limits, critical = limits_of(policy)
                state = kept.get(policy.name) or _Policy(Controller(limits, critical))
                c = state.controller
                c.limits, c.critical = limits, critical
                c.start_rate = SLOW_START_RATE if "latency_ratio" in limits else None
                self._policies[policy.name] = state

    @property
    def interval(self) -> float:
        return min((p.health_interval for p in self.config.policy), default=1.0)

    # -- a check -------------------------------------------------------------------

    def check(self) -> float:
        """Read every signal once, feed each policy's controller, log each change
        of state; returns the seconds to the next check."""
        now = self.clock()
        policies = list(self.config.policy)
        try:
            shared = self._shared_readings(policies, now)
        except Exception as exc:  # the database went away: the worker's claims say so
            log.warning("health check failed: %s", exc)
            return self.interval
        for policy in policies:
            readings = {**shared, **self._policy_readings(policy, now)}
            self._feed(policy, readings, now)
        return self.interval

    def _shared_readings(self, policies: list[Policy], now: float) -> dict[str, float]:
        readings: dict[str, float] = {}
        engine = self.engine
        wants_lag = any(p.max_replica_lag or p.critical_replica_lag for p in policies)
        wants_backends = any(p.max_active_backends or p.critical_active_backends for p in policies)
        wants_foreground = any(p.nice_ratio and p.nice_when == "busy" for p in policies)
        wants_flow = any(
            p.max_flow_control or p.critical_flow_control or p.max_recv_queue for p in policies
        )
        with engine.transaction() as conn:
            schedules = engine.schedule_list(conn=conn)
            paused = {s.policy for s in schedules if s.paused and s.paused_by == STOPPED_BY}
            if wants_lag:
                readings["replica_lag"] = self._primary_lag(conn, now)
            if wants_backends:
                readings["active_backends"] = float(engine.health_active_backends(conn) or 0)
            if wants_foreground:
                foreground = engine.health_foreground_sessions(conn, max(self.interval, 1.0))
                if foreground is not None:
                    readings["foreground_sessions"] = float(foreground)
                self._foreground = (now, foreground)
            if wants_flow:
                readings.update(self._flow_control(engine.health_flow_control(conn), now))
        if wants_lag:
            for url in (r.url for r in self.config.replica):
                readings["replica_lag"] = max(readings["replica_lag"], self._standby_lag(url))
        with self._lock:
            resumed = self._paused - paused
            self._paused = paused
        for name in resumed:  # an operator resumed it: a critical stop ends
            state = self._policies.get(name)
            if state is not None and (change := state.controller.reset(now)) is not None:
                log.warning("policy resumed: %s", change.detail, extra={"policy": name})
        return readings

    def quiet(self) -> bool:
        """The database showed none of the application's sessions at work at
        the last check, no more than two intervals ago: a policy's nice_ratio
        has no one to rest for. Unknown (SQLite, a failed or late check): busy."""
        when, foreground = self._foreground
        return foreground == 0 and self.clock() - when <= 2 * self.interval

    def _primary_lag(self, conn: Any, now: float) -> float:
        """The largest lag of the standbys streaming from this primary."""
        position = self.engine.health_wal_position(conn)
        if position is None:
            return 0.0
        self._wal.append((now, position))
        while self._wal and self._wal[0][0] < now - WAL_HISTORY_SECONDS:
            self._wal.popleft()
        worst = 0.0
        for replica in self.engine.health_replicas(conn):
            if replica.replay_position is None and replica.visible:
                continue  # just connected: it reports its position within a second or ten
            if replica.replay_position is None:
                self._warn_once(
                    "pg_monitor",
                    "cannot read the standbys' replay positions: grant pg_monitor to the "
                    "worker's role (GRANT pg_monitor TO ...); holding the policies meanwhile",
                )
                return float("inf")
            behind = 0.0
            if replica.replay_position < position:
                first_past = next((t for t, lsn in self._wal if lsn > replica.replay_position), now)
                behind = now - first_past
            worst = max(worst, behind, replica.replay_lag or 0.0)
        return worst

    def _flow_control(self, flow: FlowControl | None, now: float) -> dict[str, float]:
        """The share of the time since the last check that the Galera cluster
        stood paused for flow control, and this node's receive queue. The first
        reading has nothing to compare with, nor one from another node (a
        reconnect through a proxy) or a restarted one: the pause reads 0 until
        the next. A server that is no Galera node reads nothing (the log says so,
        once): its limits never hold."""
        if flow is None:
            self._warn_once(
                "flow_control",
                "max_flow_control and max_recv_queue read a Galera cluster's wsrep status, "
                "and this server has none (wsrep is off): they hold nothing (remove them)",
            )
            return {}
        last, self._flow = self._flow, (now, flow.paused_ns, flow.node)
        paused = 0.0  # a first reading, or another node's (a proxy moved us): a new baseline
        if (
            last is not None
            and now > last[0]
            and last[2] == flow.node
            and flow.paused_ns >= last[1]
        ):
            paused = (flow.paused_ns - last[1]) / 1e9 / (now - last[0])
        return {"flow_control": min(1.0, paused), "recv_queue": float(flow.recv_queue)}

    def _standby_lag(self, url: str) -> float:
        engine = self._replicas.get(url)
        try:
            if engine is None:
                engine = self._replicas[url] = self._open_replica(url)
            with engine.transaction() as conn:
                lag = engine.health_replay_lag(conn)
        except Exception as exc:
            self._warn_once(url, f"cannot read replica {url}: {exc}; holding the policies")
            return float("inf")
        return 0.0 if lag is None else lag

    def _policy_readings(self, policy: Policy, now: float) -> dict[str, float]:
        readings: dict[str, float] = {}
        if policy.pause_file is not None:
            readings["pause_file"] = 1.0 if os.path.exists(policy.pause_file) else 0.0
        if policy.throttle_query is not None:
            readings["throttle_query"] = self._ask(policy, policy.throttle_query)
        if policy.canary is not None:
            readings["latency_ratio"] = self._latency_ratio(policy, now)
        if policy.max_dead_tuple_ratio is not None:
            with self.engine.transaction() as conn:
                stats = self.engine.table_vacuum_stats(conn, policy.table)
            readings["dead_tuple_ratio"] = stats.dead_ratio if stats else 0.0
        return readings

    def _ask(self, policy: Policy, query: str) -> float:
        """1 when the throttle query's first column is true, else 0; a query that
        fails holds (the log says why, once)."""
        try:
            with self.engine.transaction() as conn:
                row = conn.execute(query).fetchone()
        except Exception as exc:
            self._warn_once(f"q:{policy.name}", f"policy {policy.name!r}: throttle_query: {exc}")
            return 1.0
        if row is None:
            return 0.0
        value = next(iter(row.values()), None) if isinstance(row, dict) else row[0]
        return 1.0 if value else 0.0

    def _latency_ratio(self, policy: Policy, now: float) -> float:
        """The canary's recent tail over its idle tail (``latency_quantile``)."""
        assert policy.canary is not None
        samples = []
        try:
            for _ in range(CANARY_RUNS):  # each its own transaction, its commit timed
                began = time.perf_counter()
                with self.engine.transaction(statement=True) as conn:
                    cursor = conn.execute(policy.canary)
                    if cursor.description:
                        cursor.fetchall()
                samples.append(time.perf_counter() - began)
        except Exception as exc:
            self._warn_once(f"c:{policy.name}", f"policy {policy.name!r}: canary: {exc}")
            return float("inf")
        state = self._policies[policy.name]
        if not state.warm:
            state.warm = True
            return 1.0
        idle = not state.ends or now - state.ends[-1] > IDLE_AFTER_SECONDS
        if not state.idle or (idle and not state.controller.holding):
            state.idle.extend(samples)
            state.busy.clear()
            return 1.0
        state.busy.extend(samples)
        # The tail the application sees, where a median stays flat, against the
        # idle runs' p90 at most: a few slow idle runs (a worker's start, a
        # checkpoint) would make an idle p99 that no cleanup ever breaches.
        q = policy.latency_quantile
        baseline = quantile(state.idle, min(q, BASELINE_QUANTILE))
        return quantile(state.busy, q) / max(baseline, CANARY_FLOOR_SECONDS)

    def _feed(self, policy: Policy, readings: dict[str, float], now: float) -> None:
        state = self._policies[policy.name]
        state.readings = readings
        change = state.controller.observe(now, readings, self._running_rate(state, now))
        if change is None:
            return
        fields = {"policy": policy.name, "reason": change.reason, "rate": change.rate}
        if change.state == CRITICAL:
            log.error(
                "policy stopped: %s; `expiry resume %s` lifts it",
                change.detail,
                policy.name,
                extra=fields,
            )
            self._stop(policy.name, change.detail)
        elif change.reason is not None:
            log.warning("policy held: %s", change.detail, extra=fields)
        else:
            log.info("policy unheld: %s", change.detail, extra=fields)

    def _stop(self, name: str, why: str) -> None:
        """A critical reading: pause the policy for every process, audited."""
        try:
            with self.engine.transaction() as conn:
                self.engine.schedule_set_paused(name, True, by=STOPPED_BY, conn=conn)
                self.engine.audit_append(
                    conn,
                    AuditAction.POLICY_PAUSED,
                    actor="throttle",
                    policy=name,
                    detail={"reason": why},
                )
            with self._lock:
                self._paused.add(name)
        except Exception as exc:
            log.error("could not pause policy %s: %s", name, exc)

    def _running_rate(self, state: _Policy, now: float) -> float | None:
        """Windows a second over the last RATE_WINDOW_SECONDS, or since the
        first of them when the policy began running within that time."""
        recent = [t for t in state.ends if t > now - RATE_WINDOW_SECONDS]
        if not recent:
            return None
        return len(recent) / max(now - recent[0], self.interval)

    def _warn_once(self, topic: str, message: str) -> None:
        if topic not in self._warned:
            self._warned.add(topic)
            log.warning(message)

    # -- what the worker reads and tells --------------------------------------------

    def observe(self, policy: str, seconds: float) -> None:
        """A window of ``policy`` just ended after ``seconds``: its rate, and
        under a rate limit the earliest start of its next window."""
        now = self.clock()
        state = self._policies.get(policy)
        if state is None:
            return
        with self._lock:
            state.ends.append(now)
            state.last_start = max(state.last_start, now - seconds)

    def gates(self) -> Gates:
        """Held and stopped policies' queues, until the next check; a
        rate-limited one's until its next window may start (1 / rate after the
        latest began), one window a claim."""
        now = self.clock()
        resting: dict[str, float] = {}
        limits: dict[str, int] = {}
        with self._lock:
            for name, state in self._policies.items():
                queue, rate = policy_queue(name), state.controller.rate
                if name in self._paused or state.controller.holding:
                    resting[queue] = now + self.interval
                elif rate:
                    limits[queue] = 1
                    if (opens := state.last_start + 1.0 / rate) > now:
                        resting[queue] = opens
        return Gates(resting, limits)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Each policy's throttle as this process holds it (the workers' roll)."""
        now = self.clock()
        out = {}
        with self._lock:
            for name, state in self._policies.items():
                c = state.controller
                stopped = name in self._paused and not c.holding  # by another process
                out[name] = {
                    "state": CRITICAL if stopped else c.state,
                    "reason": "stopped by the throttle" if stopped else c.reason,
                    "rate": c.rate,
                    "throttled_seconds": {k: round(v, 3) for k, v in c.throttled_at(now).items()},
                    "detail": c.detail,
                    "held_seconds": None if (held := c.held_for(now)) is None else round(held, 3),
                    "readings": {
                        k: round(v, 4) if math.isfinite(v) else None
                        for k, v in state.readings.items()
                    },
                }
        return out

    def close(self) -> None:
        for engine in self._replicas.values():
            engine.close()
        self._replicas.clear()


def merge_throttles(workers: list[WorkerSeen]) -> dict[str, dict[str, Any]]:
    """Each policy's throttle over several workers' reports: the first state
    that is not open (held, stopped or paused) with its reading past the limit
    and how long it has held, the seconds held by reason summed, and the
    lowest rate limit."""
    out: dict[str, dict[str, Any]] = {}
    for worker in workers:
        for name, h in worker.health.items():
            mine = out.setdefault(
                name,
                {
                    "state": "open",
                    "reason": None,
                    "rate": None,
                    "throttled_seconds": {},
                    "detail": None,
                    "held_seconds": None,
                },
            )
            if h.get("state") not in (None, "open") and mine["state"] == "open":
                mine["state"], mine["reason"] = h.get("state"), h.get("reason")
                mine["detail"] = h.get("detail")  # "active_backends 6 > 3"
                if h.get("held_seconds") is not None:  # as of its report, then since
                    mine["held_seconds"] = round(h["held_seconds"] + worker.seen_seconds_ago, 3)
            if h.get("rate") is not None:
                mine["rate"] = min(h["rate"], mine["rate"] or h["rate"])
            for reason, seconds in (h.get("throttled_seconds") or {}).items():
                held = mine["throttled_seconds"]
                held[reason] = held.get(reason, 0.0) + seconds
    return out


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank): of 50 runs, p90 is the
    45th fastest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
