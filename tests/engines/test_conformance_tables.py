"""A policy's table on every engine: quoting and binding, the catalog (columns,
what a relation is, a plan without running), the time predicate of each storage,
and the window as one operation (delete or archive, book, complete, duplicate).

Each test runs once on each engine (the ``engine`` fixture): SQLite, PostgreSQL
and MariaDB.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _conformance import claim, enqueue, execute

from dialects import dialect
from expiry.engines import Engine, open_engine
from expiry.errors import ForeignKeyBlocked, SchemaError
from expiry.timestamps import Storage
from expiry.types import Reference, WindowApply

CUTOFF = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def make_sessions(engine: Engine, archive: bool = False) -> None:
    ts = dialect(engine).time_type
    execute(engine, f"create table sessions (id bigint primary key, expires_at {ts}, note text)")
    execute(engine, "create index sessions_expires_at on sessions (expires_at)")
    if archive:
        execute(engine, f"create table sessions_archive (id bigint, expires_at {ts}, note text)")
    for i in range(1, 11):
        at = CUTOFF + timedelta(hours=-1 if i <= 6 else 1)  # 1..6 expired
        value = at.timestamp() if engine.dialect == "sqlite" else at
        execute(engine, "insert into sessions values (%s, %s, %s)", (i, value, f"row {i}"))


def storage(engine: Engine) -> Storage:
    return Storage("epoch" if engine.dialect == "sqlite" else "native")


def delete_statement(engine: Engine, table: str = "sessions") -> str:
    """The window's delete as cleanup/target.py writes it, in this engine's style."""
    bound, guard = engine.time_predicate(storage(engine))
    p = engine.placeholder
    pred = f"{{ts}} < {bound}{guard}".format(
        ts=engine.quote("expires_at"), p_cutoff=p("cutoff"), p_exact=p("exact")
    )
    return (
        f"delete from {engine.quote(table)} where {engine.quote('id')} > {p('lo')} and "
        f"{engine.quote('id')} <= {p('hi')} and {pred} and not exists "
        f"(select 1 from {engine.ledger_table} where {engine.quote('key')} = {p('key')})"
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
        "positions": None,
        "bounds": None,
        "job": job,
        "lock_timeout_ms": 2000,
        "statement_timeout_ms": 30000,
    }
    return WindowApply(**(fields | overrides))


def ids(engine: Engine, table: str = "sessions") -> set[int]:
    return {int(row["id"]) for row in execute(engine, f"select id from {table}")}


def test_quote_and_placeholder_follow_the_driver(engine: Engine) -> None:
    if engine.dialect == "mysql":
        assert engine.quote("odd`name") == "`odd``name`"
        assert engine.quote("auth.sessions") == "`auth`.`sessions`"
    else:
        assert engine.quote('odd"name') == '"odd""name"'
        assert engine.quote("auth.sessions") == '"auth"."sessions"'
    assert engine.placeholder("lo") == (":lo" if engine.dialect == "sqlite" else "%(lo)s")
    assert engine.escape("note like 'a%'") == (
        "note like 'a%'" if engine.dialect == "sqlite" else "note like 'a%%'"
    )


def test_column_kind_reads_declared_types(engine: Engine) -> None:
    assert engine.column_kind("bigint") == "integer"
    assert engine.column_kind("text") == "other"
    expected_time = "other" if engine.dialect == "sqlite" else "time"
    assert engine.column_kind("timestamp with time zone") == expected_time
    # SQLite's own rule: a declared type containing "INT" has integer affinity.
    assert engine.column_kind("interval") == ("integer" if engine.dialect == "sqlite" else "other")
    if engine.dialect == "mysql":
        assert engine.column_kind("datetime(6)") == "time"
        assert engine.column_kind("int(10) unsigned") == "integer"
        assert engine.column_kind("time") == "other"  # a duration, not an instant


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
    if engine.dialect == "mysql":
        execute(engine, "create view sessions_count as select count(*) as n from sessions")
    with engine.transaction() as conn:
        table = engine.table_relation(conn, "sessions")
        view = engine.table_relation(conn, "sessions_view")
        mine = engine.table_relation(conn, own)
        none = engine.table_relation(conn, "no_such_table")
    assert table is not None and table.kind == "table" and table.deletable and not table.own
    assert view is not None and view.kind == "view"
    # PostgreSQL and MySQL can delete through a simple view; SQLite cannot without triggers.
    assert view.deletable == (engine.dialect != "sqlite")
    if engine.dialect == "mysql":  # an aggregate's view is not updatable
        with engine.transaction() as conn:
            counted = engine.table_relation(conn, "sessions_count")
        assert counted is not None and counted.kind == "view" and not counted.deletable
    assert mine is not None and mine.own
    assert none is None


def test_explain_refuses_invalid_sql_and_keeps_the_transaction(engine: Engine) -> None:
    make_sessions(engine)
    with engine.transaction() as conn:
        engine.explain(conn, "select 1 from sessions where note is null")
        with pytest.raises(Exception, match="no_such_column"):
            engine.explain(conn, "select 1 from sessions where no_such_column = 1")
        assert engine.now(conn) is not None  # the transaction is still usable


@pytest.mark.parametrize("declared", [None, "read"], ids=["type unknown", "declared type"])
def test_the_time_predicate_takes_exactly_the_rows_before_the_cutoff(
    engine: Engine, declared: str | None
) -> None:
    make_sessions(engine)
    if declared is not None:  # as the policy's check reads it
        with engine.transaction() as conn:
            columns = engine.table_columns(conn, "sessions")
        declared = next(c.type for c in columns if c.name == "expires_at")
    bound, guard = engine.time_predicate(storage(engine), declared)
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
        copy=None if engine.dialect == "postgres" else copy,
        action="archive",
    )
    with engine.transaction() as conn:
        assert engine.window_apply(conn, archive) == 6
    assert ids(engine) == {7, 8, 9, 10}
    assert ids(engine, "sessions_archive") == {1, 2, 3, 4, 5, 6}


def sql_time(engine: Engine) -> Any:
    at = CUTOFF - timedelta(hours=2)
    return at.timestamp() if engine.dialect == "sqlite" else at


def test_placeholder_as_binds_text_as_the_columns_type(engine: Engine) -> None:
    make_sessions(engine)
    with engine.transaction() as conn:
        declared = {c.name: c.type for c in engine.table_columns(conn, "sessions")}
        value = CUTOFF.timestamp() if engine.dialect == "sqlite" else CUTOFF.isoformat()
        if engine.dialect == "mysql":  # a DATETIME compares with its own text, in UTC
            value = CUTOFF.replace(tzinfo=None).isoformat(sep=" ")
        mark = engine.placeholder_as("at", declared["expires_at"])
        rows = conn.execute(
            f"select id from sessions where expires_at < {mark} order by id", {"at": value}
        ).fetchall()
    assert [int(r["id"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    if engine.dialect == "postgres":
        assert mark == "cast(%(at)s as timestamp with time zone)"


def test_table_indexes_lists_each_indexs_columns_in_order(engine: Engine) -> None:
    make_sessions(engine)
    execute(engine, "create index sessions_pair on sessions (expires_at, id)")
    if engine.dialect == "mysql":  # no partial indexes; a prefix orders only by its prefix
        execute(engine, "create index sessions_prefix on sessions (note(8), id)")
    else:
        execute(engine, "create index sessions_partial on sessions (note) where note is not null")
    with engine.transaction() as conn:
        indexes = {i.name: i for i in engine.table_indexes(conn, "sessions")}
    assert indexes["sessions_pair"].columns == ("expires_at", "id")
    assert indexes["sessions_expires_at"].columns == ("expires_at",)
    assert "sessions_partial" not in indexes  # serves only what implies its predicate
    if engine.dialect == "mysql":
        assert indexes["sessions_prefix"].columns == ()
    assert not indexes["sessions_pair"].unique


def test_table_references_lists_foreign_keys_with_their_on_delete(engine: Engine) -> None:
    make_sessions(engine)
    execute(engine, "create table orders (id int primary key, sid bigint references sessions (id))")
    execute(
        engine,
        "create table visits (id int primary key, sid bigint references sessions (id)"
        " on delete cascade)",
    )
    with engine.transaction() as conn:
        found = sorted(engine.table_references(conn, "sessions"), key=lambda r: r.table)
        none = engine.table_references(conn, "orders")
    # MySQL's default for a foreign key is RESTRICT; PostgreSQL's and SQLite's NO ACTION.
    default = "restrict" if engine.dialect == "mysql" else "no action"
    innodb = engine.dialect == "mysql"  # InnoDB indexes every foreign key itself
    assert found == [
        Reference("orders", ("sid",), ("id",), default, indexed=innodb),
        Reference("visits", ("sid",), ("id",), "cascade", indexed=innodb),
    ]
    assert none == []


def test_table_references_say_whether_an_index_leads_with_their_columns(engine: Engine) -> None:
    """A reference is indexed when some index of the referencing table leads
    with its columns, in any order; an index where they follow another column,
    or (PostgreSQL, SQLite) a partial one, does not count. On SQLite an INTEGER
    PRIMARY KEY is the table's own index. InnoDB indexes every foreign key."""
    execute(engine, "create table pairs (a bigint, b bigint, primary key (a, b))")
    refs = {
        "plain": "sid bigint references pairs_one (id) on delete cascade",
        "led": "x bigint, y bigint, foreign key (x, y) references pairs (a, b) on delete set null",
        "behind": "z bigint, sid bigint references pairs_one (id) on delete cascade",
        "part": "sid bigint references pairs_one (id) on delete cascade",
    }
    execute(engine, "create table pairs_one (id bigint primary key)")
    for name, columns in refs.items():
        execute(engine, f"create table {name} (id bigint primary key, {columns})")
    execute(engine, "create index led_yx on led (y, x, id)")
    execute(engine, "create index behind_z_sid on behind (z, sid)")
    if engine.dialect != "mysql":
        execute(engine, "create index part_sid on part (sid) where sid > 0")
    if engine.dialect == "sqlite":
        execute(engine, "create table own (id integer primary key references pairs_one (id))")
    with engine.transaction() as conn:
        found = {r.table: r.indexed for r in engine.table_references(conn, "pairs_one")}
        found |= {r.table: r.indexed for r in engine.table_references(conn, "pairs")}
    innodb = engine.dialect == "mysql"
    expected = {"plain": innodb, "led": True, "behind": innodb, "part": innodb}
    if engine.dialect == "sqlite":
        expected["own"] = True
    assert found == expected
    statement = engine.index_statement("plain", ("sid",))
    quoted = "`" if engine.dialect == "mysql" else '"'
    concurrently = " concurrently" if engine.dialect == "postgres" else ""
    assert statement == (
        f"create index{concurrently} {quoted}plain_sid_idx{quoted} on {quoted}plain{quoted}"
        f" ({quoted}sid{quoted})"
    )
    execute(engine, statement.replace(" concurrently", ""))  # it runs as written
    with engine.transaction() as conn:
        [plain] = [r for r in engine.table_references(conn, "pairs_one") if r.table == "plain"]
    assert plain.indexed


def test_table_partitions_with_their_ranges_and_partition_remove(engine: Engine) -> None:
    make_sessions(engine)
    with engine.transaction() as conn:
        assert engine.table_partitions(conn, "sessions") == []
    if engine.dialect == "sqlite":
        with engine.transaction() as conn, pytest.raises(SchemaError, match="no partitions"):
            engine.partition_remove(conn, "sessions", None, drop=True, lock_timeout_ms=10)  # type: ignore[arg-type]
        return
    if engine.dialect == "mysql":  # partitions are cleaned by windows, never dropped
        execute(
            engine,
            "create table ev (id int, at datetime not null, primary key (id, at))"
            " partition by range columns (at) (partition ev_1 values less than ('2026-02-01'),"
            " partition ev_2 values less than (maxvalue))",
        )
        with engine.transaction() as conn:
            relation = engine.table_relation(conn, "ev")
            assert engine.table_partitions(conn, "ev") == []
            with pytest.raises(SchemaError, match="not dropped on MySQL"):
                engine.partition_remove(conn, "ev", None, drop=True, lock_timeout_ms=10)  # type: ignore[arg-type]
        assert relation is not None and relation.partitioned and relation.kind == "table"
        return
    execute(engine, "create table ev (id int, at timestamptz not null) partition by range (at)")
    execute(
        engine, "create table ev_1 partition of ev for values from ('2026-01-01') to ('2026-02-01')"
    )
    execute(
        engine, "create table ev_2 partition of ev for values from ('2026-02-01') to (maxvalue)"
    )
    execute(engine, "create table ev_d partition of ev default")
    with engine.transaction() as conn:
        parts = {p.name: p for p in engine.table_partitions(conn, "ev")}
        relation = engine.table_relation(conn, "ev")
    assert relation is not None and relation.partitioned and relation.kind == "table"
    assert set(parts) == {"ev_1", "ev_2", "ev_d"}
    assert parts["ev_1"].key == "at" and parts["ev_1"].upper is not None
    assert parts["ev_1"].upper.startswith("2026-02-01")
    assert parts["ev_2"].upper is None and parts["ev_d"].upper is None  # maxvalue, default
    with engine.transaction() as conn:  # one partition by name, as a partition job reads it
        assert engine.table_partitions(conn, "ev", only="ev_1") == [parts["ev_1"]]
        assert engine.table_partitions(conn, "ev", only="ev_9") == []
    execute(
        engine, "insert into ev select g, '2026-01-05'::timestamptz from generate_series(1, 7) g"
    )
    execute(
        engine, "insert into ev select g, '2026-03-05'::timestamptz from generate_series(1, 3) g"
    )
    with engine.transaction() as conn:
        # The rows each held, counted (never analyzed: the planner knows none).
        assert (
            engine.partition_remove(conn, "ev", parts["ev_1"], drop=False, lock_timeout_ms=1000)
            == 7
        )
        assert (
            engine.partition_remove(conn, "ev", parts["ev_2"], drop=True, lock_timeout_ms=1000) == 3
        )
    with engine.transaction() as conn:
        assert {p.name for p in engine.table_partitions(conn, "ev")} == {"ev_d"}
        # Removed already (detached, or dropped): None, and nothing is done.
        assert (
            engine.partition_remove(conn, "ev", parts["ev_1"], drop=True, lock_timeout_ms=1000)
            is None
        )
        assert (
            engine.partition_remove(conn, "ev", parts["ev_2"], drop=True, lock_timeout_ms=1000)
            is None
        )
    assert execute(engine, "select count(*) as n from ev_1")[0]["n"] == 7  # detached, kept
    assert execute(engine, "select to_regclass('ev_2') as r")[0]["r"] is None  # dropped


def test_partition_remove_twice_at_once_removes_and_counts_once(pg_url: str) -> None:
    """Two deliveries of one partition's removal, in two transactions at once:
    the second waits for the first's lock and, once it commits, finds the
    partition gone (None) and does nothing; rows written while the first waits
    are not lost from its count (none can be: its lock keeps writers out)."""
    engine = open_engine(pg_url)  # only PostgreSQL's partitions are removed whole
    execute(engine, "create table evc (id int, at timestamptz not null) partition by range (at)")
    execute(
        engine,
        "create table evc_1 partition of evc for values from ('2026-01-01') to ('2026-02-01')",
    )
    execute(
        engine, "insert into evc select g, '2026-01-09'::timestamptz from generate_series(1, 9) g"
    )
    with engine.transaction() as conn:
        [part] = engine.table_partitions(conn, "evc")
    second: list[int | None] = []
    with engine.transaction() as first:
        assert engine.partition_remove(first, "evc", part, drop=True, lock_timeout_ms=5000) == 9

        def remove_again() -> None:
            with engine.transaction() as conn:
                second.append(
                    engine.partition_remove(conn, "evc", part, drop=True, lock_timeout_ms=5000)
                )

        thread = threading.Thread(target=remove_again)
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive(), "the second removal waits for the first's lock"
    thread.join(10)
    assert second == [None]
    assert execute(engine, "select to_regclass('evc_1') as r")[0]["r"] is None
    engine.close()


def time_delete(engine: Engine) -> str:
    """A time window's delete: positions (expires_at, id) after lower, up to upper."""
    q, cols = engine.quote, {"ts": engine.quote("expires_at"), "tie": engine.quote("id")}
    ts_type = {"postgres": "timestamp with time zone", "sqlite": "real", "mysql": "datetime(6)"}[
        engine.dialect
    ]
    lo_ts, hi_ts = (engine.placeholder_as(n, ts_type) for n in ("lo_ts", "hi_ts"))
    lo_tie, hi_tie = (engine.placeholder_as(n, "bigint") for n in ("lo_tie", "hi_tie"))
    return (
        f"delete from {q('sessions')} where ({cols['ts']}, {cols['tie']}) > ({lo_ts}, {lo_tie})"
        f" and ({cols['ts']}, {cols['tie']}) <= ({hi_ts}, {hi_tie})"
        f" and not exists (select 1 from {engine.ledger_table}"
        f" where {q('key')} = {engine.placeholder('key')})"
    )


def test_window_apply_takes_a_time_window_between_two_positions(engine: Engine) -> None:
    make_sessions(engine)
    at = CUTOFF - timedelta(hours=1)  # rows 1..6 share it: ties split by id
    ts: Any = {"postgres": at.isoformat(), "sqlite": at.timestamp(), "mysql": at}[engine.dialect]
    lo: list[Any] = [ts, "2" if engine.dialect == "postgres" else 2]
    hi: list[Any] = [ts, "5" if engine.dialect == "postgres" else 5]
    params = {"lo_ts": lo[0], "lo_tie": lo[1], "hi_ts": hi[0], "hi_tie": hi[1], "key": "p:run:t"}
    params |= engine.cutoff_params(storage(engine), CUTOFF)
    timed = window(
        engine,
        "p:run:t",
        delete=time_delete(engine),
        params=params,
        lo=None,
        hi=None,
        positions=[*lo, *hi],
        bounds="positions (a) .. (b)]",
    )
    with engine.transaction() as conn:
        assert engine.window_apply(conn, timed) == 3
    assert ids(engine) == {1, 2, 6, 7, 8, 9, 10}
    entry = engine.ledger_get("p:run:t")
    assert entry is not None and entry.lo is None and entry.bounds == "positions (a) .. (b)]"


def test_window_apply_refused_by_a_foreign_key_takes_nothing_and_keeps_the_transaction(
    engine: Engine,
) -> None:
    make_sessions(engine, archive=True)
    execute(engine, "create table orders (id int primary key, sid bigint references sessions (id))")
    execute(engine, "insert into orders values (1, 3)")
    with engine.transaction() as conn:
        with pytest.raises(ForeignKeyBlocked):
            engine.window_apply(conn, window(engine, "p:run:0"))
        assert engine.now(conn) is not None  # still usable: the split runs here
    assert ids(engine) == set(range(1, 11))
    assert engine.ledger_get("p:run:0") is None
    with engine.transaction(statement=True) as conn, pytest.raises(ForeignKeyBlocked):
        engine.window_apply(conn, window(engine, "p:run:0"))
    assert ids(engine) == set(range(1, 11))


def test_table_layout_and_estimate_rows_read_the_planners_statistics(engine: Engine) -> None:
    make_sessions(engine)
    with engine.transaction() as conn:
        before = engine.table_layout(conn, "sessions", "expires_at")
    if engine.dialect in ("sqlite", "mysql"):
        assert before is None  # no statistics of that kind: no block windows
        with engine.transaction() as conn:
            assert engine.estimate_rows(conn, "select 1 from sessions", {}) is None
        return
    assert before is not None and before.pages == 1 and before.correlation is None
    execute(engine, "analyze sessions")
    with engine.transaction() as conn:
        after = engine.table_layout(conn, "sessions", "expires_at")
        estimate = engine.estimate_rows(conn, "select 1 from sessions where id <= %(n)s", {"n": 6})
    assert after is not None and after.rows == 10 and after.correlation is not None
    assert estimate == 6
    assert engine.block_span is not None and engine.block_of_row is not None


def test_postgres_sessions_carry_application_name_expiry_unless_named(pg_url: str) -> None:
    """An operator finds expiry's sessions in pg_stat_activity by name."""
    engine = open_engine(pg_url)
    try:
        with engine.transaction() as conn:
            name = conn.execute("select current_setting('application_name') as n").fetchone()["n"]
        assert name == "expiry"
    finally:
        engine.close()
    named = open_engine(pg_url + ("&" if "?" in pg_url else "?") + "application_name=billing-gc")
    try:
        with named.transaction() as conn:
            name = conn.execute("select current_setting('application_name') as n").fetchone()["n"]
        assert name == "billing-gc"
    finally:
        named.close()


def test_lock_holders_leaves_out_a_session_of_another_database(
    engine: Engine, another_db_url: str
) -> None:
    """A transaction holding row locks in another database of the same server
    (a table of the same name) is not this table's holder: MariaDB names every
    transaction holding row locks, and a relation id is unique only within its
    database."""
    if engine.dialect == "sqlite":
        return
    other = open_engine(another_db_url)
    try:
        for eng in (engine, other):
            execute(eng, "create table holders_t (id integer primary key)")
            execute(eng, "insert into holders_t values (1)")
        with other.transaction() as conn:
            conn.execute("select id from holders_t where id = 1 for update").fetchall()
            time.sleep(0.1)
            assert engine.lock_holders("holders_t") == []
            assert len(other.lock_holders("holders_t")) == 1  # and there, it is the holder
    finally:
        other.close()


def test_lock_holders_names_another_session_holding_the_tables_locks(engine: Engine) -> None:
    """While another session holds a row of the table locked, lock_holders
    names it (its id, how long its transaction is open); once it ends, no one.
    SQLite has one writer and names no one."""
    execute(engine, "create table holders_t (id integer primary key)")
    execute(engine, "insert into holders_t values (1)")
    if engine.dialect == "sqlite":
        assert engine.lock_holders("holders_t") == []
        return
    with engine.transaction() as conn:
        conn.execute("select id from holders_t where id = 1 for update").fetchall()
        mine = conn.execute(
            "select pg_backend_pid()" if engine.dialect == "postgres" else "select connection_id()"
        ).fetchall()
        time.sleep(0.1)
        [holder] = engine.lock_holders("holders_t")
    row = mine[0]
    pid = row[0] if isinstance(row, tuple | list) else next(iter(row.values()))
    assert holder.pid == int(pid)
    assert holder.seconds is not None and 0.05 <= holder.seconds < 60
    assert engine.lock_holders("holders_t") == []
