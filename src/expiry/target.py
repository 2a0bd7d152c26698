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
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from .config import Policy
from .engines.base import Engine
from .errors import SchemaError
from .types import Job

log = logging.getLogger("expiry.target")

# -- the statements ----------------------------------------------------------------

PREDICATE = "{ts} < {p_cutoff}"

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
        self.ts_kind = "timestamp"  # sqlite: "epoch" or "iso" / "iso-t"
        self.checked = False
        self._texts: dict[tuple[str, bool], str] = {}

    # -- building statements -----------------------------------------------------

    def statement(self, template: str, *, positional: bool = False) -> Any:
        """The statement of ``template`` for this policy. ``positional`` (PostgreSQL):
        with window_apply's $1..$4 for parameters, as text that function executes."""
        p = self.policy
        pred = PREDICATE + (" and ({where})" if p.where else "")
        template = template.replace("{pred}", pred)
        names = ["cutoff", "after", "max", "window", "page", "lo", "hi", "key"]
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

    def text(self, conn: Any, template: str, *, positional: bool = False) -> str:
        """The statement as the driver sends it, built once per template (the
        schema check builds them afresh, as the columns may have changed)."""
        text = self._texts.get((template, positional))
        if text is None:
            built = self.statement(template, positional=positional)
            text = built if isinstance(built, str) else built.as_string(conn)
            self._texts[(template, positional)] = text
        return text

    def run(self, conn: Any, template: str, **params: Any) -> Any:
        if "cutoff" in params:
            params["cutoff"] = self.bind_time(params["cutoff"])
        return conn.execute(self.text(conn, template), params)

    def bind_time(self, value: datetime) -> Any:
        """A cutoff as the timestamp column stores it."""
        if self.engine.dialect == "postgres":
            return value
        value = value.astimezone(UTC)
        if self.ts_kind == "epoch":
            return value.timestamp()
        sep = "T" if self.ts_kind == "iso-t" else " "
        return value.strftime(f"%Y-%m-%d{sep}%H:%M:%S.%f").rstrip("0").rstrip(".")

    def read_time(self, value: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, int | float):
            return datetime.fromtimestamp(float(value), UTC)
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)

    # -- the operations ----------------------------------------------------------

    def bounds(self, conn: Any, cutoff: datetime) -> tuple[int, int] | None:
        row = self.run(conn, BOUNDS, cutoff=cutoff).fetchone()
        if row is None or row["lo"] is None:
            return None
        return int(row["lo"]), int(row["hi"])

    def plan_page(
        self, conn: Any, cutoff: datetime, after: int, max_key: int, page: int
    ) -> list[int]:
        """Lower bounds of up to ``page`` windows (lo, lo + window] after ``after``."""
        rows = self.run(
            conn,
            PLAN_PAGE,
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
            rows = self._copy_and_delete(conn, params)
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
                "statement": self.text(conn, DELETE if delete else ARCHIVE_MOVE, positional=True),
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

    def _copy_and_delete(self, conn: Any, params: dict[str, Any]) -> int:
        if self.policy.action == "delete":
            return int(self.run(conn, DELETE, **params).rowcount)
        copied = int(self.run(conn, ARCHIVE_COPY, **params).rowcount)
        deleted = int(self.run(conn, DELETE, **params).rowcount)
        if copied != deleted:
            raise SchemaError(f"archive copied {copied} rows but deleted {deleted}; rolled back")
        return deleted

    def count(self, conn: Any, cutoff: datetime) -> int:
        return int(self.run(conn, COUNT, cutoff=cutoff).fetchone()["n"])

    def oldest(self, conn: Any, cutoff: datetime) -> datetime | None:
        return self.read_time(self.run(conn, OLDEST, cutoff=cutoff).fetchone()["oldest"])

    # -- the schema check ----------------------------------------------------------

    def check(self, conn: Any) -> list[str]:
        """Check the policy against the live schema; returns warnings, raises SchemaError."""
        p = self.policy
        self._texts.clear()
        columns = self._columns(conn, p.table)
        if not columns:
            raise SchemaError(
                f"policy {p.name!r}: table {p.table!r} does not exist "
                "(fix: create it, or correct 'table')"
            )
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
        self.ts_kind = self._ts_kind(conn, by_name[p.timestamp])
        warnings = []
        if not by_name[p.timestamp].indexed:
            warnings.append(
                f"policy {p.name!r}: timestamp column {p.timestamp!r} has no index; "
                "planning and the watermark will scan the table"
            )
        self.columns = [c.name for c in columns]
        if p.action == "archive":
            assert p.archive_table is not None
            archive = {c.name for c in self._columns(conn, p.archive_table)}
            if not archive:
                raise SchemaError(
                    f"policy {p.name!r}: archive_table {p.archive_table!r} does not exist"
                )
            missing = [c for c in self.columns if c not in archive]
            if missing:
                raise SchemaError(
                    f"policy {p.name!r}: archive_table {p.archive_table!r} lacks "
                    f"columns {', '.join(missing)}"
                )
        if p.where:
            self._explain_where(conn)
        self.checked = True
        return warnings

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

    def _ts_kind(self, conn: Any, column: Column) -> str:
        if self.engine.dialect == "postgres":
            if not any(t in column.type for t in ("timestamp", "date")):
                raise SchemaError(
                    f"policy {self.policy.name!r}: timestamp column {column.name!r} is "
                    f"{column.type}; use timestamptz, timestamp or date"
                )
            return "timestamp"
        declared = column.type.upper()
        if any(t in declared for t in ("INT", "REAL", "FLOA", "DOUB", "NUM")):
            return "epoch"
        sample = conn.execute(
            f"select {quote(column.name)} as v from {quote(self.policy.table)} "
            f"where {quote(column.name)} is not null limit 1"
        ).fetchone()
        return "iso-t" if sample and "T" in str(sample["v"]) else "iso"


def quote(identifier: str) -> str:
    """Quote a validated SQLite identifier, schema-qualified or not."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in identifier.split("."))
