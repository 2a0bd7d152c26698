"""Whole partitions past retention: expiry against pg_partman's own retention
(``partman.run_maintenance``) on the same daily-partitioned table.

    apt-get install postgresql-15-partman                 # once: Debian's pg_partman 4.7
    .venv/bin/python bench/partman.py                     # 65 days of 20,000 rows, 3 rounds
    .venv/bin/python bench/partman.py --rows-per-day 75000 --rounds 3   # 4.9 M rows

pg_partman is a benchmark's baseline only: the suite never needs it, and this
script says how to install it when the server lacks it.

Each method gets a fresh scratch database on the shared PostgreSQL with the
same table: ``events (id, created_at, payload)`` partitioned by range of
``created_at``, made by ``partman.create_parent(..., 'daily')`` from 65 days
ago (66 daily partitions and two premade, so no row lands in the default one), ``--rows-per-day`` rows a day spread
evenly over the last 65 days, then VACUUM ANALYZE. Retention is 30 days:

* pg_partman: ``retention = '30 days'``, ``retention_keep_table = false`` in
  ``partman.part_config``, then one ``partman.run_maintenance('public.events')``
  timed from the client: it drops each partition whose whole range is older
  than 30 days and leaves the rows of the one that straddles the boundary.
* expiry: a delete policy ``retain = "30d"``, ``partitions = "auto"`` (the
  partitions wholly before the cutoff dropped, the straddling one cleaned by
  row windows), ``window = 10000``, ``nice_ratio = 0``, a run opened and
  worked by an in-process worker of 2 threads until idle; the time is the
  run's own span in ``expiry.runs`` (opened_at to finished_at).

Printed per round and method: seconds, partitions dropped, rows gone, and
the expired rows left (older than 30 days when counted, a moment after the
method's own cutoff: a row or two expire meanwhile) with the age of the
oldest of them; then the median ratio expiry / pg_partman.
Rounds alternate which method goes first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import psycopg

from expiry.app import App
from expiry.config import parse_config
from scratch import scratch_database

ADMIN = os.environ.get("EXPIRY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
DAYS = 65


def build(url: str, rows_per_day: int) -> int:
    """The partitioned table, made by pg_partman; its partition count."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create schema partman")
        try:
            conn.execute("create extension pg_partman schema partman")
        except psycopg.errors.FeatureNotSupported as exc:
            raise SystemExit(
                f"pg_partman is not installed on this server ({exc}): "
                "apt-get install postgresql-15-partman"
            ) from None
        conn.execute(
            "create table events (id bigint generated always as identity,"
            " created_at timestamptz not null, payload text not null,"
            " primary key (id, created_at)) partition by range (created_at)"
        )
        conn.execute(
            "select partman.create_parent('public.events', 'created_at', 'native', 'daily',"
            " p_premake := 2, p_start_partition := (now() - interval '65 days')::date::text,"
            " p_jobmon := false)"
        )
        conn.execute("create index on events (created_at)")
        conn.execute(
            "insert into events (created_at, payload)"
            " select now() - make_interval(secs => (g::float8 / %s) * 86400 * %s), 'x'"
            " from generate_series(0, %s - 1) g",
            (rows_per_day * DAYS, DAYS, rows_per_day * DAYS),
        )
        conn.execute("vacuum analyze events")
    return counts(url)[0]


def left(url: str) -> tuple[int, float]:
    """Rows older than 30 days still there, and the oldest one's age past it (s)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select count(*), coalesce(extract(epoch from (now() - interval '30 days')"
            " - min(created_at)), 0) from events where created_at < now() - interval '30 days'"
        ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


def counts(url: str) -> tuple[int, int]:
    """The table's partitions and rows."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select (select count(*) from pg_inherits where inhparent = 'events'::regclass),"
            " (select count(*) from events)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def partman(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "update partman.part_config set retention = '30 days',"
            " retention_keep_table = false where parent_table = 'public.events'"
        )
        began = time.perf_counter()
        conn.execute("select partman.run_maintenance('public.events', p_jobmon := false)")
        seconds = time.perf_counter() - began
    return {"seconds": seconds}


def expiry(url: str) -> dict[str, Any]:
    policy = {
        "name": "events",
        "table": "events",
        "key": "id",
        "timestamp": "created_at",
        "retain": "30d",
        "window": 10_000,
        "nice_ratio": 0,
    }
    app = App(config=parse_config({"database": {"url": url}, "policy": [policy]}))
    try:
        app.migrate()
        assert app.cleanup is not None
        opened = app.cleanup.open_run("events")
        app.worker(concurrency=2, until_idle=True, poll=0.02).run()
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "select extract(epoch from finished_at - opened_at) from expiry.runs where id = %s",
                (opened.run_id,),
            ).fetchone()
        assert row is not None and row[0] is not None, "the run did not finish"
        return {"seconds": float(row[0])}
    finally:
        app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-day", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    methods = {"pg_partman": partman, "expiry": expiry}
    times: dict[str, list[float]] = {name: [] for name in methods}
    print(f"{DAYS} days of {args.rows_per_day:,} rows, retention 30 days")
    for n in range(1, args.rounds + 1):
        order = list(methods) if n % 2 else list(reversed(methods))
        for name in order:
            with scratch_database(ADMIN, "expiry_bench_partman") as url:
                build(url, args.rows_per_day)
                parts, total = counts(url)
                got = methods[name](url)
                rows, oldest = left(url)
                parts_after, total_after = counts(url)
            times[name].append(got["seconds"])
            print(
                f"round {n} {name:<10} {got['seconds']:7.3f} s  {parts - parts_after} partitions"
                f" dropped, {total - total_after:,} rows gone; {rows:,} expired rows left"
                + (f", the oldest {oldest / 3600:.1f} h past the cutoff" if rows else "")
            )
    ratio = statistics.median(times["expiry"]) / statistics.median(times["pg_partman"])
    print(
        f"median: expiry {statistics.median(times['expiry']):.3f} s, pg_partman "
        f"{statistics.median(times['pg_partman']):.3f} s: expiry takes {ratio:.2f}x "
        "pg_partman's time (target <= 1.5x)"
    )


if __name__ == "__main__":
    main()
