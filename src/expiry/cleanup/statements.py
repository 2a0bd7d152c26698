"""The statements on a policy's table, rendered for its engine: the window's
delete or move, the planner's pages, counts, partitions. The base of Target
(target.py); the SQL is sql.py's."""

from __future__ import annotations

import logging
from datetime import date, datetime, timedelta
from typing import Any

from ..config import Hold, Policy
from ..engines.base import Engine
from ..errors import SchemaError
from ..timestamps import (
    UNIX_EPOCH,
    Storage,
    instant,
)
from ..types import Job, Partition, Reference, Relation, WindowApply
from .sql import (
    ARCHIVE_COPY,
    ARCHIVE_MOVE,
    BOUNDS,
    BOUNDS_AGGREGATE,
    COUNT,
    COUNT_SPAN,
    DELETE,
    FREE,
    NEXT_KEY,
    NTH_BLOCK,
    NTH_KEY,
    NTH_TIME,
    OLDEST,
    ORDERED,
    PARTITION_EXPIRED,
    PARTITION_HELD,
    PLAN_PAGE,
    PREDICATE,
    SAMPLE,
    SAMPLE_SIZE,
    SPANS,
    TIME_PAGE,
)
from .windows import (
    BLOCKS,
    KEY,
    TIME,
    Position,
    Span,
    Strategy,
)

log = logging.getLogger("expiry.target")


PARAMETERS = (
    "cutoff", "exact", "after", "max", "window", "page", "lo", "hi", "key", "skip", "partition",
)  # fmt: skip
"""The bound values a statement may name, as ``{p_<name>}``."""


class Statements:
    """A policy's table in one engine's dialect: its statements."""

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

    def statement(
        self,
        template: str,
        *,
        storage: Storage | None = None,
        span: str = "key",
        unreferenced: bool = False,
        holds: tuple[Hold, ...] | None = None,
    ) -> str:
        """The statement of ``template`` for this policy, ``storage`` (default:
        the checked one) and a window ``span`` (SPANS), in the engine's quoting
        and parameter style; ``unreferenced``: its candidates exclude the rows
        that other tables' rows reference (``skip_referenced``); ``holds``: the
        holds it honours (default: every hold on the table; only
        ``kept_by_holds`` counts with fewer)."""
        p, engine = self.policy, self.engine
        declared = self._declared if self.checked else None
        bound, guard = engine.time_predicate(storage or self.storage, declared)
        pred = PREDICATE.format(ts="{ts}", bound=bound, guard=guard)
        pred += " and ({where})" if p.where else ""
        unheld = self._unheld(p.holds if holds is None else holds)
        pred += self._beyond_newest() + unheld
        pred += self._unreferenced() if unreferenced else ""
        spans = SPANS | {"blocks": engine.block_span or "0 = 1"}
        text = template.replace("{span}", spans[span]).replace("{pred}", pred)
        text = text.replace("{pred_by_key}", pred.replace("{ts}", "{ts_off_index}"))
        text = text.replace("{unheld}", unheld)
        text = text.replace("{partition_rows}", engine.partition_rows or "0 = 1")
        # A window over a key range, or the planner's walk along the key, scans
        # the key's index: the timestamp's terms are kept off its own index.
        key_ranged = ("{span}" in template and span == "key") or "{p_after}" in template
        text = text.replace("{bound}", bound)
        text = text.replace("{block_of_row}", engine.block_of_row or "null")
        return self._names(text, key_ranged)

    def _names(self, text: str, key_ranged: bool) -> str:
        """``text`` with the policy's names quoted in and the engine's
        placeholders; the timestamp kept off its index where ``key_ranged``."""
        p, engine = self.policy, self.engine
        ts = engine.quote(p.timestamp)
        return text.format(
            table=engine.quote(p.table),
            archive=engine.quote(p.archive_table or "_"),
            ledger=engine.ledger_table,
            ledger_key=engine.quote("key"),
            integer=engine.integer_type,
            div=engine.integer_division,
            key=engine.quote(p.key),
            ts=engine.unindexed.format(ts) if key_ranged else ts,
            ts_off_index=engine.unindexed.format(ts),
            tie=engine.quote(self.tie),
            columns=", ".join(engine.quote(c) for c in self.columns),
            where=engine.escape(p.where) if p.where else "1 = 1",
            **{f"p_{n}": engine.placeholder(n) for n in PARAMETERS},
            **self._typed_placeholders(),
        )

    def _typed_placeholders(self) -> dict[str, str]:
        """The placeholders of a time window's bounds, cast where the engine
        needs the column's type to compare them."""
        engine = self.engine
        ts_type = self.types.get(self.policy.timestamp, "")
        tie_type = self.types.get(self.tie, "")
        return {
            "p_lo_ts": engine.placeholder_as("lo_ts", ts_type),
            "p_hi_ts": engine.placeholder_as("hi_ts", ts_type),
            "p_upper": engine.placeholder_as("upper", ts_type),
            "p_lo_tie": engine.placeholder_as("lo_tie", tie_type),
            "p_hi_tie": engine.placeholder_as("hi_tie", tie_type),
        }

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

    def _beyond_newest(self) -> str:
        """keep_last: the row is older, in (timestamp, key) order, than the N-th
        newest row of its group (of the table without group_by). A group of N
        rows or fewer has no N-th newest past them: the comparison is null and
        the row is kept; so is a row whose group is null (equal to none). Read by
        the statement as it runs, as the rest of the predicate is."""
        p, q = self.policy, self.engine.quote
        if p.keep_last is None:
            return ""
        table, ts, key = q(p.table), q(p.timestamp), q(p.key)
        same = f" where n.{q(p.group_by)} = {table}.{q(p.group_by)}" if p.group_by else ""
        clause = (
            f" and ({table}.{ts}, {table}.{key}) < (select n.{ts}, n.{key} from {table} n{same}"
            f" order by n.{ts} desc, n.{key} desc limit 1 offset {int(p.keep_last) - 1})"
        )
        return clause.replace("{", "{{").replace("}", "}}")

    def _unheld(self, holds: tuple[Hold, ...]) -> str:
        """The rows no hold names: ``not (where)`` (a row for which a hold's
        predicate is null is held, as NOT has it), or no row of ``keys_table``
        listing its key. Braces doubled: the statement's format() undoes them."""
        q, table = self.engine.quote, self.engine.quote(self.policy.table)
        clauses = []
        for h in holds:
            if h.where is not None:
                clauses.append(f" and not ({self.engine.escape(h.where)})")
            else:
                assert h.keys_table is not None and h.keys_column is not None
                key = q(h.key or self.policy.key)
                clauses.append(
                    f" and not exists (select 1 from {q(h.keys_table)} expiry_hold"
                    f" where expiry_hold.{q(h.keys_column)} = {table}.{key})"
                )
        return "".join(clauses).replace("{", "{{").replace("}", "}}")

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

    def bounds(
        self, conn: Any, cutoff: datetime, storage: Storage | None = None
    ) -> tuple[int, int] | None:
        return self.bounds_counted(conn, cutoff, storage)[0]

    def bounds_counted(
        self, conn: Any, cutoff: datetime, storage: Storage | None = None
    ) -> tuple[tuple[int, int] | None, int | None]:
        """The candidates' key bounds (None: no candidate) and, where the engine
        reads them in one pass over the candidates (bounds_by_aggregate), their
        count; None where it reads the two ends alone (an index probe each)."""
        aggregate = self.engine.bounds_by_aggregate
        row = self.run(conn, BOUNDS_AGGREGATE if aggregate else BOUNDS, storage, cutoff=cutoff)
        found = row.fetchone()
        if found is None or found["lo"] is None:
            return None, 0 if aggregate else None
        return (int(found["lo"]), int(found["hi"])), int(found["n"]) if aggregate else None

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

    def partition_mode(self) -> str:
        """ "drop", "detach" or "rows": how whole expired partitions go."""
        p = self.policy
        if p.partitions != "auto":
            return p.partitions
        partitioned = self.relation is not None and self.relation.partitioned
        plain = p.action == "delete" and not p.where and p.keep_last is None
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
        for part in self.engine.table_partitions(conn, self.policy.table, only):
            if part.key != self.policy.timestamp or part.upper is None:
                continue
            row = self.run(conn, PARTITION_EXPIRED, storage, cutoff=cutoff, upper=part.upper)
            if row.fetchone()["expired"] and not self._holds_a_row(conn, part):
                found.append(part)
        return found

    def _holds_a_row(self, conn: Any, part: Partition) -> bool:
        """Whether a hold keeps a row of the partition: then it is no expired
        partition, and windows clean the rest of its rows around the held ones."""
        if not self.policy.holds:
            return False
        name = self.engine.quote(f"{part.schema}.{part.name}")
        return bool(self.run(conn, PARTITION_HELD, partition=name).fetchone()["n"])

    def count(self, conn: Any, cutoff: datetime, storage: Storage | None = None) -> int:
        return int(self.run(conn, COUNT, storage, cutoff=cutoff).fetchone()["n"])

    def kept_by_holds(
        self, conn: Any, cutoff: datetime, storage: Storage | None = None
    ) -> dict[str, int]:
        """Per hold on the table: the rows it keeps from ``cutoff`` (the
        candidates were there no hold, less those with it alone)."""
        holds = self.policy.holds
        if not holds:
            return {}
        storage = storage or self.storage
        params = {"cutoff": cutoff, **self.engine.cutoff_params(storage, self.edge(cutoff))}

        def candidates(honoured: tuple[Hold, ...]) -> int:
            text = self.statement(COUNT, storage=storage, holds=honoured)
            return int(conn.execute(text, params).fetchone()["n"])

        free = candidates(())
        return {h.name: free - candidates((h,)) for h in holds}

    def oldest(
        self, conn: Any, cutoff: datetime, storage: Storage | None = None
    ) -> datetime | None:
        storage = storage or self.storage
        return storage.read(self.run(conn, OLDEST, storage, cutoff=cutoff).fetchone()["oldest"])

    def sample_check(self, conn: Any, cutoff: datetime, storage: Storage) -> list[str]:
        """Belt and braces before a run's first window: read candidates by the
        windows' own predicate and compare each with the cutoff in Python
        (timestamps.instant: a naive value in the storage's zone, by its latest
        reading), independently of the SQL. Raises SchemaError, which stops the
        run before anything is deleted, if one is not expired. The keys read,
        oldest first."""
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
        return [str(row["k"]) for row in rows]


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
