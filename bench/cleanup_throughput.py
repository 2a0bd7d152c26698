"""Cleanup throughput: expiry against a hand-written loop of the same PK-window DELETEs.

    .venv/bin/python bench/cleanup_throughput.py                  # 2,000,000 rows, window 10,000, 2 conns
    .venv/bin/python bench/cleanup_throughput.py --rows 500000 --window 5000 --connections 4
    .venv/bin/python bench/cleanup_throughput.py --repeat 3       # three raw/expiry pairs per engine
    .venv/bin/python bench/cleanup_throughput.py --quick          # smoke run (20,000 rows, window 1,000)
    .venv/bin/python bench/cleanup_throughput.py --rows 4000000 --repeat 3 --queue-only
                                                                  # and the queue alone, raw DELETEs as jobs
    .venv/bin/python bench/cleanup_throughput.py --engines mysql --repeat 3
                                                                  # MariaDB: raw loop, expiry, pt-archiver

The table is ``sessions (id bigint primary key, user_id bigint, expires_at
timestamptz indexed, payload text of 100 bytes)``, 80% of its rows expired and
scattered over the key space (exactly 800 of every 1,000 consecutive ids). On
each engine, in the same run, the table is built, cleaned by one method, built
again identically, and cleaned by the other:

* raw: the hand-written loop. ``select min(id), max(id)`` of the expired rows,
  then N connections (threads) take PK windows ``(lo, lo + window]`` from a
  shared counter and run ``DELETE FROM sessions WHERE id > lo AND id <= hi AND
  expires_at < cutoff``, each window its own transaction (autocommit);
* expiry: ``App(config=parse_config(...))`` with one delete policy of the same
  window, N worker processes (``Worker``, concurrency 1, the config's claim batch
  and lease) and ``cleanup.open_run``, timed from ``open_run`` to the run's state
  being ``finished``. The workers run as deployed, as `expiry worker` does: started
  before the clock, their first claim empty, they idle in LISTEN until the run's
  first hint. The end is read when the run's finished hint arrives (PostgreSQL;
  SQLite polls every 20 ms). Each window is expiry's own transaction:
  the same DELETE guarded by the ledger, the ledger row and the job's
  completion. ``nice_ratio = 0``: the rests that spare live traffic by default
  are a throttle, not overhead, and the raw loop has none.

With ``--queue-only`` a third method runs on PostgreSQL, to show where the
difference between the two lies:

* queue-only: the raw loop's windows as jobs of expiry's queue, one job each,
  run by the same N worker processes with a handler that executes the raw
  loop's DELETE in the job's transaction, pipelined, completing its job in the
  delete's round trip and then committing (two round trips; the window job
  needs one, a single statement in autocommit): the queue's claim,
  transaction and completion per window, without the cleanup core (no planner,
  ledger, guard or window lock). Timed from the enqueue until no job is left
  pending.

Both clocks start with every connection open: the raw loop's connections, and
the worker processes after they have opened their pool and LISTEN connection and
checked the policy. Odd rounds run the raw loop first, even rounds expiry
first, so that whatever the second place costs or gains is shared.
Before each measurement the table is VACUUM ANALYZEd and a CHECKPOINT flushes
the build's dirty pages. ``sessions`` has autovacuum off, so that a vacuum
starting during one method and not the other does not decide the result.

On MySQL/MariaDB (``--engines mysql``, the server at EXPIRY_BENCH_MYSQL_URL,
default root on 127.0.0.1:3306; ``DATETIME(6)`` timestamps, InnoDB) a third
method runs in the same rounds:

* pt-archiver: Percona Toolkit's purge on the same table, as its users run it,
  ``pt-archiver --purge --limit 10000 --commit-each --where 'expires_at <
  cutoff'`` (one process: it has no parallel mode). It walks the primary key
  in chunks of ``--limit`` rows and deletes them one statement per row,
  committing each chunk; ``--bulk-delete`` (one DELETE a chunk) is measured as
  pt-archiver-bulk.

Both methods must leave exactly the rows that were not expired (count and two
id checksums); a mismatch exits 1. SQLite (a file in a temporary directory,
epoch REAL timestamps) gets one connection for both methods, since it has one
writer, with WAL and synchronous=NORMAL as expiry's engine uses. The target
(expiry >= 0.9x the raw loop's rows/s) is printed, never asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import psycopg
import pymysql

from expiry.app import App
from expiry.config import parse_config
from expiry.queue.handlers import Handler
from expiry.queue.jobs import new_job
from expiry.status import Status
from scratch import scratch_database

ADMIN_URL = os.environ.get(
    "EXPIRY_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
MYSQL_URL = os.environ.get("EXPIRY_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/")
POLICY = "expired-sessions"
QUEUE_ONLY_HANDLER = "bench.delete_window"
QUEUE_ONLY_QUEUE = "bench"
QUEUE_ONLY_BOUNDS = (
    "select min(id) as lo, max(id) as hi from sessions where expires_at < %(cutoff)s"
)
QUEUE_ONLY_DONE = "select count(*) filter (where state = 'completed') as completed from expiry.jobs where queue = %s"
TARGET_RATIO = 0.9
# The watcher reads the run's state when a run-finished hint arrives (PostgreSQL's
# LISTEN expiry_runs) or every 20 ms: a round trip each. SQLite has no hints, so
# there it finds the end at most 20 ms late, and queue-only polls on both.
POLL_SECONDS = 0.02
IDLE_SECONDS = 0.3  # after start-up, before the clock: the workers' first claims come back empty

_CTX = mp.get_context("spawn")

# -- the table ----------------------------------------------------------------------
#
# Row i is expired iff (i * 2654435761) mod 1000 < 800: 2654435761 = 761 (mod 1000)
# and gcd(761, 1000) = 1, so every 1,000 consecutive ids hold exactly 800 expired
# rows, spread out. Expired rows end 1 s to 1 day before the cutoff, live rows
# 1 s to 1 day after it.

PG_CREATE = """
create table sessions (
    id         bigint primary key,
    user_id    bigint not null,
    expires_at timestamptz not null,
    payload    text not null
) with (autovacuum_enabled = false)
"""

PG_FILL = """
insert into sessions (id, user_id, expires_at, payload)
select i, (i * 7919) %% 100003,
       case when (i * 2654435761) %% 1000 < 800
            then %(cutoff)s - make_interval(secs => 1 + i %% 86400)
            else %(cutoff)s + make_interval(secs => 1 + i %% 86400) end,
       md5(i::text) || md5((i + 1)::text) || md5((i + 2)::text) || 'sess'
from generate_series(1, %(rows)s::bigint) as i
"""

SQLITE_CREATE = """
create table sessions (
    id         integer primary key,
    user_id    integer not null,
    expires_at real not null,
    payload    text not null
)
"""

SQLITE_FILL = """
with recursive s(i) as (select 1 union all select i + 1 from s where i < :rows)
insert into sessions (id, user_id, expires_at, payload)
select i, (i * 7919) % 100003,
       case when (i * 2654435761) % 1000 < 800
            then :cutoff - (1 + i % 86400)
            else :cutoff + (1 + i % 86400) end,
       printf('%0100d', i * 2654435761)
from s
"""

# MySQL: the same rows from MariaDB's sequence engine (seq_1_to_N).
MYSQL_CREATE = """
create table sessions (
    id         bigint primary key,
    user_id    bigint not null,
    expires_at datetime(6) not null,
    payload    text not null
) engine = InnoDB
"""

MYSQL_FILL = """
insert into sessions (id, user_id, expires_at, payload)
select seq, (seq * 7919) %% 100003,
       case when (seq * 2654435761) %% 1000 < 800
            then %(cutoff)s - interval (1 + seq %% 86400) second
            else %(cutoff)s + interval (1 + seq %% 86400) second end,
       concat(md5(seq), md5(seq + 1), md5(seq + 2), 'sess')
from seq_1_to_{rows}
"""
MYSQL_FINGERPRINT = (
    "select count(*), coalesce(sum(id), 0), coalesce(sum(cast(id as decimal(38)) * id), 0) "
    "from sessions where {}"
)

# --mysql-key varchar: Django's session table on MariaDB, a 40-character text
# key (md5 of the row's number, so in no particular order), the same expiry.
MYSQL_CREATE_VARCHAR = MYSQL_CREATE.replace(
    "id         bigint primary key", "id varchar(40) primary key"
)
MYSQL_FILL_VARCHAR = MYSQL_FILL.replace("select seq, ", "select concat('s', md5(seq)), ")
MYSQL_FINGERPRINT_VARCHAR = (
    "select count(*), coalesce(sum(crc32(id)), 0), coalesce(sum(crc32(reverse(id))), 0) "
    "from sessions where {}"
)

# The hand-written loop on a text key: no key ranges, the timestamp's index,
# DELETE ... LIMIT until a statement deletes nothing (one connection).
MYSQL_DELETE_LIMIT = "delete from sessions where expires_at < %(cutoff)s limit %(window)s"

INDEX = "create index sessions_expires_at on sessions (expires_at)"

# The hand-written loop's statements. Postgres binds %(name)s, SQLite :name.
PG_BOUNDS = "select min(id), max(id) from sessions where expires_at < %(cutoff)s"
PG_DELETE = "delete from sessions where id > %(lo)s and id <= %(hi)s and expires_at < %(cutoff)s"
SQLITE_BOUNDS = "select min(id), max(id) from sessions where expires_at < :cutoff"
SQLITE_DELETE = "delete from sessions where id > :lo and id <= :hi and expires_at < :cutoff"

# What survives: (rows, sum of ids, sum of squared ids). The ``where`` is either
# "true" or the not-expired predicate.
PG_FINGERPRINT = (
    "select count(*), coalesce(sum(id), 0), coalesce(sum(id::numeric * id), 0) "
    "from sessions where {}"
)
SQLITE_FINGERPRINT = (
    "select count(*), coalesce(sum(id), 0), coalesce(sum(id * id), 0) from sessions where {}"
)

Fingerprint = tuple[int, int, int]


# -- results ------------------------------------------------------------------------


@dataclass
class Measured:
    engine: str
    method: str  # "raw" or "expiry"
    round: int
    connections: int
    window: int
    rows: int
    windows: int  # transactions that deleted: raw DELETEs, expiry ledger rows, or queue-only jobs
    seconds: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


class Mismatch(RuntimeError):
    """A method left different survivors than expected."""


@dataclass(frozen=True)
class Built:
    """What a fresh table holds: rows to delete and the survivors' fingerprint."""

    expired: int
    survivors: Fingerprint


def check(engine: str, method: str, built: Built, deleted: int, after: Fingerprint) -> None:
    if deleted != built.expired or after != built.survivors:
        raise Mismatch(
            f"{engine} {method}: deleted {deleted:,} of {built.expired:,} expired rows; "
            f"survivors {after} but expected {built.survivors}"
        )


# -- PostgreSQL -------------------------------------------------------------------


def pg_fingerprint(
    conn: psycopg.Connection[Any], where: str, params: dict[str, Any] | None = None
) -> Fingerprint:
    row = conn.execute(PG_FINGERPRINT.format(where), params).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def pg_build(url: str, rows: int, cutoff: datetime) -> Built:
    """(Re)build ``sessions``, reset expiry's tables, VACUUM ANALYZE, CHECKPOINT."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("drop table if exists sessions")
        conn.execute(PG_CREATE)
        conn.execute(PG_FILL, {"cutoff": cutoff, "rows": rows})
        conn.execute(INDEX)
        conn.execute("truncate expiry.jobs, expiry.ledger, expiry.audit, expiry.runs")
        conn.execute("vacuum analyze sessions")
        conn.execute("vacuum analyze expiry.jobs, expiry.ledger, expiry.audit, expiry.runs")
        conn.execute("checkpoint")
        expired = conn.execute(
            "select count(*) from sessions where expires_at < %s", (cutoff,)
        ).fetchone()
        assert expired is not None
        return Built(
            int(expired[0]), pg_fingerprint(conn, "expires_at >= %(cutoff)s", {"cutoff": cutoff})
        )


def pg_survivors(url: str) -> Fingerprint:
    with psycopg.connect(url, autocommit=True) as conn:
        return pg_fingerprint(conn, "true")


def raw_postgres(
    url: str, cutoff: datetime, window: int, connections: int
) -> tuple[int, int, float]:
    """The hand-written loop on N connections: (rows deleted, windows, seconds)."""
    conns = [psycopg.connect(url, autocommit=True) for _ in range(connections)]
    try:
        lock = threading.Lock()
        started = time.perf_counter()
        lo, hi = conns[0].execute(PG_BOUNDS, {"cutoff": cutoff}).fetchone() or (None, None)
        lows = iter(range(lo - 1, hi, window) if lo is not None else ())

        def loop(conn: psycopg.Connection[Any]) -> tuple[int, int]:
            rows = windows = 0
            while True:
                with lock:
                    low = next(lows, None)
                if low is None:
                    return rows, windows
                params = {"lo": low, "hi": low + window, "cutoff": cutoff}
                rows += conn.execute(PG_DELETE, params, prepare=True).rowcount
                windows += 1

        with ThreadPoolExecutor(max_workers=connections) as pool:
            done = [f.result() for f in [pool.submit(loop, c) for c in conns]]
        seconds = time.perf_counter() - started
    finally:
        for conn in conns:
            conn.close()
    return sum(r for r, _ in done), sum(w for _, w in done), seconds


# -- MySQL / MariaDB ----------------------------------------------------------------


def mysql_connect(url: str) -> Any:
    from expiry.engines.mysql.sessions import parse_url

    return pymysql.connect(
        **parse_url(url), autocommit=True, init_command="set session time_zone = '+00:00'"
    )


def mysql_fingerprint(
    conn: Any, where: str, params: Any = None, key: str = "bigint"
) -> Fingerprint:
    text = MYSQL_FINGERPRINT_VARCHAR if key == "varchar" else MYSQL_FINGERPRINT
    with conn.cursor() as cur:
        cur.execute(text.format(where), params)
        row = cur.fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def mysql_build(url: str, rows: int, cutoff: datetime, key: str = "bigint") -> Built:
    """(Re)build ``sessions``, empty expiry's tables, ANALYZE."""
    naive = cutoff.replace(tzinfo=None)
    create, fill = (
        (MYSQL_CREATE_VARCHAR, MYSQL_FILL_VARCHAR)
        if key == "varchar"
        else (MYSQL_CREATE, MYSQL_FILL)
    )
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("drop table if exists sessions")
            cur.execute(create)
            cur.execute(fill.format(rows=int(rows)), {"cutoff": naive})
            cur.execute(INDEX)
            for table in ("expiry_jobs", "expiry_ledger", "expiry_runs"):
                cur.execute(f"truncate table {table}")
            cur.execute("analyze table sessions")
            cur.fetchall()
            cur.execute("select count(*) from sessions where expires_at < %s", (naive,))
            expired = int(cur.fetchone()[0])
        return Built(
            expired, mysql_fingerprint(conn, "expires_at >= %(cutoff)s", {"cutoff": naive}, key)
        )
    finally:
        conn.close()


def mysql_survivors(url: str, key: str = "bigint") -> Fingerprint:
    conn = mysql_connect(url)
    try:
        return mysql_fingerprint(conn, "1", key=key)
    finally:
        conn.close()


def raw_mysql_limit(url: str, cutoff: datetime, window: int) -> tuple[int, int, float]:
    """The hand-written loop on a text key, one connection: DELETE ... LIMIT
    until nothing is deleted (rows deleted, statements, seconds)."""
    naive = cutoff.replace(tzinfo=None)
    conn = mysql_connect(url)
    try:
        started = time.perf_counter()
        rows = windows = 0
        with conn.cursor() as cur:
            while True:
                got = cur.execute(MYSQL_DELETE_LIMIT, {"cutoff": naive, "window": window})
                windows += 1
                rows += got
                if got < window:
                    break
        seconds = time.perf_counter() - started
    finally:
        conn.close()
    return rows, windows, seconds


def raw_mysql(url: str, cutoff: datetime, window: int, connections: int) -> tuple[int, int, float]:
    """The hand-written loop on N connections: (rows deleted, windows, seconds)."""
    naive = cutoff.replace(tzinfo=None)
    conns = [mysql_connect(url) for _ in range(connections)]
    try:
        lock = threading.Lock()
        started = time.perf_counter()
        with conns[0].cursor() as cur:
            cur.execute(PG_BOUNDS, {"cutoff": naive})
            lo, hi = cur.fetchone()
        lows = iter(range(lo - 1, hi, window) if lo is not None else ())

        def loop(conn: Any) -> tuple[int, int]:
            rows = windows = 0
            with conn.cursor() as cur:
                while True:
                    with lock:
                        low = next(lows, None)
                    if low is None:
                        return rows, windows
                    rows += cur.execute(PG_DELETE, {"lo": low, "hi": low + window, "cutoff": naive})
                    windows += 1

        with ThreadPoolExecutor(max_workers=connections) as pool:
            done = [f.result() for f in [pool.submit(loop, c) for c in conns]]
        seconds = time.perf_counter() - started
    finally:
        for conn in conns:
            conn.close()
    return sum(r for r, _ in done), sum(w for _, w in done), seconds


def pt_archiver(url: str, cutoff: datetime, *, bulk: bool) -> tuple[int, int, float]:
    """``pt-archiver --purge --limit 10000 --commit-each`` on the same table:
    (rows deleted, chunks, seconds). Its statistics say how many rows it took."""
    from expiry.engines.mysql.sessions import parse_url

    p = parse_url(url)
    dsn = f"h={p['host']},P={p['port']},u={p['user']},D={p['database']},t=sessions"
    if p["password"]:
        dsn += f",p={p['password']}"
    naive = cutoff.replace(tzinfo=None).isoformat(sep=" ")
    command = [
        "pt-archiver",
        "--source",
        dsn,
        "--purge",
        "--where",
        f"expires_at < '{naive}'",
        "--limit",
        "10000",
        "--commit-each",
        "--no-check-charset",
        "--statistics",
        *(["--bulk-delete"] if bulk else []),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"pt-archiver failed: {done.stderr.strip()[:500]}")
    stats = dict(
        line.split(None, 1) for line in done.stdout.splitlines() if len(line.split(None, 1)) == 2
    )
    deleted = int(stats.get("DELETE", "0").split()[0])
    return deleted, deleted // 10_000 + 1, seconds


def mysql_run_state(url: str) -> Any:
    conn = mysql_connect(url)

    def state(run_id: str) -> str | None:
        with conn.cursor() as cur:
            cur.execute("select state from expiry_runs where id = %s", (run_id,))
            row = cur.fetchone()
        return None if row is None else str(row[0])

    state.conn = conn  # type: ignore[attr-defined]
    return state


def bench_mysql(args: argparse.Namespace) -> list[Measured]:
    out: list[Measured] = []
    n, window, rows = args.connections, args.window, args.mysql_rows
    name = f"expiry_bench_cleanup_{os.getpid()}"
    admin = mysql_connect(MYSQL_URL.rstrip("/") + "/mysql")
    with admin.cursor() as cur:
        cur.execute(f"drop database if exists `{name}`")
        cur.execute(f"create database `{name}`")
    url = MYSQL_URL.rstrip("/") + "/" + name
    try:
        app = App(url)
        app.migrate()
        cutoff = app.engine.now().replace(microsecond=0)
        app.close()
        methods: tuple[str, ...] = ("raw", "expiry")
        methods += () if args.no_pt_archiver else ("pt-archiver",)
        methods += ("pt-archiver-bulk",) if args.bulk else ()
        for round_ in range(1, args.repeat + 1):
            for method in round_order(methods, round_):
                progress(f"mysql: building {rows:,} rows for {method} (round {round_})")
                built = mysql_build(url, rows, cutoff, args.mysql_key)
                note = ""
                if method == "raw" and args.mysql_key == "varchar":
                    deleted, windows, seconds = raw_mysql_limit(url, cutoff, window)
                    note = "DELETE ... LIMIT, one connection"
                elif method == "raw":
                    deleted, windows, seconds = raw_mysql(url, cutoff, window, n)
                elif method.startswith("pt-archiver"):
                    deleted, windows, seconds = pt_archiver(
                        url, cutoff, bulk=method.endswith("bulk")
                    )
                    note = "one process (pt-archiver has no parallel mode)"
                else:
                    poll = mysql_run_state(url)
                    try:
                        deleted, windows, seconds, note = expiry_round(
                            url, cutoff, window, n, args.claim_batch, poll
                        )
                    finally:
                        poll.conn.close()
                check("mysql", method, built, deleted, mysql_survivors(url, args.mysql_key))
                out.append(
                    Measured("mysql", method, round_, n, window, deleted, windows, seconds, note)
                )
                progress(f"mysql    {method:<16} {out[-1].rate:>12,.0f} rows/s  {seconds:.3f} s")
    finally:
        with admin.cursor() as cur:
            cur.execute(f"drop database if exists `{name}`")
        admin.close()
    return out


def pg_run_state(conn: psycopg.Connection[Any], run_id: str) -> str | None:
    row = conn.execute("select state from expiry.runs where id = %s", (run_id,)).fetchone()
    return None if row is None else str(row[0])


# -- SQLite ---------------------------------------------------------------------------


def sqlite_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    conn.execute("pragma journal_mode = wal")
    conn.execute("pragma synchronous = normal")
    return conn


def sqlite_fingerprint(conn: sqlite3.Connection, where: str) -> Fingerprint:
    row = conn.execute(SQLITE_FINGERPRINT.format(where)).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def sqlite_build(path: Path, rows: int, cutoff: datetime) -> Built:
    """A new file: ``sessions``, expiry's tables, ANALYZE, a truncating checkpoint."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    epoch = cutoff.timestamp()
    conn = sqlite_connect(path)
    try:
        conn.execute("begin")
        conn.execute(SQLITE_CREATE)
        conn.execute(SQLITE_FILL, {"rows": rows, "cutoff": epoch})
        conn.execute(INDEX)
        conn.execute("commit")
        app = App(f"sqlite:///{path}")
        app.migrate()
        app.close()
        conn.execute("analyze")
        conn.execute("pragma wal_checkpoint(truncate)")
        (expired,) = conn.execute(
            "select count(*) from sessions where expires_at < ?", (epoch,)
        ).fetchone()
        return Built(int(expired), sqlite_fingerprint(conn, f"expires_at >= {epoch!r}"))
    finally:
        conn.close()


def sqlite_survivors(path: Path) -> Fingerprint:
    conn = sqlite_connect(path)
    try:
        return sqlite_fingerprint(conn, "1")
    finally:
        conn.close()


def raw_sqlite(path: Path, cutoff: datetime, window: int) -> tuple[int, int, float]:
    """The hand-written loop on one connection: (rows deleted, windows, seconds)."""
    conn = sqlite_connect(path)
    epoch = cutoff.timestamp()
    try:
        started = time.perf_counter()
        lo, hi = conn.execute(SQLITE_BOUNDS, {"cutoff": epoch}).fetchone()
        rows = windows = 0
        for low in range(lo - 1, hi, window) if lo is not None else ():
            params = {"lo": low, "hi": low + window, "cutoff": epoch}
            rows += conn.execute(SQLITE_DELETE, params).rowcount
            windows += 1
        seconds = time.perf_counter() - started
    finally:
        conn.close()
    return rows, windows, seconds


def sqlite_run_state(conn: sqlite3.Connection, run_id: str) -> str | None:
    row = conn.execute("select state from expiry_runs where id = ?", (run_id,)).fetchone()
    return None if row is None else str(row[0])


# -- expiry ---------------------------------------------------------------------------


def expiry_config(url: str, window: int, claim_batch: int | None) -> dict[str, Any]:
    return {
        "database": {"url": url},
        "worker": {} if claim_batch is None else {"claim_batch": claim_batch},
        "policy": [
            {
                "name": POLICY,
                "table": "sessions",
                "key": "id",
                "timestamp": "expires_at",
                "retain": "0s",
                "window": window,
                "nice_ratio": 0,  # no rests: the raw loop does not rest either
            }
        ],
    }


def _expiry_worker(config: dict[str, Any], ready: Barrier, done: Event, results: Any) -> None:
    """One worker process, as deployed: connect and check the policy, then run,
    idle in LISTEN until the run's first hint; stop once the parent saw the run
    end, and report how many jobs it ran."""
    app = App(config=parse_config(config, "bench"), pool_size=2)
    assert app.cleanup is not None and app.config is not None
    settings = app.config.worker

    # Pipelined, completed in the delete's round trip, then committed: two round trips.
    def delete_window(job: Any, tx: Any) -> int:
        params = {**job.payload, "cutoff": datetime.fromisoformat(job.payload["cutoff"])}
        deleted = tx.execute(PG_DELETE, params)
        app.queue.complete(job, tx)  # its read brings the delete's count back too
        return int(deleted.rowcount)

    # The private modes of the built-in window job (queue/handlers.py), for comparison.
    app.register(Handler(QUEUE_ONLY_HANDLER, delete_window, completes_job=True, pipelined=True))

    app.cleanup.check()
    app.queue.pending()  # the pool is open before the clock starts,
    app.engine.listen()  # and so is the LISTEN connection (PostgreSQL)
    worker = app.worker(
        queues=(QUEUE_ONLY_QUEUE, "default"),
        concurrency=1,
        batch=settings.claim_batch,
        lease=settings.lease,
        prune_after=settings.prune_after,
    )

    def stop_when_done() -> None:
        done.wait(timeout=600)
        worker.stop()

    threading.Thread(target=stop_when_done, daemon=True).start()
    ready.wait(timeout=120)
    worker.run()
    results.put(worker.processed)
    app.close()


def expiry_round(
    url: str,
    cutoff: datetime,
    window: int,
    workers: int,
    claim_batch: int | None,
    poll: Any,
    queue_only: bool = False,
) -> tuple[int, int, float, str]:
    """N idle worker processes, open_run, until the run is finished:
    (rows deleted, windows applied, seconds, note). ``queue_only``: enqueue the
    raw loop's windows as jobs instead, until none is pending (``poll`` is then
    unused)."""
    config = expiry_config(url, window, claim_batch)
    app = App(config=parse_config(config, "bench"), pool_size=2)
    assert app.cleanup is not None
    ready = _CTX.Barrier(workers + 1)
    done = _CTX.Event()
    results = _CTX.Queue()
    children: list[BaseProcess] = [
        _CTX.Process(target=_expiry_worker, args=(config, ready, done, results))
        for _ in range(workers)
    ]
    try:
        app.cleanup.check()
        app.queue.pending()
        app.engine.wait_for_runs(0)  # LISTEN expiry_runs from here (PostgreSQL)
        for child in children:
            child.start()
        ready.wait(timeout=120)
        time.sleep(IDLE_SECONDS)  # every worker's first claim found nothing: it idles
        started = time.perf_counter()
        if queue_only:
            return queue_only_jobs(app, cutoff, window, started, done, children, results)
        opened = app.cleanup.open_run(POLICY, cutoff, opened_by="bench", actor="bench")
        while (state := poll(opened.run_id)) != "finished":
            if not any(child.is_alive() for child in children):
                raise RuntimeError(f"every worker exited but the run is {state!r}")
            app.engine.wait_for_runs(POLL_SECONDS)
        seconds = time.perf_counter() - started
        done.set()
        jobs = [results.get(timeout=120) for _ in children]
        for child in children:
            child.join(timeout=60)
        failed = [child.exitcode for child in children if child.exitcode != 0]
        if failed:
            raise RuntimeError(f"worker processes exited with {failed}")
        summary = Status.of(app).run_summary(opened.run_id)
        assert summary is not None
        if summary["jobs_dead"] or summary["retries"]:
            raise RuntimeError(f"the run had failures: {summary}")
        note = (
            f"{summary['jobs_total']} window jobs, {summary['windows_applied']} ledger rows, "
            f"jobs per worker {jobs}"
        )
        return int(summary["rows_affected"]), int(summary["windows_applied"]), seconds, note
    finally:
        app.close()
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join()


def queue_only_jobs(
    app: App,
    cutoff: datetime,
    window: int,
    started: float,
    done: Event,
    children: list[BaseProcess],
    results: Any,
) -> tuple[int, int, float, str]:
    """The queue-only method, from the clock's start until no job is pending:
    (rows deleted: 0, counted by the caller from the survivors; jobs; seconds; note)."""
    with app.engine.transaction() as tx:
        lo, hi = tx.execute(QUEUE_ONLY_BOUNDS, {"cutoff": cutoff}).fetchone().values()
        jobs = [
            new_job(
                QUEUE_ONLY_HANDLER,
                {"lo": low, "hi": low + window, "cutoff": cutoff.isoformat()},
                queue=QUEUE_ONLY_QUEUE,
                key=f"bench:{low}",
            )
            for low in (range(lo - 1, hi, window) if lo is not None else ())
        ]
        app.queue.enqueue_many(jobs, tx)
    while pending := app.queue.pending(QUEUE_ONLY_QUEUE):
        if not any(child.is_alive() for child in children):
            raise RuntimeError(f"every worker exited with {pending} jobs pending")
        time.sleep(POLL_SECONDS)
    seconds = time.perf_counter() - started
    done.set()
    jobs_run = [results.get(timeout=120) for _ in children]
    with app.engine.transaction() as tx:
        done = tx.execute(QUEUE_ONLY_DONE, (QUEUE_ONLY_QUEUE,)).fetchone()
    if done["completed"] != len(jobs):
        raise RuntimeError(f"queue-only: {done['completed']} of {len(jobs)} jobs completed")
    return 0, len(jobs), seconds, f"{len(jobs)} jobs, jobs per worker {jobs_run}"


# -- one engine, both methods ---------------------------------------------------------


def round_order(methods: tuple[str, ...], round_: int) -> tuple[str, ...]:
    """Raw first in odd rounds, expiry first in even ones: whatever going first or
    second is worth on this host (the server's caches, drift) each gets in half
    of an even number of rounds."""
    return methods if round_ % 2 else (methods[1], methods[0], *methods[2:])


def bench_postgres(args: argparse.Namespace) -> list[Measured]:
    out: list[Measured] = []
    n, window, rows = args.connections, args.window, args.rows
    with scratch_database(args.admin_url, f"expiry_bench_cleanup_{os.getpid()}") as url:
        app = App(url)
        app.migrate()
        with app.engine.transaction() as conn:
            row = conn.execute("select date_trunc('second', now()) as now").fetchone()
            assert row is not None
            cutoff: datetime = row["now"]
        app.close()
        methods = ("raw", "expiry") + (("queue-only",) if args.queue_only else ())
        for round_ in range(1, args.repeat + 1):
            for method in round_order(methods, round_):
                progress(f"postgres: building {rows:,} rows for {method} (round {round_})")
                built = pg_build(url, rows, cutoff)
                if method == "raw":
                    deleted, windows, seconds = raw_postgres(url, cutoff, window, n)
                    note = ""
                elif method == "queue-only":
                    _, windows, seconds, note = expiry_round(
                        url, cutoff, window, n, args.claim_batch, None, queue_only=True
                    )
                    deleted = rows - pg_survivors(url)[0]
                else:
                    with psycopg.connect(url, autocommit=True) as watcher:
                        deleted, windows, seconds, note = expiry_round(
                            url, cutoff, window, n, args.claim_batch, partial(pg_run_state, watcher)
                        )
                check("postgres", method, built, deleted, pg_survivors(url))
                out.append(
                    Measured("postgres", method, round_, n, window, deleted, windows, seconds, note)
                )
                progress(f"postgres {method:<10} {out[-1].rate:>12,.0f} rows/s  {seconds:.3f} s")
    return out


def bench_sqlite(args: argparse.Namespace) -> list[Measured]:
    out: list[Measured] = []
    window, rows = args.window, args.sqlite_rows
    cutoff = datetime.now(UTC).replace(microsecond=0)
    with tempfile.TemporaryDirectory(prefix="expiry_bench_cleanup_") as tmp:
        path = Path(tmp) / "sessions.db"
        url = f"sqlite:///{path}"
        for round_ in range(1, args.repeat + 1):
            for method in round_order(("raw", "expiry"), round_):
                progress(f"sqlite: building {rows:,} rows for {method} (round {round_})")
                built = sqlite_build(path, rows, cutoff)
                if method == "raw":
                    deleted, windows, seconds = raw_sqlite(path, cutoff, window)
                    note = ""
                else:
                    watcher = sqlite3.connect(path, isolation_level=None, timeout=30.0)
                    try:
                        deleted, windows, seconds, note = expiry_round(
                            url,
                            cutoff,
                            window,
                            1,
                            args.claim_batch,
                            partial(sqlite_run_state, watcher),
                        )
                    finally:
                        watcher.close()
                check("sqlite", method, built, deleted, sqlite_survivors(path))
                out.append(
                    Measured("sqlite", method, round_, 1, window, deleted, windows, seconds, note)
                )
                progress(f"sqlite   {method:<10} {out[-1].rate:>12,.0f} rows/s  {seconds:.3f} s")
    return out


# -- the report -----------------------------------------------------------------------


def progress(message: str) -> None:
    print(f"  {message}", flush=True)


def ratios(results: list[Measured], engine: str, method: str = "expiry") -> list[float]:
    rounds: dict[int, dict[str, Measured]] = {}
    for r in results:
        if r.engine == engine:
            rounds.setdefault(r.round, {})[r.method] = r
    return [m[method].rate / m["raw"].rate for m in rounds.values() if {method, "raw"} <= set(m)]


def print_table(results: list[Measured]) -> None:
    header = (
        f"{'engine':<9} {'method':<10} {'round':>5} {'conns':>5} {'window':>7} {'windows':>7} "
        f"{'rows deleted':>13} {'seconds':>8} {'rows/s':>11} {'expiry/raw':>10}"
    )
    print(header)
    print("-" * len(header))
    raw = {(r.engine, r.round): r for r in results if r.method == "raw"}
    for r in results:
        base = raw.get((r.engine, r.round))
        ratio = f"{r.rate / base.rate:.2f}x" if r.method != "raw" and base else ""
        print(
            f"{r.engine:<9} {r.method:<10} {r.round:>5} {r.connections:>5} {r.window:>7,} "
            f"{r.windows:>7,} {r.rows:>13,} {r.seconds:>8.3f} {r.rate:>11,.0f} {ratio:>10}"
        )
    notes = [r for r in results if r.note]
    if notes:
        print()
        for r in notes:
            print(f"{r.engine} {r.method} round {r.round}: {r.note}")


def print_targets(results: list[Measured]) -> None:
    print()
    print(f"target (reported, not asserted): expiry >= {TARGET_RATIO}x the raw loop's rows/s")
    for engine in ("postgres", "sqlite", "mysql"):
        found = ratios(results, engine)
        if found:
            median = statistics.median(found)
            verdict = "ok" if median >= TARGET_RATIO else "MISS"
            each = ", ".join(f"{x:.2f}x" for x in found)
            print(f"  {engine:<9} {median:.2f}x (median of {each})  {verdict}")
    for method in ("pt-archiver", "pt-archiver-bulk"):
        found = ratios(results, "mysql", method)
        if found:
            each = ", ".join(f"{x:.2f}x" for x in found)
            vs = [e / p for e, p in zip(ratios(results, "mysql"), found, strict=False)]
            print(
                f"  mysql {method} against the raw loop: {statistics.median(found):.2f}x"
                f" (median of {each}); expiry against {method}:"
                f" {statistics.median(vs):.2f}x"
            )
    found = ratios(results, "postgres", "queue-only")
    if found:
        each = ", ".join(f"{x:.2f}x" for x in found)
        print(
            f"  queue-only (the queue alone, raw DELETEs as jobs): "
            f"{statistics.median(found):.2f}x (median of {each})"
        )


# -- main -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=None, help="rows in sessions (2000000)")
    parser.add_argument(
        "--sqlite-rows", type=int, default=None, help="rows on SQLite (default: --rows)"
    )
    parser.add_argument(
        "--mysql-rows", type=int, default=None, help="rows on MySQL (default: --rows)"
    )
    parser.add_argument("--bulk", action="store_true", help="MySQL: also pt-archiver --bulk-delete")
    parser.add_argument(
        "--mysql-key",
        choices=["bigint", "varchar"],
        default="bigint",
        help="MySQL: the key's type; varchar (Django's sessions) has expiry's time windows"
        " against a DELETE ... LIMIT loop on one connection (bigint)",
    )
    parser.add_argument(
        "--no-pt-archiver", action="store_true", help="MySQL: the raw loop and expiry only"
    )
    parser.add_argument("--window", type=int, default=None, help="keys per window (10000)")
    parser.add_argument(
        "--connections", type=int, default=2, help="PostgreSQL connections / worker processes (2)"
    )
    parser.add_argument(
        "--queue-only",
        action="store_true",
        help="also run the raw DELETEs as jobs of expiry's queue (PostgreSQL)",
    )
    parser.add_argument(
        "--claim-batch",
        type=int,
        default=None,
        help="expiry worker claim batch (default: the config default)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="raw/expiry pairs per engine (1)")
    parser.add_argument(
        "--engines",
        type=lambda s: [e.strip() for e in s.split(",") if e.strip()],
        default=["postgres", "sqlite"],
        help="comma separated: postgres,sqlite,mysql",
    )
    parser.add_argument("--admin-url", default=ADMIN_URL, help="server to create the scratch db on")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 rows, window 1,000")
    args = parser.parse_args(argv)
    if args.rows is None:
        args.rows = 20_000 if args.quick else 2_000_000
    if args.window is None:
        args.window = 1_000 if args.quick else 10_000
    if args.sqlite_rows is None:
        args.sqlite_rows = args.rows
    if args.mysql_rows is None:
        args.mysql_rows = args.rows
    if args.claim_batch is not None and args.claim_batch <= 0:
        parser.error("--claim-batch must be positive")
    if min(args.rows, args.sqlite_rows, args.window, args.connections, args.repeat) <= 0:
        parser.error("--rows, --sqlite-rows, --window, --connections and --repeat must be positive")
    unknown = set(args.engines) - {"postgres", "sqlite", "mysql"}
    if unknown or not args.engines:
        parser.error(f"--engines takes postgres, sqlite and/or mysql, not {sorted(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # parse_config lets EXPIRY_DATABASE_URL override the url: not here.
    os.environ.pop("EXPIRY_DATABASE_URL", None)
    print(
        f"cleanup throughput: {args.rows:,} rows (sqlite {args.sqlite_rows:,}), 80% expired, "
        f"window {args.window:,}, postgres {args.connections} connections, sqlite 1, "
        f"{args.repeat} round(s), {os.cpu_count()} cpus",
        flush=True,
    )
    results: list[Measured] = []
    try:
        if "postgres" in args.engines:
            results += bench_postgres(args)
        if "sqlite" in args.engines:
            results += bench_sqlite(args)
        if "mysql" in args.engines:
            results += bench_mysql(args)
    except Mismatch as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    print()
    print_table(results)
    print_targets(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
