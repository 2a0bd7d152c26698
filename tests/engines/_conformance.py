"""Helpers for the engine conformance tests (tests/engines/test_conformance_*.py).

The tests talk to the engine through its methods; they reach under it only to
move a stored time into the past or to read what a table holds. That SQL is
written once for PostgreSQL and moved into the engine's dialect by the tests'
one dialect profile (tests/dialects.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from dialects import dialect
from expiry.engines import Engine
from expiry.types import Job, NewJob


def translate(engine: Engine, statement: str) -> str:
    """A statement written for PostgreSQL, in this engine's dialect."""
    return dialect(engine).translate(statement)


def execute(engine: Engine, statement: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Run one statement in its own transaction; its rows as dicts."""
    statement = translate(engine, statement)
    with engine.transaction() as conn:
        cur = conn.execute(statement, tuple(params))
        return list(cur.fetchall()) if cur.description is not None else []


def age(engine: Engine, table: str, column: str, seconds: float, where: str = "true") -> None:
    """Move ``column`` of the rows of ``table`` matching ``where`` ``seconds`` back."""
    amount = dialect(engine).seconds(seconds)
    execute(engine, f"update expiry.{table} set {column} = {column} - {amount} where {where}")


def set_time(engine: Engine, table: str, column: str, value: datetime, key: str, id: str) -> None:
    """Store ``value`` in ``column`` of the row whose ``key`` column is ``id``."""
    execute(
        engine,
        f"update expiry.{table} set {column} = %s where {key} = %s",
        (engine.time_param(value), id),
    )


def is_utc(value: datetime | None) -> bool:
    """An aware datetime in UTC, as every engine method returns times."""
    return value is not None and value.utcoffset() == timedelta(0)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def queue_of(key: str) -> str:
    """The queue a test job waits in alone: one of expiry's own (only those
    jobs are part of runs), named after its key."""
    return f"expiry.test.{key}"


def enqueue(engine: Engine, key: str, run_id: str | None, handler: str = "expiry.window") -> None:
    """A due job of ``run_id``, alone in a queue named after its key (so that
    ``claim`` takes exactly it)."""
    payload: dict[str, Any] = {"run_id": run_id} if run_id else {}
    engine.job_insert_many([NewJob(handler, payload, key, queue=queue_of(key))])


def claim(engine: Engine, key: str) -> Job:
    [job] = engine.job_claim([queue_of(key)], 1, 30.0, "conformance")
    return job


def complete(engine: Engine, key: str, run_id: str | None, handler: str = "expiry.window") -> Job:
    """A job of ``run_id`` run to completion; the job as it ended."""
    enqueue(engine, key, run_id, handler)
    engine.job_complete(claim(engine, key))
    done = engine.job_get(key)
    assert done is not None
    return done


def drop_expiry_tables(engine: Engine) -> None:
    """Drop every table of expiry's own, as if it had never been migrated."""
    if engine.dialect == "postgres":
        execute(engine, "drop schema expiry cascade")
        return
    listed = {
        "sqlite": "select name from sqlite_master where type = 'table' and name like 'expiry%'",
        "mysql": "select table_name as name from information_schema.tables"
        " where table_schema = database() and table_name like 'expiry%%'",
    }[engine.dialect]
    for row in execute(engine, listed):
        execute(engine, f"drop table {engine.quote(row['name'])}")
