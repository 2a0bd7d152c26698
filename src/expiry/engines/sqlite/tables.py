"""A policy's table on SQLite: quoting, typing, the catalog, and the window as
statements in one transaction.

SQLite has no stored functions and no DELETE inside a CTE: a window runs its
steps as statements inside the worker's transaction (an embedded database
costs no round trips), and an archive copies then deletes, checking that the
two counts agree. Writers take turns (BEGIN IMMEDIATE), so a later delivery
of a window sees the earlier one's ledger row. Each value has its own storage
class whatever the column's declared type, so timestamps are read from the
data (cleanup/target.py), and the predicate binds values Python computed.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from ...errors import ForeignKeyBlocked, SchemaError
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


def quote(identifier: str) -> str:
    """Quote a validated identifier, schema-qualified or not."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in identifier.split("."))


class SQLiteTables(Engine):
    """The Engine methods about a policy's table (the base of SQLiteEngine)."""

    ledger_table = '"expiry_ledger"'
    typed_columns = False

    def quote(self, identifier: str) -> str:
        return quote(identifier)

    def placeholder(self, name: str) -> str:
        return f":{name}"

    def escape(self, text: str) -> str:
        return text

    def time_predicate(self, storage: Storage, declared: str | None = None) -> tuple[str, str]:
        if storage.format == "native":  # no native time type: before a check reads
            return "{p_cutoff}", " and 0"  # the column, a statement matches nothing
        if storage.format == "iso":
            return "{p_cutoff}", (
                " and typeof({ts}) = 'text' and julianday({ts}) < julianday({p_exact})"
            )
        if declared is not None and not _text_affinity(declared):
            # A number bound as the cutoff: a text or blob value compares above
            # every number and NULL with nothing, so "< cutoff" takes numbers
            # alone and typeof() says nothing more. Only a column of TEXT
            # affinity turns the bound into text and compares as strings. A
            # function in a DELETE's where costs SQLite a statement journal in
            # the window's transaction: 12% of the bench's window.
            return "{p_cutoff}", f" and {storage.plausible()}"
        return "{p_cutoff}", f" and typeof({{ts}}) in ('integer', 'real') and {storage.plausible()}"

    def cutoff_params(self, storage: Storage, cutoff: datetime) -> dict[str, Any]:
        return {"cutoff": storage.bound(cutoff), "exact": storage.exact(cutoff)}

    def column_kind(self, declared: str) -> str:
        return "integer" if "int" in declared.lower() else "other"  # SQLite's own rule

    def table_columns(self, conn: Any, table: str) -> list[Column]:
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

    def table_relation(self, conn: Any, table: str) -> Relation | None:
        name = table.split(".")[-1]
        row = conn.execute(
            "select type from sqlite_master where name = ? collate nocase", (name,)
        ).fetchone()
        if row is None:
            return None
        table_kind = row["type"] == "table"  # a view takes no DELETE without triggers
        return Relation(
            kind=row["type"],
            own=name.lower().startswith("expiry_"),
            deletable=table_kind,
            insertable=table_kind,
            rowid=_rowid(conn, name) if table_kind else None,
        )

    def table_layout(self, conn: Any, table: str, column: str) -> Layout | None:
        return None  # no planner statistics of that kind: windows by key or time

    def estimate_rows(self, conn: Any, statement: str, params: dict[str, Any]) -> int | None:
        return None

    # The health signals SQLite has none of: one file, one writer, no replicas.

    def health_wal_position(self, conn: Any) -> int | None:
        return None

    def health_replicas(self, conn: Any) -> list[Replica]:
        return []

    def health_replay_lag(self, conn: Any) -> float | None:
        return None

    def health_active_backends(self, conn: Any) -> int | None:
        return None

    def health_flow_control(self, conn: Any) -> FlowControl | None:
        return None

    def write_set_limit(self, conn: Any) -> int | None:
        return None

    def health_foreground_sessions(self, conn: Any, within: float) -> int | None:
        return None  # another process's statements cannot be seen

    def table_vacuum_stats(self, conn: Any, table: str) -> VacuumStats | None:
        return None

    def table_vacuum(self, conn: Any, table: str) -> None:
        conn.execute(f"analyze {self.quote(table)}")

    def placeholder_as(self, name: str, declared: str) -> str:
        return f":{name}"  # values are bound as they were read, storage class and all

    def table_indexes(self, conn: Any, table: str) -> list[Index]:
        name = table.split(".")[-1]
        found = []
        for index in conn.execute(f"pragma index_list({quote(name)})").fetchall():
            if index["partial"]:
                continue
            columns = []
            for column in conn.execute(f"pragma index_info({quote(index['name'])})").fetchall():
                if column["name"] is None:  # an expression (or the rowid): stop there
                    break
                columns.append(column["name"])
            found.append(Index(index["name"], tuple(columns), bool(index["unique"])))
        return found

    def table_references(self, conn: Any, table: str) -> list[Reference]:
        name = table.split(".")[-1].lower()
        tables = conn.execute(
            "select name from sqlite_master where type = 'table' order by name"
        ).fetchall()
        primary = [
            r["name"]
            for r in sorted(
                conn.execute(f"pragma table_info({quote(name)})").fetchall(),
                key=lambda r: r["pk"],
            )
            if r["pk"]
        ]
        found: list[Reference] = []
        for other in tables:
            keys: dict[int, list[Any]] = {}
            for fk in conn.execute(f"pragma foreign_key_list({quote(other['name'])})").fetchall():
                if fk["table"].lower() == name:
                    keys.setdefault(fk["id"], []).append(fk)
            for parts in keys.values():
                parts.sort(key=lambda fk: fk["seq"])
                referenced = [fk["to"] for fk in parts]
                columns = tuple(fk["from"] for fk in parts)
                found.append(
                    Reference(
                        table=other["name"],
                        columns=columns,
                        referenced=tuple(primary if None in referenced else referenced),
                        on_delete=parts[0]["on_delete"].lower(),
                        indexed=self._indexed(conn, other["name"], columns),
                    )
                )
        return found

    def _indexed(self, conn: Any, table: str, columns: tuple[str, ...]) -> bool:
        """An index of ``table`` leads with ``columns``, or they are its rowid
        (an INTEGER PRIMARY KEY, which no index lists: the table is its index)."""
        rowid = _rowid(conn, table)
        if len(columns) == 1 and rowid is not None and columns[0].lower() == rowid.lower():
            return True
        return index_leads(self.table_indexes(conn, table), columns)

    def table_partitions(self, conn: Any, table: str, only: str | None = None) -> list[Partition]:
        return []  # SQLite has no partitions

    def partition_remove(
        self, conn: Any, table: str, partition: Partition, *, drop: bool, lock_timeout_ms: int
    ) -> int | None:
        raise SchemaError("SQLite has no partitions")

    unindexed = "+{}"
    bounds_by_aggregate = True

    def explain(self, conn: Any, statement: str) -> None:
        conn.execute("explain " + statement, {})

    def window_apply(self, conn: Any, window: WindowApply) -> int | None:
        # An archive's copy and delete go in a savepoint, so that a foreign key
        # that refuses the delete undoes the copy too. A delete alone needs
        # none: a statement that fails undoes itself (SQLite's statement
        # journal), and a savepoint around it cost 10% of the window. Either
        # way the worker's transaction stays usable for the split.
        saved = window.copy is not None
        if saved:
            conn.execute("savepoint expiry_window")
        try:
            rows = self._take(conn, window)
        except sqlite3.IntegrityError as exc:
            if saved:
                conn.execute("rollback to savepoint expiry_window")
                conn.execute("release savepoint expiry_window")
            if "FOREIGN KEY" in str(exc).upper():
                raise ForeignKeyBlocked(str(exc)) from exc
            raise
        if saved:
            conn.execute("release savepoint expiry_window")
        return self._book_window(conn, window, rows)

    @staticmethod
    def _take(conn: Any, window: WindowApply) -> int:
        """Delete the window's rows (an archive copies them first); the rows taken."""
        if window.copy is None:
            return int(conn.execute(window.delete, window.params).rowcount)
        copied = int(conn.execute(window.copy, window.params).rowcount)
        rows = int(conn.execute(window.delete, window.params).rowcount)
        if copied != rows:
            raise SchemaError(f"archive copied {copied} rows but deleted {rows}; rolled back")
        return rows


def _text_affinity(declared: str) -> bool:
    """A declared type of TEXT affinity (SQLite's rules, in their order: "INT"
    first, then "CHAR", "CLOB" or "TEXT")."""
    upper = declared.upper()
    return "INT" not in upper and any(word in upper for word in ("CHAR", "CLOB", "TEXT"))


def _rowid(conn: Any, table: str) -> str | None:
    """The column that is the table's row id: its INTEGER PRIMARY KEY, else the
    hidden rowid; None for a WITHOUT ROWID table."""
    try:
        conn.execute(f"select rowid from {quote(table)} limit 0")  # noqa: S608 (quoted)
    except sqlite3.OperationalError:  # no such column: a WITHOUT ROWID table
        return None
    columns = conn.execute(f"pragma table_info({quote(table)})").fetchall()
    keys = [c for c in columns if c["pk"]]
    if len(keys) == 1 and (keys[0]["type"] or "").upper() == "INTEGER":
        return str(keys[0]["name"])
    return "rowid"
