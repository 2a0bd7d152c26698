"""A policy's table on MySQL and MariaDB: quoting, typing, the catalog
(information_schema), and the window as statements in one transaction.

Identifiers are quoted with backticks (a backtick inside doubled), values are
bound by PyMySQL. A window runs as statements inside the worker's transaction,
as on SQLite: its delete is guarded by the ledger, then the job is completed
and the ledger row inserted. Deliveries of one window take turns on the rows
themselves and on the ledger's unique key: a second delivery's delete waits on
the first's row locks and then finds the rows gone (READ COMMITTED re-reads
them), and its ledger insert waits on the first's key and then meets it
(duplicate key): no rows taken is an audited duplicate, rows taken roll back
(AlreadyApplied). An archive locks the window's rows, copies them, deletes
them and checks that the two counts agree.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pymysql

from ...errors import ForeignKeyBlocked, SchemaError, TransientError
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
from ..common import index_leads

_COLUMNS = """
select c.column_name as name, c.column_type as type,
       exists (select 1 from information_schema.statistics s
               where s.table_schema = c.table_schema and s.table_name = c.table_name
                 and s.column_name = c.column_name and s.seq_in_index = 1) as indexed
from information_schema.columns c
where c.table_schema = coalesce(%(schema)s, database()) and c.table_name = %(table)s
order by c.ordinal_position
"""

_RELATION = """
select t.table_type as kind, coalesce(v.is_updatable, 'YES') as updatable,
       (select count(*) from information_schema.partitions p
        where p.table_schema = t.table_schema and p.table_name = t.table_name
          and p.partition_name is not null) as partitions,
       t.engine as engine,
       (select group_concat(s.column_name order by s.seq_in_index separator ',')
        from information_schema.statistics s
        where s.table_schema = t.table_schema and s.table_name = t.table_name
          and s.index_name = 'PRIMARY') as primary_key
from information_schema.tables t
left join information_schema.views v
       on v.table_schema = t.table_schema and v.table_name = t.table_name
where t.table_schema = coalesce(%(schema)s, database()) and t.table_name = %(table)s
"""

# Key columns in order; a column indexed by a prefix only, or an expression
# (MySQL 8's functional key parts), ends what the index orders.
_INDEXES = """
select index_name as name, non_unique, column_name as column_name, sub_part
from information_schema.statistics
where table_schema = coalesce(%(schema)s, database()) and table_name = %(table)s
order by index_name, seq_in_index
"""

_REFERENCES = """
select k.table_schema as `schema`, k.table_name as name, k.constraint_name as constraint_name,
       k.column_name as column_name, k.referenced_column_name as referenced,
       r.delete_rule as on_delete
from information_schema.key_column_usage k
join information_schema.referential_constraints r
  on r.constraint_schema = k.constraint_schema and r.constraint_name = k.constraint_name
 and r.table_name = k.table_name
where k.referenced_table_schema = coalesce(%(schema)s, database())
  and k.referenced_table_name = %(table)s
order by k.table_schema, k.table_name, k.constraint_name, k.ordinal_position
"""


_BASE_TYPE = re.compile(r"^[a-z]+")


def quote(identifier: str) -> str:
    """Quote a validated identifier, database-qualified or not, with backticks."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in identifier.split("."))


def _split(table: str) -> dict[str, Any]:
    schema, _, name = table.rpartition(".")
    return {"schema": schema or None, "table": name}


class MySQLTables(Engine):
    """The Engine methods about a policy's table (the base of MySQLEngine)."""

    ledger_table = "`expiry_ledger`"
    typed_columns = True
    integer_type = "signed"
    integer_division = "div"
    recursive_scans = False

    def quote(self, identifier: str) -> str:
        return quote(identifier)

    def placeholder(self, name: str) -> str:
        return f"%({name})s"

    def escape(self, text: str) -> str:
        return text.replace("%", "%%")

    def time_predicate(self, storage: Storage, declared: str | None = None) -> tuple[str, str]:
        # unix_timestamp() reads the cutoff in the session's time zone, UTC.
        if storage.format == "epoch":
            bound = "cast(ceil(unix_timestamp({p_cutoff})) as signed)"
        elif storage.format == "epoch_ms":
            bound = "cast(ceil(unix_timestamp({p_cutoff}) * 1000) as signed)"
        else:
            return "{p_cutoff}", ""
        return bound, f" and {storage.plausible()}"

    def cutoff_params(self, storage: Storage, cutoff: datetime) -> dict[str, Any]:
        # Naive wall-clock times of a zone: their bound, labelled UTC as this
        # session reads a naive value (Storage.compared).
        return {"cutoff": storage.compared(cutoff)}

    def column_kind(self, declared: str) -> str:
        base = _BASE_TYPE.match(declared.lower())
        name = base.group(0) if base else ""
        if name in ("tinyint", "smallint", "mediumint", "int", "integer", "bigint"):
            return "integer"
        if name in ("datetime", "timestamp", "date"):
            return "time"
        return "other"

    def table_columns(self, conn: Any, table: str) -> list[Column]:
        rows = conn.execute(_COLUMNS, _split(table)).fetchall()
        return [Column(r["name"], r["type"], bool(r["indexed"])) for r in rows]

    def table_relation(self, conn: Any, table: str) -> Relation | None:
        row = conn.execute(_RELATION, _split(table)).fetchone()
        if row is None:
            return None
        kind = {"BASE TABLE": "table", "VIEW": "view", "SYSTEM VERSIONED": "table"}.get(
            row["kind"], str(row["kind"]).lower()
        )
        writable = kind == "table" or (kind == "view" and row["updatable"] == "YES")
        return Relation(
            kind=kind,
            own=_split(table)["table"].lower().startswith("expiry_"),
            deletable=writable,
            insertable=writable,
            partitioned=int(row["partitions"]) > 0,
            # InnoDB clusters the table on its primary key: every secondary
            # index ends with it, so an index on (ts) orders by (ts, pk).
            clustered=row["primary_key"]
            if (row["engine"] or "").lower() == "innodb"
            and row["primary_key"]
            and "," not in row["primary_key"]
            else None,
        )

    def table_layout(self, conn: Any, table: str, column: str) -> Layout | None:
        return None  # no correlation statistics: windows by key or by time

    def estimate_rows(self, conn: Any, statement: str, params: dict[str, Any]) -> int | None:
        return None

    def placeholder_as(self, name: str, declared: str) -> str:
        return f"%({name})s"  # the server converts a bound value to the column's type

    def table_indexes(self, conn: Any, table: str) -> list[Index]:
        found: dict[str, tuple[list[str], bool, bool]] = {}
        for row in conn.execute(_INDEXES, _split(table)).fetchall():
            columns, unique, open_ = found.setdefault(
                row["name"], ([], not row["non_unique"], True)
            )
            if not open_:
                continue
            if row["column_name"] is None or row["sub_part"] is not None:
                found[row["name"]] = (columns, unique, False)
                continue
            columns.append(row["column_name"])
        return [Index(name, tuple(cols), unique) for name, (cols, unique, _) in found.items()]

    def table_references(self, conn: Any, table: str) -> list[Reference]:
        groups: dict[tuple[str, str, str], list[Any]] = {}
        for row in conn.execute(_REFERENCES, _split(table)).fetchall():
            groups.setdefault((row["schema"], row["name"], row["constraint_name"]), []).append(row)
        current = conn.execute("select database() as db").fetchone()["db"]
        found = []
        for (schema, name, _), rows in groups.items():
            table = name if schema == current else f"{schema}.{name}"
            columns = tuple(r["column_name"] for r in rows)
            found.append(
                Reference(
                    table=table,
                    columns=columns,
                    referenced=tuple(r["referenced"] for r in rows),
                    on_delete=str(rows[0]["on_delete"]).lower(),
                    # InnoDB creates an index for a foreign key that has none (and
                    # refuses to drop it): always true there, read all the same.
                    indexed=index_leads(self.table_indexes(conn, table), columns),
                )
            )
        return found

    def table_partitions(self, conn: Any, table: str, only: str | None = None) -> list[Partition]:
        return []  # partitions are cleaned by windows like any table (no drop yet)

    def partition_remove(
        self, conn: Any, table: str, partition: Partition, *, drop: bool, lock_timeout_ms: int
    ) -> int | None:
        raise SchemaError("partitions are not dropped on MySQL: its windows delete their rows")

    # -- the database's health -----------------------------------------------------

    def health_wal_position(self, conn: Any) -> int | None:
        return None  # a binary log position is a file and an offset, not one number

    def health_replicas(self, conn: Any) -> list[Replica]:
        return []  # a primary does not see its replicas' lag: name them in [[replica]]

    def health_replay_lag(self, conn: Any) -> float | None:
        """Seconds_Behind_Master of SHOW REPLICA STATUS (SHOW SLAVE STATUS before
        MariaDB 10.5 and MySQL 8.0.22): None on a server that replicates from
        none; infinite while its SQL thread is stopped (lag unknown, late)."""
        try:
            row = conn.execute("show replica status").fetchone()
        except pymysql.err.ProgrammingError:
            row = conn.execute("show slave status").fetchone()
        if not row:
            return None
        lag = row.get("Seconds_Behind_Master", row.get("Seconds_Behind_Source"))
        return float("inf") if lag is None else max(0.0, float(lag))

    def health_active_backends(self, conn: Any) -> int | None:
        row = conn.execute("show global status like 'Threads_running'").fetchone()
        return max(0, int(row["Value"]) - 1) if row else None  # this one aside

    def health_flow_control(self, conn: Any) -> FlowControl | None:
        """Read where wsrep is on; a server without it has no such status."""
        rows = conn.execute(
            "show global status where variable_name in"
            " ('wsrep_flow_control_paused_ns', 'wsrep_local_recv_queue', 'wsrep_gcomm_uuid')"
        ).fetchall()
        status = {str(r["Variable_name"]).lower(): r["Value"] for r in rows}
        if "wsrep_flow_control_paused_ns" not in status or "wsrep_local_recv_queue" not in status:
            return None
        return FlowControl(
            int(status["wsrep_flow_control_paused_ns"] or 0),
            int(status["wsrep_local_recv_queue"] or 0),
            str(status.get("wsrep_gcomm_uuid") or ""),
        )

    def write_set_limit(self, conn: Any) -> int | None:
        rows = conn.execute(
            "show global variables where variable_name in ('wsrep_on', 'wsrep_max_ws_rows')"
        ).fetchall()
        settings = {str(r["Variable_name"]).lower(): str(r["Value"]) for r in rows}
        if settings.get("wsrep_on", "OFF").upper() != "ON":
            return None
        limit = int(settings.get("wsrep_max_ws_rows") or 0)
        return limit or None  # 0: no limit

    def table_vacuum_stats(self, conn: Any, table: str) -> VacuumStats | None:
        return None  # InnoDB purges deleted rows itself: nothing to vacuum

    def table_vacuum(self, conn: Any, table: str) -> None:
        conn.execute(f"analyze table {self.quote(table)}").fetchall()

    def explain(self, conn: Any, statement: str) -> None:
        # A failed statement leaves a MySQL transaction usable: no savepoint needed.
        conn.execute("explain " + statement, {}).fetchall()

    def window_apply(self, conn: Any, window: WindowApply) -> int | None:
        self.session_limits(conn, f"{window.lock_timeout_ms}ms", f"{window.statement_timeout_ms}ms")
        if not conn.in_transaction:  # statement mode: the window is a transaction of its own
            with self.atomic(conn):
                return self.window_apply(conn, window)
        # A foreign key that refuses the delete rolls back that statement alone and
        # leaves the worker's transaction usable for the split; an archive's copy
        # before it is undone by a savepoint.
        archive = window.copy is not None
        if archive:
            conn.execute("savepoint expiry_window")
        try:
            rows = self._take_rows(conn, window)
        except pymysql.err.IntegrityError as exc:
            if archive:
                conn.execute("rollback to savepoint expiry_window")
            if exc.args and exc.args[0] in (1451, 1217):  # a row is referenced
                raise ForeignKeyBlocked(str(exc.args[-1])) from exc
            raise
        if archive:
            conn.execute("release savepoint expiry_window")
        return self._book_window(conn, window, rows)

    @staticmethod
    def _take_rows(conn: Any, window: WindowApply) -> int:
        """Delete the window's rows (an archive locks, copies, then deletes them); the rows taken."""
        label = f"/* {window.label} */ "
        if window.copy is None:
            return int(conn.execute(label + window.delete, window.params).rowcount)
        head = "delete from "
        assert window.delete.lstrip().startswith(head), window.delete
        # cleanup/target.py's statement (identifiers quoted, values bound), as a locking read.
        lock = "select 1 from " + window.delete.lstrip()[len(head) :] + " for update"  # noqa: S608
        conn.execute(label + lock, window.params).fetchall()
        copied = int(conn.execute(label + window.copy, window.params).rowcount)
        rows = int(conn.execute(label + window.delete, window.params).rowcount)
        if copied != rows:
            raise TransientError(
                f"archive copied {copied} rows but deleted {rows} (rows changed meanwhile); "
                "rolled back, to run again"
            )
        return rows
