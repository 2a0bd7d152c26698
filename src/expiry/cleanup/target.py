"""The statements expiry runs on a policy's table: the one place Python builds
SQL. Each statement is written once below, for every engine; identifiers from
the config are validated (config.check_identifier) and quoted by the engine
(the driver's API), values are always bound parameters in the engine's style,
and the ``where`` predicate (trusted config only) is wrapped in parentheses.
What differs by dialect (quoting, binding, the time predicate of a storage,
the catalog, how a window runs) is the engine's: engines/*/tables.py.

The retention predicate ``{ts} < cutoff AND (where)`` is evaluated by the
database when the statement runs, so a row revived after planning survives.
Dry-run, planning, the watermark and the delete all use the same predicate.

A window is applied and booked in the ledger together, by one engine
operation (Engine.window_apply): its delete (or move) is guarded by the
ledger, then the ledger row is inserted with the count of rows it affected.
"""

from __future__ import annotations

import logging
import math
from datetime import date, datetime, timedelta
from typing import Any

from ..config import Policy
from ..engines.base import Engine
from ..errors import SchemaError
from ..times import format_time
from ..timestamps import (
    NUMERIC_RANGES,
    UNIX_EPOCH,
    UTC_ZONES,
    Storage,
    instant,
    naive_type,
    numeric_format,
)
from ..types import Column, Index, Job, Partition, Reference, Relation, WindowApply
from .windows import (
    BLOCKS,
    BLOCKS_CORRELATION,
    BLOCKS_SHARE,
    DENSE_ENOUGH,
    KEY,
    TIME,
    Position,
    Span,
    Strategy,
)

log = logging.getLogger("expiry.target")

# -- the statements ----------------------------------------------------------------

# The retention predicate: the index bound and the storage's guard (see
# timestamps.py), then the user's where in parentheses. {bound} and {guard}
# are the engine's for the column's storage (Engine.time_predicate).
PREDICATE = "{ts} < {bound}{guard}"

BOUNDS = """
select (select {key} from {table} where {pred} order by {key} limit 1) as lo,
       (select {key} from {table} where {pred} order by {key} desc limit 1) as hi
"""

# The windows of one planning page: a loose index scan that jumps from each
# window to the next key that is still a candidate, so empty stretches of the
# key space cost one index probe, not one job.
PLAN_PAGE = """
with recursive w(lo, n) as (
    select cast((select {key} from {table}
                 where {key} > {p_after} and {key} <= {p_max} and {pred}
                 order by {key} limit 1) - 1 as {integer}), 1
    union all
    select cast((select {key} from {table}
                 where {key} > w.lo + {p_window} and {key} <= {p_max} and {pred}
                 order by {key} limit 1) - 1 as {integer}), w.n + 1
    from w where w.lo is not null and w.n < {p_page}
)
select lo from w where lo is not null order by lo
"""

# The same scan one step at a time, where a recursive statement would cost more
# (Engine.recursive_scans): the first candidate key after a window's start.
NEXT_KEY = """
select {key} as k from {table}
where {key} > {p_after} and {key} <= {p_max} and {pred}
order by {key} limit 1
"""

# A window's range ({span} below): two integer keys, or two positions in the
# timestamp's order, (timestamp, tie), compared as row values. The plain
# timestamp bounds beside them let any index on the timestamp serve the scan.
SPANS = {
    "key": "{key} > {p_lo} and {key} <= {p_hi}",
    "time": "{ts} >= {p_lo_ts} and ({ts}, {tie}) > ({p_lo_ts}, {p_lo_tie})"
    " and {ts} <= {p_hi_ts} and ({ts}, {tie}) <= ({p_hi_ts}, {p_hi_tie})",
    # a run's first time window, and the planner's first page: no lower bound
    "time-first": "{ts} <= {p_hi_ts} and ({ts}, {tie}) <= ({p_hi_ts}, {p_hi_tie})",
    "time-after": "{ts} >= {p_lo_ts} and ({ts}, {tie}) > ({p_lo_ts}, {p_lo_tie})",
    "all": "1 = 1",
}

WINDOW = "{span} and {pred}"

# The ledger guard: a window whose job key is booked deletes nothing. Read in
# the statement's snapshot, it sees every ledger row committed before the
# statement began, so a redelivery after commit is a no-op even when rows of the
# window expired since. On PostgreSQL deliveries of one window first take turns
# on a transaction lock of its key (inside expiry.window_apply, before the
# delete takes its snapshot), so the guard sees the earlier one's commit. Should
# one still pass the guard while another is uncommitted (SQLite serializes
# writers; this is belt and braces), its ledger insert waits for the other's
# commit and finds the key taken, and AlreadyApplied rolls back whatever its
# delete took.
UNBOOKED = WINDOW + " and not exists (select 1 from {ledger} where {ledger_key} = {p_key})"

# The count comes back as the statement's row count, never by a RETURNING: that
# would project and keep every row taken, which costs more than the delete.
DELETE = "delete from {table} where " + UNBOOKED

# PostgreSQL moves rows in one statement; SQLite (no DELETE in a CTE) copies then
# deletes inside its single-writer transaction, and checks the two counts agree.
ARCHIVE_MOVE = (
    """
with moved as (delete from {table} where """
    + UNBOOKED
    + """ returning {columns})
insert into {archive} ({columns}) select {columns} from moved
"""
)
ARCHIVE_COPY = "insert into {archive} ({columns}) select {columns} from {table} where " + UNBOOKED

COUNT = "select count(*) as n from {table} where {pred}"

# Time windows: one planning page reads the next ``page`` candidates in the
# (timestamp, tie) order after the page's start and returns every window-th
# position (and the last), each the upper bound of a window. Its cost follows
# the candidates, never the key range.
TIME_PAGE = """
select t, k from (
    select t, k, row_number() over (order by t, k) as n, count(*) over () as total
    from (select {ts} as t, {tie} as k from {table} where {span} and {pred}
          order by {ts}, {tie} limit {p_page}) as c
) as r
where n - n {div} {p_window} * {p_window} = 0 or n = total  -- every window-th, and the last
order by t, k
"""

# The candidate at a given place of a window, in the window's order: where a
# paced window stops, or where a window blocked by a foreign key is halved.
NTH_KEY = (
    "select {key} as k from {table} where {span} and {pred} order by {key} limit 1 offset {p_skip}"
)
NTH_TIME = (
    "select {ts} as t, {tie} as k from {table} where {span} and {pred}"
    " order by {ts}, {tie} limit 1 offset {p_skip}"
)
NTH_BLOCK = (
    "select {block_of_row} as k from {table} where {span} and {pred}"
    " order by ctid limit 1 offset {p_skip}"
)
COUNT_SPAN = "select count(*) as n from {table} where {span} and {pred}"

# Which candidates of a window another transaction holds: after a window waited
# out its lock_timeout, its candidates in the window's order (ORDERED) beside
# those this transaction can lock at once (FREE: the free ones, locked on the
# way for the delete that follows; a held one is skipped, never waited for).
# Around the held rows the window is cut at once, where halving it would wait
# out one lock_timeout a halving (cleanup/service.py's _around_held).
_POSITIONS = {
    KEY: ("{key} as k", "{key}"),
    BLOCKS: ("{block_of_row} as k", "ctid"),
    TIME: ("{ts} as t, {tie} as k", "{ts}, {tie}"),
}
ORDERED = {
    strategy: f"select {columns} from {{table}} where {{span}} and {{pred}} order by {order}"
    for strategy, (columns, order) in _POSITIONS.items()
}
FREE = {
    strategy: f"select {columns} from {{table}} where {{span}} and {{pred}} for update skip locked"
    for strategy, (columns, _) in _POSITIONS.items()
}

# The candidates, as the planner estimates them (never run).
CANDIDATES = "select 1 from {table} where {pred}"

# How densely the expired rows fill their key range: candidates, counted up to
# a cap (the share of the range that key windows need to be worth it).
DENSITY = "select count(*) as n from (select 1 from {table} where {pred} limit {p_page}) as c"

# A partition's range ends no later than the cutoff: every row it can hold is
# expired. Compared by the database, in the column's type, with the predicate's
# bound (a naive column's wall-clock bound in its zone).
PARTITION_EXPIRED = "select {p_upper} <= {bound} as expired"
OLDEST = "select min({ts}) as oldest from {table} where {pred}"

EXPLAIN_WHERE = "select 1 from {table} where {where}"

# How the column stores time, read from every row the policy covers (never one
# row): per storage class and ISO spelling, the count and the range. For
# engines whose values carry their own storage class (SQLite); a full scan of
# the timestamp index, once per run and per check of an ISO text column.
STORAGE_CLASSES = """
select typeof({ts}) as storage,
       case when typeof({ts}) <> 'text' then ''
            when julianday({ts}) is null then '?'
            when length({ts}) = 10 then 'date'
            else substr({ts}, 11, 1) || '|' || case
                when {ts} like '%Z' then 'Z'
                when substr({ts}, -6, 1) in ('+', '-') and substr({ts}, -3, 1) = ':'
                    then substr({ts}, -6)
                else '' end
       end as spelling,
       count(*) as n, min({ts}) as lo, max({ts}) as hi
from {table} where {ts} is not null and ({where})
group by 1, 2
"""
# The two ends of the column in the index's order. SQLite sorts every number
# before every text and every text before every blob, so two numbers at the
# ends mean numbers only, read in two index probes; otherwise the scan above.
STORAGE_ENDS = """
select (select {ts} from {table} where {ts} is not null and ({where})
        order by {ts} limit 1) as lo,
       (select {ts} from {table} where {ts} is not null and ({where})
        order by {ts} desc limit 1) as hi
"""
# Integer columns of a typed engine (PostgreSQL): the range tells the unit.
STORAGE_RANGE = (
    "select min({ts}) as lo, max({ts}) as hi from {table} where {ts} is not null and ({where})"
)

STORAGE_ABOVE_ZERO = "select min({ts}) as lo from {table} where {ts} > 0 and ({where})"

# The run's sample check: candidates read by the very predicate the windows
# use, from both ends of the timestamp order and from the first keys.
SAMPLE = """
select * from (select {key} as k, {ts} as v from {table} where {pred}
               order by {ts} limit {p_page}) as oldest
union all
select * from (select {key} as k, {ts} as v from {table} where {pred}
               order by {ts} desc limit {p_page}) as newest
union all
select * from (select {key} as k, {ts} as v from {table} where {pred}
               order by {key} limit {p_page}) as first_keys
"""

SAMPLE_SIZE = 20
"""Candidates read from each end by the sample check (three reads of this many)."""

DEADLINE_WORDS = ("expir", "until", "deadline", "due", "valid", "end", "ttl", "next", "sched")
"""A timestamp column whose name holds one of these is a deadline, which may
lie in the future; any other is taken for a creation or activity time, which
may not (Target._shifted)."""

SHIFT_MIN_SECONDS = 15 * 60
SHIFT_MAX_SECONDS = 14 * 3600 + 15 * 60
"""A creation or activity time this far ahead of the database clock looks
written in another zone (no zone is more than 14 hours from UTC); less is
taken for clock skew."""


class Target:
    """A policy's table in one engine's dialect."""

    def __init__(self, engine: Engine, policy: Policy) -> None:
        self.engine = engine
        self.policy = policy
        self.columns: list[str] = []
        self.storage = Storage("native")
        """How the timestamp column stores time, as the last check read it. A run
        reads it again when it plans and carries it in its jobs' payloads."""
        self.checked = False
        self.reading = ""
        """How the check read the timestamp column: its storage, the zone of its
        naive values, its oldest and newest values beside the database clock."""
        self._naive = False
        self.types: dict[str, str] = {}
        """Each column's declared type, as the catalog writes it."""
        self.tie = policy.key
        """What orders rows of one timestamp in time windows: the key, or the
        row id every index ends with (Relation.rowid)."""
        self.fixed: Strategy | None = None
        """The windows the schema or the policy decides; None: the data decides
        (choose), run by run."""
        self.notes: list[str] = []
        """What the check found that is not a warning: the strategy, the ties,
        the partitions, the tables that reference this one."""
        self.relation: Relation | None = None
        self._not_key: str | None = None
        self._declared = ""
        self._texts: dict[tuple[str, str, str, bool], str] = {}
        self.restricting: list[Reference] = []
        """Other tables' foreign keys to this one that refuse a referenced row's
        delete (RESTRICT, NO ACTION): what ``skip_referenced`` steps around."""

    # -- building statements -----------------------------------------------------

    def statement(
        self,
        template: str,
        *,
        storage: Storage | None = None,
        span: str = "key",
        unreferenced: bool = False,
    ) -> str:
        """The statement of ``template`` for this policy, ``storage`` (default:
        the checked one) and a window ``span`` (SPANS), in the engine's quoting
        and parameter style; ``unreferenced``: its candidates exclude the rows
        that other tables' rows reference (``skip_referenced``)."""
        p, engine = self.policy, self.engine
        bound, guard = engine.time_predicate(storage or self.storage)
        pred = PREDICATE.format(ts="{ts}", bound=bound, guard=guard)
        pred += " and ({where})" if p.where else ""
        pred += self._unreferenced() if unreferenced else ""
        names = ["cutoff", "exact", "after", "max", "window", "page", "lo", "hi", "key", "skip"]
        ts_type, tie_type = self.types.get(p.timestamp, ""), self.types.get(self.tie, "")
        typed = {
            "p_lo_ts": engine.placeholder_as("lo_ts", ts_type),
            "p_hi_ts": engine.placeholder_as("hi_ts", ts_type),
            "p_upper": engine.placeholder_as("upper", ts_type),
            "p_lo_tie": engine.placeholder_as("lo_tie", tie_type),
            "p_hi_tie": engine.placeholder_as("hi_tie", tie_type),
        }
        spans = SPANS | {"blocks": engine.block_span or "0 = 1"}
        text = template.replace("{span}", spans[span]).replace("{pred}", pred)
        text = text.replace("{bound}", bound)
        text = text.replace("{block_of_row}", engine.block_of_row or "null")
        return text.format(
            table=engine.quote(p.table),
            archive=engine.quote(p.archive_table or "_"),
            ledger=engine.ledger_table,
            ledger_key=engine.quote("key"),
            integer=engine.integer_type,
            div=engine.integer_division,
            key=engine.quote(p.key),
            ts=engine.quote(p.timestamp),
            tie=engine.quote(self.tie),
            columns=", ".join(engine.quote(c) for c in self.columns),
            where=engine.escape(p.where) if p.where else "1 = 1",
            **{f"p_{n}": engine.placeholder(n) for n in names},
            **typed,
        )

    def text(
        self,
        template: str,
        storage: Storage | None = None,
        span: str = "key",
        unreferenced: bool = False,
    ) -> str:
        """The statement, built once per template, storage and span (the schema
        check builds them afresh, as the columns may have changed)."""
        storage = storage or self.storage
        compares = "{pred}" in template or "{bound}" in template
        cache = (template, storage.token if compares else "", span, unreferenced)
        text = self._texts.get(cache)
        if text is None:
            text = self._texts[cache] = self.statement(
                template, storage=storage, span=span, unreferenced=unreferenced
            )
        return text

    @property
    def skips_referenced(self) -> bool:
        """Whether a window can step around the rows other tables reference
        (``apply(unreferenced=True)``): some other table's foreign key refuses
        their delete. A table's reference to itself is left to the split
        (MySQL refuses a DELETE whose subquery reads the table it deletes from)."""
        return bool(self._others())

    def _others(self) -> list[Reference]:
        own = self.policy.table.split(".")[-1].lower()
        return [r for r in self.restricting if r.table.split(".")[-1].lower() != own]

    def _unreferenced(self) -> str:
        """The candidates' clause that leaves out the rows other tables'
        RESTRICT or NO ACTION foreign keys reference, in the engine's quoting
        (its braces doubled: the statement's format() undoes them)."""
        q, table = self.engine.quote, self.engine.quote(self.policy.table)
        clauses = []
        for ref in self._others():
            match = " and ".join(
                f"r.{q(c)} = {table}.{q(r)}"
                for c, r in zip(ref.columns, ref.referenced, strict=True)
            )
            clauses.append(f" and not exists (select 1 from {q(ref.table)} r where {match})")
        return "".join(clauses).replace("{", "{{").replace("}", "}}")

    def edge(self, cutoff: datetime) -> datetime:
        """The bound every comparison with a run's cutoff uses: the cutoff itself
        (expired means ``ts < cutoff``), or, for a policy with ``inclusive``,
        a microsecond past it (``ts <= cutoff``: every storage holds whole
        microseconds or coarser, so the two are the same rows)."""
        return cutoff + timedelta(microseconds=1) if self.policy.inclusive else cutoff

    def run(
        self,
        conn: Any,
        template: str,
        storage: Storage | None = None,
        span: str = "key",
        **params: Any,
    ) -> Any:
        storage = storage or self.storage
        if "cutoff" in params:
            params.update(self.engine.cutoff_params(storage, self.edge(params["cutoff"])))
        return conn.execute(self.text(template, storage, span), params)

    # -- the operations ----------------------------------------------------------

    def bounds(
        self, conn: Any, cutoff: datetime, storage: Storage | None = None
    ) -> tuple[int, int] | None:
        row = self.run(conn, BOUNDS, storage, cutoff=cutoff).fetchone()
        if row is None or row["lo"] is None:
            return None
        return int(row["lo"]), int(row["hi"])

    def plan_page(
        self,
        conn: Any,
        cutoff: datetime,
        after: int,
        max_key: int,
        page: int,
        storage: Storage | None = None,
    ) -> list[int]:
        """Lower bounds of up to ``page`` windows (lo, lo + window] after ``after``."""
        if not self.engine.recursive_scans:
            return self._plan_stepwise(conn, cutoff, after, max_key, page, storage)
        rows = self.run(
            conn,
            PLAN_PAGE,
            storage,
            cutoff=cutoff,
            after=after,
            max=max_key,
            window=self.policy.window,
            page=page,
        ).fetchall()
        return [int(row["lo"]) for row in rows]

    def _plan_stepwise(
        self,
        conn: Any,
        cutoff: datetime,
        after: int,
        max_key: int,
        page: int,
        storage: Storage | None,
    ) -> list[int]:
        """PLAN_PAGE's windows, one index probe (and round trip) each."""
        lows: list[int] = []
        while len(lows) < page:
            row = self.run(conn, NEXT_KEY, storage, cutoff=cutoff, after=after, max=max_key)
            found = row.fetchone()
            if found is None:
                break
            lows.append(int(found["k"]) - 1)
            after = lows[-1] + self.policy.window
        return lows

    def time_page(
        self,
        conn: Any,
        cutoff: datetime,
        after: Position | None,
        windows: int,
        storage: Storage | None = None,
    ) -> list[Position]:
        """Upper bounds of up to ``windows`` time windows after ``after`` (None:
        from the first candidate), each holding ``window`` candidates (the last
        may hold fewer)."""
        window = self.policy.window
        params: dict[str, Any] = {"cutoff": cutoff, "page": windows * window, "window": window}
        if after is not None:
            params.update(lo_ts=after[0], lo_tie=after[1])
        span = "all" if after is None else "time-after"
        rows = self.run(conn, TIME_PAGE, storage, span, **params).fetchall()
        return [self._position(row["t"], row["k"]) for row in rows]

    def nth(
        self, conn: Any, cutoff: datetime, span: Span, skip: int, storage: Storage | None = None
    ) -> Any:
        """The key (key windows) or position (time windows) of the candidate
        after ``skip`` others in ``span``'s order; None when it holds no more."""
        if span.strategy in (KEY, BLOCKS):
            params = self._span_params(span) | {"cutoff": cutoff, "skip": skip}
            nth = NTH_KEY if span.strategy == KEY else NTH_BLOCK
            row = self.run(conn, nth, storage, _span_name(span), **params).fetchone()
            return None if row is None else int(row["k"])
        params = self._span_params(span) | {"cutoff": cutoff, "skip": skip}
        row = self.run(conn, NTH_TIME, storage, _span_name(span), **params).fetchone()
        return None if row is None else self._position(row["t"], row["k"])

    def count_span(
        self, conn: Any, cutoff: datetime, span: Span, storage: Storage | None = None
    ) -> int:
        """Candidates in ``span`` now."""
        params = self._span_params(span) | {"cutoff": cutoff}
        return int(self.run(conn, COUNT_SPAN, storage, _span_name(span), **params).fetchone()["n"])

    def held(
        self, conn: Any, cutoff: datetime, span: Span, storage: Storage | None = None
    ) -> tuple[list[Any], list[Any]]:
        """``span``'s candidates in its order, and those of them another
        transaction holds locked now (never waited for): the others are locked
        by ``conn``'s transaction on the way. Where the engine can skip a
        locked row (``for update skip locked``: PostgreSQL, MariaDB)."""
        params = self._span_params(span) | {"cutoff": cutoff}
        name = _span_name(span)
        ordered = self.run(conn, ORDERED[span.strategy], storage, name, **params).fetchall()
        free = self.run(conn, FREE[span.strategy], storage, name, **params).fetchall()
        order: list[Any]
        unheld: set[Any]
        if span.strategy == TIME:
            order = [self._position(r["t"], r["k"]) for r in ordered]
            unheld = {self._position(r["t"], r["k"]) for r in free}
        else:
            order = [int(r["k"]) for r in ordered]
            unheld = {int(r["k"]) for r in free}
        return order, [p for p in order if p not in unheld]

    def apply(
        self,
        conn: Any,
        cutoff: datetime,
        span: Span,
        *,
        key: str,
        run_id: str,
        worker: str | None,
        job: Job | None = None,
        storage: Storage | None = None,
        unreferenced: bool = False,
    ) -> int | None:
        """Delete (or archive) the window's rows that are expired right now and book
        the window under ``key`` (its ledger row, or a duplicate's audit event),
        under the policy's limits, in the caller's transaction (or, on a
        PostgreSQL connection outside one, as a transaction of its own); with
        ``job``, complete it there too. Returns the rows taken, or None when the
        key was booked before (nothing changed). Raises AlreadyApplied when rows
        were taken but the key was booked meanwhile: the transaction must roll
        back; ForeignKeyBlocked when a foreign key refused the delete (nothing
        was taken, the transaction is usable). ``unreferenced``: leave out the
        rows other tables reference (``skips_referenced``)."""
        storage = storage or self.storage
        window = self._window(cutoff, span, key, run_id, worker, job, storage, unreferenced)
        return self.engine.window_apply(conn, window)

    def _window(
        self,
        cutoff: datetime,
        span: Span,
        key: str,
        run_id: str,
        worker: str | None,
        job: Job | None,
        storage: Storage,
        unreferenced: bool = False,
    ) -> WindowApply:
        p = self.policy
        archive = p.action == "archive"
        name = _span_name(span)
        params = self._span_params(span)
        timed = span.strategy == TIME
        skip = unreferenced
        return WindowApply(
            delete=self.text(DELETE, storage, name, skip),
            move=self.text(ARCHIVE_MOVE, storage, name, skip) if archive else None,
            copy=self.text(ARCHIVE_COPY, storage, name, skip) if archive else None,
            label=f"expiry window: delete from {p.table}"
            + (f", archive into {p.archive_table}" if archive else ""),
            params=params | {"key": key} | self.engine.cutoff_params(storage, self.edge(cutoff)),
            key=key,
            policy=p.name,
            run_id=run_id,
            action=p.action,
            worker=worker,
            lo=None if timed else span.lo,
            hi=None if timed else span.hi,
            positions=[params.get(n) for n in ("lo_ts", "lo_tie", "hi_ts", "hi_tie")]
            if timed
            else None,
            bounds=None if span.strategy == KEY else span.describe(),
            job=job,
            lock_timeout_ms=int(p.lock_timeout * 1000),
            statement_timeout_ms=int(p.statement_timeout * 1000),
        )

    @staticmethod
    def _span_params(span: Span) -> dict[str, Any]:
        if span.strategy != TIME:
            return {"lo": span.lo, "hi": span.hi}
        params = {"hi_ts": span.hi[0], "hi_tie": span.hi[1]}
        if span.lo is not None:
            params.update(lo_ts=span.lo[0], lo_tie=span.lo[1])
        return params

    def _position(self, ts: Any, tie: Any) -> Position:
        """A position as the run's jobs carry it (JSON) and the statements bind it
        back: on a typed engine, text the column's type reads back exactly
        (placeholder_as casts it); elsewhere the value itself, storage class and all."""
        if not self.engine.typed_columns:
            if isinstance(ts, bytes) or isinstance(tie, bytes):
                raise SchemaError(
                    f"policy {self.policy.name!r}: a blob in {self.policy.timestamp!r} or "
                    f"{self.tie!r} cannot bound a time window (fix: key the policy by a "
                    "column that holds numbers or text)"
                )
            return (ts, tie)
        return (_text(ts), _text(tie))

    # -- choosing the windows ------------------------------------------------------

    def choose(self, conn: Any, cutoff: datetime, storage: Storage | None = None) -> Strategy:
        """The run's windows: those the policy fixed; else key windows where
        the expired keys of an indexed integer key fill their range densely
        enough (DENSE_ENOUGH), measured from the data; else block windows where
        the planner's statistics say a large share of the table is expired and
        the timestamp does not follow the heap (_blocks); else time windows
        (random or hash ids, ids not in time order, text and UUID keys, a few
        rows newly expired among many live ones)."""
        if self.fixed is not None:
            return self.fixed
        reason = self._not_key
        if reason is None:
            bounds = self.bounds(conn, cutoff, storage)
            if bounds is None:
                return Strategy(KEY, "nothing is expired now")
            lo, hi = bounds
            keys = hi - lo + 1
            cap = max(1, math.ceil(keys * DENSE_ENOUGH))
            n = int(self.run(conn, DENSITY, storage, cutoff=cutoff, page=cap).fetchone()["n"])
            k = self.policy.key
            if n >= cap:
                return Strategy(
                    KEY,
                    f"expired keys are dense: {n:,}+ of the {keys:,} {k} values {lo}..{hi} "
                    f"are candidates (at least {DENSE_ENOUGH:.0%})",
                )
            reason = (
                f"expired keys are sparse: {n:,} candidates over the {keys:,} {k} values "
                f"{lo}..{hi} ({n / keys:.2%}); key windows would hold "
                f"{n * self.policy.window / keys:,.1f} rows each"
            )
        blocks = self._blocks(conn, cutoff, storage)
        if blocks is not None:
            return Strategy(BLOCKS, f"{reason}; {blocks}")
        return Strategy(TIME, reason)

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
        storage = storage or self.storage
        params = engine.cutoff_params(storage, self.edge(cutoff))
        estimate = engine.estimate_rows(conn, self.text(CANDIDATES, storage), params) or 0
        share = estimate / layout.rows
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
        p, engine = self.policy, self.engine
        layout = engine.table_layout(conn, p.table, p.timestamp)
        storage = storage or self.storage
        params = engine.cutoff_params(storage, self.edge(cutoff))
        estimate = engine.estimate_rows(conn, self.text(CANDIDATES, storage), params) or 0
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

    # -- partitions ------------------------------------------------------------------

    def partition_mode(self) -> str:
        """ "drop", "detach" or "rows": how whole expired partitions go."""
        p = self.policy
        if p.partitions != "auto":
            return p.partitions
        partitioned = self.relation is not None and self.relation.partitioned
        plain = p.action == "delete" and not p.where
        return "drop" if partitioned and plain else "rows"

    def expired_partitions(
        self,
        conn: Any,
        cutoff: datetime,
        storage: Storage | None = None,
        *,
        only: str | None = None,
    ) -> list[Partition]:
        """The partitions whose whole range lies before ``cutoff`` (every row they
        can hold is expired), when the policy removes whole partitions: ranges on
        the timestamp column alone, in a native time type, compared by the
        database. Others, and the default partition, are cleaned by windows."""
        storage = storage or self.storage
        if self.partition_mode() == "rows" or storage.format != "native":
            return []
        found = []
        for part in self.engine.table_partitions(conn, self.policy.table):
            if part.key != self.policy.timestamp or part.upper is None:
                continue
            if only is not None and part.name != only:
                continue
            row = self.run(conn, PARTITION_EXPIRED, storage, cutoff=cutoff, upper=part.upper)
            if row.fetchone()["expired"]:
                found.append(part)
        return found

    def count(self, conn: Any, cutoff: datetime) -> int:
        return int(self.run(conn, COUNT, cutoff=cutoff).fetchone()["n"])

    def oldest(
        self, conn: Any, cutoff: datetime, storage: Storage | None = None
    ) -> datetime | None:
        storage = storage or self.storage
        return storage.read(self.run(conn, OLDEST, storage, cutoff=cutoff).fetchone()["oldest"])

    def sample_check(self, conn: Any, cutoff: datetime, storage: Storage) -> None:
        """Belt and braces before a run's first window: read candidates by the
        windows' own predicate and compare each with the cutoff in Python
        (timestamps.instant: a naive value in the storage's zone, by its latest
        reading), independently of the SQL. Raises SchemaError, which stops the
        run before anything is deleted, if one is not expired."""
        rows = self.run(conn, SAMPLE, storage, cutoff=cutoff, page=SAMPLE_SIZE).fetchall()
        for row in rows:
            zero = storage.zero and row["v"] in (0, 0.0)  # the epoch itself (Storage.zero)
            when = UNIX_EPOCH if zero else instant(row["v"], storage.zone)
            if when is None or not when < self.edge(cutoff):
                shown = "unreadable" if when is None else when.isoformat()
                raise SchemaError(
                    f"policy {self.policy.name!r}: stopped before deleting anything: the "
                    f"candidate row {self.policy.key} = {row['k']!r} has "
                    f"{self.policy.timestamp} = {row['v']!r} ({shown}), which is not before "
                    f"the cutoff {cutoff.isoformat()} when read by Python; the column was "
                    f"read as {storage.describe()}. Fix: state timestamp_format (or "
                    "timestamp_zone), or make the column hold one storage, then trigger again"
                )

    # -- the schema check ----------------------------------------------------------

    def check(self, conn: Any) -> list[str]:
        """Check the policy against the live schema and data; returns warnings,
        raises SchemaError."""
        p = self.policy
        self._texts.clear()
        self.relation = relation = self._check_relation(conn, p.table, "table")
        columns = self.engine.table_columns(conn, p.table)
        by_name = {c.name: c for c in columns}
        for field, column in (("key", p.key), ("timestamp", p.timestamp)):
            if column not in by_name:
                raise SchemaError(
                    f"policy {p.name!r}: {field} column {column!r} is not in table {p.table!r} "
                    f"(columns: {', '.join(by_name)})"
                )
        self._declared = by_name[p.timestamp].type
        self.types = {c.name: c.type for c in columns}
        self.tie = relation.rowid if relation.rowid not in (None, p.key) else p.key
        warnings: list[str] = []
        view = relation.kind != "table"  # its table's indexes serve it, unseen here
        if not view and not by_name[p.timestamp].indexed:
            warnings.append(
                f"policy {p.name!r}: no index leads with timestamp column {p.timestamp!r}: "
                "planning, time windows and the watermark scan the table (fix: create index "
                f"on {p.table} ({p.timestamp}))"
            )
        self.fixed = self._fixed(by_name, warnings)
        self.notes = []
        if view:
            self.notes.append(
                f"{p.table} is a {relation.kind}: the indexes of the table it reads serve it, "
                "unseen through it (an index leading with the column behind "
                f"{p.timestamp!r} belongs on that table: none can be created on a view)"
            )
        if self.fixed is not None:
            self.notes.append(self.fixed.describe())
        if self.fixed is None or self.fixed.name == TIME:
            self.notes.append(self._ties(self.engine.table_indexes(conn, p.table)))
        if relation.partitioned:
            self.notes.append(self._partitions_note())
        self.notes += self._references(conn, warnings)
        self.columns = [c.name for c in columns]
        if p.action == "archive":
            self._check_archive(conn)
        if p.where:
            self._explain_where(conn)
        self.storage = self.detect(conn)
        warnings += self.read_values(conn, self.storage)
        self.checked = True
        return warnings

    def _check_archive(self, conn: Any) -> None:
        p = self.policy
        assert p.archive_table is not None
        self._check_relation(conn, p.archive_table, "archive_table")
        archive = {c.name for c in self.engine.table_columns(conn, p.archive_table)}
        missing = [c for c in self.columns if c not in archive]
        if missing:
            raise SchemaError(
                f"policy {p.name!r}: archive_table {p.archive_table!r} lacks "
                f"columns {', '.join(missing)}"
            )

    def _partitions_note(self) -> str:
        p, mode = self.policy, self.partition_mode()
        if mode == "rows":
            why = (
                'partitions = "rows"'
                if p.partitions == "rows"
                else "the policy has a where or archives"
            )
            return f"partitioned table: rows are deleted by windows in every partition ({why})"
        verb = "detached and dropped" if mode == "drop" else "detached and kept"
        return (
            f"partitioned table: a partition whose range on {p.timestamp} ends by the cutoff is "
            f'{verb} whole (partitions = "{mode}"); the others are cleaned by windows'
        )

    def _references(self, conn: Any, warnings: list[str]) -> list[str]:
        """Tables whose foreign keys reference this one: other tables' RESTRICT
        and NO ACTION ones are notes (windows step around the rows they
        reference: skips_referenced), a table's reference to itself a warning
        with the where that avoids it; CASCADE and SET
        NULL ones are notes, and warnings too when no index of the referencing
        table leads with its columns (_unindexed)."""
        p, notes = self.policy, []
        self.restricting = []
        for ref in self.engine.table_references(conn, p.table):
            cols, refd = ", ".join(ref.columns), ", ".join(ref.referenced)
            named = f"{ref.table} ({cols}) references {p.table} ({refd}) on delete {ref.on_delete}"
            if ref.on_delete in ("restrict", "no action"):
                self.restricting.append(ref)
            if ref.on_delete in ("restrict", "no action") and self._others()[-1:] == [ref]:
                notes.append(
                    f"{named}: a window whose delete it refuses is applied again at once "
                    f"without the rows {ref.table} references, which are kept and counted in "
                    "the ledger (rows kept); a later run tries them again"
                )
                if not ref.indexed:
                    warnings.append(self._unindexed(ref, named))
                continue
            if ref.on_delete in ("restrict", "no action"):
                match = " and ".join(
                    f"r.{c} = {p.table.split('.')[-1]}.{r}"
                    for c, r in zip(ref.columns, ref.referenced, strict=True)
                )
                warnings.append(
                    f"policy {p.name!r}: {named}: a window that meets a referenced row is split "
                    "until that row stands alone, which is kept and booked as blocked (fix, to "
                    f'skip such rows: where = "not exists (select 1 from {ref.table} r where '
                    f'{match})")'
                )
                continue
            if not ref.indexed:
                warnings.append(self._unindexed(ref, named))
            if ref.on_delete == "cascade":
                notes.append(f"{named}: its rows that reference a deleted row are deleted too")
            else:
                notes.append(
                    f"{named}: its references to a deleted row are set to {ref.on_delete[4:]}"
                )
        return notes

    def _unindexed(self, ref: Reference, named: str) -> str:
        """The warning for a CASCADE, SET NULL or SET DEFAULT reference that no
        index serves: each row a window deletes makes the database scan the
        referencing table for its references, so a window's delete runs long
        (a timeout then halves the window down to one row, cleanup/service.py)."""
        create = self.engine.index_statement(ref.table, ref.columns)
        return (
            f"policy {self.policy.name!r}: {named}, and no index of {ref.table} leads with "
            f"({', '.join(ref.columns)}): every row a window deletes scans {ref.table} "
            f"for its references, so windows run long and may hit statement_timeout "
            f"(fix: {create})"
        )

    def _check_relation(self, conn: Any, table: str, field: str) -> Relation:
        """The table exists, is one expiry may delete from (or insert into), and is
        not one of expiry's own."""
        p = self.policy
        relation = self.engine.table_relation(conn, table)
        kind = None if relation is None else relation.kind
        own = relation is not None and relation.own
        writable = relation is not None and (
            relation.deletable if field == "table" else relation.insertable
        )
        if kind is None:
            raise SchemaError(
                f"policy {p.name!r}: {field} {table!r} does not exist "
                f"(fix: create it, or correct {field!r})"
            )
        if own:
            raise SchemaError(
                f"policy {p.name!r}: {field} {table!r} is one of expiry's own tables; a "
                "policy may only clean the application's tables (fix: correct "
                f"{field!r})"
            )
        if kind == "foreign table":  # its rows, locks and transactions are elsewhere
            raise SchemaError(
                f"policy {p.name!r}: {field} {table!r} is a foreign table: its rows live in "
                "another database, where the window's transaction cannot guard them "
                "(fix: run expiry against the database that holds the table)"
            )
        if kind != "table" and not writable:
            verb = "delete from" if field == "table" else "insert into"
            raise SchemaError(
                f"policy {p.name!r}: {field} {table!r} is a {kind}, which expiry cannot "
                f"{verb} (fix: point {field!r} at the table that holds the rows)"
            )
        assert relation is not None
        return relation

    # -- how the timestamp column stores time ----------------------------------------

    def detect(self, conn: Any) -> Storage:
        """Read how the timestamp column stores time, from every row the policy
        covers; raise SchemaError, with the counts and the fix, when a reading
        could be wrong (timestamps.py says why). Naive values are read as
        wall-clock times of the policy's timestamp_zone, else the database's."""
        self._naive = False
        if self.engine.typed_columns:
            return self._zoned(self._detect_typed(conn))
        return self._zoned(self._detect_values(conn))

    def _zoned(self, storage: Storage) -> Storage:
        """``storage`` with the zone of its naive values; a zone the policy states
        for a column that carries its zone, or holds epoch numbers, is refused
        (the database's default does not apply there)."""
        p = self.policy
        zone = p.timestamp_zone or p.database_zone
        if self._naive:
            return storage.zoned(zone) if zone else storage
        if p.timestamp_zone:
            held = (
                f"holds {storage.describe()}, which are UTC by definition"
                if storage.format not in ("native", "iso")
                else f"holds {storage.describe()}, which carries its zone"
                if storage.format == "iso"
                else f"is {self._declared}, which carries its zone"
            )
            raise self._refuse(
                f"{held}, but the policy states timestamp_zone = {p.timestamp_zone!r}",
                "remove timestamp_zone: it is for naive times (timestamp without time zone, "
                "DATETIME, DATE, ISO text without a zone suffix)",
            )
        return storage

    def _refuse(self, problem: str, fix: str) -> SchemaError:
        p = self.policy
        return SchemaError(
            f"policy {p.name!r}: timestamp column {p.timestamp!r} {problem}; nothing is "
            f"deleted while it could be misread. Fix: {fix}"
        )

    def _detect_typed(self, conn: Any) -> Storage:
        """Where the declared type decides (PostgreSQL): a native time type as
        it is; an integer column by the range of its values."""
        p, kind = self.policy, self.engine.column_kind(self._declared)
        if kind == "time":
            if p.timestamp_format:
                raise self._refuse(
                    f"is {self._declared}, a native time type",
                    "remove timestamp_format (it is for integer epoch columns)",
                )
            self._naive = naive_type(self._declared)
            return Storage("native")
        if kind != "integer":
            raise self._refuse(
                f"is {self._declared}",
                "store time as timestamptz, timestamp or date, or as integer epoch "
                'seconds or milliseconds with timestamp_format = "epoch" or "epoch_ms"',
            )
        if p.timestamp_format not in (None, "epoch", "epoch_ms"):
            raise self._refuse(
                f"is {self._declared}",
                'on PostgreSQL write timestamp_format = "epoch" or "epoch_ms"',
            )
        row = conn.execute(self.text(STORAGE_RANGE), {}).fetchone()
        storage = self._numeric(row["lo"], row["hi"], None, conn)
        if storage.format not in ("epoch", "epoch_ms"):  # julianday is SQLite's (a real)
            raise self._refuse(
                f"holds integers from {row['lo']!r} to {row['hi']!r}, which are neither "
                "epoch seconds (1e8..1e11) nor epoch milliseconds (1e11..1e14)",
                "convert the column to timestamptz, or to epoch seconds or milliseconds",
            )
        return storage

    def _numeric(self, lo: Any, hi: Any, counts: str | None, conn: Any = None) -> Storage:
        """The numeric format of values from ``lo`` to ``hi`` (None: no values).
        Under a stated epoch format a 0 is the epoch itself (Storage.zero): the
        format is read off the other values."""
        stated = self.policy.timestamp_format
        zero = stated in ("epoch", "epoch_ms")
        if lo is None:
            return Storage(stated or "epoch", zero=zero)
        if zero and float(lo) == 0 and conn is not None:
            lo = conn.execute(self.text(STORAGE_ABOVE_ZERO), {}).fetchone()["lo"]
            if lo is None:  # every value is 0
                return Storage(str(stated), zero=True)
        low, high = numeric_format(float(lo)), numeric_format(float(hi))
        ranges = "epoch seconds 1e8..1e11, epoch milliseconds 1e11..1e14, julianday 1e6..1e7"
        held = counts or f"numbers from {lo!r} to {hi!r}"
        if low is None or high is None or low != high:
            raise self._refuse(
                f"holds {held}, which are not all of one format ({ranges})",
                "convert the rows to one format" + _one_format(self.policy.timestamp, low, high),
            )
        if stated and stated != low:
            raise self._refuse(
                f"holds {held}, which look like {Storage(low).describe()}, but the policy "
                f'states timestamp_format = "{stated}"',
                f'correct timestamp_format (to "{low}"), or the data',
            )
        return Storage(low, zero=zero)

    def _detect_values(self, conn: Any) -> Storage:
        """Where each value has its own storage class (SQLite): read them all."""
        p = self.policy
        ends = conn.execute(self.text(STORAGE_ENDS), {}).fetchone()
        lo, hi = ends["lo"], ends["hi"]
        if lo is None:  # no rows to read: this run deletes nothing
            self._naive = p.timestamp_format in (None, "iso")
            stated = p.timestamp_format or "iso"
            return Storage(stated, zero=stated in ("epoch", "epoch_ms"))
        if all(isinstance(v, int | float) for v in (lo, hi)):
            return self._numeric(lo, hi, None, conn)
        rows = conn.execute(self.text(STORAGE_CLASSES), {}).fetchall()
        classes: dict[str, int] = {}
        for row in rows:
            classes[row["storage"]] = classes.get(row["storage"], 0) + row["n"]
        counts = ", ".join(f"{n:,} {kind}" for kind, n in sorted(classes.items()))
        if "blob" in classes or ("text" in classes and len(classes) > 1):
            keep = "text" if classes.get("text", 0) >= sum(classes.values()) / 2 else "integer"
            raise self._refuse(
                f"mixes storage classes ({counts} values)",
                f"convert the rows to one storage, or limit the policy to one with "
                f"where = \"typeof({p.timestamp}) = '{keep}'\"",
            )
        return self._spelling(rows)

    def _spelling(self, rows: list[Any]) -> Storage:
        """ISO text: one separator and one zone, so that values sort as times do."""
        p = self.policy
        if p.timestamp_format not in (None, "iso"):
            raise self._refuse(
                f"holds ISO-8601 text, but the policy states timestamp_format = "
                f'"{p.timestamp_format}"',
                'correct timestamp_format (to "iso"), or the data',
            )
        unread = [r for r in rows if r["spelling"] == "?"]
        if unread:
            raise self._refuse(
                f"holds {unread[0]['n']:,} text values that are not ISO-8601 times "
                f"(such as {unread[0]['lo']!r})",
                "rewrite them as YYYY-MM-DD HH:MM:SS, or exclude them with a where",
            )
        separators, zones, suffixed = _spellings(rows)
        if len(separators) > 1:
            shown = ", ".join(f"{n:,} with {s!r}" for s, n in sorted(separators.items()))
            raise self._refuse(
                f"spells times two ways ({shown} between date and time), which do not "
                "sort together",
                f"rewrite them to one spelling, for example update {p.table} set "
                f"{p.timestamp} = replace({p.timestamp}, 'T', ' ')",
            )
        if len(zones) > 1:
            shown = ", ".join(f"{n:,} {z or 'UTC'}" for z, n in sorted(zones.items()))
            raise self._refuse(
                f"holds times in several zones ({shown}), which do not sort together",
                "rewrite them in one zone (UTC)",
            )
        naive = sum(r["n"] for r in rows) - suffixed
        zone = p.timestamp_zone or p.database_zone
        if zone and naive and suffixed:
            raise self._refuse(
                f"holds {naive:,} times without a zone suffix and {suffixed:,} with one, "
                f"which do not sort together once the first are read as {zone} times",
                "rewrite them in one zone, or limit the policy to one kind with a where",
            )
        self._naive = not suffixed
        separator = next(iter(separators), " ")
        return Storage("iso", separator, next(iter(zones), ""))

    # -- how the column reads, for people ----------------------------------------------

    def read_values(self, conn: Any, storage: Storage) -> list[str]:
        """Set ``reading``: how the column is read, and its oldest and newest
        values (stored, and as read) beside the database clock; returns a
        warning when the newest looks shifted by a zone (_shifted)."""
        p = self.policy
        ends = conn.execute(self.text(STORAGE_ENDS), {}).fetchone()
        now = self.engine.now(conn)
        self.reading = f"{p.timestamp}: {self.how(storage)}; "
        if ends is None or ends["lo"] is None:
            self.reading += f"no values yet (now {format_time(now)})"
            return []
        oldest, newest = storage.read(ends["lo"]), storage.read(ends["hi"])
        self.reading += (
            f"oldest {_shown(ends['lo'], oldest)}, newest {_shown(ends['hi'], newest)}, "
            f"now {format_time(now)}"
        )
        shifted = self._shifted(storage, ends["hi"], newest, now)
        return [] if shifted is None else [shifted]

    def how(self, storage: Storage) -> str:
        """How the column's values are read, in words (after a check or detect)."""
        p = self.policy
        if storage.format == "native":
            kind = self._declared
        elif storage.format == "iso" and self._naive:
            sep = "'T'" if storage.separator == "T" else "a space"
            kind = f"ISO-8601 text ({sep} between date and time)"
        else:
            kind = storage.describe()
        if self._naive and storage.zone:
            return f"naive {kind}, read as {storage.zone} wall-clock time"
        if self._naive:
            return f"naive {kind}, read as UTC (set timestamp_zone if your app writes local time)"
        ignored = (
            f" ([database] timestamp_zone {p.database_zone} does not apply)"
            if p.database_zone
            else ""
        )
        if storage.format in ("native", "iso"):
            return f"{kind}, which carries its zone{ignored}"
        return f"{kind}, UTC by definition{ignored}"

    def _shifted(
        self, storage: Storage, stored: Any, newest: datetime | None, now: datetime
    ) -> str | None:
        """A warning when a creation or activity time (a column not named like a
        deadline, DEADLINE_WORDS) has its newest value between a quarter of an
        hour and 14h15m ahead of the database clock: written, it seems, as the
        wall-clock time of a zone east of the one it is read in."""
        p = self.policy
        if newest is None or any(word in p.timestamp.lower() for word in DEADLINE_WORDS):
            return None
        ahead = (newest - now).total_seconds()
        if not SHIFT_MIN_SECONDS <= ahead <= SHIFT_MAX_SECONDS:
            return None
        quarters = round(ahead / 900)
        about = f"{quarters // 4}h{quarters % 4 * 15:02d}m"
        read = f"{storage.zone} wall-clock time" if storage.zone else "UTC"
        return (
            f"policy {p.name!r}: timestamp column {p.timestamp!r}, read as {read}, holds a "
            f"value about {about} ahead of the database clock (newest {_shown(stored, newest)}, "
            f"now {format_time(now)}): a creation or activity time lies in the past, so the "
            f"app seems to write the wall-clock time of another zone, and rows are deleted "
            f"about {about} late (fix: timestamp_zone = the zone the app writes in)"
        )

    def _explain_where(self, conn: Any) -> None:
        try:
            self.engine.explain(conn, self.statement(EXPLAIN_WHERE))
        except Exception as exc:
            first = str(exc).splitlines()[0]
            raise SchemaError(
                f"policy {self.policy.name!r}: where = {self.policy.where!r} "
                f"is not a valid predicate on {self.policy.table!r}: {first}"
            ) from exc


def _spellings(rows: list[Any]) -> tuple[dict[str, int], dict[str, int], int]:
    """Rows per separator and per zone (every UTC spelling as one) of ISO text,
    and the rows with a zone suffix ("Z" or an offset)."""
    separators: dict[str, int] = {}
    zones: dict[str, int] = {}
    suffixed = 0
    for row in rows:
        if row["spelling"] == "date":
            continue  # a date alone sorts before its day's times in either spelling
        separator, zone = row["spelling"].split("|")
        suffixed += row["n"] if zone else 0
        zone = "" if zone in UTC_ZONES else zone
        separators[separator] = separators.get(separator, 0) + row["n"]
        zones[zone] = zones.get(zone, 0) + row["n"]
    return separators, zones, suffixed


def _shown(stored: Any, read: datetime | None) -> str:
    """A stored value, and the instant it was read as."""
    value = stored.isoformat(sep=" ") if isinstance(stored, datetime) else str(stored)
    return f"{value} (= {format_time(read)})" if read is not None else f"{value} (unreadable)"


def _one_format(column: str, low: str | None, high: str | None) -> str:
    """The where that limits a policy to the values of one numeric format (the
    higher values' where they have one), as a refusal's fix: exactly that
    format's range, so that the check reads one format under it."""
    keep = high or low
    if keep is None:
        return ""
    start, end = NUMERIC_RANGES[keep]
    return (
        f", or limit the policy to the {Storage(keep).describe()} with where = "
        f'"{column} >= {int(start)} and {column} < {int(end)}"'
    )


def _span_name(span: Span) -> str:
    """The SPANS entry that bounds ``span``."""
    if span.strategy != TIME:
        return span.strategy  # "key", "blocks"
    return "time-first" if span.lo is None else "time"


def _text(value: Any) -> str:
    """A value as text its column's type reads back exactly (ISO 8601 for times)."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)
