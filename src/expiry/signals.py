"""What SIGTERM, SIGINT and SIGHUP do in expiry's long-running processes
(`expiry worker`, `scheduler`, `serve`), in one place:

    SIGTERM, SIGINT  stop: the work in hand finishes, claimed jobs not started
                     go back; a second one, or a stop still not done after the
                     grace period, exits at once (os._exit, 128 + the signal),
                     leaving the jobs in hand to their leases
    SIGHUP           reload the config; a bad file is refused, the old one kept

Why a handler here does nothing but note the signal: Python runs a signal's
handler in the main thread between two bytecodes, wherever that thread was,
even inside the handler of the signal before. A handler that takes a lock
(Event.set takes its Condition's, logging takes its handler's) waits for ever
when the code it interrupted holds that lock: two SIGTERMs 0.5 ms apart hung
a worker so (issue 36). Here ``signal.set_wakeup_fd`` has the interpreter's C
handler write each signal's number to a pipe, the Python handler only assigns
an attribute, and a watcher thread reads the pipe and does the rest: the log
lines, the services' stops, the escalation, and the reloads (on a thread of
their own, so that a slow reload never holds a stop back). The C handler's
write reaches the watcher even while the main thread waits inside a driver
call, where no Python handler runs.

One Listener a process, installed by the main thread: ``listening()`` there
installs it (the CLI's long-running commands do, for their whole life), and
``listening(stop=..., reload=...)`` from any thread adds a service's callbacks
for as long as it runs (the worker's and the scheduler's ``run``). A stop
reaches a service that registers after it, at once. Outside the main thread,
with no Listener installed, ``listening`` does nothing: the program that
started the thread owns its signals. Installed, the Listener takes the
process's wakeup fd (an asyncio loop in the main thread would lose it until
it is restored).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any, NoReturn

from . import defaults

log = logging.getLogger("expiry.signals")

STOPS = (signal.SIGTERM, signal.SIGINT)
RELOAD = signal.SIGHUP
CLOSE = 0
"""Written to the pipe by the Listener itself when it is removed (no signal is 0)."""
JOIN_SECONDS = 5.0
"""How long removing the Listener waits for its threads (they end at once)."""
LAST_WORDS_SECONDS = 1.0
"""An exit at once waits this long at most for its log line: a stderr pipe that
nobody reads must not keep the process alive."""

Callback = Callable[[], Any]


class Listener:
    """The process's signals, read from a pipe by a thread (the module says why)."""

    def __init__(self, grace: float = defaults.STOP_GRACE_SECONDS) -> None:
        self.grace = grace
        self.received = 0
        """The last signal's number: all the Python handler does is set it."""
        self.stopping_since: float | None = None
        """When the first stop arrived (monotonic); None until then."""
        self._stop_signal: int = signal.SIGTERM
        self._stops: list[Callback] = []
        self._reloads: list[Callback] = []
        self._lock = threading.Lock()  # never taken by a signal handler
        self._reload_wanted = threading.Event()
        self._closing = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # a full pipe drops a byte, never blocks
        self._previous: dict[int, Any] = {}
        self._previous_fd = -1
        self._threads = [
            threading.Thread(target=self._watch, name="signals", daemon=True),
            threading.Thread(target=self._reload_loop, name="reload", daemon=True),
        ]

    # -- installing ----------------------------------------------------------------

    def install(self) -> None:
        """Take SIGTERM, SIGINT and SIGHUP (from the main thread)."""
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for sig in (*STOPS, RELOAD):
            self._previous[sig] = signal.signal(sig, self._note)
        for thread in self._threads:
            thread.start()

    def remove(self, *, exiting: bool = False) -> None:
        """Give the signals back to the handlers found at install, and end the
        threads (a grace period running then is called off). ``exiting``: the
        process ends next; once a stop was heard, a later SIGTERM or SIGINT is
        ignored rather than given to the default handler, which would kill the
        process on its way out (exit -15 after a clean stop)."""
        for sig, handler in self._previous.items():
            if exiting and sig in STOPS and self.stopping_since is not None:
                handler = signal.SIG_IGN
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._previous_fd)
        self._closing = True
        self._reload_wanted.set()
        with suppress(BlockingIOError):  # a full pipe: the watcher is reading anyway
            os.write(self._write, bytes([CLOSE]))
        for thread in self._threads:
            thread.join(JOIN_SECONDS)
        if not any(thread.is_alive() for thread in self._threads):  # else left open
            os.close(self._read)
            os.close(self._write)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        # In the main thread, between two bytecodes: an assignment and nothing
        # else (the C handler already wrote the signal to the pipe).
        self.received = signum

    # -- callbacks -----------------------------------------------------------------

    def add(self, stop: Callback | None, reload: Callback | None) -> None:
        """A service's callbacks; a stop already under way reaches it at once."""
        with self._lock:
            if stop is not None:
                self._stops.append(stop)
            if reload is not None:
                self._reloads.append(reload)
            stopping = self.stopping_since is not None
        if stop is not None and stopping:
            _call(stop, "stop")

    def discard(self, stop: Callback | None, reload: Callback | None) -> None:
        with self._lock:
            if stop in self._stops:
                self._stops.remove(stop)
            if reload in self._reloads:
                self._reloads.remove(reload)

    # -- the watcher ---------------------------------------------------------------

    def _watch(self) -> None:
        while True:
            if not select.select([self._read], [], [], self._until_grace_ends())[0]:
                name = signal.Signals(self._stop_signal).name
                self._exit(f"still stopping {self.grace:g} s after {name}", self._stop_signal)
            for signum in os.read(self._read, 64):
                if signum == CLOSE:
                    return
                if signum in STOPS:
                    self._stop(signum)
                elif signum == RELOAD and self.stopping_since is None:
                    log.info("SIGHUP received: reloading the config")
                    self._reload_wanted.set()

    def _until_grace_ends(self) -> float | None:
        if self.stopping_since is None:
            return None
        return max(0.0, self.stopping_since + self.grace - time.monotonic())

    def _stop(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.stopping_since is not None:
            self._exit(f"{name} while stopping", signum)
        with self._lock:
            self.stopping_since = time.monotonic()
            self._stop_signal = signum
            stops = list(self._stops)
        log.info(
            "%s received: stopping once the work in hand is done (a second SIGTERM or "
            "SIGINT, or %g s, exits at once)",
            name,
            self.grace,
        )
        for stop in stops:
            _call(stop, "stop")

    def _exit(self, why: str, signum: int) -> NoReturn:
        """Exit now, without waiting for any thread: a job in hand either commits
        whole or not at all, and its lease returns it to the queue."""
        words = threading.Thread(
            target=log.error,
            args=(
                "%s: exiting now (code %d); jobs in hand go back to the queue when "
                "their leases expire",
                why,
                128 + signum,
            ),
            daemon=True,
        )
        words.start()
        words.join(LAST_WORDS_SECONDS)
        os._exit(128 + signum)

    def _reload_loop(self) -> None:
        while True:
            self._reload_wanted.wait()
            self._reload_wanted.clear()
            if self._closing:
                return
            with self._lock:
                reloads = list(self._reloads)
            if not reloads:
                log.warning("SIGHUP: nothing in this process reloads a config yet")
            for reload in reloads:
                _call(reload, "reload")


def _call(fn: Callback, what: str) -> None:
    try:
        fn()
    except Exception:  # one service's failure must not keep the others from hearing
        log.exception("signal %s callback failed", what)


_active: Listener | None = None
_active_lock = threading.Lock()


@contextmanager
def listening(
    *,
    stop: Callback | None = None,
    reload: Callback | None = None,
    grace: float | None = None,
    exiting: bool = False,
) -> Iterator[Listener | None]:
    """Hear stops and reloads for the duration: ``stop`` is called (from the
    watcher thread) on the first SIGTERM or SIGINT, ``reload`` (from the reload
    thread) on SIGHUP. Installs the process's Listener when there is none and
    this is the main thread (``grace``: its grace period), and removes it
    after (``exiting``: the process ends then, Listener.remove says what that
    changes); yields the Listener in use, or None (another thread, none installed)."""
    global _active
    with _active_lock:
        listener, mine = _active, False
        if listener is None and threading.current_thread() is threading.main_thread():
            listener = _active = Listener(defaults.STOP_GRACE_SECONDS if grace is None else grace)
            listener.install()
            mine = True
    if listener is not None:
        listener.add(stop, reload)
    try:
        yield listener
    finally:
        if listener is not None:
            listener.discard(stop, reload)
        if mine:
            assert listener is not None
            with _active_lock:
                _active = None
            listener.remove(exiting=exiting)
