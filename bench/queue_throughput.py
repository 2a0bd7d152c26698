"""Queue throughput and latency: expiry's modes against its peers on the same PostgreSQL.

    .venv/bin/python bench/queue_throughput.py                 # 100,000 jobs; 1, 2 procs
    .venv-bench/bin/python bench/queue_throughput.py --jobs 50000 --rounds 3   # with Oban-py
    .venv/bin/python bench/queue_throughput.py --quick         # smoke run (2,000 jobs, 1 proc)
    .venv/bin/python bench/queue_throughput.py --concurrency 2 # the job threads `expiry worker` ships with

What it measures, on scratch databases it creates and drops itself:

* enqueue: N no-op jobs, ``--chunk`` a call, for expiry (``Queue.enqueue_many``)
  and each peer (its own batch insert);
* drain: N no-op jobs run to completion by 1, 2... worker *processes*, each mode
  of expiry with the guarantee it offers (the "promise" column):

  - ``expiry``: one transaction a job, the completion in it (tx);
  - ``expiry/group``: ``group_commit=True``, a claimed batch in one (tx);
  - ``expiry/ack``: ``transactional=False``, acknowledged after the handler,
    one commit a job (each);
  - ``expiry/batched``: ``transactional=False, batched_ack=True``,
    acknowledged after the handler in batches (batch);

  against the peers: procrastinate (each: ``concurrency=1, wait=False``),
  pgqueuer (batch: asyncpg, ``batch_size`` 100, drain mode) and Oban-py (batch:
  a queue limit of 100; it needs Python 3.12, ``make bench-peers`` builds
  ``.venv-bench`` with it). A peer that is not installed is skipped with a line
  saying why. Each mode's ratio is to the fastest peer whose promise is the
  same or weaker. ``floor: commit/job`` is the hand-written floor of one
  durable commit a job (one autocommitted UPDATE a job, nothing else, on as
  many connections a process as expiry has job threads, ``--concurrency``):
  what one transaction a job cannot beat. Every drain is checked exactly once: the
  ids each process's handler ran, and the peer's own table;
* latency: from the commit of a single enqueue to the handler starting in an
  idle worker process, for expiry on PostgreSQL (LISTEN/NOTIFY) and SQLite
  (polling) and for each peer, as p50/p99 over ``--samples``.

Every queue gets the same treatment between rounds: a truncated job table, the
enqueue, then VACUUM ANALYZE and CHECKPOINT before the drain, so no drain
pays for another's dirty pages. ``--rounds`` interleaves the rounds; the table
shows each one's median. Next to each rate is the CPU it cost: the worker
processes plus their own PostgreSQL backends (found by application_name in
/proc), which stays meaningful when other work shares the machine; the load
average is printed for the same reason. Targets are printed, never asserted;
the exit status is 2 when a drain left jobs unfinished (0 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import math
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import peers
from expiry import defaults
from expiry.app import App
from expiry.queue.jobs import new_job
from scratch import scratch_database

ADMIN_URL = os.environ.get(
    "EXPIRY_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

TARGET_ENQUEUE = 50_000.0
TARGET_PEER = 1.0  # each mode against the fastest peer of the same or a weaker promise
TARGET_FLOOR = 0.5  # one transaction a job against one bare durable commit a job
TARGET_LATENCY_MS = 10.0

GROUP = "expiry/group"  # group_commit=True: a claimed batch commits together
ACK = "expiry/ack"  # transactional=False: acknowledged after the handler, one commit a job
BATCHED = "expiry/batched"  # transactional=False, batched_ack=True
FLOOR = "floor: commit/job"  # by hand: one durable commit a job and nothing else
PEERS = ("procrastinate", "pgqueuer", "oban")

_CTX = mp.get_context("spawn")


# -- scratch databases --------------------------------------------------------


def settle(url: str, table: str) -> None:
    """VACUUM ANALYZE the freshly filled job table and flush dirty pages."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("vacuum analyze {}").format(sql.SQL(table)))
        conn.execute("checkpoint")


def scalar(url: str, query: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


# -- CPU accounting -------------------------------------------------------------


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used; NaN when /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return math.nan


class CpuMeter:
    """CPU seconds of this process and of the PostgreSQL backends it opened.

    Call ``tag()`` before the process opens any connection: every connection
    it then opens carries application_name ``qbench-<pid>`` (through PGAPPNAME),
    which is how its backends are found in pg_stat_activity. The server must be
    on this machine for /proc to see them; otherwise the figure is NaN."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = f"qbench-{os.getpid()}"
        self._own0 = 0.0
        self._backends0: dict[int, float] = {}

    @staticmethod
    def tag() -> None:
        os.environ["PGAPPNAME"] = f"qbench-{os.getpid()}"

    def _backends(self) -> dict[int, float]:
        with psycopg.connect(self.url, autocommit=True, application_name="qbench-meter") as c:
            pids = c.execute(
                "select pid from pg_stat_activity where application_name = %s", (self.name,)
            ).fetchall()
        return {pid: _proc_cpu(pid) for (pid,) in pids}

    def start(self) -> None:
        self._backends0 = self._backends()
        self._own0 = time.process_time()

    def stop(self) -> float:
        own = time.process_time() - self._own0
        backends = sum(cpu - self._backends0.get(pid, 0.0) for pid, cpu in self._backends().items())
        return own + backends


# -- results ------------------------------------------------------------------


@dataclass
class Result:
    phase: str  # "enqueue" or "drain"
    engine: str
    procs: int
    jobs: int
    seconds: float
    cpu: float  # CPU seconds: the processes and their own backends
    twice: int = 0  # handler runs beyond the first of a job (a redelivery)
    missing: int = 0  # jobs whose handler never ran

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else math.inf

    @property
    def cpu_us_per_job(self) -> float:
        return self.cpu / self.jobs * 1e6


def exactly_once(ran: list[list[int]], jobs: int) -> tuple[int, int]:
    """From the job ids each process's handler ran: the runs beyond a job's
    first, and the jobs never run (both 0 when every job ran exactly once)."""
    counts = Counter(job_id for part in ran for job_id in part)
    return sum(n - 1 for n in counts.values()), jobs - len(counts)


def checked(result: Result, ran: list[list[int]], jobs: int, finished: int) -> Result:
    """The drain's result with its exactly-once check, printed when it fails;
    ``finished`` is what the peer's own table says is done."""
    result.twice, result.missing = exactly_once(ran, jobs)
    if result.twice or result.missing or finished != jobs:
        print(
            f"    NOT EXACTLY ONCE: {result.engine}, {result.procs} procs: {result.twice} "
            f"second runs, {result.missing} jobs never run, {finished:,} of {jobs:,} "
            "done in its table",
            flush=True,
        )
    return result


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# -- drain: worker processes --------------------------------------------------


class WarningCounter(logging.Handler):
    """Counts the warnings a worker process logs, by message, instead of printing
    them: the report shows each one and how often it came."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[f"{record.levelname.lower()}: {record.msg}"] += 1

    @classmethod
    def install(cls, logger_name: str) -> WarningCounter:
        handler = cls()
        logger = logging.getLogger(logger_name)
        logger.addHandler(handler)
        logger.propagate = False
        return handler


MODES: dict[str, dict[str, Any]] = {
    "expiry": {},
    GROUP: {"group_commit": True},
    ACK: {"transactional": False},
    BATCHED: {"transactional": False, "batched_ack": True},
}
"""expiry's modes: the handler's registration options of each."""


def _expiry_drain_worker(
    url: str,
    batch: int,
    threads: int,
    mode: str,
    claim_ahead: bool,
    barrier: Barrier,
    results: Any,
) -> None:
    CpuMeter.tag()
    warnings = WarningCounter.install("expiry")
    meter = CpuMeter(url)
    app = App(url, pool_size=2 * threads + 2)  # a loop's claim ahead has a connection too
    ran: list[int] = []
    options = MODES[mode]

    if options.get("transactional", True):

        @app.handler("noop", **options)
        def noop(job: Any, tx: Any) -> None:
            ran.append(job.id)
    else:

        @app.handler("noop", **options)
        def noop_outside(job: Any) -> None:
            ran.append(job.id)

    app.queue.pending()  # open the pool before the clock starts
    worker = app.worker(batch=batch, concurrency=threads, until_idle=True, claim_ahead=claim_ahead)
    meter.start()
    barrier.wait()
    worker.run()
    finished = time.monotonic()
    results.put((ran, finished, meter.stop(), dict(warnings.counts)))
    app.close()


def _peer_drain_worker(peer: str, url: str, jobs: int, barrier: Barrier, results: Any) -> None:
    CpuMeter.tag()
    warnings = WarningCounter.install(peer)
    meter = CpuMeter(url)

    def ready() -> None:
        meter.start()
        barrier.wait()

    if peer == "pgqueuer":
        ran = peers.pgqueuer_drain(url, ready)
    else:
        ran = peers.oban_drain(url, jobs, ready)
    finished = time.monotonic()
    results.put((ran, finished, meter.stop(), dict(warnings.counts)))


def _floor_thread(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    for job_id in ids:
        conn.execute("update commit_floor set done = true where id = %s", (job_id,), prepare=True)


def _floor_worker(url: str, ids: list[int], threads: int, barrier: Barrier, results: Any) -> None:
    """The hand-written floor: one durable commit a job, nothing else (an
    autocommitted single-row UPDATE, prepared), on as many connections, each
    with a thread of its own, as expiry's worker has job threads."""
    CpuMeter.tag()
    meter = CpuMeter(url)
    conns = [psycopg.connect(url, autocommit=True) for _ in range(threads)]
    for conn in conns:
        conn.execute("select 1")
    meter.start()
    barrier.wait()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(_floor_thread, conns, [ids[t::threads] for t in range(threads)]))
    finished = time.monotonic()
    for conn in conns:
        conn.close()
    results.put((ids, finished, meter.stop(), {}))


def _procrastinate_drain_worker(url: str, barrier: Barrier, results: Any) -> None:
    import procrastinate

    CpuMeter.tag()
    warnings = WarningCounter.install("procrastinate")
    meter = CpuMeter(url)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    ran: list[int] = []

    @app.task(name="noop", pass_context=True)
    async def noop(context: Any) -> None:
        ran.append(context.job.id)

    async def run() -> None:
        async with app.open_async():
            await app.check_connection_async()  # the pool is open before the clock starts
            meter.start()
            await asyncio.to_thread(barrier.wait)
            await app.run_worker_async(concurrency=1, wait=False, install_signal_handlers=False)
            finished = time.monotonic()
            results.put((ran, finished, meter.stop(), dict(warnings.counts)))

    asyncio.run(run())


def run_processes(
    target: Callable[..., None], args: tuple[Any, ...], procs: int, timeout: float
) -> tuple[float, float, list[Any]]:
    """Start ``procs`` processes and release them together. Returns the seconds
    from the release to the last finish, their CPU seconds, and what each
    reported as processed; prints the warnings they logged."""
    barrier = _CTX.Barrier(procs + 1)
    results = _CTX.Queue()
    children = [_CTX.Process(target=target, args=(*args, barrier, results)) for _ in range(procs)]
    for child in children:
        child.start()
    try:
        barrier.wait(timeout=120)
        started = time.monotonic()
        reports = [results.get(timeout=timeout) for _ in children]
        for child in children:
            child.join(timeout=30)
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join()
    failed = [child.exitcode for child in children if child.exitcode != 0]
    if failed:
        raise RuntimeError(f"worker processes exited with {failed}")
    finished = max(report[1] for report in reports)
    cpu = sum(report[2] for report in reports)
    warnings: Counter[str] = Counter()
    for report in reports:
        warnings.update(report[3])
    for message, count in warnings.most_common():
        print(f"    worker log, {count}x: {message}", flush=True)
    return finished - started, cpu, [report[0] for report in reports]


# -- expiry -------------------------------------------------------------------


def expiry_round(
    url: str,
    jobs: int,
    procs: int,
    chunk: int,
    batch: int,
    threads: int,
    mode: str,
    claim_ahead: bool = False,
) -> list[Result]:
    app = App(url)
    meter = CpuMeter(url)
    try:
        with app.engine.transaction() as conn:
            conn.execute("truncate expiry.jobs, expiry.ledger, expiry.audit restart identity")
        batches = [
            [new_job("noop") for _ in range(start, min(start + chunk, jobs))]
            for start in range(0, jobs, chunk)
        ]
        meter.start()
        started = time.perf_counter()
        for part in batches:
            app.queue.enqueue_many(part)
        enqueue = time.perf_counter() - started
        enqueue_cpu = meter.stop()
    finally:
        app.close()
    settle(url, "expiry.jobs")
    seconds, cpu, ran = run_processes(
        _expiry_drain_worker,
        (url, batch, threads, mode, claim_ahead),
        procs,
        timeout=max(300.0, jobs / 50),
    )
    done = scalar(url, "select count(*) from expiry.jobs where state = 'completed'")
    drain = Result("drain", mode, procs, done, seconds, cpu)
    return [
        Result("enqueue", "expiry", 1, jobs, enqueue, enqueue_cpu),
        checked(drain, ran, jobs, done),
    ]


def floor_round(url: str, jobs: int, procs: int, threads: int) -> list[Result]:
    """One durable commit a job by hand, ``procs`` x ``threads`` connections in parallel."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("drop table if exists commit_floor")
        conn.execute("create table commit_floor (id bigint primary key, done boolean not null)")
        conn.execute(
            "insert into commit_floor select g, false from generate_series(1, %s) g", (jobs,)
        )
    settle(url, "commit_floor")
    shares = [list(range(1 + p, jobs + 1, procs)) for p in range(procs)]
    barrier = _CTX.Barrier(procs + 1)
    results = _CTX.Queue()
    children = [
        _CTX.Process(target=_floor_worker, args=(url, share, threads, barrier, results))
        for share in shares
    ]
    for child in children:
        child.start()
    barrier.wait(timeout=120)
    started = time.monotonic()
    reports = [results.get(timeout=max(300.0, jobs / 50)) for _ in children]
    for child in children:
        child.join(timeout=30)
    done = scalar(url, "select count(*) from commit_floor where done")
    seconds = max(r[1] for r in reports) - started
    drain = Result("drain", FLOOR, procs, done, seconds, sum(r[2] for r in reports))
    return [checked(drain, [r[0] for r in reports], jobs, done)]


# -- pgqueuer and Oban-py (bench/peers.py) -------------------------------------------


def peer_round(peer: str, url: str, jobs: int, procs: int, chunk: int) -> list[Result]:
    meter = CpuMeter(url)
    if peer == "pgqueuer":
        peers.pgqueuer_reset(url)
        meter.start()
        enqueue = peers.pgqueuer_enqueue(url, jobs, chunk)
        settle(url, "pgqueuer")
    else:
        peers.oban_reset(url)
        meter.start()
        enqueue = peers.oban_enqueue(url, jobs, chunk)
        settle(url, "oban_jobs")  # Oban's fetch plans badly on a table never analyzed
    enqueue_cpu = meter.stop()
    seconds, cpu, ran = run_processes(
        _peer_drain_worker, (peer, url, jobs), procs, timeout=max(300.0, jobs / 50)
    )
    if peer == "pgqueuer":
        done = jobs - peers.pgqueuer_unfinished(url)  # an acknowledged job leaves the table
    else:
        done = peers.oban_completed(url)
    drain = Result("drain", peer, procs, done, seconds, cpu)
    return [Result("enqueue", peer, 1, jobs, enqueue, enqueue_cpu), checked(drain, ran, jobs, done)]


# -- procrastinate --------------------------------------------------------------


def procrastinate_setup(url: str) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    async def apply() -> None:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(apply())


def procrastinate_round(url: str, jobs: int, procs: int, chunk: int) -> list[Result]:
    import procrastinate

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("truncate procrastinate_jobs restart identity cascade")
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    meter = CpuMeter(url)

    @app.task(name="noop")
    async def noop() -> None:
        return None

    async def enqueue() -> tuple[float, float]:
        async with app.open_async():
            await app.check_connection_async()
            sizes = [min(chunk, jobs - start) for start in range(0, jobs, chunk)]
            meter.start()
            started = time.perf_counter()
            for size in sizes:
                await noop.batch_defer_async(*({} for _ in range(size)))
            return time.perf_counter() - started, meter.stop()

    enqueue_seconds, enqueue_cpu = asyncio.run(enqueue())
    settle(url, "procrastinate_jobs")
    seconds, cpu, ran = run_processes(
        _procrastinate_drain_worker, (url,), procs, timeout=max(300.0, jobs / 20)
    )
    done = scalar(url, "select count(*) from procrastinate_jobs where status = 'succeeded'")
    drain = Result("drain", "procrastinate", procs, done, seconds, cpu)
    return [
        Result("enqueue", "procrastinate", 1, jobs, enqueue_seconds, enqueue_cpu),
        checked(drain, ran, jobs, done),
    ]


# -- latency: enqueue commit -> handler start ------------------------------------


def _latency_worker(kind: str, url: str, starts: Any) -> None:
    def started(i: int) -> None:
        starts.put((i, time.monotonic()))

    if kind == "pgqueuer":
        peers.pgqueuer_latency_worker(url, started)
        return
    if kind == "oban":
        peers.oban_latency_worker(url, started)
        return
    app = App(url, pool_size=2)

    @app.handler("probe")
    def probe(job: Any, tx: Any) -> None:
        started(job.payload["i"])

    app.queue.pending()
    app.worker(batch=1, until_idle=False).run()  # until SIGTERM
    app.close()


class ExpiryClient:
    def __init__(self, url: str) -> None:
        self.app = App(url)

    def enqueue(self, i: int) -> None:
        self.app.queue.enqueue("probe", {"i": i})

    def close(self) -> None:
        self.app.close()


def measure_latency(url: str, samples: int, kind: str = "expiry", warmup: int = 5) -> list[float]:
    """Seconds from each enqueue's commit to its handler starting, in an idle
    worker process; the first ``warmup`` samples (worker start-up) are dropped."""
    starts = _CTX.Queue()
    child = _CTX.Process(target=_latency_worker, args=(kind, url, starts))
    child.start()
    client: Any
    if kind == "pgqueuer":
        client = peers.PgqueuerClient(url)
    elif kind == "oban":
        client = peers.ObanClient(url)
    else:
        client = ExpiryClient(url)
    latencies: list[float] = []
    gaps = random.Random(7)
    try:
        for i in range(samples + warmup):
            # Let the worker go back to waiting, then enqueue at a random moment
            # (longer than SQLite's 50 ms poll period: a fixed gap would always
            # land at the same phase of the poll loop and bias its figure).
            time.sleep(gaps.uniform(0.01, 0.11))
            client.enqueue(i)
            committed = time.monotonic()
            index, began = starts.get(timeout=60)
            if index != i:
                raise RuntimeError(f"latency probe {i} saw job {index}")
            if i >= warmup:
                latencies.append(began - committed)
    finally:
        client.close()
        child.terminate()  # SIGTERM: the worker finishes the job in hand and stops
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()
    return latencies


# -- the report -------------------------------------------------------------------

ENGINES = ("expiry", GROUP, ACK, BATCHED, FLOOR, *PEERS)

GUARANTEES = {
    "tx": "the effect and the completion commit in one transaction (exactly-once effect)",
    "each": "acknowledged after the handler, one commit a job (at least once)",
    "batch": "acknowledged after the handler, in batches (at least once; a crash reruns a batch)",
}
GUARANTEE = {
    "expiry": "tx",
    GROUP: "tx",
    ACK: "each",
    BATCHED: "batch",
    "procrastinate": "each",
    "pgqueuer": "batch",
    "oban": "batch",
}
STRENGTH = {"tx": 2, "each": 1, "batch": 0}


def median_results(results: list[Result]) -> list[Result]:
    """One result for each (phase, engine, procs): the round of median rate."""
    groups: dict[tuple[str, str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.phase, r.engine, r.procs), []).append(r)
    return [sorted(rs, key=lambda r: r.rate)[(len(rs) - 1) // 2] for rs in groups.values()]


def best_peer(r: Result, drains: dict[tuple[str, int], Result]) -> Result | None:
    """The fastest peer at ``r``'s process count whose guarantee is the same as
    ``r``'s or weaker."""
    mine = STRENGTH[GUARANTEE[r.engine]]
    candidates = [
        drains[(p, r.procs)]
        for p in PEERS
        if (p, r.procs) in drains and STRENGTH[GUARANTEE[p]] <= mine
    ]
    return max(candidates, key=lambda p: p.rate, default=None)


def ratio_text(r: Result, drains: dict[tuple[str, int], Result]) -> str:
    if r.engine in PEERS or r.engine == FLOOR or r.phase != "drain":
        return "-"
    peer = best_peer(r, drains)
    return "-" if peer is None else f"{r.rate / peer.rate:.2f}x {peer.engine}"


def format_row(r: Result, procs: str, ratio: str) -> str:
    cpu = "-" if math.isnan(r.cpu) else f"{r.cpu_us_per_job:,.0f}"
    guarantee = GUARANTEE.get(r.engine, "-") if r.phase == "drain" else "-"
    return (
        f"{r.phase:<8} {r.engine:<18} {guarantee:<6} {procs:>5} {r.jobs:>8} {r.seconds:>9.3f} "
        f"{r.rate:>10,.0f} {cpu:>11} {ratio:>24}"
    )


def print_table(results: list[Result], rounds: list[Result]) -> None:
    header = (
        f"{'phase':<8} {'engine':<18} {'promise':<6} {'procs':>5} {'jobs':>8} {'seconds':>9} "
        f"{'jobs/s':>10} {'cpu us/job':>11} {'vs fastest peer, <= promise':>24}"
    )
    print(header)
    print("-" * len(header))
    drains = {(r.engine, r.procs): r for r in results if r.phase == "drain"}
    enqueues: dict[str, list[Result]] = {}
    for r in rounds:
        if r.phase == "enqueue":
            enqueues.setdefault(r.engine, []).append(r)
    best = {engine: max(rs, key=lambda r: r.rate) for engine, rs in enqueues.items()}
    for engine in ENGINES:
        if engine in best:
            print(format_row(best[engine], "-", "-"))
    for procs in sorted({p for _, p in drains}):
        for engine in ENGINES:
            if (engine, procs) in drains:
                r = drains[(engine, procs)]
                print(format_row(r, str(procs), ratio_text(r, drains)))
    print()
    print("promise: " + "; ".join(f"{k}: {v}" for k, v in GUARANTEES.items()))
    for engine, rs in enqueues.items():
        rates = ", ".join(f"{r.rate:,.0f}" for r in rs)
        print(f"enqueue rounds, {engine} (jobs/s): {rates}; the table shows the best")
    per_round: dict[tuple[str, int], list[Result]] = {}
    for r in rounds:
        if r.phase == "drain":
            per_round.setdefault((r.engine, r.procs), []).append(r)
    if any(len(rs) > 1 for rs in per_round.values()):
        for (engine, procs), rs in per_round.items():
            rates = ", ".join(f"{r.rate:,.0f}" for r in rs)
            print(f"drain rounds, {engine}, {procs} procs (jobs/s): {rates}; the table: median")


def print_latency(name: str, latencies: list[float]) -> None:
    ms = [v * 1000 for v in latencies]
    print(
        f"latency {name:<28} n={len(ms):<4} p50={percentile(ms, 50):7.2f} ms  "
        f"p99={percentile(ms, 99):7.2f} ms  max={max(ms):7.2f} ms"
    )


def print_targets(results: list[Result], latencies: dict[str, list[float]]) -> None:
    print("targets (reported, not asserted):")
    enqueue = [r.rate for r in results if r.phase == "enqueue" and r.engine == "expiry"]
    if enqueue:
        verdict = "ok" if max(enqueue) >= TARGET_ENQUEUE else "MISS"
        print(f"  enqueue_many >= {TARGET_ENQUEUE:,.0f} jobs/s: {max(enqueue):,.0f}  {verdict}")
    drains = {(r.engine, r.procs): r for r in results if r.phase == "drain"}
    for (engine, procs), r in sorted(drains.items()):
        if engine in PEERS or engine == FLOOR:
            continue
        peer = best_peer(r, drains)
        if peer is not None:
            ratio = r.rate / peer.rate
            verdict = "ok" if ratio >= TARGET_PEER else "MISS"
            print(
                f"  {engine} >= {TARGET_PEER:.1f}x the fastest peer of the same or a weaker "
                f"promise ({peer.engine}), {procs} procs: {ratio:.2f}x  {verdict}"
            )
    for (engine, procs), r in sorted(drains.items()):
        floor = drains.get((FLOOR, procs))
        if engine == "expiry" and floor is not None:
            ratio = r.rate / floor.rate
            verdict = "ok" if ratio >= TARGET_FLOOR else "MISS"
            print(
                f"  expiry (one transaction a job) >= {TARGET_FLOOR:.1f}x the commit floor, "
                f"{procs} procs: {ratio:.2f}x ({r.rate:,.0f} of {floor.rate:,.0f})  {verdict}"
            )
    for name, values in latencies.items():
        if name.startswith("expiry, postgres"):
            p99 = percentile([v * 1000 for v in values], 99)
            verdict = "ok" if p99 < TARGET_LATENCY_MS else "MISS"
            print(f"  due->start p99 < {TARGET_LATENCY_MS:.0f} ms, {name}: {p99:.2f} ms  {verdict}")


# -- main -------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="expiry queue throughput and latency, against its peers"
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per round (100000)")
    parser.add_argument(
        "--procs",
        type=lambda text: [int(p) for p in text.split(",") if p.strip()],
        default=[1, 2],
        help="worker process counts, comma separated (1,2)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (1)")
    parser.add_argument(
        "--batch",
        type=int,
        default=defaults.CLAIM_BATCH,
        help=f"expiry jobs per claim (the shipped [worker] claim_batch, {defaults.CLAIM_BATCH}: "
        f"pgqueuer's batch here is {peers.PGQUEUER_BATCH})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="expiry job threads per worker process, and the floor's connections (1; "
        "`expiry worker` ships with [worker] concurrency 2)",
    )
    parser.add_argument("--chunk", type=int, default=10_000, help="jobs per enqueue call (10000)")
    parser.add_argument("--samples", type=int, default=200, help="latency samples (200)")
    parser.add_argument("--admin-url", default=ADMIN_URL, help="where scratch databases are made")
    parser.add_argument(
        "--modes",
        type=lambda text: [m.strip() for m in text.split(",") if m.strip()],
        default=list(MODES),
        help=f"expiry modes, comma separated ({','.join(MODES)})",
    )
    parser.add_argument(
        "--peers",
        type=lambda text: [p.strip() for p in text.split(",") if p.strip()],
        default=list(PEERS),
        help="peer queues, comma separated, '' for none (procrastinate,pgqueuer,oban); "
        "one that is not installed is skipped with a line saying why",
    )
    parser.add_argument(
        "--no-procrastinate", action="store_true", help="the peers without procrastinate"
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the commit floor")
    parser.add_argument(
        "--claim-ahead",
        action="store_true",
        help="expiry's loops claim their next batch while they run one (the worker's "
        "claim_ahead=True; off as shipped)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2,000 jobs, 1 proc, 20 latency samples, no peers but procrastinate",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.procs, args.samples = 2_000, [1], 20
        args.chunk = min(args.chunk, 1_000)
        if "--peers" not in (argv if argv is not None else sys.argv[1:]):
            args.peers = ["procrastinate"]
    if args.no_procrastinate:
        args.peers = [p for p in args.peers if p != "procrastinate"]
    if min(args.jobs, args.chunk, args.batch, args.samples, args.rounds, args.concurrency) <= 0:
        parser.error(
            "--jobs, --chunk, --batch, --samples, --rounds and --concurrency must be positive"
        )
    if not args.procs or min(args.procs) <= 0:
        parser.error("--procs must list positive numbers")
    unknown = [m for m in args.modes if m not in MODES] + [p for p in args.peers if p not in PEERS]
    if unknown:
        parser.error(f"unknown modes or peers: {', '.join(unknown)}")
    return args


def usable_peers(wanted: list[str]) -> list[str]:
    """The peers of ``wanted`` that can run here; a line for each that cannot."""
    reasons = peers.available()
    reasons["procrastinate"] = (
        None if importlib.util.find_spec("procrastinate") else "procrastinate is not installed"
    )
    for peer in wanted:
        if reasons[peer] is not None:
            print(f"skipped peer {peer}: {reasons[peer]}", flush=True)
    return [p for p in wanted if reasons[p] is None]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # procrastinate warns when its App is built in __main__ (its CLI could not
    # import the tasks); here every process registers the task itself.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    CpuMeter.tag()
    load_before = os.getloadavg()
    print(
        f"queue throughput: {args.jobs:,} no-op jobs; procs {','.join(map(str, args.procs))}; "
        f"{args.rounds} rounds; expiry claim batch {args.batch}, {args.concurrency} job "
        f"threads a process; enqueue chunk "
        f"{args.chunk:,}; {os.cpu_count()} cpus; load average {load_before[0]:.2f}; "
        f"Python {sys.version.split()[0]}",
        flush=True,
    )
    chosen = usable_peers(args.peers)
    rounds: list[Result] = []
    latencies: dict[str, list[float]] = {}
    suffix = os.getpid()  # concurrent runs (the smoke test) must not share databases
    with contextlib.ExitStack() as stack:
        expiry_url = stack.enter_context(
            scratch_database(args.admin_url, f"expiry_bench_queue_{suffix}")
        )
        urls = {
            peer: stack.enter_context(scratch_database(args.admin_url, f"{peer}_bench_{suffix}"))
            for peer in chosen
        }
        app = App(expiry_url)
        app.migrate()
        app.close()
        for peer in chosen:
            SETUP[peer](urls[peer])
        for round_no in range(args.rounds):
            for procs in args.procs:
                # Every other round runs its queues in the reverse order: this
                # host's speed drifts over minutes, and a fixed order would hand
                # the same queue the same part of each round.
                for name in turn(["expiry", "floor", *chosen], round_no):
                    found = run_round(name, args, expiry_url, urls, procs)
                    for r in found:
                        if r.phase == "drain":
                            report(r, round_no)
                    rounds += found
        with psycopg.connect(expiry_url, autocommit=True) as conn:
            conn.execute("truncate expiry.jobs restart identity")
        latencies["expiry, postgres (LISTEN/NOTIFY)"] = measure_latency(expiry_url, args.samples)
        for peer in chosen:
            if peer != "procrastinate":
                RESET[peer](urls[peer])
                latencies[f"{peer}, postgres"] = measure_latency(urls[peer], args.samples, peer)
    with tempfile.TemporaryDirectory(prefix="expiry_bench_") as tmp:
        sqlite_url = f"sqlite:///{Path(tmp) / 'queue.db'}"
        app = App(sqlite_url)
        app.migrate()
        app.close()
        latencies["expiry, sqlite (50 ms polling)"] = measure_latency(sqlite_url, args.samples)

    results = median_results(rounds)
    print()
    print_table(results, rounds)
    print()
    for name, values in latencies.items():
        print_latency(name, values)
    print()
    print_targets(results, latencies)
    load_after = os.getloadavg()
    print(
        f"load average (1 min) before/after: {load_before[0]:.2f}/{load_after[0]:.2f} "
        f"on {os.cpu_count()} cpus; other work on the machine slows every figure"
    )
    broken = [r for r in rounds if r.phase == "drain" and (r.jobs != args.jobs or r.missing)]
    for r in broken:
        print(f"INCOMPLETE: {r.engine}, {r.procs} procs, finished {r.jobs:,} of {args.jobs:,} jobs")
    return 2 if broken else 0


SETUP: dict[str, Callable[[str], None]] = {
    "procrastinate": procrastinate_setup,
    "pgqueuer": peers.pgqueuer_setup,
    "oban": peers.oban_setup,
}
RESET: dict[str, Callable[[str], None]] = {
    "pgqueuer": peers.pgqueuer_reset,
    "oban": peers.oban_reset,
}


def turn(names: list[str], round_no: int) -> list[str]:
    """The queues of a round in order, reversed in every other round."""
    return names if round_no % 2 == 0 else names[::-1]


def run_round(
    name: str, args: argparse.Namespace, expiry_url: str, urls: dict[str, str], procs: int
) -> list[Result]:
    """One queue's enqueue and drain at ``procs`` processes (expiry: each of its
    modes; "floor": the commit floor, unless --no-floor)."""
    if name == "expiry":
        found: list[Result] = []
        for mode in args.modes:
            found += expiry_round(
                expiry_url,
                args.jobs,
                procs,
                args.chunk,
                args.batch,
                args.concurrency,
                mode,
                args.claim_ahead,
            )
        return found
    if name == "floor":
        return [] if args.no_floor else floor_round(expiry_url, args.jobs, procs, args.concurrency)
    if name == "procrastinate":
        return procrastinate_round(urls[name], args.jobs, procs, args.chunk)
    return peer_round(name, urls[name], args.jobs, procs, args.chunk)


def report(r: Result, round_no: int) -> None:
    print(f"  round {round_no + 1}: {r.engine}, {r.procs} procs: {r.rate:,.0f} jobs/s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
