"""Drill 1: workers SIGKILLed at random, mid-window and between commit and bookkeeping.

Four `expiry worker` processes with a 3 s lease clean a big table in small
windows while a chaos loop SIGKILLs a random one every 0.2-2 s and starts it
again. The workers also kill themselves, with some probability, right after a
window's transaction committed and before their own bookkeeping, and right
after claiming a window, before working on it (_app.py).
Nothing may be lost or applied twice: the invariants hold at the end.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from ._harness import (
    config,
    connect,
    dialect,
    drill_env,
    job_states,
    load_sessions,
    pending,
    runs_open,
    scale,
    trigger,
    wait_until,
    worker_proc,
)
from ._invariants import check, record_expected

ROWS = scale(1_000_000, 5_000_000)
KILLS = scale(50, 500)
WORKERS = 4
WINDOW = 1000
RATE = scale(3000, 1200)
"""Rows/s per worker process: the work must outlast the chaos (50 kills take about
a minute against 83 s of work; 500 about 9 minutes) however fast the machine is."""
ROWS_MYSQL = scale(300_000, 2_000_000)
RATE_MYSQL = scale(600, 500)
"""MariaDB: fewer rows at a lower rate, for as long a chaos (300,000 rows at
4 x 600 rows/s: 125 s of work; restarted workers begin with a fresh rate, so
50 kills once ran out of 900 rows/s' work in 60 s)."""


def test_random_worker_kills_lose_nothing_and_apply_nothing_twice(
    server_url: str, tmp_path: Path
) -> None:
    pg_url = server_url  # PostgreSQL, then MariaDB
    mysql = dialect(pg_url) == "mysql"
    load_sessions(pg_url, ROWS_MYSQL if mysql else ROWS)
    record_expected(pg_url)
    # A kill spends an attempt of every job the victim had claimed, started or not
    # (up to concurrency x claim_batch): a small batch and a large budget keep this
    # drill about crash safety, not about the attempt budget.
    cfg = config(
        tmp_path / "expiry.toml",
        pg_url,
        {
            "window": WINDOW,
            "max_attempts": 50,
            "max_rows_per_second": RATE_MYSQL if mysql else RATE,
        },
        worker={"lease": "3s", "concurrency": 2, "claim_batch": 4},
    )
    marks = tmp_path / "killed-after-commit.txt"
    marks_before = tmp_path / "killed-holding-a-claim.txt"
    env = drill_env(
        cfg,
        DRILL_KILL_AFTER_COMMIT="0.03",
        DRILL_MARKS=str(marks),
        DRILL_KILL_BEFORE_WINDOW="0.03",
        DRILL_MARKS_BEFORE=str(marks_before),
    )
    procs = [worker_proc(tmp_path, cfg, n, app="drills._app:app", env=env) for n in range(WORKERS)]
    rng = random.Random(20261130)
    for proc in procs:
        proc.start()
    run_id = trigger(cfg)

    kills = 0
    started = time.monotonic()
    try:
        while pending(pg_url) and kills < KILLS:
            time.sleep(rng.uniform(0.2, 2.0))
            for proc in procs:  # a worker that killed itself after a commit
                if not proc.alive():
                    proc.start()
            victim = rng.choice(procs)
            victim.kill()
            kills += 1
            victim.start()
        chaos = time.monotonic() - started
        print(f"chaos: {kills} kills in {chaos:.1f}s; state {job_states(pg_url)}")
        assert kills >= KILLS, f"the work ran out after {kills} kills: make the drill bigger"

        def settled() -> bool:
            for proc in procs:
                if not proc.alive():
                    proc.start()
            # A worker killed right after the last commit leaves the run to the
            # rescuer's sweep of a surviving worker.
            return pending(pg_url) == 0 and runs_open(pg_url) == 0

        wait_until(
            settled,
            scale(180, 3600),
            "every job and the run to finish after the chaos",
            every=0.5,
            on_timeout=lambda: f"{job_states(pg_url)}\n{procs[0].tail()}",
        )
    finally:
        codes = [proc.stop() for proc in procs]
    print(f"finished in {time.monotonic() - started:.1f}s; exit codes {codes}")

    report = check(pg_url)
    assert report.jobs.keys() == {"completed"}, report.jobs
    assert run_id
    lines = marks.read_text().splitlines() if marks.exists() else []
    after_commit = {line.split(maxsplit=1)[1] for line in lines}  # a block key has a space
    with connect(pg_url) as conn:
        contains = (
            'json_contains(errors, \'[{"kind": "lease_expired"}]\')'
            if mysql
            else 'errors @> \'[{"kind": "lease_expired"}]\''
        )
        rescued = conn.execute(f"select count(*) from expiry.jobs where {contains}").fetchone()
        # A worker killed after its commit left the window completed and in the ledger.
        keys = list(after_commit) or [""]
        committed = conn.execute(
            "select count(*) from expiry.jobs j join expiry.ledger l on l.key = j.key"
            + (
                f" where j.key in ({', '.join(['%s'] * len(keys))})"
                if mysql
                else " where j.key = any(%s)"
            )
            + " and j.state = 'completed'",
            keys if mysql else (keys,),
        ).fetchone()
    holding = marks_before.read_text().splitlines() if marks_before.exists() else []
    print(
        f"kills: {kills} by the chaos loop, {len(lines)} after a commit,"
        f" {len(holding)} holding a claim; rescued {rescued}"
    )
    assert len(lines) >= 1, "no worker died between commit and bookkeeping"
    assert committed and committed[0] == len(after_commit)
    assert len(holding) >= 1, "no worker died holding a claim"
    # A window a worker died holding came back by its lease's expiry.
    assert rescued and rescued[0] >= 1, "no abandoned claim was rescued"


def test_a_run_whose_last_window_lost_its_bookkeeping_still_finishes(
    pg_url: str, tmp_path: Path
) -> None:
    """The worker dies right after committing the run's only window, before the
    bookkeeping that would mark the run finished: another worker finishes it."""
    load_sessions(pg_url, 500)
    record_expected(pg_url)
    # One job loop: the planning job's batch hook (which may finish the run) is over
    # before the window is claimed, so only the window's own (lost) bookkeeping could
    # have finished the run.
    cfg = config(
        tmp_path / "expiry.toml",
        pg_url,
        {"window": 10_000},
        worker={"lease": "3s", "concurrency": 1},
    )
    marks = tmp_path / "killed-after-commit.txt"
    doomed = worker_proc(
        tmp_path,
        cfg,
        0,
        app="drills._app:app",
        env=drill_env(cfg, DRILL_KILL_AFTER_COMMIT="1", DRILL_MARKS=str(marks)),
    )
    doomed.start()
    run_id = trigger(cfg)
    assert doomed.popen is not None
    assert doomed.popen.wait(60) == -9
    doomed.stop()
    assert len(marks.read_text().splitlines()) == 1
    with connect(pg_url) as conn:
        state = conn.execute("select state from expiry.runs where id = %s", (run_id,)).fetchone()
    assert state == ("running",) and pending(pg_url) == 0  # the bookkeeping was lost

    survivor = worker_proc(tmp_path, cfg, 1)
    survivor.start()
    try:

        def finished() -> bool:
            with connect(pg_url) as conn:
                row = conn.execute("select state from expiry.runs where id = %s", (run_id,))
                return row.fetchone() == ("finished",)

        wait_until(finished, 30, "another worker to finish the run", on_timeout=survivor.tail)
    finally:
        survivor.stop()
    check(pg_url)
