"""Shared helpers for the queue tests: direct SQL on expiry's own tables.

The tests reach under the queue only to move time (make a job due, expire a
lease, age a finished job) and to read what the database really holds. Each
helper writes its SQL once for PostgreSQL, with ``{now}`` for the database's
clock, and the tests' dialect profile (tests/dialects.py) moves it into the
engine's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dialects import dialect
from expiry.engines import Engine

PROC = Path(__file__).with_name("_proc.py")


def sql(engine: Engine, statement: str) -> str:
    """``statement`` in this engine's dialect (tests/dialects.py)."""
    return dialect(engine).translate(statement)


def seconds(engine: Engine, expr: str) -> str:
    """An SQL expression of ``expr`` seconds that adds to this engine's times."""
    return dialect(engine).seconds(expr)


def execute(engine: Engine, statement: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Run one statement in its own transaction; return its rows as dicts."""
    with engine.transaction() as conn:
        cur = conn.execute(sql(engine, statement), tuple(params))
        return list(cur.fetchall()) if cur.description is not None else []


def make_due(engine: Engine, keys: Sequence[str] | None = None) -> None:
    """Move waiting jobs (all, or those of ``keys``) to one second ago."""
    where = "state in ('scheduled', 'available', 'retryable')"
    execute(
        engine,
        f"update expiry.jobs set run_at = {{now}} - {seconds(engine, '1')} where {where}"
        + ("" if keys is None else f" and key in ({', '.join('%s' for _ in keys)})"),
        list(keys or ()),
    )


def expire_leases(engine: Engine) -> None:
    """Make every running claim's lease one second overdue."""
    execute(
        engine,
        f"update expiry.jobs set lease_expires_at = {{now}} - {seconds(engine, '1')}"
        " where state = 'running'",
    )


def age_finished(engine: Engine, keys: Sequence[str], by_seconds: float) -> None:
    """Pretend the jobs of ``keys`` finished ``by_seconds`` earlier than they did."""
    marks = ", ".join("%s" for _ in keys)
    execute(
        engine,
        f"update expiry.jobs set finished_at = finished_at - {seconds(engine, '%s')}"
        f" where key in ({marks})",
        [by_seconds, *keys],
    )


def placeholder(engine: Engine) -> str:
    """The driver's own parameter style, as handlers write it."""
    return "?" if engine.dialect == "sqlite" else "%s"


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll ``predicate`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.02)


def spawn(*args: str) -> subprocess.Popen[bytes]:
    """Start ``tests/queue/_proc.py`` with this interpreter."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, str(PROC), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> tuple[int, str]:
    """Wait for a subprocess; return (exit code, its stderr). Kills it on timeout."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"subprocess did not exit in {timeout}s:\n{err.decode()}") from None
    return proc.returncode, err.decode()
