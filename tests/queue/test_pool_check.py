"""PostgreSQL's pool checks a connection with a round trip only once it sat idle
for a while: a busy worker skips the check, and a connection cut while idle is
still replaced before anyone uses it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from expiry.engines.postgres.engine import PostgresEngine
from expiry.engines.postgres.sessions import IDLE_CHECK_SECONDS


@pytest.fixture
def engine(pg_url: str) -> Iterator[PostgresEngine]:
    engine = PostgresEngine(pg_url, pool_size=1)
    engine.migrate()
    yield engine
    engine.close()


def backend_pid(engine: PostgresEngine) -> int:
    with engine.transaction() as tx:
        row = tx.execute("select pg_backend_pid() as pid").fetchone()
    return int(row["pid"])


def terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("select pg_terminate_backend(%s, 5000)", (pid,))


def test_a_connection_cut_while_idle_is_replaced_before_use(
    engine: PostgresEngine, pg_url: str
) -> None:
    pid = backend_pid(engine)
    terminate(pg_url, pid)
    time.sleep(IDLE_CHECK_SECONDS + 0.2)
    assert backend_pid(engine) != pid  # checked, found broken, replaced: no error


def test_a_connection_back_within_the_idle_limit_is_not_checked(
    engine: PostgresEngine, pg_url: str
) -> None:
    pid = backend_pid(engine)
    terminate(pg_url, pid)
    # Unchecked, the cut connection fails its next use (a worker retries such a
    # transaction); the pool then drops it and the use after gets a new one.
    with pytest.raises(psycopg.OperationalError):
        backend_pid(engine)
    assert backend_pid(engine) != pid
