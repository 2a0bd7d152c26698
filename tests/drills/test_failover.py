"""Drill: the primary crashes mid-run and its streaming replica is promoted.

The test makes its own primary and hot standby (tests/clusters.py). Two
`expiry worker` processes and `expiry trigger` reach them through one
multi-host URL, as a user points expiry at an HA pair without a proxy:

    postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/drill?target_session_attrs=read-write

Mid-run the primary is stopped with ``-m immediate`` (a crash: no checkpoint,
every connection cut) and the standby promoted. Nobody restarts the workers:
they reconnect to the new primary, which the URL finds by itself, and finish.
A commit the old primary acknowledged but had not yet streamed is lost with
it, together with everything its transaction did (the window's deletes, its
ledger row, its job's completion): the window runs again. The invariants of
docs/drills.md then hold on the new primary.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusters import Cluster, primary_and_standby
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

ROWS = scale(80_000, 2_000_000)


@pytest.fixture
def pair() -> Iterator[tuple[Cluster, Cluster]]:
    with primary_and_standby() as clusters:
        yield clusters


def database_url(cluster: Cluster) -> str:
    return cluster.url.rsplit("/", 1)[0] + "/drill"


def test_workers_follow_a_promoted_replica_through_a_multi_host_url(
    pair: tuple[Cluster, Cluster], tmp_path: Path
) -> None:
    primary, standby = pair
    primary.sql("create database drill")
    old, new = database_url(primary), database_url(standby)
    both = (
        f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/drill"
        "?target_session_attrs=read-write"
    )
    engine = open_engine(both)
    engine.migrate()
    engine.close()
    load_sessions(old, ROWS)
    record_expected(old)
    standby.wait_caught_up(primary)
    cfg = config(
        tmp_path / "expiry.toml",
        both,
        {"window": 1000, "max_rows_per_second": scale(8_000, 50_000)},
        worker={"lease": "3s", "concurrency": 2, "claim_batch": 4},
    )
    workers = [worker_proc(tmp_path, cfg, n) for n in range(2)]
    for proc in workers:
        proc.start()
    try:
        trigger(cfg)

        def applied() -> bool:
            with connect(old) as conn:
                row = conn.execute("select count(*) from expiry.ledger").fetchone()
            return bool(row and row[0] >= 15)

        wait_until(applied, 60, "windows to be applied", on_timeout=workers[0].tail)
        assert pending(old) > 0, "the run ended before the crash: make it bigger"
        crashed = time.monotonic()
        primary.stop()  # -m immediate: a crash
        standby.promote()
        promoted = time.monotonic() - crashed
        wait_until(
            lambda: pending(new) == 0,
            scale(120, 1200),
            "every job to finish on the promoted replica",
            every=0.5,
            on_timeout=lambda: f"{job_states(new)}\n{workers[0].tail()}\n{workers[1].tail()}",
        )
        print(
            f"promoted {promoted:.1f}s after the crash; every job done "
            f"{time.monotonic() - crashed:.1f}s after it"
        )
        assert all(proc.alive() for proc in workers), "a worker exited instead of reconnecting"
        assert all(proc.starts == 1 for proc in workers)
    finally:
        for proc in workers:
            proc.stop()
    report = check(new)
    assert set(report.jobs) == {"completed"}
