"""The seam's part for who acts: the workers' roll, API keys and the HTTP
API's idempotency records."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ...types import (
    ActiveKey,
    ApiKey,
    IdempotencyRecord,
    WorkerSeen,
)
from ..common import scopes_of
from .primitives import Primitives


class AccessSeam(Primitives):
    """The workers' roll, API keys and idempotency records."""

    def worker_seen(
        self,
        name: str,
        *,
        host: str,
        pid: int,
        threads: int,
        queues: Sequence[str],
        resting: Mapping[str, float],
        holding: int,
        health: Mapping[str, Any] | None = None,
        conn: Any | None = None,
    ) -> None:
        """A worker's roll call (every heartbeat): stored or refreshed, with its
        policies' throttles (health/database.py's snapshot), and any worker not seen for
        a day forgotten."""
        params = {
            "name": name,
            "host": host,
            "pid": pid,
            "threads": threads,
            "queues": json.dumps(list(queues)),
            "resting": json.dumps({q: round(s, 3) for q, s in resting.items()}),
            "holding": holding,
            "health": json.dumps(health or {}),
        }
        with self.transaction_or(conn) as tx:
            self._rows(tx, "worker_forget")
            self._rows(tx, "worker_seen", params)

    def worker_gone(self, name: str, *, conn: Any | None = None) -> None:
        """A worker that stopped cleanly leaves the roll."""
        self._tx_rows(conn, "worker_gone", {"name": name})

    def worker_list(self, *, conn: Any | None = None) -> list[WorkerSeen]:
        """The roll, newest first."""

        def loaded(value: Any) -> Any:
            return json.loads(value) if isinstance(value, str) else value

        return [
            WorkerSeen(
                name=row["name"],
                host=row["host"],
                pid=int(row["pid"]),
                threads=int(row["threads"]),
                queues=list(loaded(row["queues"])),
                resting=dict(loaded(row["resting"])),
                holding=int(row["holding"]),
                health=dict(loaded(row["health"])),
                started_at=self._time(row["started_at"]),
                seen_at=self._time(row["seen_at"]),
                seen_seconds_ago=max(0.0, float(row["seen_seconds_ago"])),
            )
            for row in self._tx_rows(conn, "worker_list")
        ]

    def key_insert(
        self,
        name: str,
        key_hash: str,
        scopes: Sequence[str] = ("admin",),
        *,
        conn: Any | None = None,
    ) -> bool:
        """Store a new key's hash and scopes; False when a key of that name exists
        (revoked or not)."""
        params = {"name": name, "hash": key_hash, "scopes": json.dumps(list(scopes))}
        return bool(self._tx_rows(conn, "key_insert", params))

    def key_list(self, *, conn: Any | None = None) -> list[ApiKey]:
        """Every key, revoked ones included, by name; never a secret or hash."""
        return [
            ApiKey(
                row["name"],
                self._time(row["created_at"]),
                self._maybe_time(row["revoked_at"]),
                scopes_of(row["scopes"]),
            )
            for row in self._tx_rows(conn, "key_list")
        ]

    def key_set_scopes(self, name: str, scopes: Sequence[str], *, conn: Any | None = None) -> bool:
        """Replace the scopes of a key in force; False when there is none of that name."""
        params = {"name": name, "scopes": json.dumps(list(scopes))}
        return bool(self._tx_rows(conn, "key_set_scopes", params))

    def key_revoke(self, name: str, *, conn: Any | None = None) -> bool:
        """Revoke a key; False when there is no key of that name still in force."""
        return bool(self._tx_rows(conn, "key_revoke", {"name": name}))

    def key_active(self, *, conn: Any | None = None) -> dict[str, ActiveKey]:
        """{name: its hash and scopes} of every key still in force."""
        return {
            row["name"]: ActiveKey(row["hash"], scopes_of(row["scopes"]))
            for row in self._tx_rows(conn, "key_active")
        }

    def idempotency_begin(
        self, api_key: str, key: str, request_hash: str, *, conn: Any | None = None
    ) -> bool:
        """Record a request under (api_key, key) as in flight; False when a record
        exists already (expired or not: see idempotency_get)."""
        params = {"api_key": api_key, "key": key, "hash": request_hash}
        return bool(self._tx_rows(conn, "idempotency_begin", params))

    def idempotency_get(
        self, api_key: str, key: str, *, conn: Any | None = None
    ) -> IdempotencyRecord | None:
        """The record of (api_key, key) if younger than 24 hours."""
        row = self._one(conn, "idempotency_get", {"api_key": api_key, "key": key})
        if row is None:
            return None
        status = row["status"]
        return IdempotencyRecord(
            row["request_hash"], None if status is None else int(status), row["body"]
        )

    def idempotency_finish(
        self, api_key: str, key: str, status: int, body: str, *, conn: Any | None = None
    ) -> None:
        """Store the first response (status and JSON body text) for replay."""
        params = {"api_key": api_key, "key": key, "status": status, "body": body}
        self._one(conn, "idempotency_finish", params)

    def idempotency_forget(self, api_key: str, key: str, *, conn: Any | None = None) -> None:
        """Drop the record of (api_key, key), and every record over 24 hours old."""
        self._one(conn, "idempotency_forget", {"api_key": api_key, "key": key})
