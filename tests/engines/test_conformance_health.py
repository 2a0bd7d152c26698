"""The database's health as the throttle reads it, on every engine: the WAL
position, the standbys and their replay, active backends, the application's
sessions at work, a table's vacuum pressure and a vacuum. The replication methods run against a primary and a
streaming standby of the test's own (tests/clusters.py); SQLite has none of
these signals and says so with None or []."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from _conformance import execute

from cleanup._support import MySQLConn
from clusters import Cluster, primary_and_standby
from dialects import dialect
from expiry.engines import Engine, open_engine


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[Cluster, Cluster]]:
    with primary_and_standby() as pair:
        yield pair


def test_health_wal_position_grows_with_writes(engine: Engine) -> None:
    with engine.transaction() as conn:
        before = engine.health_wal_position(conn)
    if engine.dialect in ("sqlite", "mysql"):  # MySQL's binary log: a file and an offset
        assert before is None
        return
    execute(engine, "create table grows (id int)")
    execute(engine, "insert into grows select generate_series(1, 1000)")
    with engine.transaction() as conn:
        after = engine.health_wal_position(conn)
    assert before is not None and after is not None and after > before


def _active(engine: Engine) -> int | None:
    with engine.transaction() as conn:
        return engine.health_active_backends(conn)


@pytest.mark.serial  # the server's active backends: the other tests' come and go meanwhile
def test_health_active_backends_counts_others_running_a_statement(engine: Engine) -> None:
    """The count is the server's: another test's teardown may run a statement
    meanwhile, so the quiet reading is the least of a few, the busy one the most."""
    if engine.dialect == "sqlite":
        assert _active(engine) is None
        return
    quiet = []
    for _ in range(3):
        quiet.append(_active(engine))
        time.sleep(0.05)
    assert None not in quiet
    alone = min(n for n in quiet if n is not None)
    url = engine.url  # type: ignore[attr-defined]

    def sleep() -> None:
        if engine.dialect == "mysql":
            other_engine = open_engine(url)
            with other_engine.transaction() as other:
                other.execute("select sleep(1.5)")
            other_engine.close()
            return
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("select pg_sleep(1.5)")

    sleeping = threading.Thread(target=sleep)
    sleeping.start()
    time.sleep(0.5)
    busy = []
    for _ in range(3):
        busy.append(_active(engine))
        time.sleep(0.05)
    sleeping.join()
    assert None not in busy and max(n for n in busy if n is not None) >= alone + 1


def _foreground(engine: Engine) -> int | None:
    with engine.transaction() as conn:
        return engine.health_foreground_sessions(conn, 1.0)


def _readings(engine: Engine) -> list[int]:
    found = []
    for _ in range(3):
        n = _foreground(engine)
        assert n is not None
        found.append(n)
        time.sleep(0.05)
    return found


def _sleeping(work: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=work)
    thread.start()
    time.sleep(0.5)
    return thread


@pytest.mark.serial  # the server's sessions: the other tests' come and go meanwhile
def test_health_foreground_sessions_counts_the_applications_and_not_expirys(
    engine: Engine,
) -> None:
    """What nice_ratio rests for: a session of the application running a
    statement counts (and for a second after); one of expiry's own (another of
    its connections, running as expiry does) does not. The quiet and expiry's
    readings are the least of a few (a teardown may run a statement
    meanwhile), the application's the most."""
    if engine.dialect == "sqlite":
        assert _foreground(engine) is None
        return
    url = engine.url  # type: ignore[attr-defined]
    time.sleep(1.2)  # the fixtures' own statements out of the last second
    quiet = min(_readings(engine))

    def expirys() -> None:
        other_engine = open_engine(url)
        statement = {
            "postgres": "select pg_sleep(1.5)",
            "mysql": "select sleep(1.5) as s, (select count(*) from expiry_jobs) as n",
        }[engine.dialect]
        with other_engine.transaction() as other:
            other.execute(statement).fetchall()
        other_engine.close()

    def applications() -> None:
        if engine.dialect == "mysql":
            other = MySQLConn(url)
            other.execute("select sleep(1.5)").fetchall()
            other.close()
            return
        with psycopg.connect(url, autocommit=True, application_name="shop") as conn:
            conn.execute("select pg_sleep(1.5)")

    thread = _sleeping(expirys)
    during_expirys = min(_readings(engine))
    thread.join()
    assert during_expirys <= quiet
    thread = _sleeping(applications)
    during_applications = max(_readings(engine))
    thread.join()
    assert during_applications >= quiet + 1


def test_health_replicas_and_replay_lag_without_a_standby(engine: Engine) -> None:
    with engine.transaction() as conn:
        assert engine.health_replicas(conn) == []  # the test server streams to nobody
        assert engine.health_replay_lag(conn) is None  # a primary, or SQLite


def test_table_vacuum_stats_and_table_vacuum(engine: Engine) -> None:
    ts = dialect(engine).time_type
    flush = "select pg_stat_force_next_flush()" if engine.dialect == "postgres" else "select 1"
    execute(engine, f"create table churn (id bigint primary key, at {ts})")
    with engine.transaction() as conn:
        conn.execute("insert into churn (id) values " + ", ".join(f"({i})" for i in range(1, 201)))
        conn.execute("delete from churn where id <= 150")
        conn.execute(flush)  # the statistics report them at commit
    with engine.transaction(statement=True) as conn:
        engine.table_vacuum(conn, "churn")  # outside a transaction: VACUUM refuses one
    with engine.transaction() as conn:
        stats = engine.table_vacuum_stats(conn, "churn")
    if engine.dialect in ("sqlite", "mysql"):  # InnoDB purges deleted rows itself
        assert stats is None
        return
    assert stats is not None and stats.live_tuples == 50 and stats.dead_tuples == 0
    assert stats.last_vacuum is not None and stats.last_analyze is not None
    with engine.transaction() as conn:
        conn.execute("delete from churn where id <= 180")
        conn.execute(flush)
    with engine.transaction() as conn:
        dead = engine.table_vacuum_stats(conn, "churn")
    assert dead is not None and dead.dead_tuples == 30 and dead.live_tuples == 20
    assert dead.dead_ratio == 30 / 50


def test_health_replicas_on_a_primary_and_health_replay_lag_on_its_standby(
    clusters: tuple[Cluster, Cluster],
) -> None:
    primary, standby = clusters
    on_primary, on_standby = open_engine(primary.url), open_engine(standby.url)
    try:
        deadline = time.monotonic() + 10
        while True:  # a standby reports its position within wal_receiver_status_interval
            with on_primary.transaction() as conn:
                [replica] = on_primary.health_replicas(conn)
                position = on_primary.health_wal_position(conn)
                assert on_primary.health_replay_lag(conn) is None
            if replica.replay_position is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert replica.visible and replica.replay_position is not None and position is not None
        with on_standby.transaction() as conn:
            assert on_standby.health_wal_position(conn) is None  # a standby writes no WAL
            assert on_standby.health_replay_lag(conn) == 0.0  # caught up
        standby.pause_replay()
        try:
            primary.sql("create table if not exists lagging (id int)")
            primary.sql("insert into lagging select generate_series(1, 100)")
            # Nothing replayed since the standby started dates the lag: unknown, late.
            time.sleep(1.5)
            with on_standby.transaction() as conn:
                lag = on_standby.health_replay_lag(conn)
            with on_primary.transaction() as conn:
                [behind] = on_primary.health_replicas(conn)
                now_at = on_primary.health_wal_position(conn)
            assert lag is not None and lag >= 1.0  # infinite or dated
            assert behind.replay_position is not None and now_at is not None
            assert behind.replay_position < now_at
        finally:
            standby.resume_replay()
        standby.wait_caught_up(primary)
        with on_standby.transaction() as conn:
            assert on_standby.health_replay_lag(conn) == 0.0
    finally:
        on_primary.close()
        on_standby.close()


def _statement_limit(engine: Engine, conn: object) -> object:
    """The session's statement timeout as the engine reads it."""
    if engine.dialect == "postgres":
        sql = "select current_setting('statement_timeout') as v"
    elif getattr(engine, "mariadb", False):
        sql = "select @@session.max_statement_time as v"
    else:
        sql = "select @@session.max_execution_time as v"
    return conn.execute(sql).fetchone()["v"]  # type: ignore[attr-defined]


def test_session_limits_bind_the_statements_after_them_and_never_a_vacuum(engine: Engine) -> None:
    """A window's limits stay on a statement-mode session (the next window with
    the same limits sets nothing) but a table's vacuum runs without them."""
    execute(
        engine, f"create table churn_limits (id bigint primary key, at {dialect(engine).time_type})"
    )
    with engine.transaction(statement=True) as conn:
        if engine.dialect == "sqlite":  # one writer, busy_timeout: no session limits
            assert engine.session_limits(conn, "2000ms", "30000ms") is None
            return
        own = _statement_limit(engine, conn)
        engine.session_limits(conn, "2000ms", "30000ms")
        bound = _statement_limit(engine, conn)
        assert bound != own and str(bound) in ("30s", "30.0", "30.000000", "30000"), bound
        engine.table_vacuum(conn, "churn_limits")
        assert _statement_limit(engine, conn) == own
        engine.session_limits(conn, "2000ms", "30000ms")  # set again after the vacuum
        assert _statement_limit(engine, conn) == bound


def test_health_flow_control_is_none_off_a_galera_cluster(engine: Engine) -> None:
    """The shared servers are no Galera nodes (MariaDB without wsrep): no
    reading. A node's own readings are tested on a cluster of the test's own
    (tests/drills/test_galera.py)."""
    with engine.transaction() as conn:
        assert engine.health_flow_control(conn) is None


def test_write_set_limit_is_none_off_a_galera_cluster(engine: Engine) -> None:
    with engine.transaction() as conn:
        assert engine.write_set_limit(conn) is None
