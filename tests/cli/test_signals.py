"""Signals in the real processes (`expiry worker`, `scheduler`, `serve`) on
PostgreSQL: SIGHUP reloads the config and never kills (a bad file is refused,
the old config kept); two SIGTERMs microseconds apart never hang a worker; a
second SIGTERM, or a stop that outlasts --stop-grace, exits at once (143),
even while the work in hand waits on a lock."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from test_cli import free_port

from cleanup._support import (
    Db,
    cli_env,
    doomed,
    expiry_cmd,
    standard_rows,
    wait_for,
    write_config,
)
from expiry import defaults, signals
from expiry.app import App

POLICY = "expired-sessions"
HELD = {"throttle_query": "select true", "health_interval": "100ms", "nice_ratio": 0}
"""A policy whose windows the throttle holds for as long as this config is loaded."""
ROWS = standard_rows(600)
KEPT = len(ROWS) - len(doomed(ROWS))
TERM_EXIT = 128 + signal.SIGTERM
BATCH = 10
"""Workers started at once by the double-SIGTERM test (the machine has 2 cores)."""


@dataclass
class Proc:
    """An expiry command in the background, its stderr in a file."""

    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def err(self) -> str:
        return self.log.read_text()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def said(self, text: str, timeout: float = 30) -> None:
        def seen() -> bool:
            assert self.alive() or text in self.err, self.err
            return text in self.err

        wait_for(seen, timeout, f"{text!r} in the log")

    def exit_within(self, seconds: float) -> tuple[int, float]:
        """The exit code, and how long it took."""
        started = time.monotonic()
        try:
            code = self.popen.wait(seconds)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {seconds:g} s:\n{self.err}") from None
        return code, time.monotonic() - started

    def signal(self, sig: int) -> None:
        os.kill(self.popen.pid, sig)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    procs: list[Proc] = []

    def starting(config: Path, *args: str) -> Proc:
        log = tmp_path / f"proc-{len(procs)}.err"
        with log.open("wb") as err:
            popen = subprocess.Popen(
                expiry_cmd("--config", str(config), *args),
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=cli_env(),
            )
        procs.append(Proc(popen, log))
        return procs[-1]

    yield starting
    for proc in procs:
        if proc.alive():
            proc.popen.kill()
            proc.popen.wait()


@pytest.fixture
def db(pg_url: str) -> Iterator[Db]:
    db = Db(pg_url)
    db.create_sessions()
    db.insert_sessions(ROWS)
    yield db
    db.close()


def open_run(config: Path) -> str:
    app = App.from_config(config)
    try:
        assert app.cleanup is not None
        return app.cleanup.open_run(POLICY).run_id
    finally:
        app.close()


def sigterm_twice(proc: Proc, gap: float) -> None:
    """Two SIGTERMs ``gap`` seconds apart (a busy wait: sleep is too coarse)."""
    proc.signal(signal.SIGTERM)
    until = time.perf_counter() + gap
    while time.perf_counter() < until:
        pass
    proc.signal(signal.SIGTERM)


# -- two SIGTERMs ------------------------------------------------------------------


def test_two_sigterms_microseconds_apart_stop_every_worker_within_the_grace(
    db: Db, tmp_path: Path, start: Any
) -> None:
    """50 workers, each sent two SIGTERMs 30 to 300 us apart once it runs: each
    exits within the grace period, 0 (the kernel merged the two) or 143 (the
    second exits at once). Before signals.py the handler logged and set an
    Event: a second signal landing inside Event.set waited for ever on the
    lock the first held (2 to 3 workers of 50 hung here)."""
    config = write_config(tmp_path / "expiry.toml", db.url)
    outcomes: list[tuple[int | None, float, str]] = []
    for batch in range(50 // BATCH):
        procs = [start(config, "worker") for _ in range(BATCH)]
        for proc in procs:
            proc.said("worker started")
        sent = []
        for i, proc in enumerate(procs):
            sigterm_twice(proc, gap=(i + 1) * 30e-6)
            sent.append(time.monotonic())
        for proc, when in zip(procs, sent, strict=True):
            left = when + defaults.STOP_GRACE_SECONDS - time.monotonic()
            try:
                outcomes.append((proc.popen.wait(max(0.0, left)), time.monotonic() - when, ""))
            except subprocess.TimeoutExpired:
                outcomes.append((None, defaults.STOP_GRACE_SECONDS, proc.err[-500:]))
        assert len(outcomes) == (batch + 1) * BATCH
    hung = [o for o in outcomes if o[0] is None]
    assert not hung, f"{len(hung)} of 50 workers still ran after the grace period: {hung[0][2]}"
    assert {code for code, _, _ in outcomes} <= {0, TERM_EXIT}, outcomes
    slowest = max(seconds for _, seconds, _ in outcomes)
    assert slowest < 10, f"the slowest worker took {slowest:.1f} s to exit"


def test_a_second_sigterm_during_a_clean_exit_never_kills_the_worker(
    db: Db, tmp_path: Path, start: Any
) -> None:
    """A supervisor's second SIGTERM that lands while a stopped worker exits
    (after "worker stopped", its signal handlers being put back) must not
    kill it with the default handler: -15 where the stop was clean. The
    soak's workers-down fault met it in 1 of 4 double stops."""
    config = write_config(tmp_path / "expiry.toml", db.url)
    codes = []
    for delay in (0.0, 0.005, 0.01, 0.02, 0.04, 0.08):
        proc = start(config, "worker")
        proc.said("worker started")
        proc.signal(signal.SIGTERM)
        proc.said("worker stopped")
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):
            proc.signal(signal.SIGTERM)
        codes.append(proc.exit_within(defaults.STOP_GRACE_SECONDS)[0])
    assert set(codes) <= {0, TERM_EXIT}, codes


# -- SIGHUP ------------------------------------------------------------------------


def test_sighup_reloads_a_workers_config_and_a_bad_file_keeps_the_old_one(
    db: Db, tmp_path: Path, start: Any
) -> None:
    """A worker whose only policy the throttle holds: a broken file sent with
    SIGHUP is refused (still held, still running); the config without the
    hold, sent with SIGHUP, lets the windows run and the rows go."""
    config = write_config(tmp_path / "expiry.toml", db.url, HELD)
    open_run(config)
    worker = start(config, "worker")
    worker.said("worker started")
    time.sleep(1.0)
    assert db.count("sessions") == 600, "a window ran while the policy was held"

    config.write_text("[[policy]\nname = ")
    worker.signal(signal.SIGHUP)
    worker.said("config reload refused, keeping the old one")
    time.sleep(0.5)
    assert worker.alive()
    assert db.count("sessions") == 600

    write_config(config, db.url)
    worker.signal(signal.SIGHUP)
    worker.said("config reloaded from")
    wait_for(lambda: db.count("sessions") == KEPT, 30, "the windows after the reload")
    assert worker.alive()

    worker.signal(signal.SIGTERM)
    code, _ = worker.exit_within(20)
    assert code == 0, worker.err
    assert "Traceback" not in worker.err


def scheduled(url: str, *names: str) -> list[dict[str, Any]]:
    return [{"name": name, "schedule": "* * * * *"} for name in names]


def registered(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {str(r[0]) for r in conn.execute("select policy from expiry.schedules")}


@pytest.mark.parametrize("command", ["scheduler", "serve"])
def test_sighup_reloads_the_schedulers_config_and_a_bad_file_keeps_the_old_one(
    db: Db, tmp_path: Path, start: Any, command: str
) -> None:
    """`expiry scheduler`, and the scheduler of `expiry serve`: a broken file
    is refused and the process goes on; a policy added to the file and sent
    with SIGHUP gets its schedule, and serve's API lists it."""
    config = write_config(tmp_path / "expiry.toml", db.url, *scheduled(db.url, "first"))
    args = command_line(command)
    proc = start(config, *args)
    wait_for(lambda: proc.alive() and registered(db.url) == {"first"}, 30, "the first schedule")

    config.write_text("[[policy]\nname = ")
    proc.signal(signal.SIGHUP)
    proc.said("config reload refused, keeping the old one")
    time.sleep(0.5)
    assert proc.alive(), proc.err

    write_config(config, db.url, *scheduled(db.url, "first", "second"))
    proc.signal(signal.SIGHUP)
    wait_for(lambda: registered(db.url) == {"first", "second"}, 5, "the added policy's schedule")
    assert proc.alive(), proc.err
    assert "config reloaded: 2 scheduled policies" in proc.err
    if command == "serve":
        assert_listed(db.url, args[-1], {"first", "second"})

    proc.signal(signal.SIGTERM)
    code, _ = proc.exit_within(20)
    assert code == 0, proc.err
    assert "scheduler stopped" in proc.err
    assert ("worker stopped" in proc.err) == (command == "serve")
    assert "Traceback" not in proc.err


def assert_listed(url: str, listen: str, names: set[str]) -> None:
    app = App(url)
    try:
        key = app.keys.create("signals-test", ["admin"], actor="test")
    finally:
        app.close()
    response = httpx.get(
        f"http://{listen}/v1/policies",
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert {p["name"] for p in response.json()} == names


# -- stops that outlast the grace ---------------------------------------------------


STUCK = {"lock_timeout": "60s", "statement_timeout": "60s", "schedule": "* * * * *"}
"""A window that waits a minute for a row lock rather than two seconds."""


@pytest.fixture
def holder(db: Db) -> Iterator[psycopg.Connection[Any]]:
    """A connection whose open transaction holds the locks a test takes."""
    with psycopg.connect(db.url) as conn:
        yield conn


def stuck(
    db: Db, holder: psycopg.Connection[Any], start: Any, config: Path, args: list[str]
) -> Proc:
    """``expiry *args``, its work in hand waiting on a lock ``holder`` took: a
    worker's window (serve's too) on the policy's rows; the scheduler, in its
    main thread, on its schedules."""
    if args[0] == "scheduler":
        proc = start(config, *args)
        wait_for(lambda: proc.alive() and registered(db.url) == {POLICY}, 30, "the schedule")
        holder.execute("lock table expiry.schedules in access exclusive mode")
    else:
        open_run(config)
        holder.execute("select id from sessions for update")
        proc = start(config, *args)
    wait_for(lambda: proc.alive() and waiting_on_a_lock(db.url), 30, f"{args[0]} to wait")
    return proc


def waiting_on_a_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity "
            "where datname = current_database() and wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


def command_line(command: str, *extra: str) -> list[str]:
    listen = ["--listen", f"127.0.0.1:{free_port()}"] if command == "serve" else []
    return [command, *listen, *extra]


@pytest.mark.parametrize("command", ["worker", "scheduler", "serve"])
def test_a_stop_that_outlasts_the_grace_exits_at_once(
    db: Db, holder: psycopg.Connection[Any], tmp_path: Path, start: Any, command: str
) -> None:
    """One SIGTERM while the work in hand waits on a lock: the process exits
    143 once --stop-grace has passed, saying why, not when the lock goes."""
    config = write_config(tmp_path / "expiry.toml", db.url, STUCK)
    proc = stuck(db, holder, start, config, command_line(command, "--stop-grace", "1s"))

    proc.signal(signal.SIGTERM)
    code, seconds = proc.exit_within(10)

    assert code == TERM_EXIT, proc.err
    assert 0.9 < seconds < 5, seconds
    assert "still stopping 1 s after SIGTERM: exiting now (code 143)" in proc.err


@pytest.mark.parametrize("command", ["worker", "scheduler", "serve"])
def test_a_second_sigterm_exits_at_once(
    db: Db, holder: psycopg.Connection[Any], tmp_path: Path, start: Any, command: str
) -> None:
    """The first SIGTERM waits for the work in hand (here, on a lock, for the
    default grace period); a second one exits 143 at once."""
    config = write_config(tmp_path / "expiry.toml", db.url, STUCK)
    proc = stuck(db, holder, start, config, command_line(command))

    proc.signal(signal.SIGTERM)
    proc.said("SIGTERM received: stopping")
    time.sleep(0.5)
    assert proc.alive(), "the first SIGTERM did not wait for the work in hand"
    proc.signal(signal.SIGTERM)
    code, seconds = proc.exit_within(5)

    assert code == TERM_EXIT, proc.err
    assert seconds < 2, seconds
    assert "SIGTERM while stopping: exiting now (code 143)" in proc.err


# -- the Listener in this process ---------------------------------------------------


def test_listening_hands_each_signal_to_a_thread_and_puts_the_handlers_back() -> None:
    """SIGHUP reaches the reload callback on the Listener's reload thread, not
    the main thread; a stop reaches a service that registers after it; on
    leaving, the handlers and the wakeup fd are the ones found."""
    before = {sig: signal.getsignal(sig) for sig in (*signals.STOPS, signals.RELOAD)}
    reloaded: list[str] = []
    stopped = threading.Event()
    with signals.listening(grace=60) as listener:
        assert listener is not None
        assert signal.getsignal(signal.SIGTERM) == listener._note  # or SIGTERM ends pytest
        with signals.listening(reload=lambda: reloaded.append(threading.current_thread().name)):
            os.kill(os.getpid(), signal.SIGHUP)
            wait_for(lambda: reloaded, 5, "the reload")
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: listener.stopping_since is not None, 5, "the stop")
        with signals.listening(stop=stopped.set):
            assert stopped.is_set(), "a service that came after the stop never heard of it"
    assert reloaded == ["reload"]
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert signal.set_wakeup_fd(-1) == -1
