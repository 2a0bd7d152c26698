"""engine.scratch: statements inside the caller's transaction whose changes
end with the block (the probe of the rows another transaction holds takes
row locks there, and must not keep them on PostgreSQL). On every engine: what
is written inside is gone after it, an error inside is raised and leaves the
transaction usable, and what the transaction did before the block stays."""

from __future__ import annotations

import pytest

from dialects import dialect
from expiry.engines import Engine


def count(conn: object, table: str) -> int:
    row = conn.execute(f"select count(*) as n from {table}").fetchone()  # type: ignore[attr-defined]  # noqa: S608 (a constant)
    return int(row["n"])


def test_what_a_scratch_block_writes_is_gone_after_it(engine: Engine) -> None:
    table = dialect(engine).table("runs")
    assert engine.run_insert("p:1", "p", engine.now(), "trigger") is True
    assert engine.run_insert("p:2", "p", engine.now(), "trigger") is True
    with engine.transaction() as conn, engine.atomic(conn):
        conn.execute(f"delete from {table} where id = 'p:2'")  # noqa: S608 (a constant)
        with engine.scratch(conn):
            conn.execute(f"delete from {table}")  # noqa: S608 (a constant)
            assert count(conn, table) == 0
        assert count(conn, table) == 1  # the block's delete undone, the one before kept
    with engine.transaction() as conn:
        assert count(conn, table) == 1


def test_an_error_in_a_scratch_block_is_raised_and_the_transaction_goes_on(
    engine: Engine,
) -> None:
    table = dialect(engine).table("runs")
    with engine.transaction() as conn, engine.atomic(conn):
        with pytest.raises(Exception, match=r"(?i)no_such_table|does not exist|doesn't exist"):  # noqa: PT011 (each driver's own)
            with engine.scratch(conn):
                conn.execute("select * from no_such_table")
        assert count(conn, table) == 0  # the transaction still answers
        conn.execute(f"delete from {table}")  # noqa: S608 (a constant)
