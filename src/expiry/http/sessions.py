"""Dashboard sign-in: signed session cookies and per-session CSRF tokens.

A user signs in by pasting an API key. The cookie then holds the key's name,
the time it was issued and a random nonce, signed with HMAC-SHA256 under a key
derived from two secrets:

- a random secret made when the server starts, so a cookie cannot be minted by
  anyone who reads the database (the key hashes live there), and
- the stored hash of the API key the user signed in with, so revoking that key
  (``expiry keys revoke NAME``) ends its sessions within a second: the hash is
  read from the one cache of active keys (expiry.keys).

The cost of the first: a restart signs everyone out, and a dashboard behind a
load balancer needs sticky sessions. The CSRF token is an HMAC of the session's
nonce under the same key: it is different for every sign-in and is never
stored server-side. The sign-in form carries a token of its own: an HMAC of a
random value the form's page sets as a cookie (LOGIN_COOKIE), so a page of
another site cannot sign a browser in under a key of the attacker's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass

from ..keys import Keys, Principal, hash_key
from .security import RateLimiter

COOKIE = "expiry_session"
LOGIN_COOKIE = "expiry_login"
MAX_AGE_SECONDS = 12 * 3600
"""A session lasts 12 hours; then the key is asked for again."""


SIGN_IN_FAILURES_PER_SECOND = 5 / 60
SIGN_IN_FAILURES_BURST = 10
"""Ten refused sign-ins from one address, then one every 12 seconds."""
REFUSALS_AUDITED_PER_SECOND = 1.0
REFUSALS_AUDITED_BURST = 60
"""At most 60 refused sign-ins audited at once, then one a second, all addresses together."""


@dataclass(frozen=True)
class Session:
    key_name: str
    issued: int
    nonce: str
    csrf: str
    scopes: tuple[str, ...] = ()
    """The key's scopes now (read at every request: a narrowed key's session
    is narrowed within a second)."""

    def can(self, scope: str) -> bool:
        return self.principal.can(scope)

    @property
    def principal(self) -> Principal:
        """The key this session acts as, with the same rules as the API's."""
        return Principal(self.key_name, self.scopes)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    """Signs session cookies and reads them back, against the active keys' hashes."""

    def __init__(self, keys: Keys, *, max_age: int = MAX_AGE_SECONDS) -> None:
        self.keys, self.max_age = keys, max_age
        self._server_secret = secrets.token_bytes(32)
        self.failures = RateLimiter(SIGN_IN_FAILURES_PER_SECOND, SIGN_IN_FAILURES_BURST)
        """Refused sign-ins per client address: past the burst, the form answers
        429 without checking the key, so guessing keys costs time."""
        self.refusals_audited = RateLimiter(REFUSALS_AUDITED_PER_SECOND, REFUSALS_AUDITED_BURST)
        """Refused sign-ins from every address together that get an audit row;
        past it they are logged and counted only, so callers on many addresses
        cannot grow the audit log without end."""
        self._ended: dict[str, int] = {}
        """Nonces of sessions signed out, with their issue time: refused until
        they would have expired anyway (kept in this process, like the secret)."""
        self._lock = threading.Lock()

    def sign_out(self, session: Session) -> None:
        """End ``session`` on the server: its cookie is refused from now on,
        wherever a copy of it is."""
        now = time.time()
        with self._lock:
            self._ended = {n: t for n, t in self._ended.items() if now - t < self.max_age}
            self._ended[session.nonce] = session.issued

    def login_token(self) -> tuple[str, str]:
        """(the sign-in page's cookie value, the token its form carries)."""
        value = secrets.token_urlsafe(16)
        return value, self._login_token(value)

    def login_token_ok(self, cookie: str | None, token: str | None) -> bool:
        """The form's token matches the cookie its page set."""
        if not cookie or not token:
            return False
        return hmac.compare_digest(self._login_token(cookie).encode(), token.encode())

    def _login_token(self, value: str) -> str:
        digest = hmac.new(self._server_secret, b"login\n" + value.encode(), hashlib.sha256)
        return _b64(digest.digest())

    def _signing_key(self, name: str, stored_hash: str) -> bytes:
        message = f"expiry-dashboard-session\n{name}\n{stored_hash}".encode()
        return hmac.new(self._server_secret, message, hashlib.sha256).digest()

    def sign_in(self, secret: str) -> str | None:
        """The cookie value for a valid API key, or None for a wrong one."""
        principal = self.keys.resolve(secret.strip())
        if principal is None:
            return None
        name = principal.name
        body = {"k": name, "t": int(time.time()), "n": secrets.token_urlsafe(16)}
        payload = _b64(json.dumps(body, separators=(",", ":")).encode())
        key = self._signing_key(name, hash_key(secret.strip()))
        return payload + "." + _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())

    def read(self, cookie: str | None) -> Session | None:
        """The session in a cookie, or None if it is forged, expired or its key revoked."""
        if not cookie or "." not in cookie:
            return None
        payload, _, signature = cookie.partition(".")
        try:
            body = json.loads(_unb64(payload))
            name, issued, nonce = str(body["k"]), int(body["t"]), str(body["n"])
            given = _unb64(signature)
        except (ValueError, KeyError, TypeError, OverflowError):
            return None
        with self._lock:
            if nonce in self._ended:
                return None
        principal = self.keys.principal(name)
        stored = self.keys.stored_hash(name)
        if principal is None or stored is None:
            return None
        key = self._signing_key(name, stored)
        expected = hmac.new(key, payload.encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(given, expected):
            return None
        if not 0 <= time.time() - issued < self.max_age:
            return None
        csrf = _b64(hmac.new(key, b"csrf\n" + nonce.encode(), hashlib.sha256).digest())
        return Session(name, issued, nonce, csrf, principal.scopes)

    @staticmethod
    def csrf_ok(session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(session.csrf.encode(), (token or "").encode())
