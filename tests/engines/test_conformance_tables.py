"""A policy's table on every engine: quoting and binding, the catalog (columns,
what a relation is, a plan without running), the time predicate of each storage,
and the window as one operation (delete or archive, book, complete, duplicate).

Each test runs once on SQLite and once on PostgreSQL (the ``engine`` fixture).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _conformance import claim, enqueue, execute

from expiry.engines import Engine
from expiry.timestamps import Storage
from expiry.types import WindowApply

CUTOFF = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def make_sessions(engine: Engine, archive: bool = False) -> None:
    ts = "timestamptz" if engine.dialect == "postgres" else "real"
    execute(engine, f"create table sessions (id bigint primary key, expires_at {ts}, note text)")
    execute(engine, "create index sessions_expires_at on sessions (expires_at)")
    if archive:
        execute(engine, f"create table sessions_archive (id bigint, expires_at {ts}, note text)")
    for i in range(1, 11):
        at = CUTOFF + timedelta(hours=-1 if i <= 6 else 1)  # 1..6 expired
        value = at if engine.dialect == "postgres" else at.timestamp()
        execute(engine, "insert into sessions values (%s, %s, %s)", (i, value, f"row {i}"))


def storage(engine: Engine) -> Storage:
    return Storage("native" if engine.dialect == "postgres" else "epoch")


def delete_statement(engine: Engine, table: str = "sessions") -> str:
    """The window's delete as target.py writes it, in this engine's style."""
    bound, guard = engine.time_predicate(storage(engine))
    p = engine.placeholder
    pred = f"{{ts}} < {bound}{guard}".format(
        ts=engine.quote("expires_at"), p_cutoff=p("cutoff"), p_exact=p("exact")
    )
    return (
        f"delete from {engine.quote(table)} where {engine.quote('id')} > {p('lo')} and "
        f"{engine.quote('id')} <= {p('hi')} and {pred} and not exists "
        f"(select 1 from {engine.ledger_table} where key = {p('key')})"
    )


def window(engine: Engine, key: str, job: Any = None, **overrides: Any) -> WindowApply:
    fields: dict[str, Any] = {
        "delete": delete_statement(engine),
        "move": None,
        "copy": None,
        "label": "expiry window: delete from sessions",
        "params": {"lo": 0, "hi": 100, "key": key} | engine.cutoff_params(storage(engine), CUTOFF),
        "key": key,
        "policy": "p",
        "run_id": "p:run",
        "action": "delete",
        "worker": "w-1",
        "lo": 0,
        "hi": 100,
        "job": job,
        "lock_timeout_ms": 2000,
        "statement_timeout_ms": 30000,
    }
    return WindowApply(**(fields | overrides))


def ids(engine: Engine, table: str = "sessions") -> set[int]:
    return {int(row["id"]) for row in execute(engine, f"select id from {table}")}


def test_quote_and_placeholder_follow_the_driver(engine: Engine) -> None:
    assert engine.quote('odd"name') == '"odd""name"'
    assert engine.quote("auth.sessions") == '"auth"."sessions"'
    assert engine.placeholder("lo") == ("%(lo)s" if engine.dialect == "postgres" else ":lo")
    assert engine.escape("note like 'a%'") == (
        "note like 'a%%'" if engine.dialect == "postgres" else "note like 'a%'"
    )


def test_column_kind_reads_declared_types(engine: Engine) -> None:
    assert engine.column_kind("bigint") == "integer"
    assert engine.column_kind("text") == "other"
    expected_time = "time" if engine.dialect == "postgres" else "other"
    assert engine.column_kind("timestamp with time zone") == expected_time
    # SQLite's own rule: a declared type containing "INT" has integer affinity.
    assert engine.column_kind("interval") == (
        "other" if engine.dialect == "postgres" else "integer"
    )


def test_table_columns_in_order_with_their_indexes(engine: Engine) -> None:
    make_sessions(engine)
    with engine.transaction() as conn:
        columns = engine.table_columns(conn, "sessions")
        missing = engine.table_columns(conn, "no_such_table")
    assert [c.name for c in columns] == ["id", "expires_at", "note"]
    assert [c.indexed for c in columns] == [True, True, False]
    assert missing == []


def test_table_relation_tells_tables_views_and_own_tables(engine: Engine) -> None:
    make_sessions(engine)
    execute(engine, "create view sessions_view as select id, note from sessions")
    own = "expiry.jobs" if engine.dialect == "postgres" else "expiry_jobs"
    with engine.transaction() as conn:
        table = engine.table_relation(conn, "sessions")
        view = engine.table_relation(conn, "sessions_view")
        mine = engine.table_relation(conn, own)
        none = engine.table_relation(conn, "no_such_table")
    assert table is not None and table.kind == "table" and table.deletable and not table.own
    assert view is not None and view.kind == "view"
    # PostgreSQL can delete through a simple view; SQLite cannot without triggers.
    assert view.deletable == (engine.dialect == "postgres")
    assert mine is not None and mine.own
    assert none is None


def test_explain_refuses_invalid_sql_and_keeps_the_transaction(engine: Engine) -> None:
    make_sessions(engine)
    with engine.transaction() as conn:
        engine.explain(conn, "select 1 from sessions where note is null")
        with pytest.raises(Exception, match="no_such_column"):
            engine.explain(conn, "select 1 from sessions where no_such_column = 1")
        assert engine.now(conn) is not None  # the transaction is still usable


def test_the_time_predicate_takes_exactly_the_rows_before_the_cutoff(engine: Engine) -> None:
    make_sessions(engine)
    bound, guard = engine.time_predicate(storage(engine))
    p = engine.placeholder
    pred = f"expires_at < {bound}{guard}".format(
        ts="expires_at", p_cutoff=p("cutoff"), p_exact=p("exact")
    )
    with engine.transaction() as conn:
        params = engine.cutoff_params(storage(engine), CUTOFF)
        rows = conn.execute(f"select id from sessions where {pred}", params).fetchall()
    assert {int(r["id"]) for r in rows} == {1, 2, 3, 4, 5, 6}


def test_window_apply_deletes_books_and_completes_its_job(engine: Engine) -> None:
    make_sessions(engine)
    enqueue(engine, "p:run:0", "p:run")
    job = claim(engine, "p:run:0")
    with engine.transaction(statement=True) as conn:
        taken = engine.window_apply(conn, window(engine, "p:run:0", job))
    assert taken == 6
    assert ids(engine) == {7, 8, 9, 10}
    entry = engine.ledger_get("p:run:0")
    assert entry is not None and entry.rows_affected == 6 and (entry.lo, entry.hi) == (0, 100)
    done = engine.job_get("p:run:0")
    assert done is not None and done.state.value == "completed"


def test_window_apply_again_is_a_duplicate_that_changes_nothing(engine: Engine) -> None:
    make_sessions(engine)
    with engine.transaction() as conn:
        assert engine.window_apply(conn, window(engine, "p:run:0")) == 6
    execute(engine, "insert into sessions values (11, %s, 'late')", (sql_time(engine),))
    with engine.transaction() as conn:
        assert engine.window_apply(conn, window(engine, "p:run:0")) is None
    assert 11 in ids(engine), "the ledger guard keeps a booked window from deleting again"
    events = engine.audit_list(policy="p")
    assert [e.action for e in events] == ["window.duplicate"]


def test_window_apply_sees_a_booking_of_its_own_transaction(engine: Engine) -> None:
    """The ledger guard reads the statement's snapshot: a key booked earlier in
    the same transaction takes nothing, and the window is a duplicate."""
    make_sessions(engine)
    with engine.transaction() as conn:
        assert engine.ledger_insert(conn, "p:run:0", policy="p")
        assert engine.window_apply(conn, window(engine, "p:run:0")) is None
    assert ids(engine) == set(range(1, 11))


def test_window_apply_archives_into_the_archive_table(engine: Engine) -> None:
    make_sessions(engine, archive=True)
    q = engine.quote
    unbooked = delete_statement(engine).removeprefix(f"delete from {q('sessions')} where ")
    columns = ", ".join(q(c) for c in ("id", "expires_at", "note"))
    move = (
        f"with moved as (delete from {q('sessions')} where {unbooked} returning {columns}) "
        f"insert into {q('sessions_archive')} ({columns}) select {columns} from moved"
    )
    copy = (
        f"insert into {q('sessions_archive')} ({columns}) select {columns} "
        f"from {q('sessions')} where {unbooked}"
    )
    archive = window(
        engine,
        "p:run:0",
        move=move if engine.dialect == "postgres" else None,
        copy=copy if engine.dialect == "sqlite" else None,
        action="archive",
    )
    with engine.transaction() as conn:
        assert engine.window_apply(conn, archive) == 6
    assert ids(engine) == {7, 8, 9, 10}
    assert ids(engine, "sessions_archive") == {1, 2, 3, 4, 5, 6}


def sql_time(engine: Engine) -> Any:
    at = CUTOFF - timedelta(hours=2)
    return at if engine.dialect == "postgres" else at.timestamp()
