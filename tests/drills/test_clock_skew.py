"""Drill 5: the app's clock is hours off; the database's clock decides.

The scheduler runs with its process clock 5 hours ahead and the workers 5 hours
behind (libfaketime). The scheduler fires from the database clock, so the run's
cutoff is the database's last minute boundary, not 5 hours later; the workers
delete exactly the rows expired by that cutoff. Rows expiring within the next
hours (database clock) survive; rows expired minutes ago are gone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from ._harness import (
    Proc,
    config,
    connect,
    drill_env,
    job_states,
    pending,
    skewed_env,
    wait_until,
    worker_proc,
)
from ._invariants import check, record_expected

SKEW_HOURS = 5


def process_clock_offset(env: dict[str, str]) -> float:
    """Seconds by which a process started with ``env`` sees the time off."""
    probe = "import json, time; print(json.dumps(time.time()))"
    before = __import__("time").time()
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return float(json.loads(out.stdout)) - before


def test_cutoffs_and_deletions_follow_the_database_clock(pg_url: str, tmp_path: Path) -> None:
    with connect(pg_url) as conn:
        conn.execute(
            "create table sessions (id bigint primary key, user_id integer not null default 0,"
            " expires_at timestamptz not null, revoked_at timestamptz, note text)"
        )
        # 1..3000: expired 2 minutes to 4 hours ago (database clock); 3001..6000:
        # expiring in 10 minutes to 4 hours; every 7th of the expired ones revoked.
        conn.execute(
            "insert into sessions (id, expires_at, revoked_at)"
            " select i, now() - interval '2 minutes' - (i * interval '4.7 seconds'),"
            "        case when i % 7 = 0 then now() end"
            " from generate_series(1, 3000) i"
        )
        conn.execute(
            "insert into sessions (id, expires_at)"
            " select i, now() + interval '10 minutes' + ((i - 3000) * interval '4.6 seconds')"
            " from generate_series(3001, 6000) i"
        )
        conn.execute("create index on sessions (expires_at)")
    record_expected(pg_url)
    cfg = config(
        tmp_path / "expiry.toml",
        pg_url,
        {"window": 200, "schedule": "* * * * *"},
        worker={"lease": "5s"},
    )
    ahead = skewed_env(drill_env(cfg), f"+{SKEW_HOURS}h")
    behind = skewed_env(drill_env(cfg), f"-{SKEW_HOURS}h")
    assert abs(process_clock_offset(ahead) - SKEW_HOURS * 3600) < 120
    assert abs(process_clock_offset(behind) + SKEW_HOURS * 3600) < 120

    # The schedule was last fired 90 s ago by the database clock, so the scheduler
    # owes exactly the latest minute boundary (catch_up = "latest") right away.
    with connect(pg_url) as conn:
        conn.execute(
            "insert into expiry.schedules (policy, last_fire_at)"
            " values ('expired-sessions', now() - interval '90 seconds')"
        )
    scheduler = Proc(["scheduler", "--config", str(cfg)], ahead, tmp_path / "scheduler.log")
    workers = [worker_proc(tmp_path, cfg, n, env=behind) for n in range(2)]
    procs = [scheduler, *workers]
    for proc in procs:
        proc.start()
    try:
        run = wait_until(
            lambda: _first_run(pg_url),
            60,
            "the scheduler to open a run",
            on_timeout=scheduler.tail,
        )
        wait_until(
            lambda: _planned(pg_url, run[0]) and pending(pg_url) == 0,
            60,
            "the run to finish",
            on_timeout=lambda: f"{job_states(pg_url)}\n{workers[0].tail()}",
        )
    finally:
        for proc in procs:
            proc.stop()

    run_id, cutoff, db_now = run
    print(f"run {run_id}: cutoff {cutoff}, database now {db_now}")
    # The cutoff is the database's latest minute boundary, not 5 hours off.
    assert timedelta(0) <= db_now - cutoff < timedelta(seconds=61 + 60)
    assert cutoff.second == 0 and cutoff.microsecond == 0
    report = check(pg_url)
    assert set(report.jobs) == {"completed"}
    with connect(pg_url) as conn:
        left = conn.execute(
            "select count(*) filter (where id <= 3000 and revoked_at is null),"
            " count(*) filter (where id > 3000) from sessions"
        ).fetchone()
        runs = conn.execute("select count(*) from expiry.runs").fetchone()
    assert left == (0, 3000), "expired rows must go, rows expiring in the next hours must stay"
    assert runs and runs[0] >= 1


def _first_run(url: str) -> tuple[str, object, object] | None:
    with connect(url) as conn:
        row = conn.execute(
            "select id, cutoff, now() from expiry.runs order by opened_at limit 1"
        ).fetchone()
    return (str(row[0]), row[1], row[2]) if row else None


def _planned(url: str, run_id: str) -> bool:
    with connect(url) as conn:
        row = conn.execute("select state from expiry.runs where id = %s", (run_id,)).fetchone()
    return bool(row and row[0] in ("running", "finished"))
