"""Soak: scheduler, workers and the HTTP API for a while, under continuous load.

    .venv/bin/python bench/soak.py                    # 600 s, 4 workers
    .venv/bin/python bench/soak.py --duration 3600    # an hour
    .venv/bin/python bench/soak.py --quick            # 60 s smoke run (smaller backlog)

Real processes against a scratch database made on the server of --admin-url
(dropped at the end): one ``expiry scheduler``, ``--workers`` x ``expiry worker
--app soak_app:app --queue default --queue soak.note`` (bench/soak_app.py: the
config's policy plus a trivial custom handler) and one ``expiry serve
--no-workers`` (the HTTP API; its scheduler thread is a second scheduler, so
the fires are claimed by compare-and-set between two processes).

The table is the drills' ``sessions (id, user_id, expires_at, revoked_at, note)``
with the policy ``expired-sessions`` (``where = "revoked_at is null"``, window
1,000, ``schedule = "* * * * *"``). It starts with a backlog (--rows; 60% expired,
10% expired but revoked, 30% live for 30 days). While the soak runs:

* a feeder thread inserts --insert-rate rows/s with new ids: 70% expire within
  --expire-within seconds, 15% are revoked (protected by ``where``, some already
  past their deadline), 15% live for 30 days; the protected and live ids join
  the drills' survivors and the row count baseline in the same transaction;
* a publisher thread publishes --publish-rate messages/s with ``POST
  /v1/queue/publish`` (queue ``soak.note``, a unique dedupe key each, a fifth of
  them delayed 0-5 s, and one in twenty repeating an earlier key, which must
  answer ``enqueued: false``), timing each request;
* a trigger thread calls ``POST /v1/cleanup/trigger`` every --trigger-every
  seconds. Cron's resolution is a minute: the minute schedule alone would give
  a 60 s soak one run, and a watermark that saws up to a minute; the API trigger
  is also how an application asks for a run. Both open runs of the same policy,
  so runs overlap and the later one waits for the earlier.

Every --every seconds a line: elapsed; the watermark (age of the oldest expired
row still present, the ``where`` applied, by the database clock); due jobs and
the age of the oldest; running claims; dead jobs; runs finished/opened; rows
deleted (the ledger); API publishes and their p99 over the interval; the RSS of
each process (VmRSS from /proc/PID/status).

At the end the load stops, the policy is paused through the API (so that no
cron fire opens a run after the last one), the last near-future rows are left
to expire, one final run is triggered, and the soak waits for every job to end.
Then ``expiry status --json`` is read as a cross-check, every process gets
SIGTERM and must exit 0, and tests/drills/_invariants.py checks the database:
no protected row deleted, no expired row left at the newest cutoff, one ledger
row per completed window and no key range applied twice, every job completed,
dead with a reason or cancelled, every run finished, rows gone == the ledger's
rows. Added here: no row was deleted while its deadline was at or after every
cutoff opened so far (a statement trigger records each deleted row with the
newest cutoff at that moment), every acknowledged publish ended completed with
exactly one ``soak_notes`` row, repeated keys were not enqueued again, and no
API request failed (5xx or a broken connection).

RSS at start is taken after --warmup seconds (the backlog cleaned, pools and
caches full), at end at the last sample under load. Targets are printed, never
asserted: watermark after warm-up <= 2 x --trigger-every, oldest due job <= 10 s,
publish p99 <= 100 ms, RSS growth per process <= max(8 MiB, 10%). The exit
status is nonzero only when the run itself is broken: an invariant fails, a
process dies or exits nonzero, the work does not drain, or a request or insert
fails other than around a restart of the server.

The server is shared: someone may restart it during a long soak, or cut its
connections. The expiry processes must ride that out (it is part of what is
soaked); the soak's own connections open again and note the outside event (a new
pg_postmaster_start_time(), or a connection of the soak's cut by the server), and
API or feed errors within 30 s of one are listed, not counted as broken. A
publish that failed that way is in doubt: its job may exist, and must then have
completed with one effect, like any other.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, Any, TypeVar

import psycopg

from expiry.queue.jobs import message_key
from scratch import scratch_database

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
ADMIN_URL = os.environ.get(
    "EXPIRY_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
POLICY = "expired-sessions"
WHERE = "revoked_at is null"
NOTE_QUEUE = "soak.note"
PENDING = ("scheduled", "available", "retryable", "running")
WAITING = ("scheduled", "available", "retryable")

# Targets, reported and never asserted.
OLDEST_DUE_TARGET = 10.0
PUBLISH_P99_TARGET = 0.100
RSS_NOISE_MIB = 8.0
RSS_NOISE_RATIO = 0.10

T = TypeVar("T")


# -- the database ---------------------------------------------------------------------


def connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(url, autocommit=True)


SETUP = [
    """
    create table sessions (
        id         bigint primary key,
        user_id    integer not null default 0,
        expires_at timestamptz not null,
        revoked_at timestamptz,
        note       text
    )
    """,
    # The backlog: 60% expired an hour or more ago, 10% expired and revoked
    # (protected by the policy's where), 30% live for 30 days.
    """
    insert into sessions (id, expires_at, revoked_at, note)
    select i,
           case when i %% 10 < 3 then now() + interval '30 days'
                else now() - interval '1 hour' - i * interval '1 ms' end,
           case when i %% 10 = 3 then now() end,
           'backlog ' || i
    from generate_series(1, %(rows)s::bigint) as i
    """,
    "create index sessions_expires_at on sessions (expires_at)",
    "analyze sessions",
    # The custom handler's effect: no unique key, so a double effect shows.
    "create table soak_notes (key text not null, n bigint not null, pid integer not null,"
    " at timestamptz not null default clock_timestamp())",
    # Every deleted row, with the newest cutoff opened at that moment: a row whose
    # deadline was not before it was deleted before it expired.
    "create table soak_deleted (id bigint not null, expires_at timestamptz not null,"
    " revoked_at timestamptz, newest_cutoff timestamptz,"
    " at timestamptz not null default clock_timestamp())",
    """
    create function soak_record_deleted() returns trigger language plpgsql as $$
    begin
        insert into soak_deleted (id, expires_at, revoked_at, newest_cutoff)
        select g.id, g.expires_at, g.revoked_at,
               (select max(cutoff) from expiry.runs where policy = 'expired-sessions')
        from gone g;
        return null;
    end $$
    """,
    "create trigger soak_record_deleted after delete on sessions"
    " referencing old table as gone for each statement execute function soak_record_deleted()",
]


def setup_target(url: str, rows: int) -> None:
    from expiry.engines import open_engine

    engine = open_engine(url)  # expiry's schema first: the trigger reads expiry.runs
    engine.migrate()
    engine.close()
    with connect(url) as conn:
        for statement in SETUP:
            conn.execute(statement, {"rows": rows} if "%(rows)s" in statement else None)


def load_invariants() -> ModuleType:
    """tests/drills/_invariants.py, the checker every drill ends with."""
    path = ROOT / "tests" / "drills" / "_invariants.py"
    spec = importlib.util.spec_from_file_location("soak_drill_invariants", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# -- processes -----------------------------------------------------------------------


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Proc:
    """An ``expiry`` subprocess with its log file."""

    name: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    ready_text: str
    popen: subprocess.Popen[bytes] | None = None
    log: IO[str] | None = None
    rss: list[tuple[float, float]] = field(default_factory=list)
    exit_code: int | None = None

    def start(self) -> None:
        self.log = self.log_path.open("w")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "expiry", *self.args],
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def ready(self) -> bool:
        return self.ready_text in self.log_path.read_text(errors="replace")

    def sample(self, elapsed: float) -> float | None:
        value = rss_mib(self.pid) if self.alive() else None
        if value is not None:
            self.rss.append((elapsed, value))
        return value

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not stop in time; the exit code."""
        if self.popen is None:
            return None
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        if self.log is not None:
            self.log.close()
            self.log = None
        self.exit_code = self.popen.returncode
        return self.exit_code

    def tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(f"    {line}" for line in text.splitlines()[-lines:])

    def log_summary(self) -> tuple[dict[str, int], dict[str, int]]:
        """(lines by level, the warning/error messages and how often each came)."""
        levels: dict[str, int] = {}
        messages: dict[str, int] = {}
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
                level = str(record.get("level", "?"))
                message = str(record.get("message", ""))
                if record.get("error"):
                    message += f" ({record['error']})"
            except (ValueError, AttributeError):
                level, message = "other", line.strip()[:120]
            levels[level] = levels.get(level, 0) + 1
            if level not in ("info", "debug"):
                # Group messages that differ only by numbers (delays, ids).
                key = f"{level}: {re.sub(r'[0-9]+', 'N', message)[:160]}"
                messages[key] = messages.get(key, 0) + 1
        return levels, messages


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> Any:
    """Run one ``expiry ... --json`` command; its parsed output."""
    done = subprocess.run(
        [sys.executable, "-m", "expiry", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"expiry {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return json.loads(done.stdout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(path: Path, url: str, port: int, window: int) -> Path:
    path.write_text(
        f"""[database]
url = {json.dumps(url)}

[http]
listen = "127.0.0.1:{port}"

[[policy]]
name = {json.dumps(POLICY)}
table = "sessions"
key = "id"
timestamp = "expires_at"
retain = "0s"
where = {json.dumps(WHERE)}
window = {window}
schedule = "* * * * *"
"""
    )
    return path


# -- the HTTP client -------------------------------------------------------------------


class Api:
    """Plain JSON over one keep-alive connection (one per thread)."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, dict[str, str]]:
        """(status, parsed body, headers). A keep-alive connection the server closed
        while idle is reopened and the request sent again; other errors raise."""
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                self.conn.request(method, path, body=payload, headers=headers)
                response = self.conn.getresponse()
                raw = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt == 2:
                    raise
                continue
            try:
                data = json.loads(raw) if raw else None
            except ValueError:
                data = raw.decode(errors="replace")
            return response.status, data, {k.lower(): v for k, v in response.getheaders()}
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# -- the load ------------------------------------------------------------------------


@dataclass
class Incidents:
    """Errors the load threads and the monitor met, with their wall-clock time, and
    outside events: a restart of the server (a new pg_postmaster_start_time()) or
    the soak's own connections cut by the server (SQLSTATE class 57, "operator
    intervention", or the connection lost). At the end, errors within 30 s of an
    outside event are listed; any other makes the run broken."""

    seen: list[tuple[float, str]] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)
    """epoch seconds of each new pg_postmaster_start_time() seen during the run"""
    cut: list[float] = field(default_factory=list)
    """when the server cut one of the soak's own connections"""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str) -> None:
        with self.lock:
            self.seen.append((time.time(), what))

    def db_error(self, who: str, exc: psycopg.Error) -> None:
        """An error on one of the soak's own connections."""
        if isinstance(exc, psycopg.OperationalError) and (
            exc.sqlstate is None or exc.sqlstate.startswith("57")
        ):
            with self.lock:
                self.cut.append(time.time())
        self.add(f"{who}: {type(exc).__name__}: {first_line(exc)}")

    def split(self, margin: float = 30.0) -> tuple[list[str], list[str]]:
        """(near an outside event, the others)."""
        near, other = [], []
        events = self.restarts + self.cut
        for at, what in self.seen:
            stamp = time.strftime("%H:%M:%S", time.localtime(at))
            if any(abs(at - r) <= margin for r in events):
                near.append(f"{stamp} {what}")
            else:
                other.append(f"{stamp} {what}")
        return near, other


@dataclass
class FeedStats:
    inserted: int = 0
    expiring: int = 0
    protected: int = 0
    live: int = 0
    failed_batches: int = 0


class Feeder(threading.Thread):
    """Inserts new rows with new ids at ``rate`` rows/s, in batches every 0.1 s. A
    batch, its survivors and the row count baseline commit together; a batch that
    fails (the server went away) is counted and the connection opened again."""

    def __init__(
        self,
        url: str,
        first_id: int,
        rate: float,
        horizon: float,
        stop: threading.Event,
        incidents: Incidents,
    ) -> None:
        super().__init__(name="feeder", daemon=True)
        self.url, self.next_id, self.rate, self.horizon = url, first_id, rate, horizon
        self.stopping, self.incidents = stop, incidents
        self.stats = FeedStats()
        self.rng = random.Random(7)

    def run(self) -> None:
        conn: psycopg.Connection[tuple[Any, ...]] | None = None
        step, owed, due = 0.1, 0.0, time.monotonic()
        while not self.stopping.is_set():
            owed += self.rate * step
            n, owed = int(owed), owed - int(owed)
            if n:
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.url)
                    self._batch(conn, n)
                except psycopg.Error as exc:
                    self.stats.failed_batches += 1
                    self.incidents.db_error("feeder", exc)
                    if conn is not None:
                        conn.close()
                        conn = None
            due += step
            self.stopping.wait(max(0.0, due - time.monotonic()))
        if conn is not None:
            conn.close()

    def _batch(self, conn: psycopg.Connection[tuple[Any, ...]], n: int) -> None:
        ids, offsets, revoked, keep = [], [], [], []
        kinds = {"protected": 0, "live": 0, "expiring": 0}
        for _ in range(n):
            i, r = self.next_id, self.rng.random()
            self.next_id += 1
            ids.append(i)
            if r < 0.15:  # revoked: the where protects it, expired or not
                offsets.append(self.rng.uniform(-60.0, self.horizon))
                revoked.append(True)
                keep.append(i)
                kinds["protected"] += 1
            elif r < 0.30:  # live for 30 days
                offsets.append(30 * 86400.0)
                revoked.append(False)
                keep.append(i)
                kinds["live"] += 1
            else:  # expires soon, then must go
                offsets.append(self.rng.uniform(0.5, self.horizon))
                revoked.append(False)
                kinds["expiring"] += 1
        with conn.transaction():
            conn.execute(
                "insert into sessions (id, expires_at, revoked_at, note)"
                " select i, now() + make_interval(secs => s),"
                "        case when r then now() end, 'fed'"
                " from unnest(%s::bigint[], %s::float8[], %s::bool[]) as t(i, s, r)",
                (ids, offsets, revoked),
            )
            conn.execute(
                "insert into drill_survivors (tbl, id) select 'sessions', unnest(%s::bigint[])",
                (keep,),
            )
            conn.execute(
                "update drill_baseline set rows = rows + %s where tbl = 'sessions'", (len(ids),)
            )
        # Counted once committed (a batch whose commit was lost in a restart may be
        # in the table uncounted: the checks read the database, not these).
        self.stats.inserted += n
        self.stats.protected += kinds["protected"]
        self.stats.live += kinds["live"]
        self.stats.expiring += kinds["expiring"]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


@dataclass
class PublishStats:
    acked: set[str] = field(default_factory=set)
    """keys the API answered 200 for"""
    in_doubt: set[str] = field(default_factory=set)
    """keys whose request failed (5xx, broken connection): enqueued or not"""
    repeats: int = 0
    repeats_enqueued: list[str] = field(default_factory=list)
    """repeated keys the API enqueued again (must stay empty)"""
    throttled: int = 0
    failed: int = 0
    latencies: list[tuple[float, float]] = field(default_factory=list)
    """(monotonic start, seconds) of every request that got an answer"""
    lock: threading.Lock = field(default_factory=threading.Lock)


class Publisher(threading.Thread):
    """POST /v1/queue/publish at ``rate`` messages/s."""

    def __init__(self, api: Api, rate: float, stop: threading.Event, incidents: Incidents) -> None:
        super().__init__(name="publisher", daemon=True)
        self.api, self.rate, self.stopping, self.incidents = api, rate, stop, incidents
        self.stats = PublishStats()
        self.rng = random.Random(11)

    def run(self) -> None:
        n, due = 0, time.monotonic()
        sent: list[str] = []
        while not self.stopping.is_set():
            repeat = bool(sent) and self.rng.random() < 0.05
            if repeat:
                key = self.rng.choice(sent)
                body: dict[str, Any] = {"queue": NOTE_QUEUE, "message": {"n": -1}, "key": key}
            else:
                n += 1
                key = f"soak-note-{n}"
                body = {"queue": NOTE_QUEUE, "message": {"n": n}, "key": key}
                if self.rng.random() < 0.2:
                    body["delay_seconds"] = round(self.rng.uniform(0.0, 5.0), 3)
            if self._publish(body, repeat) and not repeat:
                sent.append(key)
            due += 1.0 / self.rate
            self.stopping.wait(max(0.0, due - time.monotonic()))
        self.api.close()

    def _publish(self, body: dict[str, Any], repeat: bool) -> bool:
        """One publish (waiting out 429s); True when the API acknowledged it."""
        key = str(body["key"])
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                status, data, headers = self.api.call("POST", "/v1/queue/publish", body)
            except (OSError, http.client.HTTPException) as exc:
                self.api.close()
                self._failed(key, repeat, f"{type(exc).__name__}: {exc}")
                return False
            seconds = time.monotonic() - started
            if status == 429:
                with self.stats.lock:
                    self.stats.throttled += 1
                self.stopping.wait(float(headers.get("retry-after", "1")))
                continue
            with self.stats.lock:
                self.stats.latencies.append((started, seconds))
                if status == 200 and repeat:
                    self.stats.repeats += 1
                    if data.get("enqueued"):
                        self.stats.repeats_enqueued.append(key)
                elif status == 200:
                    self.stats.acked.add(key)
                    self.stats.in_doubt.discard(key)
            if status != 200:
                self._failed(key, repeat, f"{status} {data}")
            return status == 200
        return False

    def _failed(self, key: str, repeat: bool, what: str) -> None:
        with self.stats.lock:
            self.stats.failed += 1
            if not repeat and key not in self.stats.acked:
                self.stats.in_doubt.add(key)
        self.incidents.add(f"publish {key}: {what}")


@dataclass
class TriggerStats:
    runs: list[str] = field(default_factory=list)
    created: int = 0
    failed: int = 0


class Triggerer(threading.Thread):
    """POST /v1/cleanup/trigger every ``every`` seconds, the first one at once."""

    def __init__(self, api: Api, every: float, stop: threading.Event, incidents: Incidents) -> None:
        super().__init__(name="trigger", daemon=True)
        self.api, self.every, self.stopping, self.incidents = api, every, stop, incidents
        self.stats = TriggerStats()

    def run(self) -> None:
        while True:
            try:
                status, data, _ = self.api.call("POST", "/v1/cleanup/trigger", {"policy": POLICY})
                if status == 200:
                    self.stats.runs.append(str(data["run_id"]))
                    self.stats.created += bool(data["created"])
                elif status != 429:
                    self.stats.failed += 1
                    self.incidents.add(f"trigger: {status} {data}")
            except (OSError, http.client.HTTPException) as exc:
                self.stats.failed += 1
                self.incidents.add(f"trigger: {type(exc).__name__}: {exc}")
                self.api.close()
            if self.stopping.wait(self.every):
                break
        self.api.close()


# -- sampling --------------------------------------------------------------------------


@dataclass
class Sample:
    elapsed: float
    watermark: float
    due: int
    oldest_due: dict[str, float]
    running: int
    later: int
    dead: int
    runs: int
    runs_finished: int
    rows_deleted: int
    windows: int
    published: int
    p99: float | None
    rss: dict[str, float | None]

    @property
    def oldest(self) -> float:
        return max(self.oldest_due.values(), default=0.0)


WATERMARK = (
    "select coalesce(extract(epoch from now() - min(expires_at)), 0)::float8"
    f" from sessions where expires_at < now() and ({WHERE})"
)
QUEUE = f"""
select queue,
       count(*) filter (where state in {WAITING} and run_at <= now()) as due,
       count(*) filter (where state in {WAITING} and run_at > now()) as later,
       count(*) filter (where state = 'running') as running,
       coalesce(extract(epoch from now() - min(run_at)
                filter (where state in {WAITING} and run_at <= now())), 0)::float8 as oldest
from expiry.jobs where state in {PENDING} group by queue
"""
TOTALS = """
select (select count(*) from expiry.jobs where state = 'dead'),
       (select count(*) from expiry.runs),
       (select count(*) from expiry.runs where state = 'finished'),
       (select coalesce(sum(rows_affected), 0) from expiry.ledger where run_id is not null),
       (select count(*) from expiry.ledger where run_id is not null)
"""


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Monitor:
    """The soak's own connection. It opens again when the server went away (up to
    ``patience`` seconds), and notes a restart: a new pg_postmaster_start_time()."""

    def __init__(self, url: str, incidents: Incidents, patience: float = 120.0) -> None:
        self.url, self.incidents, self.patience = url, incidents, patience
        self.conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self.postmaster: float | None = None

    def run(self, fn: Callable[[psycopg.Connection[tuple[Any, ...]]], T]) -> T:
        deadline = time.monotonic() + self.patience
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = connect(self.url)
                    self._restarted(self.conn)
                return fn(self.conn)
            except psycopg.OperationalError as exc:
                self.incidents.db_error("monitor", exc)
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def _restarted(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        row = conn.execute("select extract(epoch from pg_postmaster_start_time())::float8")
        started = float(row.fetchone()[0])  # type: ignore[index]
        if self.postmaster is not None and started != self.postmaster:
            with self.incidents.lock:
                self.incidents.restarts.append(started)
            at = time.strftime("%H:%M:%S", time.localtime(started))
            print(
                f"!! the PostgreSQL server restarted at {at} (not by the soak); carrying on",
                flush=True,
            )
        self.postmaster = started

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def read_db(conn: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...]:
    row = conn.execute(WATERMARK).fetchone()
    watermark = float(row[0]) if row else 0.0
    queues = conn.execute(QUEUE).fetchall()
    totals = conn.execute(TOTALS).fetchone()
    assert totals is not None
    return watermark, queues, totals


def take_sample(
    monitor: Monitor,
    elapsed: float,
    procs: list[Proc],
    publisher: Publisher,
    since: float,
) -> Sample:
    watermark, queues, totals = monitor.run(read_db)
    due = running = later = 0
    oldest: dict[str, float] = {}
    for queue, q_due, q_later, q_running, q_oldest in queues:
        due, later, running = due + q_due, later + q_later, running + q_running
        oldest[queue] = float(q_oldest)
    dead, runs, finished, rows, windows = (int(x) for x in totals)
    with publisher.stats.lock:
        published = len(publisher.stats.acked) + publisher.stats.repeats
        recent = [s for t, s in publisher.stats.latencies if t >= since]
    return Sample(
        elapsed,
        watermark,
        due,
        oldest,
        running,
        later,
        dead,
        runs,
        finished,
        rows,
        windows,
        published,
        percentile(recent, 0.99),
        {p.name: p.sample(elapsed) for p in procs},
    )


def header(procs: list[Proc]) -> str:
    names = "".join(f"{p.name:>10}" for p in procs)
    return (
        f"{'elapsed':>8} {'watermark':>10} {'due':>5} {'oldest due':>10} {'running':>7}"
        f" {'later':>5} {'dead':>4} {'runs done':>9} {'rows deleted':>12} {'published':>9}"
        f" {'p99 ms':>7} | RSS MiB{names}"
    )


def line(s: Sample) -> str:
    rss = "".join(f"{v:10.1f}" if v is not None else f"{'-':>10}" for v in s.rss.values())
    p99 = f"{s.p99 * 1000:7.1f}" if s.p99 is not None else f"{'-':>7}"
    return (
        f"{s.elapsed:7.0f}s {s.watermark:9.1f}s {s.due:>5} {s.oldest:9.1f}s {s.running:>7}"
        f" {s.later:>5} {s.dead:>4} {f'{s.runs_finished}/{s.runs}':>9} {s.rows_deleted:>12,}"
        f" {s.published:>9,} {p99} |        {rss}"
    )


# -- the end -------------------------------------------------------------------------------


def pending_jobs(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    row = conn.execute(f"select count(*) from expiry.jobs where state in {PENDING}").fetchone()
    return int(row[0]) if row else 0


def unfinished_runs(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
    row = conn.execute("select count(*) from expiry.runs where state <> 'finished'").fetchone()
    return int(row[0]) if row else 0


def soak_violations(
    conn: psycopg.Connection[tuple[Any, ...]], publisher: Publisher, procs: list[Proc]
) -> list[str]:
    """What the soak checks beyond tests/drills/_invariants.py."""
    v: list[str] = []
    early = conn.execute(
        "select count(*), min(id) from soak_deleted"
        " where newest_cutoff is null or expires_at >= newest_cutoff or revoked_at is not null"
    ).fetchone()
    if early and early[0]:
        v.append(
            f"{early[0]} rows were deleted before any cutoff covered them or while revoked,"
            f" e.g. id {early[1]}"
        )
    twice = conn.execute(
        "select count(*) from (select id from soak_deleted group by id having count(*) > 1) x"
    ).fetchone()
    if twice and twice[0]:
        v.append(f"{twice[0]} ids were deleted twice")

    acked = sorted(publisher.stats.acked)
    states = dict(
        conn.execute(
            "select state, count(*) from expiry.jobs where key = any(%s) group by state",
            ([message_key(NOTE_QUEUE, k) for k in acked],),  # a message's job key is QUEUE/KEY
        ).fetchall()
    )
    if states.get("completed", 0) != len(acked):
        v.append(f"{len(acked)} acknowledged publishes, but their jobs are {states}")
    doubt = sorted(publisher.stats.in_doubt)
    notes = conn.execute(
        "select count(*) filter (where key = any(%(acked)s)),"
        "       count(distinct key) filter (where key = any(%(acked)s)),"
        "       count(*) filter (where key = any(%(doubt)s)),"
        "       count(distinct key) filter (where key = any(%(doubt)s)),"
        "       count(*) filter (where not key = any(%(acked)s) and not key = any(%(doubt)s))"
        " from soak_notes",
        {"acked": acked, "doubt": doubt},
    ).fetchone()
    assert notes is not None
    if notes[0] != len(acked) or notes[1] != len(acked):
        v.append(
            f"{len(acked)} acknowledged publishes but {notes[0]} handler effects"
            f" for them ({notes[1]} distinct)"
        )
    if notes[2] != notes[3]:
        v.append(f"publishes in doubt: {notes[2]} effects for {notes[3]} keys (at most one each)")
    if notes[4]:
        v.append(f"{notes[4]} handler effects for keys never published")
    if publisher.stats.repeats_enqueued:
        v.append(f"repeated keys enqueued again: {publisher.stats.repeats_enqueued[:5]}")
    for proc in procs:
        if proc.exit_code != 0:
            v.append(f"{proc.name} exited {proc.exit_code} after SIGTERM")
    return v


def summarize_rss(procs: list[Proc], warmup: float, load_end: float) -> list[str]:
    out = []
    header_ = f"{'process':<10} {'pid':>7} {'ready':>7} {'start':>7} {'end':>7} {'peak':>7} {'growth':>13}"
    out.append(header_)
    for p in procs:
        under_load = [(t, v) for t, v in p.rss if t <= load_end + 1e-6]
        if not under_load:
            out.append(f"{p.name:<10} {p.pid:>7}  no samples")
            continue
        ready = under_load[0][1]
        start = next((v for t, v in under_load if t >= warmup), under_load[0][1])
        end = under_load[-1][1]
        peak = max(v for _, v in under_load)
        growth = end - start
        noise = max(RSS_NOISE_MIB, RSS_NOISE_RATIO * start)
        verdict = "ok" if growth <= noise else "GROWS"
        out.append(
            f"{p.name:<10} {p.pid:>7} {ready:7.1f} {start:7.1f} {end:7.1f} {peak:7.1f}"
            f" {growth:+7.1f} ({growth / start:+.0%}) {verdict}"
        )
    return out


# -- main -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=None, help="seconds of load (600)")
    parser.add_argument(
        "--quick", action="store_true", help="60 s, a 20,000-row backlog, lines every 5 s"
    )
    parser.add_argument("--admin-url", default=ADMIN_URL, help="server to create the scratch db on")
    parser.add_argument("--workers", type=int, default=4, help="expiry worker processes (4)")
    parser.add_argument("--rows", type=int, default=None, help="backlog rows (200000)")
    parser.add_argument("--insert-rate", type=float, default=200.0, help="rows/s fed (200)")
    parser.add_argument("--publish-rate", type=float, default=20.0, help="API publishes/s (20)")
    parser.add_argument(
        "--trigger-every", type=float, default=15.0, help="seconds between API triggers (15)"
    )
    parser.add_argument(
        "--expire-within", type=float, default=None, help="fed rows expire within (30 s)"
    )
    parser.add_argument("--every", type=float, default=None, help="seconds between lines (10)")
    parser.add_argument(
        "--warmup", type=float, default=None, help="RSS 'start' after this (duration/5, <= 60 s)"
    )
    parser.add_argument("--window", type=int, default=1000, help="policy window (1000)")
    parser.add_argument(
        "--drain-timeout", type=float, default=300.0, help="seconds for the final drain (300)"
    )
    parser.add_argument("--logs", help="keep expiry.toml and the process logs in this directory")
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 60.0 if args.quick else 600.0
    if args.rows is None:
        args.rows = 20_000 if args.quick else 200_000
    if args.expire_within is None:
        args.expire_within = 10.0 if args.quick else 30.0
    if args.every is None:
        args.every = 5.0 if args.quick else 10.0
    if args.warmup is None:
        args.warmup = min(60.0, args.duration / 5)
    if min(args.duration, args.workers, args.insert_rate, args.publish_rate, args.every) <= 0:
        parser.error("--duration, --workers, --insert-rate, --publish-rate, --every: positive")
    if args.rows < 0 or args.trigger_every <= 0 or args.expire_within <= 0.5:
        parser.error("--rows >= 0, --trigger-every > 0 and --expire-within > 0.5 please")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"soak: {args.duration:.0f} s; scheduler + {args.workers} workers + API;"
        f" backlog {args.rows:,} rows; feed {args.insert_rate:.0f} rows/s (expiring within"
        f" {args.expire_within:.0f} s); publish {args.publish_rate:.0f}/s; API trigger every"
        f" {args.trigger_every:.0f} s + cron every minute; cpus {os.cpu_count()},"
        f" load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    with (
        scratch_database(args.admin_url, f"expiry_bench_soak_{os.getpid()}") as url,
        tempfile.TemporaryDirectory(prefix="expiry_soak_") as tmpdir,
    ):
        logs = Path(args.logs) if args.logs else Path(tmpdir)
        logs.mkdir(parents=True, exist_ok=True)
        return soak(args, url, logs)


def soak(args: argparse.Namespace, url: str, tmp: Path) -> int:
    invariants = load_invariants()
    target = invariants.Target(
        policy=POLICY, table="sessions", key="id", timestamp="expires_at", where=WHERE
    )
    setup_target(url, args.rows)
    survivors = invariants.record_expected(url, [target])["sessions"]
    print(f"backlog loaded: {args.rows:,} rows, {survivors:,} protected or live", flush=True)

    port = free_port()
    config = write_config(tmp / "expiry.toml", url, port, args.window)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    env.update(
        EXPIRY_CONFIG=str(config),
        EXPIRY_LOG_FORMAT="json",
        PYTHONPATH=os.pathsep.join(p for p in (str(BENCH), env.get("PYTHONPATH", "")) if p),
    )
    keys = {name: str(cli(env, "keys", "create", name)["key"]) for name in ("soak-pub", "soak-op")}

    procs = [Proc("scheduler", ["scheduler"], env, tmp / "scheduler.log", "scheduler started")]
    procs.append(
        Proc(
            "serve",
            ["serve", "--no-workers", "--listen", f"127.0.0.1:{port}"],
            env,
            tmp / "serve.log",
            "serving on",
        )
    )
    worker_args = ["worker", "--app", "soak_app:app", "--queue", "default", "--queue", NOTE_QUEUE]
    procs += [
        Proc(f"worker-{n}", worker_args, env, tmp / f"worker-{n}.log", "worker started")
        for n in range(1, args.workers + 1)
    ]
    broken: list[str] = []
    stop = threading.Event()
    incidents = Incidents()
    samples: list[Sample] = []
    publisher = Publisher(Api(port, keys["soak-pub"]), args.publish_rate, stop, incidents)
    triggerer = Triggerer(Api(port, keys["soak-op"]), args.trigger_every, stop, incidents)
    operator = Api(port, keys["soak-op"])
    monitor = Monitor(url, incidents)
    row = monitor.run(lambda c: c.execute("select coalesce(max(id), 0) from sessions").fetchone())
    feeder = Feeder(
        url, int(row[0]) + 1 if row else 1, args.insert_rate, args.expire_within, stop, incidents
    )
    threads: list[threading.Thread] = [feeder, publisher, triggerer]
    load_end = 0.0
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + 120
        while not all(p.ready() for p in procs) or not health(port):
            dead = [p for p in procs if not p.alive()]
            if dead or time.monotonic() > deadline:
                for p in dead or procs:
                    print(f"{p.name} did not start:\n{p.tail()}", file=sys.stderr)
                return 1
            time.sleep(0.2)
        print(f"processes ready: {', '.join(f'{p.name} {p.pid}' for p in procs)}", flush=True)
        print(header(procs), flush=True)
        started = time.monotonic()
        samples.append(take_sample(monitor, 0.0, procs, publisher, started))
        print(line(samples[-1]), flush=True)
        for thread in threads:
            thread.start()
        since = next_line = started
        while True:
            next_line += args.every
            time.sleep(max(0.0, next_line - time.monotonic()))
            now = time.monotonic()
            sample = take_sample(monitor, now - started, procs, publisher, since)
            since = now
            samples.append(sample)
            print(line(sample), flush=True)
            died = [p for p in procs if not p.alive()]
            if died:
                broken += [f"{p.name} died with {p.popen and p.popen.returncode}" for p in died]
                for p in died:
                    print(f"{p.name} log:\n{p.tail()}", file=sys.stderr)
                break
            if now - started >= args.duration - 1e-6:
                break
        load_end = samples[-1].elapsed
        stop.set()
        for thread in threads:
            thread.join(60)
        if not broken:
            broken += finish(args, monitor, operator, procs, publisher, samples, started)
    finally:
        stop.set()
        operator.close()
        for proc in procs:
            proc.stop()
        monitor.close()

    print()
    codes = ", ".join(f"{p.name} {p.exit_code}" for p in procs)
    print(f"SIGTERM: exit codes {codes}")
    near_event, unexplained = incidents.split()
    if broken:
        for problem in broken + unexplained[:10]:
            print(f"BROKEN: {problem}")
        report_logs(procs)
        return 1
    report = monitor.run(lambda _: invariants.violations(url, [target]))
    report.violations += monitor.run(lambda c: soak_violations(c, publisher, procs))
    report.violations += [f"error without a server restart: {u}" for u in unexplained[:10]]
    if len(unexplained) > 10:
        report.violations.append(f"... {len(unexplained)} such errors in all")
    deleted = monitor.run(lambda c: c.execute("select count(*) from soak_deleted").fetchone())
    monitor.close()
    restarts = ", ".join(time.strftime("%H:%M:%S", time.localtime(r)) for r in incidents.restarts)
    extra = [
        f"rows deleted by the delete trigger's record: {deleted[0] if deleted else 0:,}",
        f"outside events: {len(incidents.restarts)} server restarts"
        + (f" (at {restarts})" if restarts else "")
        + f", {len(incidents.cut)} of the soak's own connections cut;"
        f" {len(near_event)} errors within 30 s of one",
        *(f"    {text}" for text in near_event[:8]),
    ]
    report_figures(args, samples, procs, publisher, triggerer, feeder, load_end, extra)
    report_logs(procs)
    print(f"\ninvariants: {report}")
    return 1 if report.violations else 0


def health(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/v1/health")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def operate(
    operator: Api, incidents: Incidents, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    """An operator's API call, tried for up to a minute while it fails with a 5xx
    or a broken connection (the server restarting)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            status, data, _ = operator.call(method, path, body)
            if status < 500 or time.monotonic() > deadline:
                return status, data
            incidents.add(f"operator {method} {path}: {status} {data}")
        except (OSError, http.client.HTTPException) as exc:
            operator.close()
            if time.monotonic() > deadline:
                return 0, f"{type(exc).__name__}: {exc}"
            incidents.add(f"operator {method} {path}: {type(exc).__name__}: {exc}")
        time.sleep(1.0)


def finish(
    args: argparse.Namespace,
    monitor: Monitor,
    operator: Api,
    procs: list[Proc],
    publisher: Publisher,
    samples: list[Sample],
    started: float,
) -> list[str]:
    """Pause, let the last fed rows expire, one final run, drain. Problems found."""
    incidents = monitor.incidents
    status, data = operate(operator, incidents, "POST", f"/v1/policies/{POLICY}/pause")
    if status != 200:
        return [f"pause through the API: {status} {data}"]
    row = monitor.run(
        lambda c: c.execute(
            "select coalesce(extract(epoch from max(expires_at) - now()), 0)::float8"
            " from sessions where expires_at < now() + interval '1 day'"
        ).fetchone()
    )
    wait = max(0.0, float(row[0]) if row else 0.0) + 1.5  # and any fire claimed before the pause
    print(f"load stopped; policy paused; waiting {wait:.1f} s for the last fed rows to expire")
    time.sleep(wait)
    status, data = operate(operator, incidents, "POST", "/v1/cleanup/trigger", {"policy": POLICY})
    if status != 200:
        return [f"final trigger through the API: {status} {data}"]
    final_run = str(data["run_id"])
    drain_started = time.monotonic()
    deadline = drain_started + args.drain_timeout
    while True:
        left = monitor.run(lambda c: (pending_jobs(c), unfinished_runs(c)))
        if not any(left):
            break
        if time.monotonic() > deadline:
            return [
                f"the work did not drain in {args.drain_timeout:.0f} s: {left[0]} jobs pending,"
                f" {left[1]} runs unfinished"
            ]
        if not all(p.alive() for p in procs):
            return [f"{p.name} died while draining" for p in procs if not p.alive()]
        time.sleep(0.5)
    now = time.monotonic()
    samples.append(take_sample(monitor, now - started, procs, publisher, now))
    print(f"final run {final_run} done; drained in {now - drain_started:.1f} s")
    print(line(samples[-1]), flush=True)
    try:
        shown = cli(procs[0].env, "status")
    except RuntimeError as exc:  # a cross-check only
        print(f"expiry status --json failed: {exc}")
        return []
    policy = next(p for p in shown["policies"] if p["name"] == POLICY)
    print(
        f"expiry status --json: watermark {policy['watermark_seconds']} s, paused"
        f" {policy['paused']}, last run {policy['last_run'] and policy['last_run']['state']},"
        f" dead-letter depth {shown['queue']['dead']}"
    )
    return []


def fmt(value: float | None, scale: float = 1.0, unit: str = "") -> str:
    return "-" if value is None else f"{value * scale:.1f}{unit}"


def report_figures(
    args: argparse.Namespace,
    samples: list[Sample],
    procs: list[Proc],
    publisher: Publisher,
    triggerer: Triggerer,
    feeder: Feeder,
    load_end: float,
    extra: list[str],
) -> None:
    under_load = [s for s in samples if s.elapsed <= load_end + 1e-6]
    steady = [s for s in under_load if s.elapsed >= args.warmup] or under_load
    marks = [s.watermark for s in steady]
    print("\nfigures")
    print(
        f"  watermark: at 0 s {fmt(under_load[0].watermark, unit=' s')};"
        f" after warm-up ({args.warmup:.0f} s) min {min(marks):.1f} / median"
        f" {statistics.median(marks):.1f} / max {max(marks):.1f} s;"
        f" after the final run {samples[-1].watermark:.1f} s"
    )
    queues: dict[str, float] = {}
    for s in under_load:
        for q, age in s.oldest_due.items():
            queues[q] = max(queues.get(q, 0.0), age)
    print(
        "  queue: oldest due job, max per queue "
        + (", ".join(f"{q} {a:.1f} s" for q, a in sorted(queues.items())) or "none")
        + f"; due jobs max {max(s.due for s in under_load)}; running claims max"
        f" {max(s.running for s in under_load)}; dead {samples[-1].dead}"
    )
    last = samples[-1]
    print(
        f"  cleanup: {last.rows_deleted:,} rows deleted in {last.windows:,} ledger windows;"
        f" {last.runs} runs ({len(triggerer.stats.runs)} API triggers, {triggerer.stats.created}"
        f" opened a run; the rest by cron or the final trigger)"
    )
    f = feeder.stats
    print(
        f"  feed: {f.inserted:,} rows inserted ({f.expiring:,} expiring, {f.protected:,} revoked,"
        f" {f.live:,} live); failed batches {f.failed_batches}"
    )
    lat = [s for _, s in publisher.stats.latencies]
    print(
        f"  API: {len(publisher.stats.acked):,} publishes acknowledged + {publisher.stats.repeats}"
        f" repeated keys; latency p50 {fmt(percentile(lat, 0.5), 1000)} ms, p99"
        f" {fmt(percentile(lat, 0.99), 1000)} ms, max {fmt(max(lat, default=None), 1000)} ms;"
        f" 429s {publisher.stats.throttled}; failed {publisher.stats.failed}"
        f" ({len(publisher.stats.in_doubt)} in doubt); triggers failed {triggerer.stats.failed}"
    )
    for text in extra:
        print(f"  {text}")
    print(
        f"\nRSS MiB (ready; start = first line after {args.warmup:.0f} s; end = last line under load)"
    )
    for text in summarize_rss(procs, args.warmup, load_end):
        print(f"  {text}")
    p99 = percentile(lat, 0.99)
    oldest = max(queues.values(), default=0.0)
    grows = [t for t in summarize_rss(procs, args.warmup, load_end) if t.endswith("GROWS")]
    print(
        "\ntarget (reported, not asserted):"
        f" watermark after warm-up <= {2 * args.trigger_every:.0f} s:"
        f" {max(marks):.1f} s {'met' if max(marks) <= 2 * args.trigger_every else 'MISSED'};"
        f" oldest due job <= {OLDEST_DUE_TARGET:.0f} s: {oldest:.1f} s"
        f" {'met' if oldest <= OLDEST_DUE_TARGET else 'MISSED'};"
        f" publish p99 <= {PUBLISH_P99_TARGET * 1000:.0f} ms: {fmt(p99, 1000)} ms"
        f" {'met' if p99 is not None and p99 <= PUBLISH_P99_TARGET else 'MISSED'};"
        f" RSS growth <= max({RSS_NOISE_MIB:.0f} MiB, {RSS_NOISE_RATIO:.0%}):"
        f" {'met' if not grows else 'MISSED'}"
    )


def report_logs(procs: list[Proc]) -> None:
    print("\nprocess logs (lines by level; warnings and errors, numbers folded to N)")
    for p in procs:
        levels, messages = p.log_summary()
        print(f"  {p.name:<10} {levels}")
        for message, count in sorted(messages.items(), key=lambda kv: -kv[1])[:6]:
            print(f"      {count:>5} x {message}")


if __name__ == "__main__":
    raise SystemExit(main())
