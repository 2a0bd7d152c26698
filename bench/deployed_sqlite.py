"""SQLite cleanup as deployed: an idle `expiry worker` process and `expiry trigger
--wait` against the hand-written loop on the same file.

    .venv/bin/python bench/deployed_sqlite.py                     # 2,000,000 rows, window 10,000, 3 rounds
    .venv/bin/python bench/deployed_sqlite.py --rows 20000 --window 1000 --rounds 1   # smoke

The table and the loop are `bench/cleanup_throughput.py`'s (``sessions (id
integer primary key, user_id, expires_at real epoch seconds indexed, payload)``,
exactly 800 of every 1,000 consecutive ids expired, ANALYZEd, the WAL
checkpointed; the loop reads the expired rows' bounds and runs ``DELETE ...
WHERE id > lo AND id <= hi AND expires_at < cutoff`` in autocommit on one
connection). The file is built afresh for each method. expiry runs as
a user deploys it: an ``expiry.toml`` with one delete policy (``retain =
"0s"``, ``window = --window``, ``nice_ratio = 0``, the rest default), ``expiry
migrate``, ONE ``expiry worker --concurrency 1``, waited for until its
roll-call row is in ``expiry_workers`` and IDLE_SECONDS more, then ``expiry
trigger POLICY --cutoff C --wait`` (C the build's cutoff, the loop's: rows
that expire meanwhile are neither's to delete); SIGTERM to the worker after. The time is the run's
own span in the file, ``expiry_runs.finished_at - opened_at``: no Python
start-up. Rounds alternate which method goes first; after each method the
survivors are compared with the build's fingerprint of the live rows.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import cleanup_throughput as ct

ROOT = Path(__file__).resolve().parents[1]
EXPIRY = str(ROOT / ".venv" / "bin" / "expiry")
POLICY = ct.POLICY
IDLE_SECONDS = 2.5
START_TIMEOUT = 60.0


def write_config(path: Path, db: Path, window: int) -> Path:
    path.write_text(
        f"""[database]
url = "sqlite:///{db}"

[[policy]]
name = "{POLICY}"
table = "sessions"
key = "id"
timestamp = "expires_at"
retain = "0s"
window = {window}
nice_ratio = 0
"""
    )
    return path


def wait_idle(db: Path, worker: subprocess.Popen[bytes], log: Path) -> None:
    """Until the worker's roll-call row is in expiry_workers, then IDLE_SECONDS."""
    deadline = time.monotonic() + START_TIMEOUT
    conn = sqlite3.connect(db, timeout=30.0)
    try:
        while time.monotonic() < deadline:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited {worker.returncode}: {log.read_text()}")
            if conn.execute("select count(*) from expiry_workers").fetchone() == (1,):
                time.sleep(IDLE_SECONDS)
                return
            time.sleep(0.05)
    finally:
        conn.close()
    raise RuntimeError(f"the worker did not start within {START_TIMEOUT:g} s")


def expiry_run(db: Path, cfg: Path, tmp: Path, cutoff: datetime) -> tuple[int, float]:
    """(rows the run's ledger booked, the run's span in seconds)."""
    env = {**os.environ, "EXPIRY_CONFIG": str(cfg)}
    env.pop("EXPIRY_DATABASE_URL", None)
    subprocess.run([EXPIRY, "migrate"], env=env, check=True, capture_output=True)
    log = tmp / "worker.log"
    with log.open("wb") as sink:
        worker = subprocess.Popen(
            [EXPIRY, "worker", "--concurrency", "1"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
        try:
            wait_idle(db, worker, log)
            done = subprocess.run(
                [EXPIRY, "trigger", POLICY, "--cutoff", cutoff.isoformat()]
                + ["--wait", "--timeout", "15m"],
                env=env,
                capture_output=True,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"expiry trigger --wait exited {done.returncode}: "
                    f"{done.stdout.decode()} {done.stderr.decode()}"
                )
        finally:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(60)
    conn = sqlite3.connect(db, timeout=30.0)
    try:
        row = conn.execute(
            "select finished_at - opened_at,"
            " (select coalesce(sum(rows_affected), 0) from expiry_ledger l where l.run_id = r.id)"
            " from expiry_runs r where policy = ? and state = 'finished'"
            " order by opened_at desc limit 1",
            (POLICY,),
        ).fetchone()
    finally:
        conn.close()
    if row is None:
        raise RuntimeError("no finished run in expiry_runs")
    return int(row[1]), float(row[0])


def one(method: str, db: Path, args: argparse.Namespace, tmp: Path) -> tuple[int, float]:
    cutoff = datetime.now(UTC).replace(microsecond=0)
    built = ct.sqlite_build(db, args.rows, cutoff)
    if method == "loop":
        deleted, _, seconds = ct.raw_sqlite(db, cutoff, args.window)
    else:
        cfg = write_config(tmp / "expiry.toml", db, args.window)
        deleted, seconds = expiry_run(db, cfg, tmp, cutoff)  # the build's cutoff, as the loop
    ct.check("sqlite", method, built, deleted, ct.sqlite_survivors(db))
    return deleted, seconds


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows in sessions (2000000)")
    parser.add_argument("--window", type=int, default=10_000, help="keys per window (10000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    args = parser.parse_args(argv)
    if min(args.rows, args.window, args.rounds) <= 0:
        parser.error("--rows, --window and --rounds must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"sqlite as deployed: {args.rows:,} rows, 80% expired, window {args.window:,},"
        f" one worker thread against the loop on one connection, {args.rounds} round(s)"
    )
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="expiry-deployed-sqlite-") as name:
        tmp = Path(name)
        db = tmp / "bench.db"
        for r in range(1, args.rounds + 1):
            order = ["loop", "expiry"] if r % 2 else ["expiry", "loop"]
            got: dict[str, tuple[int, float]] = {}
            for method in order:
                got[method] = one(method, db, args, tmp)
                rows, seconds = got[method]
                print(
                    f"  round {r} {method:<6} {rows:>10,} rows {seconds:8.3f} s"
                    f" {rows / seconds:>12,.0f} rows/s",
                    flush=True,
                )
            ratio = got["loop"][1] / got["expiry"][1]
            ratios.append(ratio)
            print(f"  round {r}: expiry {ratio:.2f}x the loop's rows/s")
    print(
        f"expiry against the loop: median {statistics.median(ratios):.2f}x"
        f" ({', '.join(f'{x:.2f}x' for x in ratios)}); target (reported, not asserted) >= 0.9x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
