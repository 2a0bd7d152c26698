"""What a run would do now (`expiry plan`), and the watermark: the age of the
oldest expired row."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .. import defaults
from ..config import Config
from ..engines import Engine
from ..timestamps import Storage
from .planner import Planner
from .runs import Runs
from .target import Target
from .windows import BLOCKS, TIME, Position, Span

log = logging.getLogger("expiry.cleanup")


@dataclass(frozen=True)
class PlanPreview:
    policy: str
    cutoff: datetime
    candidates: int
    windows: int
    first_windows: list[Span]
    """The first windows."""
    storage: str = ""
    """How the timestamp column stores time and the zone its naive values are
    read in, with its oldest and newest values beside now, as this preview read it."""
    strategy: str = ""
    """The windows a run would use now, and why."""
    partitions: list[dict[str, Any]] = field(default_factory=list)
    """Whole partitions a run would drop or detach now, with their row estimates
    (their rows are counted among the candidates and windows too)."""
    warnings: list[str] = field(default_factory=list)
    """What looks wrong in how the column is read (values that look shifted by a zone)."""
    held: dict[str, int] = field(default_factory=dict)
    """Per hold on the table: the expired rows it keeps from this cutoff."""


class Previews(Planner):
    """The preview and the watermark of each policy."""

    def __init__(self, engine: Engine, config: Config, runs: Runs | None = None) -> None:
        super().__init__(engine, config, runs)
        self._watermarks: dict[str, float] = {}

    def watermark(self, name: str) -> float:
        """Seconds since the oldest expired row still present became expired (0:
        none). Raises SchemaError for a quarantined policy, quarantining one
        whose table changed since its check (last_watermark then says what was
        last read)."""
        policy, target = self.policy(name), self.target(name)
        with self._drift(name, job=False), self.engine.transaction() as conn:
            cutoff = self.engine.now(conn) - timedelta(seconds=policy.retain)
            oldest = target.oldest(conn, cutoff)
        seconds = max(0.0, (cutoff - oldest).total_seconds()) if oldest else 0.0
        with self._lock:
            self._watermarks[name] = seconds
        return seconds

    def last_watermark(self, name: str) -> float | None:
        """The policy's watermark as this process last read it (None: never)."""
        with self._lock:
            return self._watermarks.get(name)

    def kept_by_holds(self, name: str) -> dict[str, int]:
        """Per hold on the policy's table: the rows older than retain it keeps now."""
        policy, engine = self.policy(name), self.engine
        with engine.read_transaction() as conn:
            target = self.target(name, conn)
            return target.kept_by_holds(conn, engine.now(conn) - timedelta(seconds=policy.retain))

    def preview(self, name: str, cutoff: datetime | None = None, *, limit: int = 10) -> PlanPreview:
        """Dry-run: what a run would do, by the same statements, the policy's
        check included, in a transaction the database keeps from writing."""
        policy, engine = self.policy(name), self.engine
        with engine.read_transaction() as conn:
            target = self.target(name, conn)
            if cutoff is None:
                cutoff = engine.now(conn).replace(microsecond=0) - timedelta(seconds=policy.retain)
            target.storage = storage = target.detect(conn)  # as a run would read it now
            warnings = target.read_values(conn, storage)
            candidates = target.count(conn, cutoff)
            held = target.kept_by_holds(conn, cutoff)
            parts = target.expired_partitions(conn, cutoff, storage)
            strategy = target.choose(conn, cutoff, storage)
            spans = self._preview_spans(target, strategy.name, conn, cutoff, storage)
        return PlanPreview(
            name,
            cutoff,
            candidates,
            len(spans),
            spans[:limit],
            target.reading,
            strategy=strategy.describe(),
            partitions=[
                {
                    "partition": f"{x.schema}.{x.name}",
                    "rows_estimated": x.rows if x.rows >= 0 else None,  # None: never analyzed
                    "action": target.partition_mode(),
                }
                for x in parts
            ],
            warnings=warnings,
            held=held,
        )

    def _preview_spans(
        self, target: Target, strategy: str, conn: Any, cutoff: datetime, storage: Storage
    ) -> list[Span]:
        """Every window a run would plan now (rows in whole expired partitions
        included: the preview drops nothing)."""
        spans: list[Span] = []
        page = defaults.PLAN_PAGE
        if strategy == BLOCKS:
            if target.oldest(conn, cutoff, storage) is None:
                return spans
            pages, step = target.plan_blocks(conn, cutoff, storage)
            cursor: dict[str, Any] | None = {"after": 0, "max": pages, "step": step}
            while cursor is not None:
                more, cursor = self._blocks_page(target, cursor, page)
                spans += more
            return spans
        if strategy == TIME:
            after: Position | None = None
            while uppers := target.time_page(conn, cutoff, after, page, storage):
                for upper in uppers:
                    spans.append(Span.positions(after, upper))
                    after = upper
                if len(uppers) < page:
                    break
            return spans
        bounds = target.bounds(conn, cutoff, storage)
        if bounds:
            window, lo = target.policy.window, bounds[0] - 1
            while los := target.plan_page(conn, cutoff, lo, bounds[1], page, storage):
                spans += [Span.keys(x, x + window) for x in los]
                lo = los[-1] + window
                if len(los) < page:
                    break
        return spans
