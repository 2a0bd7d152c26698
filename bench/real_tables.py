"""Real tables: expiry on tables applications have, beside the hand-written cleanups it replaces.

    .venv/bin/python bench/real_tables.py                        # every scenario, one round
    .venv/bin/python bench/real_tables.py --scenario django --repeat 3
    .venv/bin/python bench/real_tables.py --scenario random-ids,partitions
    .venv/bin/python bench/real_tables.py --quick                # smoke run (~100x smaller)
    .venv/bin/python bench/real_tables.py --scenario django --method single,expiry
    .venv/bin/python bench/real_tables.py --policy target_transaction=1h  # override a policy field

PostgreSQL only: a scratch database is created on the server of
``EXPIRY_BENCH_ADMIN_URL`` (default postgresql://postgres@127.0.0.1:5432/postgres)
and dropped at the end. Each scenario builds its table, cleans it by one
method, builds it again identically (the data is a function of the row
number, never of random()), cleans it by the next method, and so on; odd rounds
run the methods in the order listed below, even rounds in the reverse order,
so that whatever going first or last is worth is shared. Before each
measurement the table is VACUUM ANALYZEd with expiry's tables (emptied) and a
CHECKPOINT flushes the build's dirty pages; the bench table has autovacuum off
(each partition, for the partitioned one).

Scenarios (``--scenario``, all by default):

* ``django``: Django's ``django_session``, its exact DDL (varchar(40) primary
  key, text, timestamptz with its index), 2,000,000 rows of which 50% expired,
  interleaved at random in the heap; keys of 32 random lowercase letters and
  digits, ``session_data`` of ~100 bytes. Methods: ``single``, one ``DELETE FROM
  django_session WHERE expire_date < now()`` (Django's clearsessions);
  ``batched-in``, the loop blog posts recommend, ``DELETE ... WHERE session_key
  IN (SELECT session_key ... WHERE expire_date < now() LIMIT 10000)`` until it
  deletes nothing, each its own transaction; ``expiry``, a policy on
  ``session_key`` / ``expire_date``, window 10,000. Targets: expiry >= 0.8x
  single's rows/s and >= 10x batched-in's.
* ``random-ids``: ``tokens (id bigint primary key, expires_at timestamptz
  indexed, payload ~50 bytes)``, 10,000,000 rows with ids spread at random over
  62 bits (a bijective mix of the row number: no duplicates), 1% expired.
  Methods: ``single`` and ``expiry`` (key id, window 10,000). Also printed: the
  run's jobs against the bound ceil(expired / window) + its planning pages.
  Target: expiry >= 0.5x single.
* ``partitions``: ``events (id, created_at, payload) PARTITION BY RANGE
  (created_at)``, primary key (id, created_at), an index on created_at, 12
  monthly partitions (the ten months before this one, this one and the next),
  200,000 rows spread evenly over them in id order. The policy's retain puts the
  cutoff inside this month's partition (1 day, or half of the month so far on
  its first two days): 10 partitions end before it, 1 straddles it, 1 is after
  it. Methods: ``by-hand``, ``ALTER TABLE events DETACH PARTITION p; DROP TABLE
  p`` for each of the 10, then one DELETE of the straddling partition's expired
  rows; ``expiry``, the policy with expiry's default handling of partitions
  (``partitions = "auto"``: those wholly before the cutoff are dropped);
  ``expiry-rows``, the same policy with ``partitions = "rows"`` (row windows
  only). Target: expiry's time <= 2x by-hand's.
* ``keep-last``: ``user_events (id bigint primary key, user_id int, created_at
  timestamptz, payload ~40 bytes)`` with indexes on created_at and (user_id,
  created_at, id), 1,000,000 rows of 10,000 users (100 rows each, user_id = id
  mod users, rows interleaved in the heap); a fifth of the users wrote nothing in the
  last 30 days (their rows are 31 to 90 days old), the others' rows are 0 to
  29 or 31 to 60 days old. A row goes when it is older than 30 days and not one of its
  user's 20 newest (created_at, then id). Methods: ``per-group``, the loop
  forum answers give, for each user with an old row ``DELETE ... WHERE user_id
  = $1 AND created_at < now() - 30 days AND id NOT IN (SELECT id ... WHERE
  user_id = $1 ORDER BY created_at DESC, id DESC LIMIT 20)``, each its own
  transaction; ``window-fn``, one unbounded DELETE of the rows whose
  ``row_number() OVER (PARTITION BY user_id ORDER BY created_at DESC, id DESC)``
  is past 20; ``expiry``, the policy with ``retain = "30d"``, ``keep_last =
  20``, ``group_by = "user_id"``. The survivors' fingerprint is read with the
  window function before any method runs.

Expiry runs as deployed: ``--connections`` worker processes (2; concurrency 1
each, so two connections delete, as ``[worker] concurrency = 2`` would),
started before the clock and idle in LISTEN, then ``cleanup.open_run`` (the
partitions scenario passes its cutoff, computed once, so that every method
deletes the same rows; the others open it at now() - retain as a schedule
would). The time is from ``open_run`` to the run's state being ``finished``.
``nice_ratio = 0``: the baselines do not rest either. "jobs" is the run's jobs
in expiry.jobs (planning pages and windows); a run that fails (a refused
policy, a dead job) prints its reason and the bench goes on.

After each method exactly the rows that were not expired must remain (their
count and the sum of hashtext(key)); a mismatch, or a method that fails,
exits 1 after the table. A method whose own count (a DELETE's row count,
expiry's ledger) differs from the rows that went is flagged WARNING in the
notes, which also give the WAL each method wrote, whether a checkpoint began
during it, and whether other databases on the server were busy meanwhile.
Targets are printed, never asserted.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import psycopg

from expiry.app import App
from expiry.config import parse_config
from scratch import scratch_database

ADMIN_URL = os.environ.get(
    "EXPIRY_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
SCENARIOS = ("django", "random-ids", "partitions", "keep-last")
POLL_SECONDS = 0.02  # the watcher's longest wait between looks at the run
PENDING_EVERY = 0.5  # seconds between looks for a run that ended without finishing
IDLE_SECONDS = 0.3  # after start-up, before the clock: the workers' first claims come back empty

_CTX = mp.get_context("spawn")

Fingerprint = tuple[int, int]  # rows, sum of hashtext(key)


# -- results ------------------------------------------------------------------------


@dataclass
class Measured:
    scenario: str
    method: str
    round: int
    rows: int  # rows deleted: the rows before less the rows after
    seconds: float
    jobs: int | None = None  # the run's jobs (expiry methods)
    plans: int | None = None  # of which planning pages
    planned: int | None = None  # and windows the planner queued (partitions too)
    expired: int = 0  # the expired rows the table held
    note: str = ""
    failed: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


@dataclass(frozen=True)
class Built:
    """What a fresh table holds: all its rows, the expired ones, and the survivors'
    fingerprint."""

    total: int
    expired: int
    survivors: Fingerprint


class Failed(RuntimeError):
    """A method failed: its reason is printed, the bench goes on, and exits 1."""


@dataclass
class Outcome:
    """What one method did, as it tells it: seconds, and for expiry its jobs."""

    seconds: float
    jobs: int | None = None  # the run's jobs, all of them
    plans: int | None = None  # of which planning pages
    planned: int | None = None  # and windows the planner queued (partitions too)
    note: str = ""
    reported_rows: int | None = None  # rows the method says it deleted, when it says


@dataclass
class Scenario:
    """A table and its methods: ``build`` (re)builds the table and returns what it
    holds, each method cleans it and returns its Outcome; ``baselines`` are the
    hand-written methods every other is compared with."""

    name: str
    table: str
    key: str
    baselines: tuple[str, ...]
    methods: dict[str, Callable[[], Outcome]]
    build: Callable[[], Built]
    header: str
    window: int


# -- the database -------------------------------------------------------------------


def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, options="-c TimeZone=UTC")


def fingerprint(
    conn: psycopg.Connection[Any], table: str, key: str, where: str = "true"
) -> Fingerprint:
    row = conn.execute(
        f"select count(*), coalesce(sum(hashtext({key}::text)), 0) from {table} where {where}"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def settle(conn: psycopg.Connection[Any], table: str) -> None:
    """Empty expiry's tables, VACUUM ANALYZE them and the bench table, CHECKPOINT."""
    conn.execute("truncate expiry.jobs, expiry.ledger, expiry.audit, expiry.runs")
    conn.execute(f"vacuum analyze {table}")
    conn.execute("vacuum analyze expiry.jobs, expiry.ledger, expiry.audit, expiry.runs")
    conn.execute("checkpoint")


def built(conn: psycopg.Connection[Any], table: str, key: str, live: str) -> Built:
    """The table as built: its rows, its expired rows (not ``live``), the survivors'
    fingerprint."""
    total = fingerprint(conn, table, key)[0]
    survivors = fingerprint(conn, table, key, live)
    return Built(total, total - survivors[0], survivors)


def others_active(url: str) -> int:
    """Sessions of other databases running a statement now (another workload on
    the server makes the figures noisy: the notes say so)."""
    with connect(url) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where state = 'active' "
            "and datname is distinct from current_database()"
        ).fetchone()
        return int(row[0]) if row else 0


def server_counters(url: str) -> tuple[int, str]:
    """The WAL position (bytes) and the last checkpoint's redo position: what a
    method wrote, and whether a checkpoint (full-page images again) began
    during it."""
    with connect(url) as conn:
        row = conn.execute(
            "select pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, "
            "(select redo_lsn::text from pg_control_checkpoint())"
        ).fetchone()
        assert row is not None
        return int(row[0]), str(row[1])


def db_now(url: str) -> datetime:
    with connect(url) as conn:
        row = conn.execute("select date_trunc('second', now())").fetchone()
        assert row is not None
        now: datetime = row[0]
        return now


# -- django_session -------------------------------------------------------------------
#
# Row i (1..N): expired iff i is even (exactly half), inserted in the order of
# md5(i), so that expired and live rows are interleaved at random in the heap.
# The key: 32 lowercase letters and digits from sha256 of the row number. Expired
# rows ended 1 s to 14 days before the reference time T (the scenario's start);
# live rows end 1 to 14 days after it, so that now() at any later moment of the
# bench splits them the same way.

DJANGO_DDL = (
    "CREATE TABLE django_session (session_key varchar(40) NOT NULL PRIMARY KEY, "
    "session_data text NOT NULL, expire_date timestamp with time zone NOT NULL)",
    "CREATE INDEX django_session_expire_date_a5c62663 ON django_session (expire_date)",
)

DJANGO_FILL = """
insert into django_session (session_key, session_data, expire_date)
select substr(lower(translate(encode(sha256(('session:' || i)::bytea), 'base64'), '+/=', '')),
              1, 32),
       '.eJxVjEEKwjAQRf8y6' || md5(i::text) || md5((i + 1)::text) || ':1tKq' || substr(md5((i + 2)::text), 1, 27),
       case when i %% 2 = 0
            then %(t)s - make_interval(secs => 1 + (i * 7919) %% (14 * 86400))
            else %(t)s + interval '1 day' + make_interval(secs => (i * 7919) %% (13 * 86400)) end
from generate_series(1, %(rows)s::bigint) as i
order by md5(i::text)
"""

DJANGO_SINGLE = "DELETE FROM django_session WHERE expire_date < now()"
DJANGO_BATCHED_IN = (
    "DELETE FROM django_session WHERE session_key IN "
    "(SELECT session_key FROM django_session WHERE expire_date < now() LIMIT {limit})"
)


def django_build(url: str, rows: int, t: datetime) -> Built:
    with connect(url) as conn:
        conn.execute("drop table if exists django_session")
        for statement in DJANGO_DDL:
            conn.execute(statement)
        conn.execute("alter table django_session set (autovacuum_enabled = false)")
        conn.execute(DJANGO_FILL, {"rows": rows, "t": t})
        settle(conn, "django_session")
        return built(conn, "django_session", "session_key", "expire_date >= now()")


def single_delete(url: str, statement: str) -> Outcome:
    with connect(url) as conn:
        started = time.perf_counter()
        deleted = conn.execute(statement).rowcount
        return Outcome(time.perf_counter() - started, reported_rows=deleted)


def loop_delete(url: str, statement: str) -> Outcome:
    """The statement again and again, each its own transaction, until it deletes nothing."""
    with connect(url) as conn:
        started = time.perf_counter()
        deleted = statements = 0
        while True:
            statements += 1
            n = conn.execute(statement, prepare=True).rowcount
            deleted += n
            if n == 0:
                break
        seconds = time.perf_counter() - started
    return Outcome(seconds, note=f"{statements:,} statements", reported_rows=deleted)


def django_scenario(url: str, args: argparse.Namespace, t: datetime) -> Scenario:
    rows, window = args.django_rows, args.window
    policy = {"table": "django_session", "key": "session_key", "timestamp": "expire_date"}
    return Scenario(
        name="django",
        table="django_session",
        key="session_key",
        baselines=("single", "batched-in"),
        methods={
            "single": lambda: single_delete(url, DJANGO_SINGLE),
            "batched-in": lambda: loop_delete(url, DJANGO_BATCHED_IN.format(limit=window)),
            "expiry": lambda: expiry_method(url, args, "django-sessions", policy, None, window),
        },
        build=lambda: django_build(url, rows, t),
        header=f"{rows:,} rows, 50% expired, varchar(40) keys, window and LIMIT {window:,}",
        window=window,
    )


# -- random 62-bit ids ----------------------------------------------------------------
#
# Row i (1..N) gets id mix(i), a bijection of [0, 2^62) (multiply by an odd
# constant, xor-shift, multiply, xor-shift; numeric arithmetic modulo 2^62): ids
# spread at random over 62 bits without a duplicate. Expired iff i % 100 = 0
# (exactly 1%); heap order is i's, unrelated to the ids'. The primary key and the
# index are built after the fill.

TOKENS_CREATE = """
create table tokens (
    id         bigint not null,
    expires_at timestamptz not null,
    payload    text not null
) with (autovacuum_enabled = false)
"""

TOKENS_FILL = """
insert into tokens (id, expires_at, payload)
select d.id,
       case when i %% 100 = 0
            then %(t)s - make_interval(secs => 1 + (i * 7919) %% (30 * 86400))
            else %(t)s + interval '1 day' + make_interval(secs => (i * 7919) %% (30 * 86400)) end,
       md5(i::text) || '-' || lpad(i::text, 17, '0')
from generate_series(1, %(rows)s::bigint) as i,
     lateral (select ((i::numeric * 11400714819323198485) %% 4611686018427387904)::bigint as a) a,
     lateral (select a.a # (a.a >> 31) as b) b,
     lateral (select ((b.b::numeric * 13787848793156543929) %% 4611686018427387904)::bigint as c) c,
     lateral (select c.c # (c.c >> 29) as id) d
"""

TOKENS_SINGLE = "DELETE FROM tokens WHERE expires_at < now()"


def tokens_build(url: str, rows: int, t: datetime) -> Built:
    with connect(url) as conn:
        conn.execute("drop table if exists tokens")
        conn.execute(TOKENS_CREATE)
        conn.execute(TOKENS_FILL, {"rows": rows, "t": t})
        conn.execute("alter table tokens add primary key (id)")
        conn.execute("create index tokens_expires_at on tokens (expires_at)")
        settle(conn, "tokens")
        return built(conn, "tokens", "id", "expires_at >= now()")


def random_ids_scenario(url: str, args: argparse.Namespace, t: datetime) -> Scenario:
    rows, window = args.random_ids_rows, args.window
    policy = {"table": "tokens", "key": "id", "timestamp": "expires_at"}
    return Scenario(
        name="random-ids",
        table="tokens",
        key="id",
        baselines=("single",),
        methods={
            "single": lambda: single_delete(url, TOKENS_SINGLE),
            "expiry": lambda: expiry_method(url, args, "expired-tokens", policy, None, window),
        },
        build=lambda: tokens_build(url, rows, t),
        header=f"{rows:,} rows, 1% expired, random 62-bit ids, window {window:,}",
        window=window,
    )


# -- a table partitioned by month -------------------------------------------------------
#
# Twelve monthly partitions, events_pYYYYMM, from ten months before this one to
# the next; rows/12 rows in each, spread evenly over its month in id order (ids
# grow with created_at, as an identity column's would).

EVENTS_CREATE = """
create table events (
    id         bigint not null,
    created_at timestamptz not null,
    payload    text,
    primary key (id, created_at)
) partition by range (created_at)
"""

EVENTS_FILL = """
insert into events (id, created_at, payload)
select i, m.lo + (m.hi - m.lo) * (((i - 1) %% %(per)s)::float8 / %(per)s),
       '{"type":"page_view","user":' || (i * 7919) %% 100003 || ',"h":"' || md5(i::text) || '"}'
from generate_series(1, %(rows)s::bigint) as i
join unnest(%(los)s::timestamptz[], %(his)s::timestamptz[]) with ordinality as m(lo, hi, k)
  on m.k = (i - 1) / %(per)s + 1
"""

LEFTOVERS = """
select c.oid::regclass::text from pg_class c join pg_namespace n on n.oid = c.relnamespace
where n.nspname = 'public' and c.relkind in ('r', 'p') and c.relname like 'events%'
"""

ATTACHED = "select count(*) from pg_inherits where inhparent = 'events'::regclass"


def months(now: datetime) -> list[tuple[str, datetime, datetime]]:
    """(name, start, end) of the 12 months from ten months before ``now``'s to the next."""
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    starts = []
    year, month = first.year, first.month - 10
    for _ in range(13):
        while month < 1:
            year, month = year - 1, month + 12
        while month > 12:
            year, month = year + 1, month - 12
        starts.append(datetime(year, month, 1, tzinfo=UTC))
        month += 1
    return [(f"events_p{s:%Y%m}", s, e) for s, e in zip(starts, starts[1:], strict=False)]


def partition_retain(now: datetime) -> int:
    """Seconds of retain that put the cutoff inside this month: 1 day, or half of
    the month so far on its first two days."""
    elapsed = (now - now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)).total_seconds()
    return 86400 if elapsed > 2 * 86400 else max(1, int(elapsed // 2))


def events_build(
    url: str, rows: int, parts: list[tuple[str, datetime, datetime]], cutoff: datetime
) -> Built:
    per = rows // len(parts)
    with connect(url) as conn:
        for (name,) in conn.execute(LEFTOVERS).fetchall():  # and whatever a method detached
            conn.execute(f"drop table if exists {name} cascade")
        conn.execute(EVENTS_CREATE)
        for name, start, end in parts:
            conn.execute(
                f"create table {name} partition of events for values "
                f"from ('{start.isoformat()}') to ('{end.isoformat()}') "
                "with (autovacuum_enabled = false)"
            )
        conn.execute("create index events_created_at on events (created_at)")
        conn.execute(
            EVENTS_FILL,
            {
                "rows": per * len(parts),
                "per": per,
                "los": [start for _, start, _ in parts],
                "his": [end for _, _, end in parts],
            },
        )
        settle(conn, "events")
        cut = cutoff.isoformat()
        return built(conn, "events", "id", f"created_at >= '{cut}'")


def by_hand(url: str, parts: list[tuple[str, datetime, datetime]], cutoff: datetime) -> Outcome:
    """DETACH and DROP each partition that ends by the cutoff, then one DELETE of
    the expired rows left (the straddling partition's), each statement autocommit."""
    expired = [name for name, _, end in parts if end <= cutoff]
    with connect(url) as conn:
        started = time.perf_counter()
        for name in expired:
            conn.execute(f"ALTER TABLE events DETACH PARTITION {name}")
            conn.execute(f"DROP TABLE {name}")
        deleted = conn.execute("DELETE FROM events WHERE created_at < %s", (cutoff,)).rowcount
        seconds = time.perf_counter() - started
    return Outcome(seconds, note=f"{len(expired)} partitions dropped, {deleted:,} rows deleted")


def partitions_note(url: str) -> str:
    with connect(url) as conn:
        row = conn.execute(ATTACHED).fetchone()
        attached = int(row[0]) if row else 0
        tables = len(conn.execute(LEFTOVERS).fetchall()) - 1  # less events itself
    detached = tables - attached
    return f"{attached} partitions left attached" + (f", {detached} detached" if detached else "")


def partitions_scenario(url: str, args: argparse.Namespace, now: datetime) -> Scenario:
    parts = months(now)
    retain = partition_retain(now)
    cutoff = now - timedelta(seconds=retain)
    rows = args.partitions_rows // len(parts) * len(parts)
    window = args.window
    policy = {
        "table": "events",
        "key": "id",
        "timestamp": "created_at",
        "retain": f"{retain}s",
    }

    def expiry_with(name: str, extra: dict[str, Any]) -> Callable[[], Outcome]:
        def run() -> Outcome:
            outcome = expiry_method(url, args, name, {**policy, **extra}, cutoff, window)
            outcome.note = f"{outcome.note}; {partitions_note(url)}"
            return outcome

        return run

    return Scenario(
        name="partitions",
        table="events",
        key="id",
        baselines=("by-hand",),
        methods={
            "by-hand": lambda: by_hand(url, parts, cutoff),
            "expiry": expiry_with("old-events", {}),
            "expiry-rows": expiry_with("old-events-rows", {"partitions": "rows"}),
        },
        build=lambda: events_build(url, rows, parts, cutoff),
        header=(
            f"{rows:,} rows in 12 monthly partitions {parts[0][0]}..{parts[-1][0]}, "
            f"retain {retain:,}s, cutoff {cutoff:%Y-%m-%d %H:%M:%S} inside {parts[10][0]}"
        ),
        window=window,
    )


# -- expiry -----------------------------------------------------------------------------


def expiry_config(
    url: str, name: str, policy: dict[str, Any], window: int, overrides: dict[str, Any]
) -> dict[str, Any]:
    return {
        "database": {"url": url},
        "policy": [
            {
                "name": name,
                "retain": "0s",
                "window": window,
                "nice_ratio": 0,  # no rests: the baselines do not rest either
                **policy,
                **overrides,
            }
        ],
    }


def _worker(config: dict[str, Any], ready: Barrier, done: Event, results: Any) -> None:
    """One worker process, as deployed: check the policy, open its pool and LISTEN
    connection, then run, idle until the run's first hint; stop once the parent
    saw the run end, and report the jobs it ran (or why it could not start)."""
    try:
        app = App(config=parse_config(config, "bench"), pool_size=2)
        assert app.cleanup is not None and app.config is not None
        settings = app.config.worker
        app.cleanup.check()
        app.queue.pending()
        app.engine.listen()
        worker = app.worker(
            concurrency=1,
            batch=settings.claim_batch,
            lease=settings.lease,
            prune_after=settings.prune_after,
        )
    except Exception as exc:
        results.put(f"worker could not start: {type(exc).__name__}: {exc}")
        ready.abort()
        return

    def stop_when_done() -> None:
        done.wait(timeout=24 * 3600)
        worker.stop()

    threading.Thread(target=stop_when_done, daemon=True).start()
    ready.wait(timeout=120)
    worker.run()
    results.put(worker.processed)
    app.close()


def expiry_method(
    url: str,
    args: argparse.Namespace,
    name: str,
    policy: dict[str, Any],
    cutoff: datetime | None,
    window: int,
) -> Outcome:
    """N idle worker processes, open_run, until the run is finished."""
    config = expiry_config(url, name, policy, window, args.policy)
    try:
        app = App(config=parse_config(config, "bench"), pool_size=2)
    except Exception as exc:
        raise Failed(f"{type(exc).__name__}: {exc}") from None
    try:
        assert app.cleanup is not None
        app.cleanup.check()
    except Exception as exc:
        app.close()
        raise Failed(f"{type(exc).__name__}: {exc}") from None
    ready = _CTX.Barrier(args.connections + 1)
    done = _CTX.Event()
    results = _CTX.Queue()
    children: list[BaseProcess] = [
        _CTX.Process(target=_worker, args=(config, ready, done, results))
        for _ in range(args.connections)
    ]
    try:
        with connect(url) as watcher:
            app.queue.pending()
            app.engine.wait_for_runs(0)  # LISTEN expiry_runs from here
            for child in children:
                child.start()
            try:
                ready.wait(timeout=120)
            except threading.BrokenBarrierError:
                try:
                    reason = str(results.get(timeout=10))
                except queue.Empty:
                    codes = [child.exitcode for child in children]
                    reason = f"a worker process did not start (exit codes {codes})"
                raise Failed(reason) from None
            time.sleep(IDLE_SECONDS)
            started = time.perf_counter()
            opened = app.cleanup.open_run(name, cutoff, opened_by="bench", actor="bench")
            wait_finished(app, watcher, opened.run_id, started, args.timeout, children)
            seconds = time.perf_counter() - started
            done.set()
            processed = [results.get(timeout=120) for _ in children]
            jobs = dict(
                watcher.execute(
                    "select handler, count(*) from expiry.jobs where run_id = %s group by 1",
                    (opened.run_id,),
                ).fetchall()
            )
        summary = app.runs.summary(opened.run_id) or {}
    finally:
        done.set()
        app.close()
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.terminate()
                child.join()
    plans = int(jobs.get("expiry.plan", 0))
    total = sum(int(n) for n in jobs.values())
    planned = int(summary.get("windows_planned", 0))  # windows, partitions, splits
    parts = int(jobs.get("expiry.partition", 0))
    rest = total - plans - planned  # a window cut short by pacing queues its rest
    note = (
        f"jobs {total:,}: {plans:,} planning page(s) + {planned - parts:,} windows"
        + (f" + {parts:,} partitions" if parts else "")
        + f" planned + {rest:,} continuations, "
        f"{summary.get('windows_applied', 0):,} ledger rows, "
        f"retries {summary.get('retries', 0)}, jobs per worker {processed}"
    )
    if summary.get("duplicates_skipped"):
        note += f", duplicates {summary['duplicates_skipped']}"
    return Outcome(
        seconds,
        jobs=total,
        plans=plans,
        planned=planned,
        note=note,
        reported_rows=summary.get("rows_affected"),
    )


def wait_finished(
    app: App,
    watcher: psycopg.Connection[Any],
    run_id: str,
    started: float,
    timeout: float,
    children: list[BaseProcess],
) -> None:
    """Until the run is finished; Failed if it ends otherwise (a dead job), every
    worker exits, or ``timeout`` passes."""
    last_look = time.perf_counter()
    while True:
        row = watcher.execute("select state from expiry.runs where id = %s", (run_id,)).fetchone()
        if row is not None and row[0] == "finished":
            return
        now = time.perf_counter()
        if now - started > timeout:
            raise Failed(f"the run {run_id} did not finish in {timeout:.0f} s")
        if not any(child.is_alive() for child in children):
            raise Failed(f"every worker exited but the run {run_id} is {row and row[0]!r}")
        if now - last_look > PENDING_EVERY:
            last_look = now
            dead = watcher.execute(
                "select count(*), max(last_error) from expiry.jobs "
                "where run_id = %s and state = 'dead'",
                (run_id,),
            ).fetchone()
            if dead is not None and dead[0]:
                error = str(dead[1] or "").splitlines()[0][:400] if dead[1] else "no error text"
                raise Failed(f"the run {run_id} has {dead[0]} dead job(s): {error}")
        app.engine.wait_for_runs(POLL_SECONDS)


# -- one scenario, every method, every round -------------------------------------------


def round_order(methods: Sequence[str], round_: int) -> list[str]:
    """The listed order in odd rounds, the reverse in even ones."""
    return list(methods) if round_ % 2 else list(reversed(methods))


def measure(url: str, scenario: Scenario, method: str, round_: int) -> Measured:
    """Build the table, clean it by ``method``, check what is left; all of it
    again, up to twice, if the server goes away meanwhile (a restart of a
    shared server: the test suite's restart drill does that)."""
    for attempt in range(3):
        try:
            return measure_once(url, scenario, method, round_)
        except psycopg.OperationalError as exc:
            if attempt == 2:
                raise
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            progress(f"the server went away ({first}); measuring {method} again once it is back")
            wait_for_server(url)
    raise AssertionError("unreachable")


def wait_for_server(url: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with connect(url) as conn:
                conn.execute("select 1")
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def measure_once(url: str, scenario: Scenario, method: str, round_: int) -> Measured:
    tag = f"[{scenario.name} round {round_}]"
    progress(f"{tag} building for {method}")
    build_started = time.perf_counter()
    table = scenario.build()
    progress(
        f"{tag} built {table.total:,} rows, {table.expired:,} expired "
        f"({time.perf_counter() - build_started:.1f} s); running {method}"
    )
    outcome: Outcome | None = None
    failed = ""
    busy, wal = others_active(url), server_counters(url)
    try:
        outcome = scenario.methods[method]()
    except Failed as exc:
        failed = str(exc)
    except psycopg.OperationalError:
        raise  # the server went away: measure again
    except Exception as exc:  # a baseline's error, or expiry's outside the run
        failed = f"{type(exc).__name__}: {exc}".strip()
    busy = max(busy, others_active(url))
    wal_after = server_counters(url)
    with connect(url) as conn:
        after = fingerprint(conn, scenario.table, scenario.key)
    deleted = table.total - after[0]
    if not failed and after != table.survivors:
        failed = (
            f"left the wrong rows: {after[0]:,} rows (hashtext sum {after[1]}) but "
            f"{table.survivors[0]:,} (hashtext sum {table.survivors[1]}) were not expired"
        )
    note = outcome.note if outcome else ""
    note += f"; WAL {(wal_after[0] - wal[0]) / 2**20:,.0f} MiB"
    if wal_after[1] != wal[1]:
        note += ", a checkpoint began during it"
    if busy:  # the figures are then not this bench's alone
        note += f"; {busy} active session(s) of other databases on the server meanwhile"
    if outcome and outcome.reported_rows is not None and outcome.reported_rows != deleted:
        note += f"; WARNING: it reports {outcome.reported_rows:,} rows deleted, not {deleted:,}"
    result = Measured(
        scenario.name,
        method,
        round_,
        deleted,
        outcome.seconds if outcome else float("nan"),
        outcome.jobs if outcome else None,
        outcome.plans if outcome else None,
        outcome.planned if outcome else None,
        table.expired,
        note.strip("; "),
        failed,
    )
    if failed:
        progress(f"{tag} {method} FAILED: {failed}")
    else:
        progress(
            f"{tag} {method}: {deleted:,} rows in {result.seconds:.3f} s, {result.rate:,.0f} rows/s"
        )
    return result


def run_scenario(
    url: str, scenario: Scenario, repeat: int, only: list[str] | None = None
) -> list[Measured]:
    print(f"scenario {scenario.name}: {scenario.header}", flush=True)
    methods = [m for m in scenario.methods if only is None or m in only]
    return [
        measure(url, scenario, method, round_)
        for round_ in range(1, repeat + 1)
        for method in round_order(methods, round_)
    ]


# -- the report -----------------------------------------------------------------------


def progress(message: str) -> None:
    print(f"  {message}", flush=True)


TARGETS = (
    # scenario, method, baseline, ratio of rows/s at least
    ("django", "expiry", "single", 0.8),
    ("django", "expiry", "batched-in", 10.0),
    ("random-ids", "expiry", "single", 0.5),
    ("partitions", "expiry", "by-hand", 0.5),  # printed as time: at most 2x by-hand's
    ("keep-last", "expiry", "per-group", 1.0),
)


def times(x: float) -> str:
    """A ratio: two decimals, or three significant digits below 0.1."""
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.3g}x"


def ratio(results: list[Measured], r: Measured, baseline: str) -> float | None:
    """r's rows/s over the baseline's, in the same round, when both succeeded."""
    for b in results:
        if (b.scenario, b.method, b.round) == (r.scenario, baseline, r.round):
            if b.failed or r.failed or not b.rate or math.isnan(r.seconds):
                return None
            return r.rate / b.rate
    return None


def print_table(results: list[Measured], scenarios: list[Scenario]) -> None:
    header = (
        f"{'scenario':<11} {'method':<12} {'round':>5} {'rows deleted':>13} {'seconds':>9} "
        f"{'rows/s':>12} {'jobs':>7}  rows/s vs each baseline"
    )
    print(header)
    print("-" * len(header))
    baselines = {s.name: s.baselines for s in scenarios}
    for r in results:
        if r.failed:
            print(f"{r.scenario:<11} {r.method:<12} {r.round:>5} FAILED ({r.rows:,} rows deleted)")
            continue
        versus = [
            f"{times(x)} {b}"
            for b in baselines.get(r.scenario, ())
            if b != r.method and (x := ratio(results, r, b)) is not None
        ]
        jobs = "-" if r.jobs is None else f"{r.jobs:,}"
        print(
            f"{r.scenario:<11} {r.method:<12} {r.round:>5} {r.rows:>13,} {r.seconds:>9.3f} "
            f"{r.rate:>12,.0f} {jobs:>7}  {', '.join(versus)}"
        )
    print()
    for s in scenarios:
        expired = next((r.expired for r in results if r.scenario == s.name), 0)
        print(f"{s.name}: {s.header}; {expired:,} expired")
    noted = [r for r in results if r.note or r.failed]
    if noted:
        print()
        for r in noted:
            text = f"FAILED: {r.failed}" if r.failed else r.note
            print(f"{r.scenario} {r.method} round {r.round}: {text}")


def print_targets(results: list[Measured], scenarios: list[Scenario]) -> None:
    print()
    print("targets (printed, not asserted):")
    for scenario, method, baseline, at_least in TARGETS:
        found = [
            x
            for r in results
            if (r.scenario, r.method) == (scenario, method)
            and (x := ratio(results, r, baseline)) is not None
        ]
        if not any(r.scenario == scenario for r in results):
            continue
        if scenario == "partitions":
            what = f"{scenario:<11} {method} time <= {1 / at_least:g}x {baseline}'s"
            shown = [1 / x for x in found]
        else:
            what = f"{scenario:<11} {method} rows/s >= {at_least:g}x {baseline}'s"
            shown = found
        if not found:
            print(f"  {what}: no successful pair  MISS")
            continue
        median = statistics.median(found)
        verdict = "ok" if median >= at_least else "MISS"
        each = ", ".join(times(x) for x in shown)
        print(f"  {what}: {times(statistics.median(shown))} (median of {each})  {verdict}")
    windows = {s.name: s.window for s in scenarios}
    for r in results:
        if (r.scenario, r.method) == ("random-ids", "expiry") and r.jobs is not None:
            plans = r.plans or 0
            planned = plans + (r.planned or 0)
            bound = math.ceil(r.expired / windows[r.scenario]) + plans
            verdict = "ok" if planned <= bound else "MISS"
            print(
                f"  random-ids  jobs planned <= ceil(expired / window) + planning pages: round "
                f"{r.round}: {planned:,} vs ceil({r.expired:,} / {windows[r.scenario]:,}) + "
                f"{plans:,} = {bound:,}  {verdict} (and {r.jobs - planned:,} continuations: "
                f"{r.jobs:,} jobs in all)"
            )


# -- keep the last N per user --------------------------------------------------------------
#
# Row i (1..N): user i mod U (U = N / 100); the first fifth of users are idle
# (rows 31 to 90 days before T), the others' rows are 0 to 29 or 31 to 60 days
# old: none is within a day of the 30-day cutoff, so that the rows it takes do
# not change while the bench runs. The 20 newest rows of each user are kept
# whatever their age.

KEEP_LAST = 20
ROWS_PER_USER = 100

KEEP_CREATE = """
create table user_events (
    id         bigint primary key,
    user_id    integer not null,
    created_at timestamptz not null,
    payload    text not null
) with (autovacuum_enabled = false)
"""

KEEP_FILL = """
insert into user_events (id, user_id, created_at, payload)
select i, i %% {users},
       case when i %% {users} < {users} / 5
            then %(t)s - interval '31 days' - make_interval(secs => (i * 7919) %% (59 * 86400))
            else %(t)s - make_interval(secs => a.s + case when a.s >= 29 * 86400
                                                          then 2 * 86400 else 0 end) end,
       md5(i::text) || lpad(i::text, 8, '0')
from generate_series(1, %(rows)s::bigint) as i,
     lateral (select (i * 7919) %% (58 * 86400) as s) a
"""

KEEP_OLD = "created_at < now() - interval '30 days'"
KEEP_RANKED = (
    "select id, created_at, row_number() over (partition by user_id"
    " order by created_at desc, id desc) as rn from user_events"
)
KEEP_LIVE = f"id not in (select id from ({KEEP_RANKED}) r where rn > {KEEP_LAST} and {KEEP_OLD})"
KEEP_WINDOW_FN = (
    "DELETE FROM user_events e USING (select id from (" + KEEP_RANKED + ") r"
    f" where rn > {KEEP_LAST} and {KEEP_OLD}) d WHERE e.id = d.id"
)
KEEP_PER_GROUP = (
    f"DELETE FROM user_events WHERE user_id = %(u)s AND {KEEP_OLD} AND id NOT IN"
    " (SELECT id FROM user_events WHERE user_id = %(u)s"
    f" ORDER BY created_at DESC, id DESC LIMIT {KEEP_LAST})"
)


def keep_build(url: str, rows: int, t: datetime) -> Built:
    users = max(1, rows // ROWS_PER_USER)
    with connect(url) as conn:
        conn.execute("drop table if exists user_events")
        conn.execute(KEEP_CREATE)
        conn.execute(KEEP_FILL.format(users=users), {"rows": rows, "t": t})
        conn.execute("create index user_events_created_at on user_events (created_at)")
        conn.execute("create index user_events_newest on user_events (user_id, created_at, id)")
        settle(conn, "user_events")
        return built(conn, "user_events", "id", KEEP_LIVE)


def per_group_delete(url: str) -> Outcome:
    """Each user with an old row: its rows past the 20 newest, one transaction each."""
    with connect(url) as conn:
        started = time.perf_counter()
        users = [
            r[0] for r in conn.execute(f"select distinct user_id from user_events where {KEEP_OLD}")
        ]
        deleted = sum(conn.execute(KEEP_PER_GROUP, {"u": u}, prepare=True).rowcount for u in users)
        seconds = time.perf_counter() - started
    return Outcome(seconds, note=f"{len(users):,} statements", reported_rows=deleted)


def keep_last_scenario(url: str, args: argparse.Namespace, t: datetime) -> Scenario:
    rows, window = args.keep_last_rows, args.window
    policy = {
        "table": "user_events",
        "key": "id",
        "timestamp": "created_at",
        "retain": "30d",
        "keep_last": KEEP_LAST,
        "group_by": "user_id",
    }
    return Scenario(
        name="keep-last",
        table="user_events",
        key="id",
        baselines=("per-group", "window-fn"),
        methods={
            "per-group": lambda: per_group_delete(url),
            "window-fn": lambda: single_delete(url, KEEP_WINDOW_FN),
            "expiry": lambda: expiry_method(url, args, "user-events", policy, None, window),
        },
        build=lambda: keep_build(url, rows, t),
        header=(
            f"{rows:,} rows of {max(1, rows // ROWS_PER_USER):,} users, a fifth idle for 30 days; older than"
            f" 30 days and past each user's {KEEP_LAST} newest; window {window:,}"
        ),
        window=window,
    )


# -- main -----------------------------------------------------------------------------


def parse_settings(items: list[str]) -> dict[str, Any]:
    """FIELD=VALUE pairs; a value that reads as a number is one."""
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        for kind in (int, float):
            try:
                out[key] = kind(value)
                break
            except ValueError:
                continue
        else:
            out[key] = value
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--scenario",
        type=lambda s: [e.strip() for e in s.split(",") if e.strip()],
        action="extend",
        default=None,
        help=f"comma separated, repeatable: {','.join(SCENARIOS)} (all)",
    )
    parser.add_argument(
        "--method",
        type=lambda s: [e.strip() for e in s.split(",") if e.strip()],
        action="extend",
        default=None,
        help="comma separated, repeatable: run only these methods (all)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: ~100x smaller, window 1,000"
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every method (1)")
    parser.add_argument(
        "--django-rows", type=int, default=None, help="django_session rows (2000000)"
    )
    parser.add_argument("--random-ids-rows", type=int, default=None, help="tokens rows (10000000)")
    parser.add_argument(
        "--partitions-rows", type=int, default=None, help="events rows, all partitions (200000)"
    )
    parser.add_argument(
        "--keep-last-rows", type=int, default=None, help="user_events rows (1000000)"
    )
    parser.add_argument(
        "--window", type=int, default=None, help="expiry's window and batched-in's LIMIT (10000)"
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=2,
        help="expiry worker processes, one connection each (2)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field of every expiry policy (repeatable)",
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds an expiry run may take (3600)"
    )
    parser.add_argument("--admin-url", default=ADMIN_URL, help="server to create the scratch db on")
    args = parser.parse_args(argv)
    quick = args.quick
    if args.django_rows is None:
        args.django_rows = 20_000 if quick else 2_000_000
    if args.random_ids_rows is None:
        args.random_ids_rows = 100_000 if quick else 10_000_000
    if args.partitions_rows is None:
        args.partitions_rows = 12_000 if quick else 200_000
    if args.keep_last_rows is None:
        args.keep_last_rows = 100_000 if quick else 1_000_000
    if args.window is None:
        args.window = 1_000 if quick else 10_000
    args.scenario = args.scenario or list(SCENARIOS)
    unknown = set(args.scenario) - set(SCENARIOS)
    if unknown:
        parser.error(f"--scenario takes {', '.join(SCENARIOS)}, not {', '.join(sorted(unknown))}")
    methods = {"single", "batched-in", "expiry", "by-hand", "expiry-rows", "per-group", "window-fn"}
    wrong = set(args.method or ()) - methods
    if wrong:
        parser.error(f"--method takes {', '.join(sorted(methods))}, not {', '.join(sorted(wrong))}")
    sizes = (
        args.django_rows,
        args.random_ids_rows,
        args.keep_last_rows,
        args.window,
        args.connections,
        args.repeat,
    )
    if min(sizes) <= 0 or args.partitions_rows < 12:
        parser.error("sizes, --window, --connections and --repeat must be positive")
    args.policy = parse_settings(args.policy)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # parse_config lets EXPIRY_DATABASE_URL override the url: not here.
    os.environ.pop("EXPIRY_DATABASE_URL", None)
    print(
        f"real tables: {', '.join(args.scenario)}; window {args.window:,}, expiry "
        f"{args.connections} worker processes, {args.repeat} round(s), {os.cpu_count()} cpus"
        + (f", policy overrides {args.policy}" if args.policy else ""),
        flush=True,
    )
    results: list[Measured] = []
    scenarios: list[Scenario] = []
    with scratch_database(args.admin_url, f"expiry_bench_real_{os.getpid()}") as url:
        app = App(url)
        app.migrate()
        app.close()
        now = db_now(url)
        makers = {
            "django": django_scenario,
            "random-ids": random_ids_scenario,
            "partitions": partitions_scenario,
            "keep-last": keep_last_scenario,
        }
        for name in SCENARIOS:
            if name in args.scenario:
                scenario = makers[name](url, args, now)
                scenarios.append(scenario)
                results += run_scenario(url, scenario, args.repeat, args.method)
    print()
    print_table(results, scenarios)
    print_targets(results, scenarios)
    failed = [r for r in results if r.failed]
    if failed:
        print(f"\nFAIL: {len(failed)} method(s) failed or left the wrong rows", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
