"""Prometheus metrics. State that lives in the database (jobs by state, the
watermark, rows affected, fires) is read at scrape time by a collector, so any
process serving /metrics reports the whole system. Timings observed while
running jobs (job duration, rows per window) are histograms of this process."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .app import App

log = logging.getLogger("expiry.metrics")

JOB_SECONDS = Histogram(
    "expiry_job_duration_seconds",
    "Time a job's transaction took, by handler and outcome",
    ["handler", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
WINDOW_ROWS = Histogram(
    "expiry_window_rows",
    "Rows deleted or archived per window transaction",
    ["policy"],
    buckets=(0, 1, 10, 100, 1000, 5000, 10000, 50000, 100000),
)


class ExpiryCollector(Collector):
    def __init__(self, app: App) -> None:
        self.app = app

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        engine = self.app.engine
        stats = self.app.queue.stats()
        jobs = GaugeMetricFamily(
            "expiry_jobs", "Jobs by queue and state", labels=["queue", "state"]
        )
        for queue, states in stats.by_state.items():
            for state, n in states.items():
                jobs.add_metric([queue, state], n)
        yield jobs
        oldest = GaugeMetricFamily(
            "expiry_oldest_due_job_age_seconds", "Age of the oldest due job", labels=["queue"]
        )
        for queue in stats.by_state:
            oldest.add_metric([queue], stats.oldest_due_seconds.get(queue, 0.0))
        yield oldest
        running = GaugeMetricFamily("expiry_running_claims", "Jobs running now", labels=["queue"])
        longest = GaugeMetricFamily(
            "expiry_running_claim_max_seconds", "Longest-held running claim", labels=["queue"]
        )
        for queue in stats.by_state:
            held = [h for q, _, h in stats.running if q == queue]
            running.add_metric([queue], len(held))
            longest.add_metric([queue], max(held, default=0.0))
        yield running
        yield longest
        retries = GaugeMetricFamily(
            "expiry_retrying_jobs", "Jobs retrying or dead, by last error kind", labels=["reason"]
        )
        for kind, n in stats.retries_by_kind.items():
            retries.add_metric([kind], n)
        yield retries
        yield GaugeMetricFamily(
            "expiry_dead_letter_jobs", "Dead-letter queue depth", value=stats.dead
        )
        with engine.transaction() as conn:
            totals = engine.policy_totals(conn=conn)
            audit = engine.audit_counts(conn=conn)
        rows = CounterMetricFamily(
            "expiry_rows_affected",
            "Rows deleted or archived, by policy",
            labels=["policy", "action"],
        )
        windows = CounterMetricFamily(
            "expiry_windows_applied", "Windows applied, by policy", labels=["policy"]
        )
        actions = {
            p.name: p.action for p in (self.app.cleanup.policies if self.app.cleanup else [])
        }
        for total in totals:
            rows.add_metric([total.policy, actions.get(total.policy, "delete")], total.rows)
            windows.add_metric([total.policy], total.windows)
        yield rows
        yield windows
        events = CounterMetricFamily(
            "expiry_events",
            "Audited events by action (fires, missed fires, duplicates, redrives...)",
            labels=["action", "policy"],
        )
        for count in audit:
            events.add_metric([count.action, count.policy or ""], count.n)
        yield events
        if self.app.cleanup is not None:
            mark = GaugeMetricFamily(
                "expiry_watermark_seconds",
                "Age of the oldest expired row still present (0: none)",
                labels=["policy"],
            )
            for policy in self.app.cleanup.policies:
                try:
                    mark.add_metric([policy.name], self.app.cleanup.watermark(policy.name))
                except Exception as exc:  # one broken policy must not hide the others
                    log.warning("watermark of %s failed: %s", policy.name, exc)
            yield mark


def render(app: App) -> tuple[bytes, str]:
    registry = CollectorRegistry()
    registry.register(ExpiryCollector(app))
    from prometheus_client import REGISTRY

    return generate_latest(registry) + generate_latest(REGISTRY), CONTENT_TYPE_LATEST
