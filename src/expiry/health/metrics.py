"""Prometheus metrics. State that lives in the database (jobs by state, the
watermark, rows affected, fires) is read at scrape time by a collector, so any
process serving /metrics reports the whole system. Timings observed while
running jobs are histograms of this process, each declared by the module that
observes it (the worker's job durations, the window's rows)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..config import Policy
from ..engines import Engine
from ..queue.jobs import Queue
from ..types import QueueStats
from . import roll
from .database import merge_throttles

log = logging.getLogger("expiry.metrics")


class Watermarks(Protocol):
    """What the collector reads of the policies (cleanup.Cleanup has it)."""

    @property
    def policies(self) -> list[Policy]: ...
    def watermark(self, name: str) -> float: ...
    def last_watermark(self, name: str) -> float | None: ...
    def open_run_ages(self) -> dict[str, float]: ...
    def awaiting_approval(self) -> dict[str, str]: ...

    broken: dict[str, str]


class Sources(Protocol):
    """Where the collector reads from (the App has them)."""

    @property
    def engine(self) -> Engine: ...
    @property
    def queue(self) -> Queue: ...
    @property
    def cleanup(self) -> Watermarks | None: ...


OTHER = "other"
"""The queue label of every queue not named (labels stay bounded whatever
queue names callers choose)."""


class ExpiryCollector(Collector):
    def __init__(
        self,
        engine: Engine,
        queue: Queue,
        cleanup: Watermarks | None,
        named: Callable[[str], bool] = lambda queue: True,
    ) -> None:
        self.engine, self.queue, self.cleanup = engine, queue, cleanup
        self.named = named
        """Whether a queue gets a label of its own; the rest are summed as "other"."""

    def _label(self, queue: str) -> str:
        return queue if self.named(queue) else OTHER

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self.queue.stats()
        yield from self._queue(stats)
        yield from self._ledger()
        yield from self._liveness(stats)
        yield self._crons()
        if self.cleanup is not None:
            yield self._watermarks(self.cleanup)
            yield self._quarantined(self.cleanup)
            yield from self._open_runs(self.cleanup)
            yield from self._throttles()
            yield from self._vacuum(self.cleanup)

    def _crons(self) -> GaugeMetricFamily:
        """Each cron target's latest call: failed or not (a failing target's
        calls give way to its next fire instead of dead-lettering: this says it)."""
        gauge = GaugeMetricFamily(
            "expiry_cron_target_failing",
            "1 while the cron target's latest call failed (an error or HTTP status >= 400), else 0",
            labels=["target"],
        )
        for target in self.engine.cron_list():
            calls = self.engine.cron_calls(target.name, 1)
            gauge.add_metric([target.name], 1.0 if calls and calls[0].error else 0.0)
        return gauge

    def _liveness(self, stats: QueueStats) -> Iterator[GaugeMetricFamily]:
        """The live workers, and each policy's due work that none of them serves
        (alert on either: nothing cleans until a worker starts)."""
        live = roll.alive(self.engine.worker_list())
        yield GaugeMetricFamily(
            "expiry_workers_alive",
            "Worker processes seen on the roll lately (0: nothing claims jobs)",
            value=len(live),
        )
        if self.cleanup is None:
            return
        names = [p.name for p in self.cleanup.policies]
        unserved = roll.unserved(names, live, stats)
        gauge = GaugeMetricFamily(
            "expiry_policy_unserved",
            "1 while the policy has due jobs and no live worker works its queue, else 0",
            labels=["policy"],
        )
        for name in names:
            gauge.add_metric([name], 1.0 if name in unserved else 0.0)
        yield gauge
        schedules = {s.policy: s for s in self.engine.schedule_list()}
        late = roll.unscheduled(self.cleanup.policies, schedules, self.engine.now())
        gauge = GaugeMetricFamily(
            "expiry_policy_unscheduled",
            "1 while the policy's schedule has a fire due over two minutes ago that no "
            "scheduler took (or none ever registered it), else 0; scheduled policies only",
            labels=["policy"],
        )
        for policy in self.cleanup.policies:
            if policy.schedule is not None:
                broken = policy.name in self.cleanup.broken
                gauge.add_metric([policy.name], 1.0 if policy.name in late and not broken else 0.0)
        yield gauge

    def _throttles(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Held time by reason and the rate limit, as the live workers report them."""
        merged = merge_throttles(roll.alive(self.engine.worker_list()))
        held = CounterMetricFamily(
            "expiry_throttled_seconds",
            "Seconds a policy's windows were held, by reason (replica_lag, active_backends, "
            "latency_ratio, dead_tuple_ratio, throttle_query, pause_file)",
            labels=["policy", "reason"],
        )
        rate = GaugeMetricFamily(
            "expiry_throttle_rate_limit",
            "Windows a second the throttle lets a policy start (0: no limit)",
            labels=["policy"],
        )
        holding = GaugeMetricFamily(
            "expiry_throttle_holding",
            "1 while a policy's windows are held (held, stopped or paused), else 0",
            labels=["policy"],
        )
        for name, t in merged.items():
            for reason, seconds in t["throttled_seconds"].items():
                held.add_metric([name, reason], seconds)
            rate.add_metric([name], t["rate"] or 0.0)
            holding.add_metric([name], 0.0 if t["state"] == "open" else 1.0)
        yield from (held, rate, holding)

    def _vacuum(self, cleanup: Watermarks) -> Iterator[GaugeMetricFamily]:
        """Each policy's table's dead tuples and the age of its last vacuum (PostgreSQL)."""
        dead = GaugeMetricFamily(
            "expiry_table_dead_tuples", "Dead tuples in the policy's table", labels=["policy"]
        )
        age = GaugeMetricFamily(
            "expiry_table_last_vacuum_age_seconds",
            "Seconds since the policy's table was last vacuumed (manually or automatically)",
            labels=["policy"],
        )
        with self.engine.transaction() as conn:
            now = self.engine.now(conn)
            for policy in cleanup.policies:
                try:
                    with self.engine.atomic(conn):
                        stats = self.engine.table_vacuum_stats(conn, policy.table)
                except Exception:  # quarantined: reported by expiry_policy_quarantined
                    continue
                if stats is None:
                    continue
                dead.add_metric([policy.name], stats.dead_tuples)
                if stats.last_vacuum is not None:
                    age.add_metric([policy.name], (now - stats.last_vacuum).total_seconds())
        yield from (dead, age)

    def _queue(self, stats: QueueStats) -> Iterator[GaugeMetricFamily]:
        """Jobs by state, the oldest due job, claims held, retries, the dead letters."""
        jobs = GaugeMetricFamily(
            "expiry_jobs", "Jobs by queue and state", labels=["queue", "state"]
        )
        oldest = GaugeMetricFamily(
            "expiry_oldest_due_job_age_seconds", "Age of the oldest due job", labels=["queue"]
        )
        running = GaugeMetricFamily("expiry_running_claims", "Jobs running now", labels=["queue"])
        longest = GaugeMetricFamily(
            "expiry_running_claim_max_seconds", "Longest-held running claim", labels=["queue"]
        )
        counts: dict[str, dict[str, int]] = {}
        ages: dict[str, float] = {}
        for queue, states in stats.by_state.items():
            label = self._label(queue)
            for state, n in states.items():
                counts.setdefault(label, {})
                counts[label][state] = counts[label].get(state, 0) + n
            ages[label] = max(ages.get(label, 0.0), stats.oldest_due_seconds.get(queue, 0.0))
        for label, states in counts.items():
            for state, n in states.items():
                jobs.add_metric([label, state], n)
            oldest.add_metric([label], ages[label])
            held = [h for q, _, h in stats.running if self._label(q) == label]
            running.add_metric([label], len(held))
            longest.add_metric([label], max(held, default=0.0))
        retries = GaugeMetricFamily(
            "expiry_retrying_jobs", "Jobs retrying or dead, by last error kind", labels=["reason"]
        )
        for kind, n in stats.retries_by_kind.items():
            retries.add_metric([kind], n)
        dead = GaugeMetricFamily(
            "expiry_dead_letter_jobs", "Dead-letter queue depth", value=stats.dead
        )
        yield from (jobs, oldest, running, longest, retries, dead)

    def _ledger(self) -> Iterator[CounterMetricFamily]:
        """Rows and windows per policy, from the ledger; audited events by action."""
        with self.engine.transaction() as conn:
            totals = self.engine.policy_totals(conn=conn)
            audit = self.engine.audit_counts(conn=conn)
        rows = CounterMetricFamily(
            "expiry_rows_affected",
            "Rows deleted or archived, by policy",
            labels=["policy", "action"],
        )
        windows = CounterMetricFamily(
            "expiry_windows_applied", "Windows applied, by policy", labels=["policy"]
        )
        actions = {p.name: p.action for p in (self.cleanup.policies if self.cleanup else [])}
        for total in totals:
            rows.add_metric([total.policy, actions.get(total.policy, "delete")], total.rows)
            windows.add_metric([total.policy], total.windows)
        events = CounterMetricFamily(
            "expiry_events",
            "Audited events by action (fires, missed fires, duplicates, redrives...)",
            labels=["action", "policy"],
        )
        for count in audit:
            events.add_metric([count.action, count.policy or ""], count.n)
        yield from (rows, windows, events)

    @staticmethod
    def _watermarks(cleanup: Watermarks) -> GaugeMetricFamily:
        mark = GaugeMetricFamily(
            "expiry_watermark_seconds",
            "Age of the oldest expired row still present (0: none)",
            labels=["policy"],
        )
        for policy in cleanup.policies:
            try:
                mark.add_metric([policy.name], cleanup.watermark(policy.name))
            except Exception as exc:  # one broken policy must not hide the others
                # The series stays: the value last read, NaN if none was (an
                # alert on the watermark keeps its series; quarantine has its own).
                last = cleanup.last_watermark(policy.name)
                mark.add_metric([policy.name], math.nan if last is None else last)
                log.warning("watermark of %s failed: %s", policy.name, exc)
        return mark

    @staticmethod
    def _open_runs(cleanup: Watermarks) -> Iterator[GaugeMetricFamily]:
        """Each policy's oldest open run's age, and whether it is past stall_after."""
        age = GaugeMetricFamily(
            "expiry_oldest_open_run_age_seconds",
            "Age of the policy's oldest run not yet finished (0: none open)",
            labels=["policy"],
        )
        stalled = GaugeMetricFamily(
            "expiry_run_stalled",
            "1 while a run of the policy has been open longer than its stall_after, else 0",
            labels=["policy"],
        )
        awaiting = GaugeMetricFamily(
            "expiry_run_awaiting_approval",
            "1 while a run of the policy (approve = true) awaits its approval, else 0",
            labels=["policy"],
        )
        ages = cleanup.open_run_ages()
        waiting = cleanup.awaiting_approval()
        for policy in cleanup.policies:
            seconds = ages.get(policy.name, 0.0)
            age.add_metric([policy.name], seconds)
            stalled.add_metric([policy.name], 1.0 if seconds > policy.stall_seconds else 0.0)
            if policy.approve:
                awaiting.add_metric([policy.name], 1.0 if policy.name in waiting else 0.0)
        yield from (age, stalled, awaiting)

    @staticmethod
    def _quarantined(cleanup: Watermarks) -> GaugeMetricFamily:
        """1 for a policy whose check failed (read after the watermarks, which
        check each policy again), else 0."""
        gauge = GaugeMetricFamily(
            "expiry_policy_quarantined",
            "1 while a policy fails its schema check (the others run); 0 otherwise",
            labels=["policy"],
        )
        broken = dict(cleanup.broken)
        for policy in cleanup.policies:
            gauge.add_metric([policy.name], 1.0 if policy.name in broken else 0.0)
        return gauge


def render(sources: Sources, named: Callable[[str], bool] = lambda q: True) -> tuple[bytes, str]:
    """The exposition text: the database's state (queues ``named`` by name, the
    rest summed as "other") and this process's histograms."""
    registry = CollectorRegistry()
    registry.register(ExpiryCollector(sources.engine, sources.queue, sources.cleanup, named))
    return generate_latest(registry) + generate_latest(REGISTRY), CONTENT_TYPE_LATEST
