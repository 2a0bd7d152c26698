"""A policy's table on PostgreSQL: quoting, typing, the catalog, and the window
as one statement.

Identifiers are quoted by psycopg.sql. A window is one call of the function
expiry.window_apply (migrations 0004 to 0006), given the window's statement
with positional parameters: it takes the window's turn, runs the statement,
completes the job and books the ledger. Outside a transaction (the worker's
statement mode) the call is its own transaction: one round trip.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import errors, sql
from psycopg.pq import TransactionStatus

from ...errors import ForeignKeyBlocked
from ...timestamps import Storage
from ...types import (
    Column,
    FlowControl,
    Index,
    Layout,
    Partition,
    Reference,
    Relation,
    Replica,
    VacuumStats,
    WindowApply,
)
from ..base import Engine

# The window statement's named parameters as window_apply passes them ($1..$5,
# $5 a time window's positions as text); any other named parameter becomes null.
_POSITIONS = {
    "lo": "$1",
    "hi": "$2",
    "cutoff": "$3",
    "key": "$4",
    "lo_ts": "$5[1]",
    "lo_tie": "$5[2]",
    "hi_ts": "$5[3]",
    "hi_tie": "$5[4]",
}

_APPLY = """
select expiry.window_apply(%(statement)s, %(lo)s, %(hi)s, %(cutoff)s, %(key)s, %(policy)s,
                           %(run_id)s, %(action)s, %(worker)s, %(job_id)s, %(lease_token)s,
                           %(positions)s, %(bounds)s) as rows
"""

_COLUMNS = """
select a.attname as name, format_type(a.atttypid, a.atttypmod) as type,
       exists (select 1 from pg_index i
               where i.indrelid = a.attrelid and i.indkey[0] = a.attnum) as indexed
from pg_attribute a
where a.attrelid = to_regclass(%s) and a.attnum > 0 and not a.attisdropped
order by a.attnum
"""

_RELATION = """
select c.relkind as kind, n.nspname as schema,
       pg_relation_is_updatable(c.oid, false) as updatable
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.oid = to_regclass(%s)
"""

# Key columns in order (INCLUDE columns left out); an expression reads as null.
# Partial indexes are left out: they serve only queries that imply their predicate.
_INDEXES = """
select ic.relname as name, i.indisunique as unique,
       array(select a.attname
             from unnest(i.indkey[0:i.indnkeyatts - 1]) with ordinality as k(attnum, n)
             left join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
             order by k.n) as columns
from pg_index i join pg_class ic on ic.oid = i.indexrelid
where i.indrelid = to_regclass(%s) and i.indpred is null
order by ic.relname
"""

# Foreign keys to a table; ``indexed``: a valid, non-partial index of the
# referencing table leads with the key's columns, in any order (the
# referential action's lookup of a deleted row's references can seek it).
_REFERENCES = """
select n.nspname as schema, r.relname as name, c.confdeltype as action,
       array(select a.attname from unnest(c.conkey) with ordinality as k(attnum, i)
             join pg_attribute a on a.attrelid = c.conrelid and a.attnum = k.attnum
             order by k.i) as columns,
       array(select a.attname from unnest(c.confkey) with ordinality as k(attnum, i)
             join pg_attribute a on a.attrelid = c.confrelid and a.attnum = k.attnum
             order by k.i) as referenced,
       exists (select 1 from pg_index i
               where i.indrelid = c.conrelid and i.indpred is null and i.indisvalid
                 and i.indnkeyatts >= cardinality(c.conkey)
                 and (i.indkey::int2[])[0:cardinality(c.conkey) - 1] @> c.conkey
                 and c.conkey @> (i.indkey::int2[])[0:cardinality(c.conkey) - 1]) as indexed
from pg_constraint c
join pg_class r on r.oid = c.conrelid join pg_namespace n on n.oid = r.relnamespace
where c.contype = 'f' and c.confrelid = to_regclass(%s) and c.conparentid = 0
order by n.nspname, r.relname, c.conname
"""

_STILL_ATTACHED = """
select 1 as attached from pg_inherits
where inhrelid = to_regclass(%s) and inhparent = to_regclass(%s)
"""

# The parent's partition key read once (not once a partition); with only, the
# one partition of that name (a partition job reads its own: 0.25 against
# 1.0 ms for 69 daily partitions).
_PARTITIONS = """
with parent as materialized (select to_regclass(%(table)s) as oid)
select n.nspname as schema, c.relname as name, pg_get_expr(c.relpartbound, c.oid) as bound,
       c.reltuples::bigint as rows,
       (select pg_get_partkeydef(p.oid) from parent p) as partkey
from parent, pg_inherits i join pg_class c on c.oid = i.inhrelid
join pg_namespace n on n.oid = c.relnamespace
where i.inhparent = parent.oid and (%(only)s::text is null or c.relname = %(only)s)
order by n.nspname, c.relname
"""

_LAYOUT = """
select pg_relation_size(c.oid) / current_setting('block_size')::int as pages,
       c.reltuples::bigint as rows,
       (select s.correlation from pg_stats s
        where s.schemaname = n.nspname and s.tablename = c.relname
          and s.attname = %(column)s and not s.inherited) as correlation
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.oid = to_regclass(%(table)s)
"""

_REPLICAS = """
select coalesce(nullif(application_name, ''), client_addr::text, pid::text) as name,
       state is not null as visible,
       (replay_lsn - '0/0'::pg_lsn)::bigint as replay,
       extract(epoch from replay_lag)::float8 as lag
from pg_stat_replication order by name
"""

_REPLAY_LAG = """
select pg_is_in_recovery() as standby,
       case when pg_last_wal_receive_lsn() is not distinct from pg_last_wal_replay_lsn() then 0
            -- behind, and nothing replayed since it started to date it by: unknown, late
            when pg_last_xact_replay_timestamp() is null then 'Infinity'::float8
            else extract(epoch from now() - pg_last_xact_replay_timestamp())::float8 end as lag
"""

_ACTIVE = """
select count(*) as n from pg_stat_activity
where state = 'active' and backend_type = 'client backend' and pid <> pg_backend_pid()
"""

_FOREGROUND = """
select count(*) as n from pg_stat_activity
where backend_type = 'client backend' and pid <> pg_backend_pid()
  and application_name is distinct from current_setting('application_name')
  and (state = 'active' or state_change > clock_timestamp() - make_interval(secs => %(within)s))
"""

_VACUUM_STATS = """
select n_live_tup as live, n_dead_tup as dead,
       greatest(last_vacuum, last_autovacuum) as vacuumed,
       greatest(last_analyze, last_autoanalyze) as analyzed
from pg_stat_user_tables where relid = to_regclass(%(table)s)
"""

_ON_DELETE = {
    "a": "no action",
    "r": "restrict",
    "c": "cascade",
    "n": "set null",
    "d": "set default",
}
_RANGE_KEY = re.compile(r'^RANGE \(("(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)\)$')
_UPPER = re.compile(r" TO \((.*)\)$")

_KINDS = {"r": "table", "p": "table", "v": "view", "m": "materialized view", "f": "foreign table"}


class PostgresTables(Engine):
    """The Engine methods about a policy's table (the base of PostgresEngine)."""

    ledger_table = '"expiry"."ledger"'
    typed_columns = True
    _applies: dict[str, str]

    def quote(self, identifier: str) -> str:
        return sql.Identifier(*identifier.split(".")).as_string(None)

    def placeholder(self, name: str) -> str:
        return f"%({name})s"

    def escape(self, text: str) -> str:
        return text.replace("%", "%%")

    def time_predicate(self, storage: Storage, declared: str | None = None) -> tuple[str, str]:
        # The timestamptz parameter is converted in SQL (an expression of the
        # parameter alone: the index is still used), so window_apply's $3 keeps
        # one type whatever the column stores. A naive column read in a zone is
        # compared with its wall-clock bound as a timestamp (Storage.compared),
        # whatever the session's TimeZone.
        if storage.zone:
            return "({p_cutoff} at time zone 'UTC')", ""
        if storage.format == "epoch":
            bound = "cast(ceil(extract(epoch from {p_cutoff})) as bigint)"
        elif storage.format == "epoch_ms":
            bound = "cast(ceil(extract(epoch from {p_cutoff}) * 1000) as bigint)"
        else:
            return "{p_cutoff}", ""
        return bound, f" and {storage.plausible()}"

    def cutoff_params(self, storage: Storage, cutoff: datetime) -> dict[str, Any]:
        # Naive wall-clock times of a zone: their bound, labelled UTC as this
        # session reads a naive value (Storage.compared).
        return {"cutoff": storage.compared(cutoff)}

    def column_kind(self, declared: str) -> str:
        declared = declared.lower()
        if declared in ("smallint", "integer", "bigint"):  # not "interval", "point"
            return "integer"
        if declared.startswith(("timestamp", "date")):
            return "time"
        return "other"

    def table_columns(self, conn: Any, table: str) -> list[Column]:
        rows = conn.execute(_COLUMNS, (self.quote(table),)).fetchall()
        return [Column(r["name"], r["type"], r["indexed"]) for r in rows]

    def table_relation(self, conn: Any, table: str) -> Relation | None:
        row = conn.execute(_RELATION, (self.quote(table),)).fetchone()
        if row is None:
            return None
        # pg_relation_is_updatable's bits: 4 update, 8 insert, 16 delete.
        return Relation(
            kind=_KINDS.get(row["kind"], "relation"),
            own=row["schema"] == "expiry",
            deletable=bool(row["updatable"] & 16),
            insertable=bool(row["updatable"] & 8),
            partitioned=row["kind"] == "p",
        )

    # Row addresses: block * 65536 + item, compared as tids (a TID Range Scan
    # reads just the window's blocks).
    block_span = (
        "ctid > cast('(' || ({p_lo} / 65536) || ',' || mod({p_lo}, 65536) || ')' as tid)"
        " and ctid <= cast('(' || ({p_hi} / 65536) || ',' || mod({p_hi}, 65536) || ')' as tid)"
    )
    block_of_row = "((ctid::text::point)[0]::bigint * 65536 + (ctid::text::point)[1]::bigint)"
    partition_rows = "tableoid = cast({p_partition} as regclass)"

    def table_layout(self, conn: Any, table: str, column: str) -> Layout | None:
        row = conn.execute(_LAYOUT, {"table": self.quote(table), "column": column}).fetchone()
        if row is None or row["pages"] is None:
            return None
        correlation = row["correlation"]
        return Layout(
            int(row["pages"]),
            int(row["rows"]),
            None if correlation is None else float(correlation),
        )

    def health_wal_position(self, conn: Any) -> int | None:
        row = conn.execute(
            "select case when pg_is_in_recovery() then null"
            " else (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint end as lsn"
        ).fetchone()
        return None if row is None or row["lsn"] is None else int(row["lsn"])

    def health_replicas(self, conn: Any) -> list[Replica]:
        return [
            Replica(
                str(row["name"]),
                None if row["replay"] is None else int(row["replay"]),
                None if row["lag"] is None else float(row["lag"]),
                bool(row["visible"]),
            )
            for row in conn.execute(_REPLICAS).fetchall()
        ]

    def health_replay_lag(self, conn: Any) -> float | None:
        row = conn.execute(_REPLAY_LAG).fetchone()
        if row is None or not row["standby"]:
            return None
        return max(0.0, float(row["lag"]))

    def health_active_backends(self, conn: Any) -> int | None:
        row = conn.execute(_ACTIVE).fetchone()
        return int(row["n"]) if row else 0

    def health_flow_control(self, conn: Any) -> FlowControl | None:
        return None  # no Galera: a standby's lag is replica_lag

    def write_set_limit(self, conn: Any) -> int | None:
        return None

    def health_foreground_sessions(self, conn: Any, within: float) -> int | None:
        row = conn.execute(_FOREGROUND, {"within": within}).fetchone()
        return int(row["n"]) if row else 0

    def table_vacuum_stats(self, conn: Any, table: str) -> VacuumStats | None:
        row = conn.execute(_VACUUM_STATS, {"table": self.quote(table)}).fetchone()
        if row is None:
            return None
        return VacuumStats(int(row["live"]), int(row["dead"]), row["vacuumed"], row["analyzed"])

    def table_vacuum(self, conn: Any, table: str) -> None:
        conn.execute(f"vacuum (analyze) {self.quote(table)}")

    def estimate_rows(self, conn: Any, statement: str, params: dict[str, Any]) -> int | None:
        row = conn.execute("explain (format json) " + statement, params).fetchone()
        plan = next(iter(row.values()))
        return int(plan[0]["Plan"]["Plan Rows"])

    def placeholder_as(self, name: str, declared: str) -> str:
        # The type as format_type wrote it: a catalog's name, quoted where needed.
        return f"cast(%({name})s as {declared})"

    def table_indexes(self, conn: Any, table: str) -> list[Index]:
        rows = conn.execute(_INDEXES, (self.quote(table),)).fetchall()
        found = []
        for row in rows:
            columns = row["columns"]
            if None in columns:  # an expression: the columns before it still order
                columns = columns[: columns.index(None)]
            found.append(Index(row["name"], tuple(columns), bool(row["unique"])))
        return found

    def table_references(self, conn: Any, table: str) -> list[Reference]:
        rows = conn.execute(_REFERENCES, (self.quote(table),)).fetchall()
        return [
            Reference(
                table=_qualified(row["schema"], row["name"]),
                columns=tuple(row["columns"]),
                referenced=tuple(row["referenced"]),
                on_delete=_ON_DELETE.get(row["action"], row["action"]),
                indexed=bool(row["indexed"]),
            )
            for row in rows
        ]

    def index_statement(self, table: str, columns: Sequence[str]) -> str:
        # Concurrently: a plain CREATE INDEX blocks the table's writes while it builds.
        return (
            super()
            .index_statement(table, columns)
            .replace("create index", "create index concurrently", 1)
        )

    def table_partitions(self, conn: Any, table: str, only: str | None = None) -> list[Partition]:
        rows = conn.execute(_PARTITIONS, {"table": self.quote(table), "only": only}).fetchall()
        found = []
        for row in rows:
            match = _RANGE_KEY.match(row["partkey"] or "")
            key = None
            if match:
                key = match.group(1)
                key = key[1:-1].replace('""', '"') if key.startswith('"') else key
            found.append(
                Partition(
                    schema=row["schema"],
                    name=row["name"],
                    key=key,
                    upper=_upper(row["bound"]) if key else None,
                    rows=int(row["rows"]),
                )
            )
        return found

    def partition_remove(
        self, conn: Any, table: str, partition: Partition, *, drop: bool, lock_timeout_ms: int
    ) -> int | None:
        # lock_timeout bounds every wait below behind live traffic (and the
        # queue of statements that would form behind a waiting lock).
        conn.execute("select set_config('lock_timeout', %s, true)", (f"{lock_timeout_ms}ms",))
        name = sql.Identifier(partition.schema, partition.name).as_string(None)
        # SHARE ROW EXCLUSIVE on the partition alone: its readers (and the
        # parent's) go on, no row can be written to it, and a concurrent removal
        # of it waits for this one to end. Under it the count is exact, the
        # evidence the ledger books.
        try:
            with conn.transaction():  # a savepoint: a partition dropped meanwhile is no error
                conn.execute(f"lock table {name} in share row exclusive mode")
        except errors.UndefinedTable:
            return None
        still = conn.execute(_STILL_ATTACHED, (name, self.quote(table))).fetchone()
        if still is None:  # detached by a concurrent removal that committed first
            return None
        counted = sql.SQL("select count(*) as n from {}").format(
            sql.Identifier(partition.schema, partition.name)
        )
        rows = int(conn.execute(counted).fetchone()["n"])
        # DETACH takes the parent's ACCESS EXCLUSIVE lock, for a catalog change only.
        conn.execute(f"alter table {self.quote(table)} detach partition {name}")
        if drop:
            conn.execute(f"drop table {name}")
        return rows

    def explain(self, conn: Any, statement: str) -> None:
        # In a savepoint, so that a failed plan leaves the transaction usable.
        conn.execute("savepoint expiry_explain")
        try:
            conn.execute("explain " + statement, {})  # bound: '%%' is undone
        except Exception:
            conn.execute("rollback to savepoint expiry_explain")
            raise
        conn.execute("release savepoint expiry_explain")

    def window_apply(self, conn: Any, window: WindowApply) -> int | None:
        self.session_limits(conn, f"{window.lock_timeout_ms}ms", f"{window.statement_timeout_ms}ms")
        if conn.info.transaction_status == TransactionStatus.IDLE:
            # One statement, its own transaction: a failure leaves nothing behind.
            return self._apply(conn, window)
        try:
            with conn.transaction():  # a savepoint: the caller's transaction survives
                return self._apply(conn, window)
        except errors.ForeignKeyViolation as exc:
            raise ForeignKeyBlocked(str(exc).splitlines()[0]) from exc

    def _apply(self, conn: Any, window: WindowApply) -> int | None:
        statement = _positional(window.move if window.move is not None else window.delete)
        try:
            row = self._call(conn, window, statement)
        except errors.ForeignKeyViolation as exc:
            if conn.info.transaction_status != TransactionStatus.IDLE:
                raise  # undone by the savepoint above, then translated
            raise ForeignKeyBlocked(str(exc).splitlines()[0]) from exc
        return None if row["rows"] is None else int(row["rows"])

    def _call(self, conn: Any, window: WindowApply, statement: str) -> Any:
        return conn.execute(
            self._apply_text(window.label),
            {
                "statement": statement,
                "lo": window.lo,
                "hi": window.hi,
                "cutoff": window.params["cutoff"],
                "key": window.key,
                "policy": window.policy,
                "run_id": window.run_id,
                "action": window.action,
                "worker": window.worker,
                "job_id": window.job.id if window.job is not None else None,
                "lease_token": window.job.lease_token if window.job is not None else None,
                "positions": window.positions,
                "bounds": window.bounds,
            },
            prepare=True,
        ).fetchone()

    def _apply_text(self, label: str) -> str:
        """The call, prefixed with the comment that names the table to whoever
        reads pg_stat_activity; one text per table, so it is prepared once."""
        text = self._applies.get(label)
        if text is None:
            text = self._applies[label] = f"/* {label} */" + _APPLY
        return text


_STATEMENTS: dict[str, str] = {}


def _positional(statement: str) -> str:
    """The window's statement with window_apply's positional parameters, as the
    text that function executes (its parameters are values: no '%%' escape)."""
    text = _STATEMENTS.get(statement)
    if text is None:
        text = statement
        for name, position in _POSITIONS.items():
            text = text.replace(f"%({name})s", position)
        for name in ("exact",):  # used by other engines' predicates only
            text = text.replace(f"%({name})s", "null")
        _STATEMENTS[statement] = text = text.replace("%%", "%")
    return text


def _qualified(schema: str, name: str) -> str:
    """A table's name as a user writes it: the schema only outside public."""
    return name if schema == "public" else f"{schema}.{name}"


def _upper(bound: str | None) -> str | None:
    """The upper bound of a one-column range partition, as the literal's text
    (None: MAXVALUE, DEFAULT or another form)."""
    match = _UPPER.search(bound or "")
    if match is None:
        return None
    text = match.group(1)
    if text.startswith("'") and text.endswith("'") and len(text) >= 2:
        return text[1:-1].replace("''", "'")
    if text.upper() == "MAXVALUE" or "," in text:
        return None
    return text  # a number
