"""Drill 2: the PostgreSQL server restarts mid-run.

Two `expiry worker` processes are cleaning when the server is restarted
(``pg_ctl restart -m fast``: every connection drops, in-flight transactions
roll back). The workers stay up, reconnect with backoff, lose nothing and
finish; the invariants hold.

The server is one of the test's own (tests/clusters.py: initdb in a temporary
folder, its own port), so the shared server and the tests running beside this
one are never touched.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusters import Cluster, private_cluster
from expiry.engines import open_engine

from ._harness import (
    config,
    connect,
    job_states,
    load_sessions,
    pending,
    scale,
    trigger,
    wait_until,
    worker_proc,
)
from ._invariants import check, record_expected

ROWS = scale(150_000, 3_000_000)
RESTARTS = scale(1, 5)


@pytest.fixture
def own_server() -> Iterator[tuple[Cluster, str]]:
    """A server of the test's own with one migrated database: (cluster, url)."""
    with private_cluster() as cluster:
        cluster.sql("create database drill")
        url = cluster.url.rsplit("/", 1)[0] + "/drill"
        engine = open_engine(url)
        engine.migrate()
        engine.close()
        yield cluster, url


def restart_server(cluster: Cluster) -> float:
    """Restart the server (it accepts connections again on return); returns seconds."""
    started = time.monotonic()
    cluster.restart("fast")
    return time.monotonic() - started


def test_workers_ride_out_a_server_restart(own_server: tuple[Cluster, str], tmp_path: Path) -> None:
    cluster, pg_url = own_server
    load_sessions(pg_url, ROWS)
    record_expected(pg_url)
    cfg = config(
        tmp_path / "expiry.toml",
        pg_url,
        {"window": 1000, "max_rows_per_second": scale(10_000, 50_000)},
        worker={"lease": "3s", "concurrency": 2, "claim_batch": 4},
    )
    workers = [worker_proc(tmp_path, cfg, n) for n in range(2)]
    for proc in workers:
        proc.start()
    trigger(cfg)
    try:
        for n in range(RESTARTS):

            def progressed(n: int = n) -> bool:
                with connect(pg_url) as conn:
                    row = conn.execute("select count(*) from expiry.ledger").fetchone()
                return bool(row and row[0] >= 10 * (n + 1))

            wait_until(progressed, 60, "windows to be applied", on_timeout=workers[0].tail)
            assert pending(pg_url) > 0, "the run ended before the restart: make it bigger"
            took = restart_server(cluster)
            print(f"restart {n + 1}: server back after {took:.1f}s; {job_states(pg_url)}")
        wait_until(
            lambda: pending(pg_url) == 0,
            scale(120, 1200),
            "every job to finish after the restart",
            every=0.5,
            on_timeout=lambda: f"{job_states(pg_url)}\n{workers[0].tail()}",
        )
        assert all(proc.alive() for proc in workers), "a worker exited instead of reconnecting"
        assert all(proc.starts == 1 for proc in workers)
    finally:
        for proc in workers:
            proc.stop()
    report = check(pg_url)
    assert set(report.jobs) == {"completed"}
    with connect(pg_url) as conn:
        kinds = conn.execute(
            "select e->>'kind', count(*) from expiry.jobs, jsonb_array_elements(errors) e"
            " group by 1 order by 1"
        ).fetchall()
    print(f"failed attempts by kind: {kinds}")
