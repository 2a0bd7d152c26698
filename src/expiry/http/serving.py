"""The HTTP server of ``expiry serve``: uvicorn over the ASGI app, with what
its defaults leave open to a caller without a key closed.

- **Slow request heads.** uvicorn arms no timer before a request's head is
  complete (its keep-alive timer starts after a response, and any byte cancels
  it), so a client trickling a header line holds a connection for as long as
  it likes: 500 such connections held 30 s. ``HeadDeadline`` closes a
  connection whose request head is not complete ``header_timeout`` after it
  connected or after its previous response.
- **Forwarded addresses.** uvicorn believes ``X-Forwarded-For`` from loopback
  by default, so one client behind a rotating header escapes every
  per-address limit (and the sign-in lockout). Forwarded headers are read only
  from the addresses ``[http] trusted_proxies`` names.

The body's own read deadline is BodyLimit's (security.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..config import HttpConfig
from . import create_app

if TYPE_CHECKING:
    from ..app import App


class HeadDeadline(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's head."""

    header_timeout: float = HttpConfig().header_timeout

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        waiting = self.conn.their_state is h11.IDLE
        super().handle_events()
        if waiting and self.conn.their_state is not h11.IDLE:
            self._disarm()  # the request's head is in

    def on_response_complete(self) -> None:
        self._arm()  # the next request on this connection has a deadline of its own
        super().on_response_complete()  # (a pipelined one, already in, disarms it)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.logger.info(
                "closed a connection whose request head took over %ss", self.header_timeout
            )
            self.transport.close()


def http_server(app: App, listen: str) -> uvicorn.Server:
    """The HTTP API on ``listen`` (HOST:PORT); ``run()`` serves it until its
    ``should_exit`` is set."""
    host, _, port = listen.rpartition(":")
    return uvicorn.Server(server_config(app, host, int(port)))


def server_config(app: App, host: str, port: int, **settings: Any) -> uvicorn.Config:
    """uvicorn's settings for ``app`` as ``expiry serve`` ships them (the tests'
    live server too), ``settings`` on top."""
    http = app.config.http if app.config is not None else HttpConfig()
    protocol = type("HeadDeadline", (HeadDeadline,), {"header_timeout": http.header_timeout})
    return uvicorn.Config(
        create_app(app),
        host=host,
        port=port,
        http=protocol,
        log_config=None,
        access_log=False,
        lifespan="off",
        proxy_headers=bool(http.trusted_proxies),
        forwarded_allow_ips=list(http.trusted_proxies) or None,
        **settings,
    )
