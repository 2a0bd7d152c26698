"""Queue throughput and latency: expiry against procrastinate on the same PostgreSQL.

    .venv/bin/python bench/queue_throughput.py                 # 100,000 jobs; 1, 2, 4 procs
    .venv/bin/python bench/queue_throughput.py --jobs 20000 --procs 1,2
    .venv/bin/python bench/queue_throughput.py --quick         # smoke run (2,000 jobs, 1 proc)

What it measures, on scratch databases it creates and drops itself:

* enqueue: ``Queue.enqueue_many`` of N no-op jobs (``--chunk`` jobs a call),
  against procrastinate's ``Task.batch_defer_async`` with the same chunks;
* drain: N no-op jobs run to completion by 1, 2, 4... worker *processes*:
  ``expiry.worker.Worker(batch=..., until_idle=True)`` against procrastinate's
  worker with ``concurrency=1, wait=False``. expiry drains twice: with one
  transaction a job (the default), and as ``expiry/group``, the handler
  registered with ``group_commit=True`` (a claimed batch commits together).
  The clock starts at a barrier every
  process reaches after its start-up and stops at the last process's finish;
* latency: from the commit of a single ``enqueue()`` (the call returned) to
  the handler starting in an idle worker process, on PostgreSQL (LISTEN/NOTIFY)
  and on SQLite (polling), as p50/p99 over ``--samples``.

Both engines get the same treatment between rounds: a truncated job table, the
enqueue, then VACUUM ANALYZE and CHECKPOINT before the drain, so neither drain
pays for the other's dirty pages. Next to each rate is the CPU it cost: the
worker processes plus their own PostgreSQL backends (found by application_name
in /proc), which stays meaningful when other work shares the machine; the load
average is printed for the same reason. Targets are printed, never asserted;
the exit status is 2 when a drain left jobs unfinished (0 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
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
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from expiry.app import App
from expiry.queue import new_job
from scratch import scratch_database

ADMIN_URL = os.environ.get(
    "EXPIRY_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

TARGET_ENQUEUE = 50_000.0
TARGET_DRAIN = 5_000.0
TARGET_RATIO = 3.0

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

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else math.inf

    @property
    def cpu_us_per_job(self) -> float:
        return self.cpu / self.jobs * 1e6


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


def _expiry_drain_worker(
    url: str, batch: int, group_commit: bool, barrier: Barrier, results: Any
) -> None:
    CpuMeter.tag()
    warnings = WarningCounter.install("expiry")
    meter = CpuMeter(url)
    app = App(url, pool_size=2)

    @app.handler("noop", group_commit=group_commit)
    def noop(job: Any, tx: Any) -> None:
        return None

    app.queue.pending()  # open the pool before the clock starts
    worker = app.worker(batch=batch, until_idle=True)
    meter.start()
    barrier.wait()
    worker.run()
    finished = time.monotonic()
    results.put((worker.processed, finished, meter.stop(), dict(warnings.counts)))
    app.close()


def _procrastinate_drain_worker(url: str, barrier: Barrier, results: Any) -> None:
    import procrastinate

    CpuMeter.tag()
    warnings = WarningCounter.install("procrastinate")
    meter = CpuMeter(url)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    async def run() -> None:
        async with app.open_async():
            await app.check_connection_async()  # the pool is open before the clock starts
            meter.start()
            await asyncio.to_thread(barrier.wait)
            await app.run_worker_async(concurrency=1, wait=False, install_signal_handlers=False)
            finished = time.monotonic()
            results.put((None, finished, meter.stop(), dict(warnings.counts)))

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
    url: str, jobs: int, procs: int, chunk: int, batch: int, group_commit: bool
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
    seconds, cpu, processed = run_processes(
        _expiry_drain_worker, (url, batch, group_commit), procs, timeout=max(300.0, jobs / 50)
    )
    done = scalar(url, "select count(*) from expiry.jobs where state = 'completed'")
    if done != jobs:
        print(f"    INCOMPLETE: expiry completed {done:,} of {jobs:,} jobs", flush=True)
    if sum(processed) != jobs:  # retries after errors (a database restart, say)
        print(f"    note: {sum(processed):,} attempts for {jobs:,} jobs", flush=True)
    return [
        Result("enqueue", "expiry", 1, jobs, enqueue, enqueue_cpu),
        Result("drain", GROUP if group_commit else "expiry", procs, done, seconds, cpu),
    ]


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
    seconds, cpu, _ = run_processes(
        _procrastinate_drain_worker, (url,), procs, timeout=max(300.0, jobs / 20)
    )
    done = scalar(url, "select count(*) from procrastinate_jobs where status = 'succeeded'")
    if done != jobs:
        print(f"    INCOMPLETE: procrastinate finished {done:,} of {jobs:,} jobs", flush=True)
    return [
        Result("enqueue", "procrastinate", 1, jobs, enqueue_seconds, enqueue_cpu),
        Result("drain", "procrastinate", procs, done, seconds, cpu),
    ]


# -- latency: enqueue commit -> handler start ------------------------------------


def _latency_worker(url: str, starts: Any) -> None:
    app = App(url, pool_size=2)

    @app.handler("probe")
    def probe(job: Any, tx: Any) -> None:
        starts.put((job.payload["i"], time.monotonic()))

    app.queue.pending()
    app.worker(batch=1, until_idle=False).run()  # until SIGTERM
    app.close()


def measure_latency(url: str, samples: int, warmup: int = 5) -> list[float]:
    """Seconds from each enqueue's commit to its handler starting, in an idle
    worker process; the first ``warmup`` samples (worker start-up) are dropped."""
    starts = _CTX.Queue()
    child = _CTX.Process(target=_latency_worker, args=(url, starts))
    child.start()
    app = App(url)
    latencies: list[float] = []
    gaps = random.Random(7)
    try:
        for i in range(samples + warmup):
            # Let the worker go back to waiting, then enqueue at a random moment
            # (longer than SQLite's 50 ms poll period: a fixed gap would always
            # land at the same phase of the poll loop and bias its figure).
            time.sleep(gaps.uniform(0.01, 0.11))
            app.queue.enqueue("probe", {"i": i})
            committed = time.monotonic()
            index, began = starts.get(timeout=60)
            if index != i:
                raise RuntimeError(f"latency probe {i} saw job {index}")
            if i >= warmup:
                latencies.append(began - committed)
    finally:
        app.close()
        child.terminate()  # SIGTERM: the worker finishes the job in hand and stops
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()
    return latencies


# -- the report -------------------------------------------------------------------

GROUP = "expiry/group"  # the no-op handler registered with group_commit=True
ENGINES = ("expiry", GROUP, "procrastinate")


def ratio_text(r: Result, peers: dict[str, Result]) -> str:
    peer = peers.get("procrastinate")
    if r.engine == "procrastinate" or peer is None:
        return "-"
    return f"{r.rate / peer.rate:.2f}x"


def format_row(r: Result, procs: str, ratio: str) -> str:
    cpu = "-" if math.isnan(r.cpu) else f"{r.cpu_us_per_job:,.0f}"
    return (
        f"{r.phase:<8} {r.engine:<14} {procs:>5} {r.jobs:>8} {r.seconds:>9.3f} "
        f"{r.rate:>10,.0f} {cpu:>12} {ratio:>21}"
    )


def print_table(results: list[Result]) -> None:
    header = (
        f"{'phase':<8} {'engine':<14} {'procs':>5} {'jobs':>8} {'seconds':>9} "
        f"{'jobs/s':>10} {'cpu us/job':>12} {'expiry/procrastinate':>21}"
    )
    print(header)
    print("-" * len(header))
    enqueues: dict[str, list[Result]] = {}
    for r in results:
        if r.phase == "enqueue":
            enqueues.setdefault(r.engine, []).append(r)
    best = {engine: max(rs, key=lambda r: r.rate) for engine, rs in enqueues.items()}
    for engine in ENGINES:
        if engine in best:
            print(format_row(best[engine], "-", ratio_text(best[engine], best)))
    drains = {(r.engine, r.procs): r for r in results if r.phase == "drain"}
    for procs in sorted({p for _, p in drains}):
        peers = {e: drains[(e, procs)] for e in ENGINES if (e, procs) in drains}
        for r in peers.values():
            print(format_row(r, str(procs), ratio_text(r, peers)))
    print()
    for engine, rs in enqueues.items():
        rates = ", ".join(f"{r.rate:,.0f}" for r in rs)
        print(f"enqueue rounds, {engine} (jobs/s): {rates}; the table shows the best")


def print_latency(name: str, latencies: list[float]) -> None:
    ms = [v * 1000 for v in latencies]
    print(
        f"latency {name:<24} n={len(ms):<4} p50={percentile(ms, 50):7.2f} ms  "
        f"p99={percentile(ms, 99):7.2f} ms  max={max(ms):7.2f} ms"
    )


def print_targets(results: list[Result]) -> None:
    print("targets (reported, not asserted):")
    enqueue = [r.rate for r in results if r.phase == "enqueue" and r.engine == "expiry"]
    if enqueue:
        verdict = "ok" if max(enqueue) >= TARGET_ENQUEUE else "MISS"
        print(f"  enqueue_many >= {TARGET_ENQUEUE:,.0f} jobs/s: {max(enqueue):,.0f}  {verdict}")
    drains = {(r.engine, r.procs): r for r in results if r.phase == "drain"}
    ours = [r for (engine, _), r in drains.items() if engine != "procrastinate"]
    if ours:
        top = max(ours, key=lambda r: r.rate)
        verdict = "ok" if top.rate >= TARGET_DRAIN else "MISS"
        print(
            f"  drain >= {TARGET_DRAIN:,.0f} jobs/s: {top.rate:,.0f} "
            f"({top.engine}, {top.procs} procs)  {verdict}"
        )
    for (engine, procs), r in sorted(drains.items()):
        peer = drains.get(("procrastinate", procs))
        if engine != "procrastinate" and peer is not None:
            ratio = r.rate / peer.rate
            verdict = "ok" if ratio >= TARGET_RATIO else "MISS"
            print(
                f"  drain >= {TARGET_RATIO:.0f}x procrastinate, {engine}, {procs} procs: "
                f"{ratio:.2f}x  {verdict}"
            )


# -- main -------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="expiry queue throughput and latency, against procrastinate"
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per round (100000)")
    parser.add_argument(
        "--procs",
        type=lambda text: [int(p) for p in text.split(",") if p.strip()],
        default=[1, 2, 4],
        help="worker process counts, comma separated (1,2,4)",
    )
    parser.add_argument("--batch", type=int, default=64, help="expiry jobs per claim (64)")
    parser.add_argument("--chunk", type=int, default=10_000, help="jobs per enqueue call (10000)")
    parser.add_argument("--samples", type=int, default=200, help="latency samples (200)")
    parser.add_argument("--admin-url", default=ADMIN_URL, help="where scratch databases are made")
    parser.add_argument("--no-procrastinate", action="store_true", help="measure expiry only")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2,000 jobs, 1 proc, 20 latency samples"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.procs, args.samples = 2_000, [1], 20
        args.chunk = min(args.chunk, 1_000)
    if args.jobs <= 0 or args.chunk <= 0 or args.batch <= 0 or args.samples <= 0:
        parser.error("--jobs, --chunk, --batch and --samples must be positive")
    if not args.procs or min(args.procs) <= 0:
        parser.error("--procs must list positive numbers")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # procrastinate warns when its App is built in __main__ (its CLI could not
    # import the tasks); here every process registers the task itself.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    CpuMeter.tag()
    load_before = os.getloadavg()
    print(
        f"queue throughput: {args.jobs:,} no-op jobs; procs {','.join(map(str, args.procs))}; "
        f"expiry claim batch {args.batch}; enqueue chunk {args.chunk:,}; {os.cpu_count()} cpus; "
        f"load average {load_before[0]:.2f}",
        flush=True,
    )
    results: list[Result] = []
    latencies: dict[str, list[float]] = {}
    suffix = os.getpid()  # concurrent runs (the smoke test) must not share databases
    with (
        scratch_database(args.admin_url, f"expiry_bench_queue_{suffix}") as expiry_url,
        scratch_database(args.admin_url, f"procrastinate_bench_{suffix}") as procrastinate_url,
    ):
        app = App(expiry_url)
        app.migrate()
        app.close()
        if not args.no_procrastinate:
            procrastinate_setup(procrastinate_url)
        for procs in args.procs:
            for group_commit in (False, True):
                results += expiry_round(
                    expiry_url, args.jobs, procs, args.chunk, args.batch, group_commit
                )
                print(
                    f"  drained: {results[-1].engine}, {procs} procs: "
                    f"{results[-1].rate:,.0f} jobs/s",
                    flush=True,
                )
            if not args.no_procrastinate:
                results += procrastinate_round(procrastinate_url, args.jobs, procs, args.chunk)
                print(
                    f"  drained: procrastinate, {procs} procs: {results[-1].rate:,.0f} jobs/s",
                    flush=True,
                )
        with psycopg.connect(expiry_url, autocommit=True) as conn:
            conn.execute("truncate expiry.jobs restart identity")
        latencies["postgres (LISTEN/NOTIFY)"] = measure_latency(expiry_url, args.samples)
    with tempfile.TemporaryDirectory(prefix="expiry_bench_") as tmp:
        sqlite_url = f"sqlite:///{Path(tmp) / 'queue.db'}"
        app = App(sqlite_url)
        app.migrate()
        app.close()
        latencies["sqlite (50 ms polling)"] = measure_latency(sqlite_url, args.samples)

    print()
    print_table(results)
    print()
    for name, values in latencies.items():
        print_latency(name, values)
    print()
    print_targets(results)
    load_after = os.getloadavg()
    print(
        f"load average (1 min) before/after: {load_before[0]:.2f}/{load_after[0]:.2f} "
        f"on {os.cpu_count()} cpus; other work on the machine slows every figure"
    )
    incomplete = [r for r in results if r.phase == "drain" and r.jobs != args.jobs]
    for r in incomplete:
        print(f"INCOMPLETE: {r.engine}, {r.procs} procs, finished {r.jobs:,} of {args.jobs:,} jobs")
    return 2 if incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
