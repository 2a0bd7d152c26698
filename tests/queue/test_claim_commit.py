"""On PostgreSQL a claim commits without waiting for its WAL to reach disk: lost
in a crash, a claim only leaves its jobs available, and the job's own durable
commit flushes the claim's WAL before its own. Checked with the server's WAL
counters: claims do not write WAL at commit, where durable commits do."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from expiry.engines.postgres.engine import PostgresEngine
from expiry.queue.jobs import new_job

CLAIMS = 20


@pytest.fixture
def engine(pg_url: str) -> Iterator[PostgresEngine]:
    engine = PostgresEngine(pg_url, pool_size=1)  # one backend: its WAL stats are ours
    engine.migrate()
    yield engine
    engine.close()


def wal_writes(engine: PostgresEngine, admin: psycopg.Connection[tuple[int]]) -> int:
    """pg_stat_wal.wal_write once the pool's backend has reported its counts."""
    with engine.transaction() as tx:
        tx.execute("select pg_stat_force_next_flush()")
    # The backend reports when it goes idle after that statement; read afresh.
    row = admin.execute("select wal_write from pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.serial  # pg_stat_wal is the server's: the other tests' commits write WAL too
def test_claims_do_not_wait_for_a_wal_flush_but_durable_commits_do(
    engine: PostgresEngine, pg_url: str
) -> None:
    engine.job_insert_many([new_job("h", {"n": n}, key=f"claim-{n}") for n in range(CLAIMS)])
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("set stats_fetch_consistency = none")

        before = wal_writes(engine, admin)
        for _ in range(CLAIMS):
            [job] = engine.job_claim(["default"], 1, 60.0, "test")
        claimed = wal_writes(engine, admin) - before

        # The control: as many commits of one-row updates, durable, on that backend.
        before = wal_writes(engine, admin)
        for _ in range(CLAIMS):
            with engine.transaction() as tx:
                tx.execute("update expiry.jobs set updated_at = now() where id = %s", (job.id,))
        durable = wal_writes(engine, admin) - before

    assert durable >= CLAIMS  # each durable commit writes (and flushes) its WAL
    assert claimed < CLAIMS / 2, (claimed, durable)  # the WAL writer's, a few at most
