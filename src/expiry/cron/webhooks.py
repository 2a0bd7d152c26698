"""Outgoing HTTP calls for cron targets: signed, pinned, bounded.

Signing follows Standard Webhooks: headers ``webhook-id``, ``webhook-timestamp``
and ``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, with
the secret returned when the target was created (``whsec_<base64>``).

Safety: a target any of whose addresses is not global (private, loopback,
link-local, shared, 6to4 or Teredo wrapping an inner one, multicast,
reserved) is refused unless its ``host:port`` is listed in ``[http]
allowed_hosts``. The host is resolved at each call, the connection goes to
the address checked (so a second DNS answer cannot redirect it), redirects
are not followed, a call has one deadline for all of it (10 s by default),
and at most 64 KiB of the response is read.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.client
import ipaddress
import secrets
import socket
import ssl
import threading
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


def allowed(host: str, port: int, allowed_hosts: Sequence[str]) -> bool:
    """Whether ``[http] allowed_hosts`` lets a call go to ``host:port`` although
    it resolves to a non-global address. An entry is ``host:port``,
    ``host:*`` (every port: an operator's explicit choice) or a bare ``host``,
    which allows its scheme's usual ports only (80 and 443); IPv6 literals go in
    brackets: ``[::1]:8080``."""
    for entry in allowed_hosts:
        name, wanted = _entry(entry)
        if name.lower() != host.strip("[]").lower():
            continue
        if wanted == "*" or wanted == str(port) or (wanted == "" and port in (80, 443)):
            return True
    return False


def _entry(entry: str) -> tuple[str, str]:
    """(host, port) of an allowed_hosts entry; the port is '' when none is given."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, rest.removeprefix(":")
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, port
    return entry, ""  # a name, an IPv4 address, or an IPv6 one without brackets


def resolve(url: str, allowed_hosts: Sequence[str]) -> tuple[str, str, int, str]:
    """(scheme, host, port, address) for a URL that may be called; UnsafeTarget if
    not. Every address the name resolves to must be global (``ipaddress``'s
    ``is_global``: not private, loopback, link-local, shared (100.64.0.0/10),
    6to4, site-local or otherwise reserved) unless ``host:port`` is allowed; the
    call then goes to the first of them (pinned)."""
    try:
        parts = urlsplit(url)
        hostname, explicit_port = parts.hostname, parts.port
    except ValueError:  # a bad port or IPv6 literal
        raise UnsafeTarget("http_url is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not hostname:
        raise UnsafeTarget("use an http:// or https:// URL with a host")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        # urlsplit strips some of them, the request line would carry others:
        # every call would fail, or be split
        raise UnsafeTarget(
            "http_url has a space or a control character: percent-encode it (%20, %0D)"
        )
    if parts.username or parts.password:
        raise UnsafeTarget("credentials in the URL are not allowed")
    host = hostname
    port = explicit_port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError):  # ValueError: a label over 63 bytes
        # The resolver's own words can describe the network inside: not repeated.
        raise UnsafeTarget(f"host {host!r} does not resolve") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    inside = [a for a in addresses if not _is_global(a)]
    if inside and not allowed(host, port, allowed_hosts):
        named = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise UnsafeTarget(
            f"{named} resolves to an address that is not global (private, loopback, "
            "link-local, shared or reserved); add it to [http] allowed_hosts as "
            f"'{named}' to allow it"
        )
    return parts.scheme, host, port, addresses[0]


NOT_GLOBAL = tuple(
    ipaddress.ip_network(n)
    for n in (
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated; ipaddress calls it global)
        "2002::/16",  # 6to4: wraps an IPv4 address, any of them
        "fec0::/10",  # IPv6 site-local (deprecated; ipaddress calls it global)
        "64:ff9b:1::/48",  # local-use NAT64
        "::/96",  # IPv4-compatible IPv6 (deprecated): some stacks reach the IPv4 address
    )
)
"""Blocks that Python's is_global lets through but no cron target needs."""


def _is_global(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if any(ip in net for net in NOT_GLOBAL if net.version == ip.version):
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        nat64 = (
            ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
            if ip in ipaddress.ip_network("64:ff9b::/96")
            else None
        )
        for inner in (ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None, nat64):
            if inner is not None and not _is_global(str(inner)):
                return False  # an IPv4 address inside an IPv6 one
    return bool(ip.is_global) and not ip.is_multicast


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
    """POST to a checked, pinned address; never follows redirects. ``timeout`` is
    the whole call's deadline (resolve, connect, send, the response's headers
    and body): at the deadline the socket is shut, however slowly the target
    drips bytes. At most RESPONSE_LIMIT bytes of the response are read."""
    started = time.monotonic()
    expired = threading.Event()
    try:
        status, text = _exchange(url, body, headers, allowed_hosts, started + timeout, expired)
    except (OSError, http.client.HTTPException, UnsafeTarget) as exc:
        failure: Exception = exc
        if expired.is_set():
            failure = TimeoutError(f"the call took longer than {timeout:g} s")
        return CallResult(
            None, (time.monotonic() - started) * 1000, None, f"{type(failure).__name__}: {failure}"
        )
    error = None if 200 <= status < 300 else f"HTTP {status}"
    return CallResult(status, (time.monotonic() - started) * 1000, text, error)


def _exchange(
    url: str,
    body: bytes,
    headers: dict[str, str],
    allowed_hosts: Sequence[str],
    deadline: float,
    expired: threading.Event,
) -> tuple[int, str]:
    """The request and its response (status, text) by ``deadline``; past it the
    socket is shut and ``expired`` set."""
    scheme, host, port, address = resolve(url, allowed_hosts)
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = _connection(scheme, host, port, address, max(0.001, deadline - time.monotonic()))
    watchdog: threading.Timer | None = None
    try:
        conn.connect()
        watchdog = _watchdog(conn.sock, deadline, expired)
        conn.request(
            "POST",
            path,
            body=body,
            headers={**headers, "Host": parts.netloc, "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        chunks, kept = [], 0
        while kept < RESPONSE_LIMIT and (chunk := response.read1(RESPONSE_LIMIT - kept)):
            chunks.append(chunk)
            kept += len(chunk)
        if expired.is_set():
            raise TimeoutError("the call ran past its deadline")
        return response.status, b"".join(chunks).decode("utf-8", "replace")
    finally:
        if watchdog is not None:
            watchdog.cancel()
        conn.close()


def _watchdog(sock: socket.socket, deadline: float, expired: threading.Event) -> threading.Timer:
    """A timer that shuts ``sock`` at ``deadline``, however slowly the target drips bytes."""

    def cut() -> None:
        expired.set()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), cut)
    watchdog.daemon = True
    watchdog.start()
    return watchdog


def _connection(
    scheme: str, host: str, port: int, address: str, timeout: float
) -> http.client.HTTPConnection:
    if scheme == "http":
        return http.client.HTTPConnection(address, port, timeout=timeout)
    context = ssl.create_default_context()

    class Pinned(http.client.HTTPSConnection):
        def connect(self) -> None:
            sock = socket.create_connection((address, port), timeout)
            self.sock = context.wrap_socket(sock, server_hostname=host)

    return Pinned(host, port, timeout=timeout, context=context)
