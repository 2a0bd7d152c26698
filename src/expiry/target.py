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
from datetime import datetime
from typing import Any

from .config import Policy
from .engines.base import Engine
from .errors import SchemaError
from .timestamps import UTC_ZONES, Storage, instant, numeric_format
from .types import Job, WindowApply

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
                 order by {key} limit 1) - 1 as bigint), 1
    union all
    select cast((select {key} from {table}
                 where {key} > w.lo + {p_window} and {key} <= {p_max} and {pred}
                 order by {key} limit 1) - 1 as bigint), w.n + 1
    from w where w.lo is not null and w.n < {p_page}
)
select lo from w where lo is not null order by lo
"""

WINDOW = "{key} > {p_lo} and {key} <= {p_hi} and {pred}"

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
UNBOOKED = WINDOW + " and not exists (select 1 from {ledger} where key = {p_key})"

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
                when {ts} like '%Z' then ''
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
        self._declared = ""
        self._texts: dict[tuple[str, str], str] = {}

    # -- building statements -----------------------------------------------------

    def statement(self, template: str, *, storage: Storage | None = None) -> str:
        """The statement of ``template`` for this policy and ``storage`` (default:
        the checked one), in the engine's quoting and parameter style."""
        p, engine = self.policy, self.engine
        bound, guard = engine.time_predicate(storage or self.storage)
        pred = PREDICATE.format(ts="{ts}", bound=bound, guard=guard)
        pred += " and ({where})" if p.where else ""
        names = ["cutoff", "exact", "after", "max", "window", "page", "lo", "hi", "key"]
        return template.replace("{pred}", pred).format(
            table=engine.quote(p.table),
            archive=engine.quote(p.archive_table or "_"),
            ledger=engine.ledger_table,
            key=engine.quote(p.key),
            ts=engine.quote(p.timestamp),
            columns=", ".join(engine.quote(c) for c in self.columns),
            where=engine.escape(p.where) if p.where else "1 = 1",
            **{f"p_{n}": engine.placeholder(n) for n in names},
        )

    def text(self, template: str, storage: Storage | None = None) -> str:
        """The statement, built once per template and storage (the schema check
        builds them afresh, as the columns may have changed)."""
        storage = storage or self.storage
        cache = (template, storage.token if "{pred}" in template else "")
        text = self._texts.get(cache)
        if text is None:
            text = self._texts[cache] = self.statement(template, storage=storage)
        return text

    def run(self, conn: Any, template: str, storage: Storage | None = None, **params: Any) -> Any:
        storage = storage or self.storage
        if "cutoff" in params:
            params.update(self.engine.cutoff_params(storage, params["cutoff"]))
        return conn.execute(self.text(template, storage), params)

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

    def apply(
        self,
        conn: Any,
        cutoff: datetime,
        lo: int,
        hi: int,
        *,
        key: str,
        run_id: str,
        worker: str | None,
        job: Job | None = None,
        storage: Storage | None = None,
    ) -> int | None:
        """Delete (or archive) the window's rows that are expired right now and book
        the window under ``key`` (its ledger row, or a duplicate's audit event),
        under the policy's limits, in the caller's transaction (or, on a
        PostgreSQL connection outside one, as a transaction of its own); with
        ``job``, complete it there too. Returns the rows taken, or None when the
        key was booked before (nothing changed). Raises AlreadyApplied when rows
        were taken but the key was booked meanwhile: the transaction must roll
        back."""
        storage = storage or self.storage
        window = self._window(cutoff, lo, hi, key, run_id, worker, job, storage)
        return self.engine.window_apply(conn, window)

    def _window(
        self,
        cutoff: datetime,
        lo: int,
        hi: int,
        key: str,
        run_id: str,
        worker: str | None,
        job: Job | None,
        storage: Storage,
    ) -> WindowApply:
        p = self.policy
        archive = p.action == "archive"
        return WindowApply(
            delete=self.text(DELETE, storage),
            move=self.text(ARCHIVE_MOVE, storage) if archive else None,
            copy=self.text(ARCHIVE_COPY, storage) if archive else None,
            label=f"expiry window: delete from {p.table}"
            + (f", archive into {p.archive_table}" if archive else ""),
            params={"lo": lo, "hi": hi, "key": key} | self.engine.cutoff_params(storage, cutoff),
            key=key,
            policy=p.name,
            run_id=run_id,
            action=p.action,
            worker=worker,
            lo=lo,
            hi=hi,
            job=job,
            lock_timeout_ms=int(p.lock_timeout * 1000),
            statement_timeout_ms=int(p.statement_timeout * 1000),
        )

    def count(self, conn: Any, cutoff: datetime) -> int:
        return int(self.run(conn, COUNT, cutoff=cutoff).fetchone()["n"])

    def oldest(self, conn: Any, cutoff: datetime) -> datetime | None:
        return self.storage.read(self.run(conn, OLDEST, cutoff=cutoff).fetchone()["oldest"])

    def sample_check(self, conn: Any, cutoff: datetime, storage: Storage) -> None:
        """Belt and braces before a run's first window: read candidates by the
        windows' own predicate and compare each with the cutoff in Python
        (timestamps.instant), independently of the SQL. Raises SchemaError,
        which stops the run before anything is deleted, if one is not expired."""
        rows = self.run(conn, SAMPLE, storage, cutoff=cutoff, page=SAMPLE_SIZE).fetchall()
        for row in rows:
            when = instant(row["v"])
            if when is None or not when < cutoff:
                shown = "unreadable" if when is None else when.isoformat()
                raise SchemaError(
                    f"policy {self.policy.name!r}: stopped before deleting anything: the "
                    f"candidate row {self.policy.key} = {row['k']!r} has "
                    f"{self.policy.timestamp} = {row['v']!r} ({shown}), which is not before "
                    f"the cutoff {cutoff.isoformat()} when read by Python; the column was "
                    f"read as {storage.describe()}. Fix: state timestamp_format, or make "
                    "the column hold one storage, then trigger again"
                )

    # -- the schema check ----------------------------------------------------------

    def check(self, conn: Any) -> list[str]:
        """Check the policy against the live schema and data; returns warnings,
        raises SchemaError."""
        p = self.policy
        self._texts.clear()
        self._check_relation(conn, p.table, "table")
        columns = self.engine.table_columns(conn, p.table)
        by_name = {c.name: c for c in columns}
        for field, column in (("key", p.key), ("timestamp", p.timestamp)):
            if column not in by_name:
                raise SchemaError(
                    f"policy {p.name!r}: {field} column {column!r} is not in table {p.table!r} "
                    f"(columns: {', '.join(by_name)})"
                )
        if self.engine.column_kind(by_name[p.key].type) != "integer":
            raise SchemaError(
                f"policy {p.name!r}: key column {p.key!r} is {by_name[p.key].type}, "
                "not an integer type; windows need a monotonic integer key"
            )
        self._declared = by_name[p.timestamp].type
        warnings = []
        if not by_name[p.timestamp].indexed:
            warnings.append(
                f"policy {p.name!r}: timestamp column {p.timestamp!r} has no index; "
                "planning and the watermark will scan the table"
            )
        self.columns = [c.name for c in columns]
        if p.action == "archive":
            self._check_archive(conn)
        if p.where:
            self._explain_where(conn)
        self.storage = self.detect(conn)
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

    def _check_relation(self, conn: Any, table: str, field: str) -> None:
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

    # -- how the timestamp column stores time ----------------------------------------

    def detect(self, conn: Any) -> Storage:
        """Read how the timestamp column stores time, from every row the policy
        covers; raise SchemaError, with the counts and the fix, when a reading
        could be wrong (timestamps.py says why)."""
        if self.engine.typed_columns:
            return self._detect_typed(conn)
        return self._detect_values(conn)

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
        storage = self._numeric(row["lo"], row["hi"], None)
        if storage.format not in ("epoch", "epoch_ms"):  # julianday is SQLite's (a real)
            raise self._refuse(
                f"holds integers from {row['lo']!r} to {row['hi']!r}, which are neither "
                "epoch seconds (1e8..1e11) nor epoch milliseconds (1e11..1e14)",
                "convert the column to timestamptz, or to epoch seconds or milliseconds",
            )
        return storage

    def _numeric(self, lo: Any, hi: Any, counts: str | None) -> Storage:
        """The numeric format of values from ``lo`` to ``hi`` (None: no values)."""
        stated = self.policy.timestamp_format
        if lo is None:
            return Storage(stated or "epoch")
        low, high = numeric_format(float(lo)), numeric_format(float(hi))
        ranges = "epoch seconds 1e8..1e11, epoch milliseconds 1e11..1e14, julianday 1e6..1e7"
        held = counts or f"numbers from {lo!r} to {hi!r}"
        if low is None or high is None or low != high:
            bad = lo if low is None or low != high else hi
            raise self._refuse(
                f"holds {held}, which are not all of one format ({ranges})",
                f"convert the rows to one format, or exclude the others with a where "
                f"(for example {self.policy.timestamp} {'>' if bad == lo else '<'} {bad!r})",
            )
        if stated and stated != low:
            raise self._refuse(
                f"holds {held}, which look like {Storage(low).describe()}, but the policy "
                f'states timestamp_format = "{stated}"',
                f'correct timestamp_format (to "{low}"), or the data',
            )
        return Storage(low)

    def _detect_values(self, conn: Any) -> Storage:
        """Where each value has its own storage class (SQLite): read them all."""
        p = self.policy
        ends = conn.execute(self.text(STORAGE_ENDS), {}).fetchone()
        lo, hi = ends["lo"], ends["hi"]
        if lo is None:  # no rows to read: this run deletes nothing
            return Storage(p.timestamp_format or "iso")
        if all(isinstance(v, int | float) for v in (lo, hi)):
            return self._numeric(lo, hi, None)
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
        separators, zones = _spellings(rows)
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
        separator = next(iter(separators), " ")
        return Storage("iso", separator, next(iter(zones), ""))

    def _explain_where(self, conn: Any) -> None:
        try:
            self.engine.explain(conn, self.statement(EXPLAIN_WHERE))
        except Exception as exc:
            first = str(exc).splitlines()[0]
            raise SchemaError(
                f"policy {self.policy.name!r}: where = {self.policy.where!r} "
                f"is not a valid predicate on {self.policy.table!r}: {first}"
            ) from exc


def _spellings(rows: list[Any]) -> tuple[dict[str, int], dict[str, int]]:
    """Rows per separator and per zone (every UTC spelling as one) of ISO text."""
    separators: dict[str, int] = {}
    zones: dict[str, int] = {}
    for row in rows:
        if row["spelling"] == "date":
            continue  # a date alone sorts before its day's times in either spelling
        separator, zone = row["spelling"].split("|")
        zone = "" if zone in UTC_ZONES else zone
        separators[separator] = separators.get(separator, 0) + row["n"]
        zones[zone] = zones.get(zone, 0) + row["n"]
    return separators, zones
