"""The check of a policy's table against the live schema: the table and its
columns, the key, the archive table, the partitions, the tables that
reference it, the ``where``; what does not fit is refused with the fix."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import SchemaError
from ..types import Column, Reference, Relation
from .detection import Detection
from .strategy import Strategies
from .windows import (
    TIME,
)

log = logging.getLogger("expiry.target")


WRITE_SET_BOOKKEEPING = 8
"""Rows a window's transaction writes besides the table's: its ledger row, its
job, the rest of a split window, with room to spare."""


class Checks(Strategies, Detection):
    """The schema check of a policy's table."""

    def check(self, conn: Any) -> list[str]:
        """Check the policy against the live schema and data; returns warnings,
        raises SchemaError."""
        p = self.policy
        self._texts.clear()
        self.relation = relation = self._check_relation(conn, p.table, "table")
        by_name = self._check_columns(conn, relation)
        warnings: list[str] = []
        view = relation.kind != "table"  # its table's indexes serve it, unseen here
        if not view and not by_name[p.timestamp].indexed:
            warnings.append(
                f"policy {p.name!r}: no index leads with timestamp column {p.timestamp!r}: "
                "planning, time windows and the watermark scan the table (fix: create index "
                f"on {p.table} ({p.timestamp}))"
            )
        if p.keep_last is not None and not view:
            warnings += self._keep_last_index(conn)
        warnings += self._write_set(conn)
        self.fixed = self._fixed(by_name, warnings)
        self.notes = self._layout_notes(conn, relation)
        self.notes += self._references(conn, warnings)
        self.columns = list(by_name)
        if p.action == "archive":
            self._check_archive(conn)
        if p.where:
            self._explain_where(conn)
        if p.holds:
            self._explain_holds(conn)
        self.storage = self.detect(conn)
        warnings += self.read_values(conn, self.storage)
        self.checked = True
        return warnings

    def _check_columns(self, conn: Any, relation: Relation) -> dict[str, Column]:
        """The table's columns by name, in their order; the policy's columns
        must be among them. Notes the timestamp's declared type, every
        column's, and the tie that orders rows of one timestamp."""
        p = self.policy
        columns = self.engine.table_columns(conn, p.table)
        by_name = {c.name: c for c in columns}
        named = [("key", p.key), ("timestamp", p.timestamp), ("group_by", p.group_by)]
        for field, column in named:
            if column is not None and column not in by_name:
                raise SchemaError(
                    f"policy {p.name!r}: {field} column {column!r} is not in table {p.table!r} "
                    f"(columns: {', '.join(by_name)})"
                )
        self._declared = by_name[p.timestamp].type
        self.types = {c.name: c.type for c in columns}
        self.tie = relation.rowid if relation.rowid not in (None, p.key) else p.key
        return by_name

    def _write_set(self, conn: Any) -> list[str]:
        """A window's transaction within a Galera cluster's wsrep_max_ws_rows: its
        rows (twice over when archived: copied, then deleted) and expiry's own
        (the ledger row, the job, the rest of a split window). A larger window
        is refused by the cluster and retried smaller (cleanup/window.py): it
        works, one refused transaction a worker process later."""
        p = self.policy
        limit = self.engine.write_set_limit(conn)
        if limit is None:
            return []
        fits = max(1, (limit - WRITE_SET_BOOKKEEPING) // (2 if p.action == "archive" else 1))
        if p.window <= fits:
            return []
        return [
            f"policy {p.name!r}: a window of {p.window:,} rows may write more than the "
            f"cluster's wsrep_max_ws_rows ({limit:,}) lets one transaction; such windows are "
            f"refused and retried smaller (fix: window = {fits:,})"
        ]

    def _keep_last_index(self, conn: Any) -> list[str]:
        """keep_last reads each candidate's group's newest rows: an index that
        leads with (group_by, timestamp), or the timestamp alone without a
        group, makes that a short walk down the index."""
        p = self.policy
        wanted = tuple(c for c in (p.group_by, p.timestamp) if c is not None)
        indexes = self.engine.table_indexes(conn, p.table)
        if any(tuple(i.columns[: len(wanted)]) == wanted for i in indexes):
            return []
        columns = ", ".join(wanted)
        return [
            f"policy {p.name!r}: keep_last: no index leads with ({columns}): each candidate "
            f"row reads its group's newest rows from the table (fix: create index on "
            f"{p.table} ({columns}, {p.key}))"
        ]

    def _layout_notes(self, conn: Any, relation: Relation) -> list[str]:
        """What the check found of the table's layout: a view's unseen indexes,
        the windows the schema decides, the ties of time windows, partitions."""
        p = self.policy
        notes = []
        if relation.kind != "table":
            notes.append(
                f"{p.table} is a {relation.kind}: the indexes of the table it reads serve it, "
                "unseen through it (an index leading with the column behind "
                f"{p.timestamp!r} belongs on that table: none can be created on a view)"
            )
        if self.fixed is not None:
            notes.append(self.fixed.describe())
        if self.fixed is None or self.fixed.name == TIME:
            notes.append(self._ties(self.engine.table_indexes(conn, p.table)))
        if relation.partitioned:
            notes.append(self._partitions_note())
        return notes

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
                warnings.append(self._split_at(ref, named))
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

    def _split_at(self, ref: Reference, named: str) -> str:
        """The warning for a reference windows cannot step around (the table's
        to itself), with the where that skips the rows it references."""
        p = self.policy
        match = " and ".join(
            f"r.{c} = {p.table.split('.')[-1]}.{r}"
            for c, r in zip(ref.columns, ref.referenced, strict=True)
        )
        return (
            f"policy {p.name!r}: {named}: a window that meets a referenced row is split "
            "until that row stands alone, which is kept and booked as blocked (fix, to "
            f'skip such rows: where = "not exists (select 1 from {ref.table} r where '
            f'{match})")'
        )

    def _unindexed(self, ref: Reference, named: str) -> str:
        """The warning for a CASCADE, SET NULL or SET DEFAULT reference that no
        index serves: each row a window deletes makes the database scan the
        referencing table for its references, so a window's delete runs long
        (a timeout then halves the window down to one row, cleanup/window.py)."""
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
