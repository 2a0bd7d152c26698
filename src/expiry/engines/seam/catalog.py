"""The seam's part for a policy's table: the catalog (columns, indexes,
references, partitions), the dialect's statements and their guards, vacuum.
What cleanup/target.py builds its statements from."""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ...timestamps import Storage
from ...types import (
    Column,
    Index,
    Layout,
    Partition,
    Reference,
    Relation,
    VacuumStats,
)
from ..common import MAX_INDEX_NAME
from .primitives import Primitives


class CatalogSeam(Primitives):
    """A policy's table, as the catalog and the dialect see it."""

    ledger_table: str
    """expiry's ledger, quoted, for the window's guard."""

    typed_columns: bool
    """True where a column's declared type decides what it holds (PostgreSQL);
    False where each value has its own storage class (SQLite), so the data is read."""

    integer_type: str = "bigint"
    """The type a statement casts an integer to (MySQL: signed)."""

    integer_division: str = "/"
    """The operator that divides two integers into an integer (MySQL: div)."""

    recursive_scans: bool = True
    """The planner's loose index scan runs as one recursive statement. False:
    the planner asks for each window's first key in turn (MariaDB re-reads every
    earlier step of a recursive query at each step: 100 windows took 16 s)."""

    block_span: str | None = None
    """A window's range over the heap's row addresses, encoded block * 65536 +
    item in {p_lo} and {p_hi} (PostgreSQL's ctid); None where rows have no
    address a window can scan in order (SQLite)."""

    block_of_row: str | None = None
    """The expression that encodes a row's address as block_span reads it."""

    unindexed: str = "{}"
    """A column as a statement that ranges over the key writes it, so that the
    planner leaves the column's indexes alone (SQLite: unary +, a no-op on the
    value). SQLite otherwise reads a key window's two-sided timestamp bounds
    (the cutoff and an epoch column's guard) through the timestamp's index,
    every expired row of the table for each window."""

    bounds_by_aggregate: bool = False
    """The expired keys' bounds read as min() and max() over the candidates, in
    one read (SQLite, whose planner takes the timestamp's index for each of two
    reads ordered by the key: every candidate twice, 410 against 170 ms at
    1,600,000 candidates); else two reads ordered by the key, which stop at the
    first candidate each way (PostgreSQL, MariaDB)."""

    partition_rows: str | None = None
    """The rows of the table that one partition holds, {p_partition} naming it
    (PostgreSQL's tableoid); None where no table is partitioned for expiry."""

    @abc.abstractmethod
    def quote(self, identifier: str) -> str:
        """A validated identifier, schema-qualified or not, quoted by the driver's rules."""

    @abc.abstractmethod
    def placeholder(self, name: str) -> str:
        """A named parameter in the driver's style."""

    @abc.abstractmethod
    def escape(self, text: str) -> str:
        """Trusted SQL text (a policy's where) as it must appear in a statement that
        has parameters (psycopg doubles '%')."""

    @abc.abstractmethod
    def time_predicate(self, storage: Storage, declared: str | None = None) -> tuple[str, str]:
        """The retention predicate's index bound and its guard for ``storage``
        (timestamps.py says why each holds), with {ts}, {p_cutoff} and {p_exact};
        ``declared``: the column's declared type where the check read it (None:
        not known), for an engine whose guard depends on it (SQLite's affinity)."""

    @abc.abstractmethod
    def cutoff_params(self, storage: Storage, cutoff: datetime) -> dict[str, Any]:
        """The cutoff as the predicate of ``storage`` binds it."""

    @abc.abstractmethod
    def column_kind(self, declared: str) -> str:
        """A declared column type as "integer", "time" (a native time type) or "other"."""

    @abc.abstractmethod
    def table_columns(self, conn: Any, table: str) -> list[Column]:
        """The table's columns in order, each with whether an index leads with it."""

    @abc.abstractmethod
    def table_relation(self, conn: Any, table: str) -> Relation | None:
        """What ``table`` is, or None when it does not exist."""

    @abc.abstractmethod
    def placeholder_as(self, name: str, declared: str) -> str:
        """A named parameter read as a column of type ``declared`` (its type as
        table_columns gave it): where the driver binds text (a time window's
        positions on PostgreSQL), cast in the statement."""

    @abc.abstractmethod
    def table_layout(self, conn: Any, table: str, column: str) -> Layout | None:
        """The table's pages, rows and ``column``'s physical correlation from the
        planner's statistics; None where the engine keeps none (SQLite)."""

    @abc.abstractmethod
    def estimate_rows(self, conn: Any, statement: str, params: dict[str, Any]) -> int | None:
        """The planner's estimate of the rows ``statement`` returns (None: no planner estimates)."""

    @abc.abstractmethod
    def table_indexes(self, conn: Any, table: str) -> list[Index]:
        """The table's indexes, each with its columns in order (expressions left out)."""

    @abc.abstractmethod
    def table_references(self, conn: Any, table: str) -> list[Reference]:
        """The foreign keys of other tables (or of ``table`` itself) that reference
        ``table``, each with whether an index of the referencing table leads
        with its columns."""

    def index_statement(self, table: str, columns: Sequence[str]) -> str:
        """The CREATE INDEX that lets the database find the rows of ``table``
        by ``columns`` (a foreign key's), identifiers quoted, to copy and run."""
        name = re.sub(r"\W", "_", "_".join([table.split(".")[-1], *columns, "idx"]))
        name = name[:MAX_INDEX_NAME]
        listed = ", ".join(self.quote(c) for c in columns)
        return f"create index {self.quote(name)} on {self.quote(table)} ({listed})"

    @abc.abstractmethod
    def table_partitions(self, conn: Any, table: str, only: str | None = None) -> list[Partition]:
        """A partitioned table's partitions with their ranges ([] for any other
        table); with ``only``, those of that name alone (one per schema)."""

    @abc.abstractmethod
    def partition_remove(
        self, conn: Any, table: str, partition: Partition, *, drop: bool, lock_timeout_ms: int
    ) -> int | None:
        """Detach ``partition`` from ``table`` and, with ``drop``, drop it, in
        ``conn``'s transaction, waiting at most ``lock_timeout_ms`` for locks.
        Returns the rows it held, counted exactly while no row could be written
        to it; None when it is no longer a partition of ``table`` (a concurrent
        removal committed first), and then nothing is done."""

    @abc.abstractmethod
    def table_vacuum_stats(self, conn: Any, table: str) -> VacuumStats | None:
        """The table's live and dead tuples and last vacuum (None: SQLite, or no
        statistics yet)."""

    @abc.abstractmethod
    def table_vacuum(self, conn: Any, table: str) -> None:
        """VACUUM (ANALYZE) the table; ``conn`` outside any transaction
        (``transaction(statement=True)``). SQLite: ANALYZE only (a VACUUM would
        rewrite the whole file)."""

    @abc.abstractmethod
    def explain(self, conn: Any, statement: str) -> None:
        """Plan ``statement`` without running it; raise the driver's error when it
        is not valid SQL, leaving the caller's transaction usable."""
