"""API keys: create, list, scope and revoke them, and resolve a presented
secret to the key (its name and scopes) that may act.

A key's secret is ``exp_`` and 256 random bits, shown once when it is made;
the database keeps only its SHA-256. ``Keys`` holds the one cache of the
active keys' hashes, re-read at most once a second so that a revoke (from
this process or another: ``expiry keys revoke NAME``) takes effect within a
second. The HTTP server builds one ``Keys``: the bearer-key check, the
Idempotency-Key owner and the dashboard's sessions all read that cache.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .engines.base import Engine
from .errors import ConfigError
from .types import RESERVED_PREFIX, ActiveKey, ApiKey, AuditAction

REFRESH_SECONDS = 1.0
"""The longest the active keys are trusted before they are read again."""

SCOPES = {
    "admin": "everything, including other keys' cron targets",
    "read": "read policies, runs, the queue's state and the dashboard's pages "
    "(another queue's jobs with its queue:consume scope)",
    "cleanup:trigger": "open, pause, resume and cancel runs of policies",
    "cleanup:approve": "approve the runs of policies with approve = true (after their preview)",
    "cron:manage": "create and manage the key's own cron targets",
    "dlq:manage": "review, redrive and discard every dead job, expiry's own too",
    "queue:publish:PATTERN": "publish to the queues PATTERN matches (fnmatch: orders.*)",
    "queue:consume:PATTERN": "receive, ack, nack and heartbeat on them, and their dead jobs",
}
"""Every scope a key can hold, with what it allows."""

QUEUE_VERBS = ("publish", "consume")


def check_scope(scope: str) -> str:
    """A scope as given, or ConfigError naming the ones there are."""
    verb, _, pattern = scope.removeprefix("queue:").partition(":")
    if scope in SCOPES and "PATTERN" not in scope:
        return scope
    if scope.startswith("queue:") and verb in QUEUE_VERBS and pattern:
        if pattern.startswith(RESERVED_PREFIX):
            raise ConfigError(
                f"scope {scope!r}: queues starting with {RESERVED_PREFIX!r} are expiry's own; "
                "no key publishes to or consumes from them"
            )
        return scope
    known = ", ".join(SCOPES)
    raise ConfigError(f"unknown scope {scope!r}: use one of {known}")


@dataclass(frozen=True)
class Principal:
    """The key a request acts as: its name and what its scopes allow."""

    name: str
    scopes: tuple[str, ...]

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes

    def can(self, scope: str) -> bool:
        """Holds ``scope`` (read, cleanup:trigger, cron:manage, dlq:manage), or admin."""
        return self.admin or scope in self.scopes

    def can_queue(self, verb: str, queue: str) -> bool:
        """May ``verb`` (publish, consume) on ``queue``: never one of expiry's own;
        an admin key on any other, else a matching queue scope."""
        if queue.startswith(RESERVED_PREFIX):
            return False
        if self.admin:
            return True
        prefix = f"queue:{verb}:"
        return any(
            fnmatch.fnmatchcase(queue, s.removeprefix(prefix))
            for s in self.scopes
            if s.startswith(prefix)
        )

    def can_see_queue(self, queue: str) -> bool:
        """May read the jobs of ``queue`` (payloads, errors, keys) where the
        dashboard shows them, as the API would: expiry's own queues with the read
        scope (their payloads are a run's windows), any queue with dlq:manage,
        else a queue it may consume."""
        if queue.startswith(RESERVED_PREFIX):
            return self.can("read") or self.can("dlq:manage")
        return self.can("dlq:manage") or self.can_queue("consume", queue)


def hash_key(secret: str) -> str:
    """The stored form of a secret."""
    # Keys are 256 random bits, so one SHA-256 is enough: there is nothing to brute-force.
    return hashlib.sha256(secret.encode()).hexdigest()


class Keys:
    """The API keys of one database, with a cache of the active ones' hashes."""

    def __init__(self, engine: Engine, *, refresh: float = REFRESH_SECONDS) -> None:
        self.engine, self.refresh = engine, refresh
        self._active: dict[str, ActiveKey] = {}
        self._loaded: float | None = None
        self._lock = threading.Lock()

    def create(
        self, name: str, scopes: Sequence[str] = ("admin",), *, actor: str = "operator"
    ) -> str:
        """Store a new key's hash with its scopes; return its secret (shown once)."""
        scopes = [check_scope(s) for s in scopes] or ["admin"]
        secret = "exp_" + secrets.token_urlsafe(32)
        with self.engine.transaction() as conn:
            if not self.engine.key_insert(name, hash_key(secret), scopes, conn=conn):
                raise ConfigError(
                    f"a key named {name!r} exists already; revoke it or pick another name"
                )
            self.engine.audit_append(
                conn, AuditAction.KEY_CREATED, actor=actor, detail={"name": name, "scopes": scopes}
            )
        with self._lock:
            self._loaded = None  # this process knows it at once
        return secret

    def set_scopes(self, name: str, scopes: Sequence[str], *, actor: str = "operator") -> None:
        """Replace a key's scopes (narrow an old admin key); audited. ConfigError
        for no such key in force, or a scope that does not exist."""
        checked = [check_scope(s) for s in scopes]
        if not checked:
            raise ConfigError("give at least one --scope")
        with self.engine.transaction() as conn:
            if not self.engine.key_set_scopes(name, checked, conn=conn):
                raise ConfigError(f"no key named {name!r} is in force")
            self.engine.audit_append(
                conn, AuditAction.KEY_SCOPED, actor=actor, detail={"name": name, "scopes": checked}
            )
        with self._lock:
            self._loaded = None  # this process sees it at once

    def all(self) -> list[ApiKey]:
        """Every key, revoked ones included, by name; never a secret or a hash."""
        return self.engine.key_list()

    def revoke(self, name: str, *, actor: str = "operator") -> bool:
        """Revoke a key; False when no key of that name is in force."""
        with self.engine.transaction() as conn:
            done = self.engine.key_revoke(name, conn=conn)
            if done:
                self.engine.audit_append(
                    conn, AuditAction.KEY_REVOKED, actor=actor, detail={"name": name}
                )
        return done

    def resolve(self, secret: str) -> Principal | None:
        """The active key whose secret this is, or None. Every stored hash is
        compared, each in constant time, so the answer's timing does not say
        how close a guess came."""
        digest = hash_key(secret)
        found = None
        for name, key in self._hashes().items():
            if hmac.compare_digest(digest, key.hash):
                found = Principal(name, key.scopes)
        return found

    def principal(self, name: str) -> Principal | None:
        """The active key ``name`` (a dashboard session's); None once revoked."""
        key = self._hashes().get(name)
        return None if key is None else Principal(name, key.scopes)

    def stored_hash(self, name: str) -> str | None:
        """The hash of the active key ``name``; None once it is revoked."""
        key = self._hashes().get(name)
        return None if key is None else key.hash

    def _hashes(self) -> dict[str, ActiveKey]:
        """The active keys by name, read again when the copy is older than
        ``refresh`` seconds (one reader at a time; the others wait for its copy)."""
        with self._lock:
            now = time.monotonic()
            if self._loaded is None or now - self._loaded > self.refresh:
                self._active = self.engine.key_active()
                self._loaded = time.monotonic()
            return self._active
