"""The peer queues of bench/queue_throughput.py: pgqueuer and Oban-py.

Each peer has the same four parts: ``setup`` (its schema in a scratch database),
``enqueue`` (N no-op jobs in chunks, timed), ``drain_worker`` (the body of one
worker process: run until the queue is empty, report the ids the handler ran)
and ``latency_worker`` with ``latency_enqueue`` (one idle worker process, one
job at a time). They are optional: ``available()`` says which can be imported
and why not, and the bench prints that line instead of their rows.

The guarantee each offers, read from their sources (pgqueuer 1.6, Oban-py 0.7):
both run a job outside any transaction and acknowledge it afterwards, in
batches (pgqueuer: ``JobStatusLogBuffer``, at most ``batch_size`` jobs or
0.1 s; Oban-py: the producer's pending acks, written in one transaction at its
next fetch). A crash between the handler and the batch's commit runs the job
again: at least once, the same guarantee as expiry's ``batched_ack=True``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

PGQUEUER_BATCH = 100
"""pgqueuer's jobs a fetch (its ``batch_size``; the issue's figures used 100)."""
OBAN_LIMIT = 100
"""Oban-py's queue limit: jobs a producer runs at once."""


def available() -> dict[str, str | None]:
    """Each peer's name and None when it can run here, else why not."""
    reasons: dict[str, str | None] = {}
    if importlib.util.find_spec("pgqueuer") is None or importlib.util.find_spec("asyncpg") is None:
        reasons["pgqueuer"] = "pgqueuer[asyncpg] is not installed (make bench-peers)"
    else:
        reasons["pgqueuer"] = None
    if sys.version_info < (3, 12):
        reasons["oban"] = (
            f"Oban-py needs Python >= 3.12, this is {sys.version_info.major}."
            f"{sys.version_info.minor} (make bench-peers builds .venv-bench with one)"
        )
    elif importlib.util.find_spec("oban") is None:
        reasons["oban"] = "oban is not installed (make bench-peers)"
    else:
        reasons["oban"] = None
    return reasons


def _dsn(url: str) -> str:
    """The URL, with the bench's application_name for asyncpg (which does not
    read PGAPPNAME, as libpq does): the CPU meter finds backends by it."""
    name = os.environ.get("PGAPPNAME")
    if name and "application_name" not in url:
        url += ("&" if "?" in url else "?") + f"application_name={name}"
    return url


# -- pgqueuer -----------------------------------------------------------------


async def _pgqueuer_queries(url: str) -> Any:
    """pgqueuer's Queries on a connection of its own (``queries.conn``)."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(_dsn(url))
    queries = Queries(AsyncpgDriver(conn))
    queries.conn = conn
    return queries


def pgqueuer_setup(url: str) -> None:
    async def apply() -> None:
        queries = await _pgqueuer_queries(url)
        await queries.install()
        await queries.conn.close()

    asyncio.run(apply())


def pgqueuer_reset(url: str) -> None:
    async def apply() -> None:
        queries = await _pgqueuer_queries(url)
        conn = queries.conn
        await conn.execute("truncate pgqueuer, pgqueuer_log, pgqueuer_statistics")
        await conn.close()

    asyncio.run(apply())


def pgqueuer_enqueue(url: str, jobs: int, chunk: int) -> float:
    """Seconds to enqueue ``jobs`` no-op jobs, ``chunk`` a call."""

    async def apply() -> float:
        queries = await _pgqueuer_queries(url)
        sizes = [min(chunk, jobs - start) for start in range(0, jobs, chunk)]
        started = time.perf_counter()
        for size in sizes:
            await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
        seconds = time.perf_counter() - started
        await queries.conn.close()
        return seconds

    return asyncio.run(apply())


def pgqueuer_drain(url: str, ready: Callable[[], None]) -> list[int]:
    """Run one pgqueuer worker until the queue is empty; the job ids it ran."""
    from pgqueuer import QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    ran: list[int] = []

    async def apply() -> None:
        qm = QueueManager(await _pgqueuer_queries(url))

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            ran.append(int(job.id))

        await asyncio.to_thread(ready)
        await qm.run(
            batch_size=PGQUEUER_BATCH,
            mode=QueueExecutionMode.drain,
            dequeue_timeout=timedelta(seconds=1),
        )

    asyncio.run(apply())
    return ran


def pgqueuer_unfinished(url: str) -> int:
    async def apply() -> int:
        queries = await _pgqueuer_queries(url)
        conn = queries.conn
        left = int(await conn.fetchval("select count(*) from pgqueuer"))
        await conn.close()
        return left

    return asyncio.run(apply())


def pgqueuer_latency_worker(url: str, started: Callable[[int], None]) -> None:
    """An idle pgqueuer worker (continuous mode, LISTEN/NOTIFY) that calls
    ``started(i)`` as each probe job begins; runs until killed."""
    from pgqueuer import QueueManager

    async def apply() -> None:
        qm = QueueManager(await _pgqueuer_queries(url))

        @qm.entrypoint("probe")
        async def probe(job: Any) -> None:
            started(int(json.loads(job.payload)["i"]))

        await qm.run(batch_size=PGQUEUER_BATCH)

    asyncio.run(apply())


class PgqueuerClient:
    """Enqueues one latency probe at a time (a connection kept open)."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.queries = self.loop.run_until_complete(_pgqueuer_queries(url))

    def enqueue(self, i: int) -> None:
        payload = json.dumps({"i": i}).encode()
        self.loop.run_until_complete(self.queries.enqueue("probe", payload))

    def close(self) -> None:
        self.loop.run_until_complete(self.queries.conn.close())
        self.loop.close()


# -- Oban-py ----------------------------------------------------------------------

_oban_ran: list[int] = []
_oban_started: Callable[[int], None] | None = None

try:  # Oban finds a job's worker by module and class name: both at module level
    from oban import worker as _oban_worker
except ImportError:  # Python 3.11, or not installed: available() says why
    _oban_worker = None

if _oban_worker is not None:

    @_oban_worker(queue="default")
    class ObanNoop:
        async def process(self, job: Any) -> None:
            _oban_ran.append(int(job.id))

    @_oban_worker(queue="default")
    class ObanProbe:
        async def process(self, job: Any) -> None:
            if _oban_started is not None:
                _oban_started(int(job.args["i"]))


def _oban_workers() -> tuple[Any, Any]:
    return globals()["ObanNoop"], globals()["ObanProbe"]


async def _oban_pool(url: str, size: int = 4) -> Any:
    from oban import Oban

    return await Oban.create_pool(_dsn(url), min_size=1, max_size=size)


def oban_setup(url: str) -> None:
    async def apply() -> None:
        from oban import schema

        pool = await _oban_pool(url)
        await schema.install(pool)
        await pool.close()

    asyncio.run(apply())


def _oban_sql(url: str, query: str) -> Any:
    import psycopg

    with psycopg.connect(_dsn(url), autocommit=True) as conn:
        cursor = conn.execute(query)
        row = cursor.fetchone() if cursor.description else None
    return row[0] if row else None


def oban_reset(url: str) -> None:
    _oban_sql(url, "truncate oban_jobs restart identity")


def oban_enqueue(url: str, jobs: int, chunk: int) -> float:
    from oban import Oban

    noop, _ = _oban_workers()

    async def apply() -> float:
        pool = await _oban_pool(url)
        async with Oban(pool=pool, name=f"enqueue-{time.monotonic_ns()}") as oban:
            sizes = [min(chunk, jobs - start) for start in range(0, jobs, chunk)]
            started = time.perf_counter()
            for size in sizes:
                await oban.enqueue_many([noop.new() for _ in range(size)])
            seconds = time.perf_counter() - started
        await pool.close()
        return seconds

    return asyncio.run(apply())


def oban_completed(url: str) -> int:
    return int(_oban_sql(url, "select count(*) from oban_jobs where state = 'completed'"))


def oban_drain(url: str, jobs: int, ready: Callable[[], None]) -> list[int]:
    """Run one Oban-py node until every job of the table is completed (Oban has
    no drain mode for a running node: the table is read every 20 ms, one index
    count); the job ids it ran."""
    from oban import Oban

    _oban_workers()
    _oban_ran.clear()

    async def apply() -> None:
        pool = await _oban_pool(url, 8)
        async with Oban(pool=pool, queues={"default": OBAN_LIMIT}, name=f"drain-{id(pool)}"):
            await asyncio.to_thread(ready)
            async with pool.connection() as conn:
                while True:
                    cursor = await conn.execute(
                        "select count(*) from oban_jobs where state = 'completed'"
                    )
                    row = await cursor.fetchone()
                    if row is not None and row[0] >= jobs:
                        break
                    await asyncio.sleep(0.02)
        await pool.close()

    asyncio.run(apply())
    return list(_oban_ran)


def oban_latency_worker(url: str, started: Callable[[int], None]) -> None:
    from oban import Oban

    global _oban_started
    _oban_workers()
    _oban_started = started

    async def apply() -> None:
        pool = await _oban_pool(url)
        async with Oban(pool=pool, queues={"default": OBAN_LIMIT}, name="latency"):
            await asyncio.Event().wait()

    asyncio.run(apply())


class ObanClient:
    def __init__(self, url: str) -> None:
        from oban import Oban

        _, self.probe = _oban_workers()
        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(_oban_pool(url))
        self.oban = Oban(pool=self.pool, name="latency-client")
        self.loop.run_until_complete(self.oban.start())

    def enqueue(self, i: int) -> None:
        self.loop.run_until_complete(self.oban.enqueue(self.probe.new({"i": i})))

    def close(self) -> None:
        self.loop.run_until_complete(self.oban.stop())
        self.loop.run_until_complete(self.pool.close())
        self.loop.close()
