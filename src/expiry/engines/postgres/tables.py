"""A policy's table on PostgreSQL: quoting, typing, the catalog, and the window
as one statement.

Identifiers are quoted by psycopg.sql. A window is one call of the function
expiry.window_apply (migrations 0004 to 0006), given the window's statement
with positional parameters: it takes the window's turn, runs the statement,
completes the job and books the ledger. Outside a transaction (the worker's
statement mode) the call is its own transaction: one round trip.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import sql

from ...timestamps import NUMERIC_RANGES, Storage
from ...types import Column, Relation, WindowApply
from ..base import Engine

# The window statement's named parameters as window_apply passes them ($1..$4);
# any other named parameter becomes null.
_POSITIONS = {"lo": "$1", "hi": "$2", "cutoff": "$3", "key": "$4"}

_APPLY = """
select expiry.window_apply(%(statement)s, %(lo)s, %(hi)s, %(cutoff)s, %(key)s, %(policy)s,
                           %(run_id)s, %(action)s, %(worker)s, %(job_id)s, %(lease_token)s) as rows
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

    def time_predicate(self, storage: Storage) -> tuple[str, str]:
        # The timestamptz parameter is converted in SQL (an expression of the
        # parameter alone: the index is still used), so window_apply's $3 keeps
        # one type whatever the column stores.
        if storage.format == "epoch":
            bound = "cast(ceil(extract(epoch from {p_cutoff})) as bigint)"
        elif storage.format == "epoch_ms":
            bound = "cast(ceil(extract(epoch from {p_cutoff}) * 1000) as bigint)"
        else:
            return "{p_cutoff}", ""
        return bound, f" and {{ts}} >= {NUMERIC_RANGES[storage.format][0]:.0f}"

    def cutoff_params(self, storage: Storage, cutoff: datetime) -> dict[str, Any]:
        return {"cutoff": cutoff}

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
        )

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
        statement = _positional(window.move if window.move is not None else window.delete)
        row = conn.execute(
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
            },
            prepare=True,
        ).fetchone()
        return None if row["rows"] is None else int(row["rows"])

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
