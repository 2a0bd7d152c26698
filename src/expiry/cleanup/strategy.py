"""Which windows a run uses (key, time or block), chosen from the schema and,
when the schema does not decide, from the data as it is now."""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any

from ..errors import SchemaError
from ..timestamps import (
    Storage,
)
from ..types import Column, Index
from .sql import CANDIDATES, DENSITY
from .statements import Statements
from .windows import (
    BLOCKS,
    BLOCKS_CORRELATION,
    BLOCKS_SHARE,
    BLOCKS_SPAN,
    DENSE_ENOUGH,
    KEY,
    TIME,
    Strategy,
)

log = logging.getLogger("expiry.target")


class Strategies(Statements):
    """The choice of windows for a policy's table."""

    def choose(self, conn: Any, cutoff: datetime, storage: Storage | None = None) -> Strategy:
        """The run's windows: those the policy fixed; else key windows where
        the expired keys of an indexed integer key fill their range densely
        enough (DENSE_ENOUGH), measured from the data (or, where their range
        spans the whole table, estimated by the planner first), unless their
        range spans the whole table (_spans_table: block windows then); else block
        windows where the planner's statistics say a large share of the table is expired and
        the timestamp does not follow the heap (_blocks); else time windows
        (random or hash ids, ids not in time order, text and UUID keys, a few
        rows newly expired among many live ones)."""
        if self.fixed is not None:
            return self.fixed
        reason = self._not_key
        if reason is None:
            bounds, counted = self.bounds_counted(conn, cutoff, storage)
            if bounds is None:
                return Strategy(KEY, "nothing is expired now")
            lo, hi = bounds
            keys = hi - lo + 1
            cap = max(1, math.ceil(keys * DENSE_ENOUGH))
            k = self.policy.key
            # A range that spans the table takes block windows when dense: the
            # planner's estimate (one EXPLAIN) may say so before the exact count
            # (up to ``cap`` keys read through an index, about 40 ms a million).
            # Either decides only the windows' shape: each applies the predicate.
            whole = self._spans_table(conn, keys)
            if whole is not None and (estimate := self._estimate(conn, cutoff, storage)) >= cap:
                return Strategy(
                    BLOCKS,
                    f"expired keys are dense: about {estimate:,} of the {keys:,} {k} values "
                    f"{lo}..{hi} are candidates by the planner's estimate (at least "
                    f"{DENSE_ENOUGH:.0%}); {whole}",
                )
            n = counted
            if n is None:  # counted up to the cap: no more is needed
                n = int(self.run(conn, DENSITY, storage, cutoff=cutoff, page=cap).fetchone()["n"])
            if n >= cap:
                dense = (
                    f"expired keys are dense: {n:,}+ of the {keys:,} {k} values {lo}..{hi} "
                    f"are candidates (at least {DENSE_ENOUGH:.0%})"
                )
                if whole is not None:
                    return Strategy(BLOCKS, f"{dense}; {whole}")
                return Strategy(KEY, dense, bounds)
            reason = (
                f"expired keys are sparse: {n:,} candidates over the {keys:,} {k} values "
                f"{lo}..{hi} ({n / keys:.2%}); key windows would hold "
                f"{n * self.policy.window / keys:,.1f} rows each"
            )
        blocks = self._blocks(conn, cutoff, storage)
        if blocks is not None:
            return Strategy(BLOCKS, f"{reason}; {blocks}")
        return Strategy(TIME, reason)

    def _estimate(self, conn: Any, cutoff: datetime, storage: Storage | None) -> int:
        """The planner's estimate of the candidates now (one EXPLAIN; 0: none)."""
        storage = storage or self.storage
        params = self.engine.cutoff_params(storage, self.edge(cutoff))
        return self.engine.estimate_rows(conn, self.text(CANDIDATES, storage), params) or 0

    def _spans_table(self, conn: Any, keys: int) -> str | None:
        """Why block windows beat dense key windows, or None: where the engine
        has row addresses (PostgreSQL), the table is not partitioned and has
        been analyzed, and the expired key range spans at least BLOCKS_SPAN of
        its rows. The key windows would then read about every page, through
        the key's index; the block windows read the same pages in order
        without it."""
        p, engine = self.policy, self.engine
        if engine.block_span is None or (self.relation is not None and self.relation.partitioned):
            return None
        layout = engine.table_layout(conn, p.table, p.timestamp)
        if layout is None or layout.rows <= 0 or layout.correlation is None:
            return None
        if keys < BLOCKS_SPAN * layout.rows:
            return None
        return (
            f"their range spans the table ({keys:,} {p.key} values, about {layout.rows:,} rows), "
            "so windows read the table's blocks in order, without the key's index"
        )

    def _blocks(self, conn: Any, cutoff: datetime, storage: Storage | None) -> str | None:
        """Why block windows fit, or None: where the engine has row addresses
        (PostgreSQL), the table is not partitioned, at least BLOCKS_SHARE of its
        rows are candidates and its timestamp's physical correlation is under
        BLOCKS_CORRELATION, by the planner's statistics (none before an ANALYZE)."""
        p, engine = self.policy, self.engine
        if engine.block_span is None or (self.relation is not None and self.relation.partitioned):
            return None
        layout = engine.table_layout(conn, p.table, p.timestamp)
        if layout is None or layout.rows <= 0 or layout.correlation is None:
            return None
        share = self._estimate(conn, cutoff, storage) / layout.rows
        if share < BLOCKS_SHARE or abs(layout.correlation) >= BLOCKS_CORRELATION:
            return None
        return (
            f"about {share:.0%} of the table's rows are expired and {p.timestamp} does not "
            f"follow the heap (correlation {layout.correlation:+.2f}), so windows read "
            "the table's blocks in order"
        )

    def plan_blocks(
        self, conn: Any, cutoff: datetime, storage: Storage | None = None
    ) -> tuple[int, int]:
        """The table's pages now, and heap blocks per block window: about
        ``window`` candidates each, by the planner's estimate of the candidates
        over those pages (one read of the layout)."""
        p = self.policy
        layout = self.engine.table_layout(conn, p.table, p.timestamp)
        estimate = self._estimate(conn, cutoff, storage)
        pages = layout.pages if layout is not None else 0
        return pages, max(1, math.ceil(p.window * pages / max(estimate, 1)))

    def _fixed(self, by_name: dict[str, Column], warnings: list[str]) -> Strategy | None:
        """The windows the policy fixes; None: the data decides (choose). Also
        notes why key windows cannot be used, where the schema says so."""
        p = self.policy
        key, declared = by_name[p.key], by_name[p.key].type
        integer = self.engine.column_kind(declared) == "integer"
        self._not_key = None
        if not integer:
            self._not_key = f"key column {p.key!r} is {declared}, not an integer"
        elif not key.indexed:
            self._not_key = f"no index leads with key column {p.key!r}"
        if p.windows == "key":
            if not integer:
                raise SchemaError(
                    f'policy {p.name!r}: windows = "key" needs an integer key, and '
                    f"{p.key!r} is {declared} (fix: remove windows, or write "
                    'windows = "time": time windows take any key)'
                )
            if not key.indexed and (self.relation is None or self.relation.kind == "table"):
                warnings.append(
                    f"policy {p.name!r}: no index leads with key column {p.key!r}: every key "
                    f"window scans the table (fix: create index on {p.table} ({p.key}), "
                    'or remove windows = "key")'
                )
            return Strategy(KEY, 'windows = "key" in the policy')
        if p.windows == "blocks":
            partitioned = self.relation is not None and self.relation.partitioned
            if self.engine.block_span is None or partitioned:
                where = "a partitioned table" if partitioned else f"{self.engine.dialect}"
                raise SchemaError(
                    f'policy {p.name!r}: windows = "blocks" reads row addresses, which '
                    f'{where} does not offer (fix: remove windows, or write windows = "time")'
                )
            return Strategy(BLOCKS, 'windows = "blocks" in the policy')
        if p.windows == "time":
            return Strategy(TIME, 'windows = "time" in the policy')
        return None

    def _ties(self, indexes: list[Index]) -> str:
        """What orders rows sharing one timestamp in time windows, and its cost."""
        p = self.policy
        if self.tie != p.key:
            return (
                f"rows sharing one {p.timestamp} are ordered by the table's {self.tie}, "
                f"which every index on {p.timestamp} ends with"
            )
        pair = (p.timestamp, p.key)
        for index in indexes:
            if index.columns[:2] == pair:
                return f"rows sharing one {p.timestamp} are ordered by {p.key} (index {index.name})"
        relation = self.relation
        if relation is not None and relation.kind != "table":
            return (
                f"rows sharing one {p.timestamp} are ordered by {p.key}: read in order by an "
                f"index of the table the {relation.kind} reads that leads with "
                f"({p.timestamp}, {p.key}), sorted per timestamp value otherwise"
            )
        ends = relation is not None and p.key in (relation.rowid, relation.clustered)
        for index in indexes if ends else []:
            if index.columns[:1] == (p.timestamp,):
                return (
                    f"rows sharing one {p.timestamp} are ordered by {p.key} (index "
                    f"{index.name}, which ends with {p.key} as every index of the table does)"
                )
        return (
            f"rows sharing one {p.timestamp} are ordered by {p.key}, sorted per timestamp "
            f"value (no index on ({p.timestamp}, {p.key}); create index on {p.table} "
            f"({p.timestamp}, {p.key}) to read them in order)"
        )
