"""API keys: create, list and revoke them, and resolve a presented secret to
the name of its key.

A key's secret is ``exp_`` and 256 random bits, shown once when it is made;
the database keeps only its SHA-256. ``Keys`` holds the one cache of the
active keys' hashes, re-read at most once a second so that a revoke (from
this process or another: ``expiry keys revoke NAME``) takes effect within a
second. The HTTP server builds one ``Keys``: the bearer-key check, the
Idempotency-Key owner and the dashboard's sessions all read that cache.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time

from .engines.base import Engine
from .errors import ConfigError
from .types import ApiKey, AuditAction

REFRESH_SECONDS = 1.0
"""The longest the active keys are trusted before they are read again."""


def hash_key(secret: str) -> str:
    """The stored form of a secret."""
    # Keys are 256 random bits, so one SHA-256 is enough: there is nothing to brute-force.
    return hashlib.sha256(secret.encode()).hexdigest()


class Keys:
    """The API keys of one database, with a cache of the active ones' hashes."""

    def __init__(self, engine: Engine, *, refresh: float = REFRESH_SECONDS) -> None:
        self.engine, self.refresh = engine, refresh
        self._active: dict[str, str] = {}
        self._loaded: float | None = None
        self._lock = threading.Lock()

    def create(self, name: str, *, actor: str = "operator") -> str:
        """Store a new key's hash; return its secret (shown once)."""
        secret = "exp_" + secrets.token_urlsafe(32)
        with self.engine.transaction() as conn:
            if not self.engine.key_insert(name, hash_key(secret), conn=conn):
                raise ConfigError(
                    f"a key named {name!r} exists already; revoke it or pick another name"
                )
            self.engine.audit_append(
                conn, AuditAction.KEY_CREATED, actor=actor, detail={"name": name}
            )
        return secret

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

    def resolve(self, secret: str) -> str | None:
        """The name of the active key whose secret this is, or None. Every stored
        hash is compared, each in constant time, so the answer's timing does
        not say how close a guess came."""
        digest = hash_key(secret)
        found = None
        for name, stored in self._hashes().items():
            if hmac.compare_digest(digest, stored):
                found = name
        return found

    def stored_hash(self, name: str) -> str | None:
        """The hash of the active key ``name``; None once it is revoked."""
        return self._hashes().get(name)

    def _hashes(self) -> dict[str, str]:
        """{name: hash} of the active keys, read again when the copy is older than
        ``refresh`` seconds (one reader at a time; the others wait for its copy)."""
        with self._lock:
            now = time.monotonic()
            if self._loaded is None or now - self._loaded > self.refresh:
                self._active = self.engine.key_active()
                self._loaded = time.monotonic()
            return self._active
