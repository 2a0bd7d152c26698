"""What the engines and every part of the seam share: the named queries and
migrations loaded from each engine's package, a driver error's kind, payload
checks and small row helpers."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

from ..defaults import MAX_PAYLOAD_BYTES
from ..errors import (
    DatabaseUnavailable,
    MigrationError,
    PayloadTooLarge,
    PermanentError,
    TransientError,
)
from ..types import (
    RESERVED_PREFIX,
    EnqueueResult,
    Index,
    Job,
    NewJob,
)

Row = dict[str, Any]

SCHEMA_DRIFT_KINDS = frozenset({"undefined_table", "undefined_column"})
"""Error kinds that say a table or column is missing: a policy's table renamed,
dropped or altered under a running process. The policy is quarantined (its
jobs wait, no attempt spent) rather than its jobs dead-lettered."""

OUTAGE_KINDS = frozenset(
    {
        "connection_lost",
        "admin_shutdown",
        "crash_shutdown",
        "cannot_connect_now",
        "too_many_connections",
        "read_only",
        "disk_full",
        "pooler_mismatch",
        "node_not_ready",
    }
)
"""Error kinds that say the database, not the job, is failing: down, restarting,
failed over (read-only), full, a Galera node cut off from its cluster's
majority, or behind a transaction pooler expiry was not told of. A job they fail spends no attempt while the outage budget lasts
(queue/worker.py)."""

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(package: str, substitutions: dict[str, str] | None = None) -> dict[str, str]:
    """Read an engine package's ``queries/*.sql`` (one file a noun: jobs,
    ledger, runs, cron, access, database, samples) into {name: sql}. A name given twice
    is refused."""
    found: dict[str, str] = {}
    folder = resources.files(package).joinpath("queries")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text()
        for token, value in (substitutions or {}).items():
            text = text.replace(token, value)
        parts = _NAME.split(text)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found:
                raise MigrationError(f"{package}: query {name!r} is named twice")
            found[name] = body.strip()
    return found


def load_migrations(package: str) -> list[tuple[int, str]]:
    """The numbered migrations of an engine, in order: [(1, sql), ...]."""
    folder = resources.files(package).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d{4})_\w+\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text()))
    return sorted(found)


_PAYLOAD_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


def check_payload(payload: dict[str, Any]) -> str:
    """Serialize a payload, refusing one over the limit. The text is ASCII (non-ASCII
    characters are escaped), so its length is its size in bytes."""
    text = _PAYLOAD_ENCODER.encode(payload)
    if len(text) > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"payload is {len(text)} bytes; the limit is {MAX_PAYLOAD_BYTES} bytes "
            "(256 KiB): carry identifiers, not records"
        )
    return text


def run_of(job: NewJob) -> str | None:
    """The run a job belongs to, stored as jobs.run_id: only expiry's own jobs
    (a reserved handler in a reserved queue) are part of runs. A run_id in an
    application's payload is the application's data, never run bookkeeping."""
    run_id = job.payload.get("run_id")
    mine = job.queue.startswith(RESERVED_PREFIX) and job.handler.startswith(RESERVED_PREFIX)
    return run_id if mine and isinstance(run_id, str) else None


def scopes_of(value: Any) -> tuple[str, ...]:
    """Stored scopes (a JSON array, as text on SQLite) as a tuple."""
    return tuple(json.loads(value) if isinstance(value, str) else value)


def in_turns(jobs: Sequence[Job]) -> list[Job]:
    """Claimed jobs in the order a claim takes them: by priority, then the
    queues taking turns (every queue's first job before any queue's second),
    then run_at."""
    turn: dict[int, int] = {}
    seen: dict[str, int] = {}
    for job in sorted(jobs, key=lambda j: (j.priority, j.run_at, j.id)):
        turn[job.id] = seen[job.queue] = seen.get(job.queue, 0) + 1
    return sorted(jobs, key=lambda j: (j.priority, turn[j.id], j.run_at, j.id))


def enqueue_results(jobs: Sequence[NewJob], inserted: set[str]) -> list[EnqueueResult]:
    """Each job's result in the batch's order: enqueued when its key is one this
    batch inserted, the first time the batch names it."""
    seen: set[str] = set()
    results = []
    for job in jobs:
        results.append(EnqueueResult(job.key, job.key in inserted and job.key not in seen))
        seen.add(job.key)
    return results


MAX_INDEX_NAME = 60
"""index_statement's names are cut to this (PostgreSQL truncates past 63
bytes, MySQL refuses past 64 characters)."""


def index_leads(indexes: Sequence[Index], columns: Sequence[str]) -> bool:
    """Some index of ``indexes`` leads with ``columns``, in any order (a lookup
    by all of them can seek it). Column names compared without case (SQLite's
    and MySQL's are case-insensitive)."""
    wanted = {c.lower() for c in columns}
    return any(
        len(index.columns) >= len(wanted)
        and {c.lower() for c in index.columns[: len(wanted)]} == wanted
        for index in indexes
    )


def ledger_params(key: str, **fields: Any) -> dict[str, Any]:
    """The ledger_insert query's parameters: ``key`` and whichever fields are known."""
    named = ("policy", "run_id", "lo", "hi", "bounds", "blocked", "action", "worker")
    return {
        "key": key,
        **{f: fields.get(f) for f in named},
        "rows": fields.get("rows", 0),
        "kept": fields.get("kept", 0),
    }


def classify_exception(exc: BaseException) -> tuple[bool, str] | None:
    """Errors every engine classifies the same way: (transient, kind)."""
    if isinstance(exc, PermanentError):
        return False, type(exc).__name__
    if isinstance(exc, TransientError):
        return True, exc.kind or type(exc).__name__
    if isinstance(exc, DatabaseUnavailable):
        return True, "connection_lost"
    return None
