"""Outgoing HTTP calls for cron targets: signed, pinned, bounded.

Signing follows Standard Webhooks: headers ``webhook-id``, ``webhook-timestamp``
and ``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, with
the secret returned when the target was created (``whsec_<base64>``).

Safety: a target whose host resolves to a private, loopback, link-local,
multicast or reserved address is refused unless the host is listed in
``[http] allowed_hosts``. The host is resolved once, the connection goes to that
address (so a second DNS answer cannot redirect it), redirects are not
followed, and only the first 64 KiB of the response is kept.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import ipaddress
import secrets
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

RESPONSE_LIMIT = 64 * 1024


class UnsafeTarget(ValueError):
    """The target URL is not allowed."""


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def verify(secret: str, headers: dict[str, str], body: bytes, tolerance: int = 300) -> bool:
    """What a receiver does: check the signature and that the timestamp is recent."""
    msg_id, stamp = headers.get("webhook-id", ""), headers.get("webhook-timestamp", "0")
    if abs(time.time() - int(stamp)) > tolerance:
        return False
    expected = sign(secret, msg_id, int(stamp), body)
    return any(
        hmac.compare_digest(expected, s) for s in headers.get("webhook-signature", "").split()
    )


def resolve(url: str, allowed_hosts: Sequence[str]) -> tuple[str, str, int, str]:
    """(scheme, host, port, address) for a URL that may be called; UnsafeTarget if not."""
    try:
        parts = urlsplit(url)
        hostname, explicit_port = parts.hostname, parts.port
    except ValueError as exc:  # a bad port or IPv6 literal
        raise UnsafeTarget(f"{url!r}: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not hostname:
        raise UnsafeTarget(f"{url!r}: use an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise UnsafeTarget(f"{url!r}: credentials in the URL are not allowed")
    host = hostname
    port = explicit_port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, ValueError) as exc:  # ValueError: e.g. a label over 63 bytes
        raise UnsafeTarget(f"{url!r}: host {host!r} does not resolve ({exc})") from None
    address = str(infos[0][4][0])
    ip = ipaddress.ip_address(address)
    internal = (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )
    if internal and host not in allowed_hosts:
        raise UnsafeTarget(
            f"{url!r}: {host} resolves to {address}, a private/loopback/link-local address; "
            "add the host to [http] allowed_hosts to allow it"
        )
    return parts.scheme, host, port, address


@dataclass(frozen=True)
class CallResult:
    status: int | None
    duration_ms: float
    response: str | None
    error: str | None


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    allowed_hosts: Sequence[str],
    timeout: float = 10.0,
) -> CallResult:
    """POST to a checked, pinned address; never follows redirects."""
    started = time.monotonic()
    try:
        scheme, host, port, address = resolve(url, allowed_hosts)
        parts = urlsplit(url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = _connection(scheme, host, port, address, timeout)
        try:
            conn.request(
                "POST",
                path,
                body=body,
                headers={**headers, "Host": parts.netloc, "Content-Type": "application/json"},
            )
            response = conn.getresponse()
            text = response.read(RESPONSE_LIMIT).decode("utf-8", "replace")
            status = response.status
        finally:
            conn.close()
        error = None if 200 <= status < 300 else f"HTTP {status}"
        return CallResult(status, (time.monotonic() - started) * 1000, text, error)
    except (OSError, http.client.HTTPException, UnsafeTarget) as exc:
        return CallResult(
            None, (time.monotonic() - started) * 1000, None, f"{type(exc).__name__}: {exc}"
        )


def _connection(
    scheme: str, host: str, port: int, address: str, timeout: float
) -> http.client.HTTPConnection:
    if scheme == "http":
        conn = http.client.HTTPConnection(address, port, timeout=timeout)
        return conn
    context = ssl.create_default_context()

    class Pinned(http.client.HTTPSConnection):
        def connect(self) -> None:
            sock = socket.create_connection((address, port), timeout)
            self.sock = context.wrap_socket(sock, server_hostname=host)

    return Pinned(host, port, timeout=timeout, context=context)
