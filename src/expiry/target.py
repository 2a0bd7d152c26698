"""The statements expiry runs on a policy's table: the one place Python builds
SQL. Each statement is written once below; identifiers from the config are
validated (config.check_identifier) and quoted by the driver's API
(psycopg.sql on PostgreSQL), values are always bound parameters, and the
``where`` predicate (trusted config only) is wrapped in parentheses.

The retention predicate ``{ts} < cutoff AND (where)`` is evaluated by the
database when the statement runs, so a row revived after planning survives.
Dry-run, planning, the watermark and the delete all use the same predicate.

A window is applied and booked in the ledger together, in the caller's
transaction: its delete (or move) is guarded by the ledger, then the ledger row
is inserted with the count of rows it affected. On PostgreSQL both are one
statement, the function expiry.window_apply (migrations 0004 and 0005), which
takes the window's turn and executes the window's statement built here, with
its values bound by position.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from .config import Policy
from .engines.base import Engine
from .errors import SchemaError
from .timestamps import NUMERIC_RANGES, UTC_ZONES, Storage, instant, numeric_format
from .types import Job

log = logging.getLogger("expiry.target")

# -- the statements ----------------------------------------------------------------

# The retention predicate: the index bound and the storage's guard (see
# timestamps.py), then the user's where in parentheses. {bound} and {guard}
# are filled per storage and dialect by _predicate below.
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

# On PostgreSQL the turn, the delete (or move), its count, the job's completion
# and the ledger row (or a duplicate's audit event) are one statement: the
# function of migration 0005, given the window's statement with positional
# parameters. Outside a transaction (the worker's statement mode) it is its own
# transaction: one round trip. The comment names the table to whoever reads
# pg_stat_activity.
WINDOW_APPLY = """
select expiry.window_apply(%(statement)s, %(lo)s, %(hi)s, %(cutoff)s, %(key)s, %(policy)s,
                           %(run_id)s, %(action)s, %(worker)s, %(job_id)s, %(lease_token)s) as rows
"""
APPLY_DELETE = "/* expiry window: delete from {table} */" + WINDOW_APPLY
APPLY_ARCHIVE = "/* expiry window: delete from {table}, archive into {archive} */" + WINDOW_APPLY
WINDOW_APPLY_PARAMETERS = {"lo": "$1", "hi": "$2", "cutoff": "$3", "key": "$4"}

COUNT = "select count(*) as n from {table} where {pred}"

OLDEST = "select min({ts}) as oldest from {table} where {pred}"

EXPLAIN_WHERE = "explain select 1 from {table} where {where}"

# How the column stores time, read from every row the policy covers (never one
# row): per storage class and ISO spelling, the count and the range. SQLite
# only; a full scan of the timestamp index, once per run and per check.
STORAGE_SQLITE = """
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
# PostgreSQL integer columns: the range tells the unit.
STORAGE_POSTGRES = (
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


def _predicate(storage: Storage, dialect: str) -> tuple[str, str]:
    """The index bound and the guard of ``storage`` in ``dialect`` (timestamps.py
    says why each holds). PostgreSQL converts its timestamptz parameter in SQL,
    so window_apply's $3 stays one type; SQLite binds values Python computed."""
    if dialect == "postgres":
        if storage.format == "epoch":
            bound = "cast(ceil(extract(epoch from {p_cutoff})) as bigint)"
        elif storage.format == "epoch_ms":
            bound = "cast(ceil(extract(epoch from {p_cutoff}) * 1000) as bigint)"
        else:
            return "{p_cutoff}", ""
        return bound, f" and {{ts}} >= {NUMERIC_RANGES[storage.format][0]:.0f}"
    if storage.format == "native":  # SQLite has no native time type: before a check
        return "{p_cutoff}", " and 0"  # reads the column, a statement matches nothing
    if storage.format == "iso":
        return "{p_cutoff}", (
            " and typeof({ts}) = 'text' and julianday({ts}) < julianday({p_exact})"
        )
    low = NUMERIC_RANGES[storage.format][0]
    return "{p_cutoff}", f" and typeof({{ts}}) in ('integer', 'real') and {{ts}} >= {low:.0f}"


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    indexed: bool


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
        self._texts: dict[tuple[str, bool, str], str] = {}

    # -- building statements -----------------------------------------------------

    def statement(
        self, template: str, *, positional: bool = False, storage: Storage | None = None
    ) -> Any:
        """The statement of ``template`` for this policy and ``storage`` (default:
        the checked one). ``positional`` (PostgreSQL): with window_apply's $1..$4
        for parameters, as text that function executes."""
        p = self.policy
        storage = storage or self.storage
        bound, guard = _predicate(storage, self.engine.dialect)
        pred = PREDICATE.format(ts="{ts}", bound=bound, guard=guard)
        pred += " and ({where})" if p.where else ""
        template = template.replace("{pred}", pred)
        names = ["cutoff", "exact", "after", "max", "window", "page", "lo", "hi", "key"]
        if self.engine.dialect == "postgres":
            if positional:
                where = p.where or "true"  # sent as a value: no %% escaping
                placeholders: dict[str, sql.Composable] = {
                    n: sql.SQL(WINDOW_APPLY_PARAMETERS.get(n, "null")) for n in names
                }
            else:
                where = p.where.replace("%", "%%") if p.where else "true"
                placeholders = {n: sql.Placeholder(n) for n in names}
            return sql.SQL(template).format(
                table=sql.Identifier(*p.table.split(".")),
                archive=sql.Identifier(*(p.archive_table or "_").split(".")),
                ledger=sql.Identifier("expiry", "ledger"),
                key=sql.Identifier(p.key),
                ts=sql.Identifier(p.timestamp),
                columns=sql.SQL(", ").join(sql.Identifier(c) for c in self.columns),
                where=sql.SQL(where),
                **{f"p_{n}": placeholder for n, placeholder in placeholders.items()},
            )
        return template.format(
            table=quote(p.table),
            archive=quote(p.archive_table or "_"),
            ledger=quote("expiry_ledger"),
            key=quote(p.key),
            ts=quote(p.timestamp),
            columns=", ".join(quote(c) for c in self.columns),
            where=p.where or "1",
            **{f"p_{n}": f":{n}" for n in names},
        )

    def text(
        self, conn: Any, template: str, *, positional: bool = False, storage: Storage | None = None
    ) -> str:
        """The statement as the driver sends it, built once per template and
        storage (the schema check builds them afresh, as the columns may have
        changed)."""
        storage = storage or self.storage
        cache = (template, positional, storage.token if "{pred}" in template else "")
        text = self._texts.get(cache)
        if text is None:
            built = self.statement(template, positional=positional, storage=storage)
            text = built if isinstance(built, str) else built.as_string(conn)
            self._texts[cache] = text
        return text

    def run(self, conn: Any, template: str, storage: Storage | None = None, **params: Any) -> Any:
        storage = storage or self.storage
        if "cutoff" in params:
            cutoff = params["cutoff"]
            if self.engine.dialect != "postgres":
                params["cutoff"] = storage.bound(cutoff)
                params["exact"] = storage.exact(cutoff)
        return conn.execute(self.text(conn, template, storage=storage), params)

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
        p = self.policy
        ledger = {"policy": p.name, "run_id": run_id, "action": p.action, "worker": worker}
        if self.engine.dialect != "postgres":
            params = {"cutoff": cutoff, "lo": lo, "hi": hi, "key": key}
            rows = self._copy_and_delete(conn, params, storage)
            if job is not None:
                self.engine.job_complete(job, conn)
            # Rows taken: the ledger row must be this delivery's (strict), else
            # AlreadyApplied; none taken: a booked key is a duplicate.
            if self.engine.ledger_insert(
                conn, key, strict=rows > 0, lo=lo, hi=hi, rows=rows, **ledger
            ):
                return rows
            self.engine.audit_append(
                conn,
                "window.duplicate",
                actor=worker or "worker",
                policy=p.name,
                run_id=run_id,
                job_key=key,
            )
            return None
        self.engine.session_limits(
            conn, f"{int(p.lock_timeout * 1000)}ms", f"{int(p.statement_timeout * 1000)}ms"
        )
        delete = p.action == "delete"
        row = conn.execute(
            self.text(conn, APPLY_DELETE if delete else APPLY_ARCHIVE),
            {
                "statement": self.text(
                    conn, DELETE if delete else ARCHIVE_MOVE, positional=True, storage=storage
                ),
                "lo": lo,
                "hi": hi,
                "cutoff": cutoff,
                "key": key,
                "job_id": job.id if job is not None else None,
                "lease_token": job.lease_token if job is not None else None,
                **ledger,
            },
            prepare=True,
        ).fetchone()
        return None if row["rows"] is None else int(row["rows"])

    def _copy_and_delete(self, conn: Any, params: dict[str, Any], storage: Storage | None) -> int:
        if self.policy.action == "delete":
            return int(self.run(conn, DELETE, storage, **params).rowcount)
        copied = int(self.run(conn, ARCHIVE_COPY, storage, **dict(params)).rowcount)
        deleted = int(self.run(conn, DELETE, storage, **dict(params)).rowcount)
        if copied != deleted:
            raise SchemaError(f"archive copied {copied} rows but deleted {deleted}; rolled back")
        return deleted

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
        columns = self._columns(conn, p.table)
        by_name = {c.name: c for c in columns}
        for field, column in (("key", p.key), ("timestamp", p.timestamp)):
            if column not in by_name:
                raise SchemaError(
                    f"policy {p.name!r}: {field} column {column!r} is not in table {p.table!r} "
                    f"(columns: {', '.join(by_name)})"
                )
        key_type = by_name[p.key].type.lower()
        if self.engine.dialect == "postgres":  # "interval" and "point" contain "int"
            integer = key_type in ("smallint", "integer", "bigint")
        else:  # SQLite's own rule for integer affinity
            integer = "int" in key_type
        if not integer:
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
            assert p.archive_table is not None
            self._check_relation(conn, p.archive_table, "archive_table")
            archive = {c.name for c in self._columns(conn, p.archive_table)}
            missing = [c for c in self.columns if c not in archive]
            if missing:
                raise SchemaError(
                    f"policy {p.name!r}: archive_table {p.archive_table!r} lacks "
                    f"columns {', '.join(missing)}"
                )
        if p.where:
            self._explain_where(conn)
        self.storage = self.detect(conn)
        self.checked = True
        return warnings

    def _check_relation(self, conn: Any, table: str, field: str) -> None:
        """The table exists, is one expiry may delete from (or insert into), and is
        not one of expiry's own."""
        p = self.policy
        name = table.split(".")[-1]
        if self.engine.dialect == "postgres":
            row = conn.execute(
                """
                select c.relkind as kind, n.nspname as schema,
                       pg_relation_is_updatable(c.oid, false) as updatable
                from pg_class c join pg_namespace n on n.oid = c.relnamespace
                where c.oid = to_regclass(%s)
                """,
                (".".join(sql.Identifier(part).as_string(conn) for part in table.split(".")),),
            ).fetchone()
            own = row is not None and row["schema"] == "expiry"
            kind = (
                None
                if row is None
                else {"r": "table", "p": "table", "v": "view"}.get(
                    row["kind"],
                    {"m": "materialized view", "f": "foreign table"}.get(row["kind"], "relation"),
                )
            )
            # pg_relation_is_updatable's bits: 4 update, 8 insert, 16 delete.
            writable = row is not None and (row["updatable"] & (16 if field == "table" else 8))
        else:
            row = conn.execute(
                "select type from sqlite_master where name = ? collate nocase", (name,)
            ).fetchone()
            own = name.lower().startswith("expiry_")
            kind = None if row is None else row["type"]
            writable = kind == "table"
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
        if self.engine.dialect == "postgres":
            return self._detect_postgres(conn)
        return self._detect_sqlite(conn)

    def _refuse(self, problem: str, fix: str) -> SchemaError:
        p = self.policy
        return SchemaError(
            f"policy {p.name!r}: timestamp column {p.timestamp!r} {problem}; nothing is "
            f"deleted while it could be misread. Fix: {fix}"
        )

    def _detect_postgres(self, conn: Any) -> Storage:
        p, declared = self.policy, self._declared.lower()
        if declared.startswith(("timestamp", "date")):
            if p.timestamp_format:
                raise self._refuse(
                    f"is {self._declared}, a native time type",
                    "remove timestamp_format (it is for integer epoch columns)",
                )
            return Storage("native")
        if declared not in ("smallint", "integer", "bigint"):
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
        row = conn.execute(self.text(conn, STORAGE_POSTGRES), {}).fetchone()
        return self._numeric(row["lo"], row["hi"], None)

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

    def _detect_sqlite(self, conn: Any) -> Storage:
        p = self.policy
        ends = conn.execute(self.text(conn, STORAGE_ENDS), {}).fetchone()
        lo, hi = ends["lo"], ends["hi"]
        if lo is None:  # no rows to read: this run deletes nothing
            return Storage(p.timestamp_format or "iso")
        if all(isinstance(v, int | float) for v in (lo, hi)):
            return self._numeric(lo, hi, None)
        rows = conn.execute(self.text(conn, STORAGE_SQLITE), {}).fetchall()
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
        separators: dict[str, int] = {}
        zones: dict[str, int] = {}
        for row in rows:
            if row["spelling"] == "date":
                continue  # a date alone sorts before its day's times in either spelling
            separator, zone = row["spelling"].split("|")
            zone = "" if zone in UTC_ZONES else zone
            separators[separator] = separators.get(separator, 0) + row["n"]
            zones[zone] = zones.get(zone, 0) + row["n"]
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
        savepoint = self.engine.dialect == "postgres"
        try:
            if savepoint:
                conn.execute("savepoint expiry_explain")
            # Bound with (empty) parameters, as every other statement is, so
            # that the '%%' escaping of a '%' in the predicate is undone.
            conn.execute(self.statement(EXPLAIN_WHERE), {})
            if savepoint:
                conn.execute("release savepoint expiry_explain")
        except Exception as exc:
            if savepoint:
                conn.execute("rollback to savepoint expiry_explain")
            first = str(exc).splitlines()[0]
            raise SchemaError(
                f"policy {self.policy.name!r}: where = {self.policy.where!r} "
                f"is not a valid predicate on {self.policy.table!r}: {first}"
            ) from exc

    def _columns(self, conn: Any, table: str) -> list[Column]:
        if self.engine.dialect == "postgres":
            rows = conn.execute(
                """
                select a.attname as name, format_type(a.atttypid, a.atttypmod) as type,
                       exists (select 1 from pg_index i
                               where i.indrelid = a.attrelid and i.indkey[0] = a.attnum) as indexed
                from pg_attribute a
                where a.attrelid = to_regclass(%s) and a.attnum > 0 and not a.attisdropped
                order by a.attnum
                """,
                (".".join(sql.Identifier(part).as_string(conn) for part in table.split(".")),),
            ).fetchall()
            return [Column(r["name"], r["type"], r["indexed"]) for r in rows]
        name = table.split(".")[-1]
        rows = conn.execute(f"pragma table_info({quote(name)})").fetchall()
        first_columns = set()
        for index in conn.execute(f"pragma index_list({quote(name)})").fetchall():
            info = conn.execute(f"pragma index_info({quote(index['name'])})").fetchall()
            if info:
                first_columns.add(info[0]["name"])
        return [
            Column(r["name"], r["type"] or "", r["name"] in first_columns or r["pk"] == 1)
            for r in rows
        ]


def quote(identifier: str) -> str:
    """Quote a validated SQLite identifier, schema-qualified or not."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in identifier.split("."))
