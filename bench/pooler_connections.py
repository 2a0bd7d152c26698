#!/usr/bin/env python3
"""How many connections one `expiry worker` holds behind pgbouncer, in session
and in transaction mode.

For each mode: a pgbouncer of its own (tests/poolers.py, Debian's package) in
front of the shared PostgreSQL, 50 server connections allowed; a database with
ROWS expired sessions; one `expiry worker` process ([worker] concurrency as
given) and one `expiry trigger`. While the run cleans, pgbouncer's admin
console is read every 0.25 s: the peak of client connections (what the worker
holds to the pooler) and of server connections (what the pooler holds to
PostgreSQL for them).

    .venv/bin/python bench/pooler_connections.py [--rows 200000] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

from cleanup._support import cli_env, expiry_cmd  # noqa: E402
from poolers import pgbouncer  # noqa: E402

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB = "expiry_bench_pooler"


def load(rows: int) -> None:
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{DB}", autocommit=True) as conn:
        conn.execute("drop table if exists sessions")
        conn.execute(
            "create table sessions (id bigint primary key, expires_at timestamptz not null)"
        )
        conn.execute(
            "insert into sessions select i, now() - interval '1 hour' - i * interval '1 ms'"
            " from generate_series(1, %s) i",
            (rows,),
        )
        conn.execute("create index on sessions (expires_at)")
        conn.execute("analyze sessions")


def measure(mode: str, rows: int, concurrency: int, scratch: Path) -> tuple[int, int, float]:
    load(rows)
    with pgbouncer(mode, pool_size=50) as bouncer:
        config = scratch / f"expiry-{mode}.toml"
        config.write_text(
            f'[database]\nurl = "{bouncer.url(DB)}"\npooler = "{mode}"\n'
            f"[worker]\nconcurrency = {concurrency}\n"
            '[[policy]]\nname = "sessions"\ntable = "sessions"\nkey = "id"\n'
            'timestamp = "expires_at"\nwindow = 500\n'
        )
        env = cli_env()
        subprocess.run(
            expiry_cmd("migrate", "--config", str(config)), env=env, check=True, capture_output=True
        )
        worker = subprocess.Popen(
            expiry_cmd("worker", "--config", str(config)),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        peaks = [0, 0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.25):
                mine = [r for r in bouncer.admin("show clients") if r[2] == DB]
                lent = [r for r in bouncer.admin("show servers") if r[2] == DB]
                peaks[0], peaks[1] = max(peaks[0], len(mine)), max(peaks[1], len(lent))

        sampler = threading.Thread(target=sample, daemon=True)
        try:
            time.sleep(2)
            sampler.start()
            started = time.monotonic()
            subprocess.run(
                expiry_cmd("trigger", "sessions", "--config", str(config), "--wait"),
                env=env,
                check=True,
                capture_output=True,
            )
            took = time.monotonic() - started
        finally:
            done.set()
            worker.terminate()
            worker.wait(30)
        return peaks[0], peaks[1], took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"drop database if exists {DB} with (force)")
        conn.execute(f"create database {DB}")
    try:
        with tempfile.TemporaryDirectory() as scratch:
            print(f"one expiry worker, concurrency {args.concurrency}, {args.rows:,} rows")
            for mode in ("session", "transaction"):
                clients, servers, took = measure(mode, args.rows, args.concurrency, Path(scratch))
                print(
                    f"{mode:>11}: {clients} client, {servers} server connections at peak;"
                    f" run {took:.1f}s"
                )
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f"drop database if exists {DB} with (force)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
