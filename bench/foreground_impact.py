"""Live-traffic safety: what cleaning a table costs the application using it.

    .venv/bin/python bench/foreground_impact.py                # 2,000,000 rows, 4 connections
    .venv/bin/python bench/foreground_impact.py --repeat 2     # each scenario twice, interleaved
    .venv/bin/python bench/foreground_impact.py --quick        # smoke run (100,000 rows)
    .venv/bin/python bench/foreground_impact.py --scenarios baseline,defaults \\
        --policy target_transaction=0.1 --policy window=5000    # try other settings

The table is ``sessions (id bigint primary key, user_id, expires_at indexed,
hits, payload of about 100 bytes)``; 60% of its rows are expired, scattered over
the key space (exactly 600 of every 1,000 consecutive ids), so every window
shares pages with live rows. It is built once in a template database; each
scenario runs on a fresh copy (``CREATE DATABASE ... TEMPLATE``), VACUUM
ANALYZEd and CHECKPOINTed first, with autovacuum off on the table.

The foreground workload is 4 processes, one connection each (autocommit),
each working on random *live* rows by primary key: half point reads
(``select * ... where id = $1``), half updates (``update ... set hits = hits +
1 where id = $1``), at --rate operations a second in all (2,000: an application
using about a quarter of this machine). The load is an open loop, as users
arrive: each operation is due at a fixed time, and its latency runs from then,
so an operation held up behind a slow one counts the wait. (``--rate 0`` runs
closed loops as fast as they go instead: the machine is then saturated before
cleanup starts, and latency measures CPU queueing more than cleanup.) Every
operation's latency is recorded with its wall-clock start. Scenarios:

* baseline: the foreground alone, for ``--duration`` seconds;
* defaults: one ``expiry worker`` process with the config's defaults
  (``[worker]`` concurrency 2; window 10,000, target_transaction 250 ms,
  nice_ratio 1, lock_timeout 2 s), started and connected before the run is opened;
* unthrottled: the same with target_transaction = 1 h and nice_ratio = 0 (the
  worker never shrinks its transactions, nor rests between them);
* naive: one ``DELETE FROM sessions WHERE expires_at < now()`` transaction;
* hand-loop: a hand-written primary-key window loop, as a team writes it
  without expiry: ``DELETE ... WHERE id > lo AND id <= lo + window AND
  expires_at < now()`` in its own transaction, then a rest of nice_ratio times
  that transaction (the policy's window and nice_ratio, so that it paces as
  expiry's defaults do), one connection;
* hand-loop-50x: the same loop resting 50 times each transaction: how slow a
  hand-written loop must go to keep the foreground's p99 near its baseline;
* budget: expiry with ``max_latency_ratio = 1.25`` and a canary on the table
  that writes as the foreground does (an update of a live row, committed),
  nice_ratio 0 and health_interval 100 ms: the throttle alone paces it from
  the canary's p90 (``latency_quantile`` 0.9, the default) against its idle
  p90; "held s" is the time it held the policy (from the worker's log);
* budget-p99 (not in the default list: it can crawl for minutes): the same
  with ``latency_quantile = 0.99``.

For the cleanup scenarios the foreground's latencies are those of operations
that started while the cleanup ran: from the run's ``opened_at`` to its
``finished_at`` (the database's own record), or around the naive DELETE. The
cleanup's rows/s is the ledger's rows over that interval. Every scenario must
delete exactly the expired rows and leave every live row (exit 1 otherwise).
Each scenario also reports the WAL the whole cluster wrote while it ran
(``pg_stat_wal``: bytes, and full-page images among them).

The target, printed and never asserted: with the defaults, foreground p99 within
1.25x the baseline's, while expiry keeps at least half its unthrottled rows/s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from scratch import db_url

ADMIN_URL = os.environ.get(
    "EXPIRY_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
POLICY = "expired-sessions"
EXPIRED_PER_MILLE = 600
TEMPLATE = f"expiry_bench_fg_template_{os.getpid()}"
_CTX = mp.get_context("spawn")

CREATE = """
create table sessions (
    id         bigint primary key,
    user_id    bigint not null,
    expires_at timestamptz not null,
    hits       bigint not null default 0,
    payload    text not null
) with (autovacuum_enabled = false)
"""

FILL = """
insert into sessions (id, user_id, expires_at, payload)
select i, (i * 7919) %% 100003,
       case when (i * 2654435761) %% 1000 < %(expired)s
            then now() - interval '1 day' - make_interval(secs => i %% 86400)
            else now() + interval '30 days' + make_interval(secs => i %% 86400) end,
       md5(i::text) || md5((i + 1)::text) || md5((i + 2)::text) || 'sess'
from generate_series(1, %(rows)s::bigint) as i
"""


def expired(i: int) -> bool:
    return (i * 2654435761) % 1000 < EXPIRED_PER_MILLE


def admin() -> psycopg.Connection[Any]:
    return psycopg.connect(ADMIN_URL, autocommit=True)


def build_template(rows: int) -> None:
    with admin() as conn:
        conn.execute(
            sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(TEMPLATE))
        )
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(TEMPLATE)))
    url = db_url(ADMIN_URL, TEMPLATE)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CREATE)
        conn.execute(FILL, {"rows": rows, "expired": EXPIRED_PER_MILLE})
        conn.execute("create index sessions_expires_at on sessions (expires_at)")
    from expiry.engines import open_engine

    engine = open_engine(url)
    engine.migrate()
    engine.close()


@contextmanager
def copy_of_template(name: str) -> Iterator[str]:
    ident = sql.Identifier(name)
    with admin() as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(ident))
        conn.execute(
            sql.SQL("create database {} template {} strategy file_copy").format(
                ident, sql.Identifier(TEMPLATE)
            )
        )
    url = db_url(ADMIN_URL, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("vacuum analyze sessions")
            conn.execute("checkpoint")
        yield url
    finally:
        with admin() as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(ident))


# -- the foreground ------------------------------------------------------------------


def foreground(
    url: str, rows: int, seed: int, rate: float, go: Event, stop: Event, out: Any
) -> None:
    """One connection's loop over random live rows: (start time, seconds) per op.

    With ``rate`` (ops/s for this connection) the loop is open: op i is due at
    go + i/rate, and its latency runs from when it was due, so an op delayed by a
    slow predecessor counts its wait (no coordinated omission). Without it, the
    loop is closed: the next op starts when the last one returns."""
    rng = random.Random(seed)
    starts, seconds = array("d"), array("d")
    with psycopg.connect(url, autocommit=True) as conn:
        read = "select * from sessions where id = %s"
        write = "update sessions set hits = hits + 1 where id = %s"
        for _ in range(50):  # warm the prepared statements and the cache
            conn.execute(read, (_live(rng, rows),), prepare=True).fetchall()
        go.wait()
        origin, wall_origin, done = time.perf_counter(), time.time(), 0
        while not stop.is_set():
            key = _live(rng, rows)
            stmt = read if rng.random() < 0.5 else write
            if rate:
                due = origin + done / rate
                ahead = due - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
                t0, began = due, wall_origin + (due - origin)
            else:
                t0, began = time.perf_counter(), time.time()
            cur = conn.execute(stmt, (key,), prepare=True)
            if cur.description is not None:
                cur.fetchall()
            seconds.append(time.perf_counter() - t0)
            starts.append(began)
            done += 1
    out.put((starts.tobytes(), seconds.tobytes()))


def _live(rng: random.Random, rows: int) -> int:
    while True:
        key = rng.randint(1, rows)
        if not expired(key):
            return key


@dataclass
class Foreground:
    url: str
    rows: int
    connections: int
    rate: float  # ops/s over all connections; 0: closed loops, as fast as they go
    procs: list[Any] = field(default_factory=list)
    samples: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.go, self.stop, self.out = _CTX.Event(), _CTX.Event(), _CTX.Queue()

    def start(self) -> None:
        for n in range(self.connections):
            proc = _CTX.Process(
                target=foreground,
                args=(
                    self.url,
                    self.rows,
                    1000 + n,
                    self.rate / self.connections,
                    self.go,
                    self.stop,
                    self.out,
                ),
            )
            proc.start()
            self.procs.append(proc)
        time.sleep(1.0)  # connected and warmed
        self.go.set()

    def finish(self) -> None:
        self.stop.set()
        for _ in self.procs:
            starts_b, seconds_b = self.out.get(timeout=120)
            starts, seconds = array("d"), array("d")
            starts.frombytes(starts_b)
            seconds.frombytes(seconds_b)
            self.samples += list(zip(starts, seconds, strict=True))
        for proc in self.procs:
            proc.join(30)

    def window(self, began: float, ended: float) -> list[float]:
        return [s for t, s in self.samples if began <= t <= ended]

    def timeline(self, name: str, began: float, ended: float, step: float = 0.5) -> None:
        """The foreground's p99 and worst latency in each ``step`` of the cleanup
        (``--timeline``): where in a run the tail comes from."""
        buckets: dict[int, list[float]] = {}
        for t, s in self.samples:
            if began <= t <= ended:
                buckets.setdefault(int((t - began) / step), []).append(s)
        for n in sorted(buckets):
            lat = buckets[n]
            print(
                f"  {name} +{n * step:5.1f}s ops {len(lat):5d} p99 {percentile(lat, 0.99) * 1000:7.2f}"
                f" ms  max {max(lat) * 1000:7.2f} ms",
                flush=True,
            )


# -- scenarios -------------------------------------------------------------------------


@dataclass
class Result:
    scenario: str
    ops: int
    seconds: float
    p50: float
    p99: float
    rows: int = 0
    cleanup_seconds: float = 0.0
    wal_bytes: int = 0  # written by the whole cluster during the scenario
    wal_fpi: int = 0  # of which full-page images (records)
    throttled: float = 0.0  # seconds the throttle held the policy (budget)

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.cleanup_seconds if self.cleanup_seconds else 0.0


def wal_counters() -> tuple[int, int]:
    """The cluster's WAL bytes and full-page images so far (pg_stat_wal)."""
    with admin() as conn:
        row = conn.execute("select wal_bytes::bigint, wal_fpi from pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(name: str, lat: list[float], seconds: float, **kw: Any) -> Result:
    return Result(name, len(lat), seconds, percentile(lat, 0.5), percentile(lat, 0.99), **kw)


def expected_gone(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select count(*) filter (where expires_at < now()), count(*) from sessions"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def verify(url: str, name: str, doomed: int, total: int) -> None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select count(*) filter (where expires_at < now()), count(*) from sessions"
        ).fetchone()
    assert row is not None
    if row[0] != 0 or row[1] != total - doomed:
        print(f"FAIL {name}: {row[0]} expired rows left, {row[1]} rows (want {total - doomed})")
        sys.exit(1)


def run_baseline(url: str, args: argparse.Namespace) -> Result:
    fg = Foreground(url, args.rows, args.connections, args.rate)
    fg.start()
    began = time.time()
    time.sleep(args.duration)
    ended = time.time()
    fg.finish()
    return summarize("baseline", fg.window(began, ended), ended - began)


def run_naive(url: str, args: argparse.Namespace) -> Result:
    doomed, total = expected_gone(url)
    fg = Foreground(url, args.rows, args.connections, args.rate)
    fg.start()
    time.sleep(args.lead)
    began = time.time()
    with psycopg.connect(url, autocommit=True) as conn:
        deleted = conn.execute("delete from sessions where expires_at < now()").rowcount
    ended = time.time()
    time.sleep(args.lead)
    fg.finish()
    verify(url, "naive", doomed, total)
    return summarize(
        "naive DELETE",
        fg.window(began, ended),
        ended - began,
        rows=deleted,
        cleanup_seconds=ended - began,
    )


def run_hand_loop(
    url: str, args: argparse.Namespace, policy: dict[str, Any], name: str = "hand-loop"
) -> Result:
    """The loop a team writes by hand: key windows, a rest in proportion to each."""
    doomed, total = expected_gone(url)
    window = int(policy.get("window", 10_000))
    nice = float(policy.get("nice_ratio", 1.0))
    fg = Foreground(url, args.rows, args.connections, args.rate)
    fg.start()
    time.sleep(args.lead)
    began, deleted = time.time(), 0
    with psycopg.connect(url, autocommit=True) as conn:
        top = conn.execute("select max(id) from sessions").fetchone()[0]  # type: ignore[index]
        lo = 0
        while lo < top:
            t0 = time.perf_counter()
            deleted += conn.execute(
                "delete from sessions where id > %s and id <= %s and expires_at < now()",
                (lo, lo + window),
            ).rowcount
            lo += window
            if nice:
                time.sleep(nice * (time.perf_counter() - t0))
    ended = time.time()
    time.sleep(args.lead)
    fg.finish()
    if args.timeline:
        fg.timeline(name, began, ended)
    verify(url, name, doomed, total)
    return summarize(
        name,
        fg.window(began, ended),
        ended - began,
        rows=deleted,
        cleanup_seconds=ended - began,
    )


def live_id(url: str) -> int:
    """A row the run keeps: the canary reads it."""
    return next(i for i in range(1, 10_000) if not expired(i))


def toml(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


def write_config(
    path: Path, url: str, policy: dict[str, Any], worker: dict[str, Any] | None = None
) -> Path:
    lines = ["[database]", f"url = {json.dumps(url)}", ""]
    if worker:
        lines += ["[worker]", *(f"{k} = {toml(v)}" for k, v in worker.items()), ""]
    lines.append("[[policy]]")
    base = {"name": POLICY, "table": "sessions", "key": "id", "timestamp": "expires_at"}
    lines += [f"{k} = {toml(v)}" for k, v in {**base, **policy}.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_expiry(
    url: str,
    args: argparse.Namespace,
    name: str,
    policy: dict[str, Any],
    tmp: Path,
    worker_settings: dict[str, Any] | None = None,
) -> Result:
    from expiry.app import App

    doomed, total = expected_gone(url)
    cfg = write_config(tmp / f"{name}.toml", url, policy, worker_settings)
    log = tmp / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "expiry", "worker", "--config", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 60
        while "worker started" not in log.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        fg = Foreground(url, args.rows, args.connections, args.rate)
        fg.start()
        time.sleep(args.lead)
        app = App.from_config(cfg)
        assert app.cleanup is not None
        opened = app.cleanup.open_run(POLICY)
        # One connection for the poll: a new one each 50 ms cost the machine about
        # 4 ms of CPU each, which the hand loop's scenario did not pay.
        with psycopg.connect(url, autocommit=True) as poll:
            while True:
                row = poll.execute(
                    "select state, extract(epoch from opened_at), extract(epoch from finished_at)"
                    " from expiry.runs where id = %s",
                    (opened.run_id,),
                ).fetchone()
                if row and row[0] == "finished":
                    break
                time.sleep(0.05)
        time.sleep(args.lead)
        fg.finish()
        app.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    began, ended = float(row[1]), float(row[2])
    if args.timeline:
        fg.timeline(name, began, ended)
    with psycopg.connect(url) as conn:
        applied = conn.execute("select coalesce(sum(rows_affected), 0) from expiry.ledger")
        deleted = int(applied.fetchone()[0])  # type: ignore[index]
    verify(url, name, doomed, total)
    result = summarize(
        name, fg.window(began, ended), ended - began, rows=deleted, cleanup_seconds=ended - began
    )
    result.throttled = held_seconds(log.read_text())
    if args.logs:
        Path(args.logs).mkdir(parents=True, exist_ok=True)
        (Path(args.logs) / f"{name}-{os.getpid()}-{time.time():.0f}.log").write_text(
            log.read_text()
        )
    return result


def held_seconds(text: str) -> float:
    """Seconds the throttle held the policy, from the worker's log: each
    "policy held" line to the next "policy unheld" one (or the log's end)."""
    held, since, last = 0.0, None, None
    for line in text.splitlines():
        try:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
            at = stamp + int(line[20:23]) / 1000
        except ValueError:
            continue
        last = at
        if "policy held" in line and since is None:
            since = at
        elif "policy unheld" in line and since is not None:
            held, since = held + at - since, None
    return held + (last - since if since is not None and last is not None else 0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument(
        "--rate",
        type=float,
        default=2000.0,
        help="foreground ops/s over all connections, open loop (2000); 0: closed loops",
    )
    parser.add_argument("--duration", type=float, default=20.0, help="baseline seconds")
    parser.add_argument("--lead", type=float, default=1.0, help="foreground before/after cleanup")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--logs", help="keep each expiry worker's log in this folder")
    parser.add_argument(
        "--timeline", action="store_true", help="the foreground's p99 each 0.5 s of a cleanup"
    )
    parser.add_argument("--quick", action="store_true", help="100,000 rows, 5 s baseline")
    parser.add_argument(
        "--scenarios",
        default="baseline,defaults,budget,hand-loop,hand-loop-50x,unthrottled,naive",
        help="comma-separated, run in this order each round",
    )
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a policy field in the 'defaults' and 'unthrottled' scenarios (repeatable)",
    )
    parser.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [worker] setting for the 'defaults' and 'unthrottled' scenarios (repeatable)",
    )
    args = parser.parse_args()
    if args.quick:
        args.rows, args.duration = 100_000, 5.0
    overrides, worker_settings = parse_settings(args.policy), parse_settings(args.worker)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]

    print(
        f"building {args.rows:,} rows ({EXPIRED_PER_MILLE / 10:.0f}% expired);"
        f" {args.connections} foreground connections at {args.rate:,.0f} ops/s"
        f" ({'open' if args.rate else 'closed'} loop); cpus {os.cpu_count()},"
        f" load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    started = time.monotonic()
    build_template(args.rows)
    print(f"built in {time.monotonic() - started:.0f}s", flush=True)
    results: list[Result] = []
    try:
        with tempfile.TemporaryDirectory() as tmpdir:
            tmp = Path(tmpdir)
            for round_ in range(args.repeat):
                for name in scenarios:
                    with copy_of_template(f"expiry_bench_fg_{os.getpid()}_{name}") as url:
                        wal_before = wal_counters()
                        if name == "baseline":
                            result = run_baseline(url, args)
                        elif name == "naive":
                            result = run_naive(url, args)
                        elif name == "defaults":
                            result = run_expiry(
                                url, args, "defaults", overrides, tmp, worker_settings
                            )
                        elif name == "hand-loop":
                            result = run_hand_loop(url, args, overrides)
                        elif name == "hand-loop-50x":
                            slow = {**overrides, "nice_ratio": 50}
                            result = run_hand_loop(url, args, slow, name=name)
                        elif name in ("budget", "budget-p99"):
                            policy = {
                                **overrides,
                                "nice_ratio": 0,
                                "max_latency_ratio": 1.25,
                                "canary": f"update sessions set hits = hits where id = {live_id(url)}",
                                "health_interval": "100ms",
                                **{k: v for k, v in overrides.items() if k == "health_interval"},
                            }
                            if name == "budget-p99":
                                policy["latency_quantile"] = 0.99
                            result = run_expiry(url, args, name, policy, tmp, worker_settings)
                        elif name == "unthrottled":
                            policy = {**overrides, "target_transaction": "1h", "nice_ratio": 0}
                            result = run_expiry(
                                url, args, "unthrottled", policy, tmp, worker_settings
                            )
                        else:
                            parser.error(f"unknown scenario {name!r}")
                        wal_after = wal_counters()
                        result.wal_bytes = wal_after[0] - wal_before[0]
                        result.wal_fpi = wal_after[1] - wal_before[1]
                    results.append(result)
                    print(
                        f"round {round_ + 1} {result.scenario:<13} p50 {result.p50 * 1000:7.2f} ms"
                        f"  p99 {result.p99 * 1000:7.2f} ms  {result.ops_per_s:8.0f} ops/s"
                        + (
                            f"  cleanup {result.rows:,} rows in {result.cleanup_seconds:.1f}s"
                            f" = {result.rows_per_s:,.0f} rows/s"
                            if result.rows
                            else ""
                        )
                        + (f"  held {result.throttled:.1f}s" if result.throttled else "")
                        + f"  WAL {result.wal_bytes / 2**20:,.0f} MiB"
                        f" ({result.wal_fpi:,} full-page images)"
                        + f"  (load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
    finally:
        with admin() as conn:
            conn.execute(
                sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(TEMPLATE))
            )
    report(results, {**overrides, **{f"worker.{k}": v for k, v in worker_settings.items()}})
    return 0


def parse_settings(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return out


def report(results: list[Result], overrides: dict[str, Any]) -> None:
    def median(name: str, attr: str) -> float:
        values = [getattr(r, attr) for r in results if r.scenario == name]
        return statistics.median(values) if values else float("nan")

    names = list(dict.fromkeys(r.scenario for r in results))
    base_p99 = median("baseline", "p99")
    print("\nforeground latency while cleaning (median over rounds)")
    print(
        f"{'scenario':<14}{'p50 ms':>9}{'p99 ms':>9}{'p99/base':>10}{'ops/s':>9}{'rows/s':>11}"
        f"{'held s':>8}{'WAL MiB':>9}{'FPIs':>9}"
    )
    for name in names:
        rate = median(name, "rows_per_s")
        print(
            f"{name:<14}{median(name, 'p50') * 1000:9.2f}{median(name, 'p99') * 1000:9.2f}"
            f"{median(name, 'p99') / base_p99:10.2f}{median(name, 'ops_per_s'):9.0f}"
            + (f"{rate:11,.0f}" if rate else f"{'-':>11}")
            + f"{median(name, 'throttled'):8.1f}"
            + f"{median(name, 'wal_bytes') / 2**20:9,.0f}{median(name, 'wal_fpi'):9,.0f}"
        )
    if {"baseline", "defaults", "unthrottled"} <= set(names):
        ratio = median("defaults", "p99") / base_p99
        keep = median("defaults", "rows_per_s") / median("unthrottled", "rows_per_s")
        print(
            "\ntarget (reported, not asserted): defaults p99 <= 1.25x baseline:"
            f" {ratio:.2f}x {'met' if ratio <= 1.25 else 'MISSED'};"
            f" defaults rows/s >= 0.5x unthrottled: {keep:.2f}x {'met' if keep >= 0.5 else 'MISSED'}"
            + (f"  (overrides {overrides})" if overrides else "")
        )
    if {"baseline", "budget"} <= set(names):
        ratio = median("budget", "p99") / base_p99
        print(
            f"target: budget p99 <= 1.3x baseline: {ratio:.2f}x"
            f" {'met' if ratio <= 1.3 else 'MISSED'}, cleaning at"
            f" {median('budget', 'rows_per_s'):,.0f} rows/s"
        )
    for ours_name in ("budget", "budget-p99"):
        if {ours_name, "hand-loop-50x"} <= set(names):
            print(
                f"side by side: {ours_name} p99 {median(ours_name, 'p99') * 1000:.2f} ms at"
                f" {median(ours_name, 'rows_per_s'):,.0f} rows/s; hand-loop-50x p99"
                f" {median('hand-loop-50x', 'p99') * 1000:.2f} ms at"
                f" {median('hand-loop-50x', 'rows_per_s'):,.0f} rows/s"
            )
    if {"defaults", "hand-loop"} <= set(names):
        ours, theirs = median("defaults", "p99"), median("hand-loop", "p99")
        speed = median("defaults", "rows_per_s") / median("hand-loop", "rows_per_s")
        print(
            f"target: defaults p99 <= hand-loop p99 at like rows/s: {ours * 1000:.2f} vs"
            f" {theirs * 1000:.2f} ms ({'met' if ours <= theirs else 'MISSED'}),"
            f" rows/s {speed:.2f}x the hand loop's"
        )


if __name__ == "__main__":
    raise SystemExit(main())
