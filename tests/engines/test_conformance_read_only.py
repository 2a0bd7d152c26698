"""Read transactions on every engine: what `check` and `plan` run in. The
database itself refuses a write there (PostgreSQL's and MySQL's READ ONLY,
SQLite's query_only), so a write hidden in a reading path fails instead of
changing anything; reading works, and the connection writes again afterwards.
"""

from __future__ import annotations

import pytest

from dialects import dialect
from expiry.engines import Engine


def count(engine: Engine) -> int:
    with engine.transaction() as conn:
        row = conn.execute(f"select count(*) as n from {dialect(engine).table('runs')}").fetchone()  # noqa: S608 (a constant)
    return int(row["n"])


def test_a_write_in_a_read_transaction_is_refused_and_changes_nothing(engine: Engine) -> None:
    table = dialect(engine).table("runs")
    assert engine.run_insert("p:1", "p", engine.now(), "trigger") is True
    with pytest.raises(Exception, match=r"(?i)read.?only"):  # noqa: PT011 (each driver's own)
        with engine.read_transaction() as conn:
            assert conn.execute(f"select count(*) as n from {table}").fetchone()["n"] == 1  # noqa: S608
            conn.execute(f"delete from {table}")  # noqa: S608 (a constant)
    assert count(engine) == 1
    # The same thread's next transactions write as before.
    assert engine.run_insert("p:2", "p", engine.now(), "trigger") is True
    assert count(engine) == 2
    with engine.read_transaction() as conn:
        assert conn.execute(f"select count(*) as n from {table}").fetchone()["n"] == 2  # noqa: S608
