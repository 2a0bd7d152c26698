"""Chaos soak: expiry's processes under load while faults are injected at random.

    .venv/bin/python bench/chaos.py                        # 30 minutes, every fault
    .venv/bin/python bench/chaos.py --duration 600         # 10 minutes
    .venv/bin/python bench/chaos.py --quick                # about 2 minutes (tests/bench)
    .venv/bin/python bench/chaos.py --seed 7 --faults kill,stop,pg-down

A PostgreSQL 15 cluster of the soak's own (tests/clusters.py's ``private_cluster``:
initdb as the postgres user in a temporary folder, its own port; removed at the
end; the shared server on 5432 is never touched) holds bench/soak.py's table,
the drills' ``sessions`` with a backlog (60% expired, 10% expired but revoked,
30% live), and its delete trigger: every deleted row is recorded in
``soak_deleted`` with the database's clock and the newest cutoff opened at that
moment. Real processes run against it: 3 x ``expiry worker``, 1 x ``expiry
scheduler`` and 1 x ``expiry serve --no-workers`` (whose scheduler thread is a
second scheduler), with the policy ``expired-sessions`` (``where = "revoked_at
is null"``, window 1,000, ``lock_timeout = "2s"``, ``schedule = "* * * * *"``:
the period P is 60 s). Each process connects with ``application_name =
expiry-NAME`` (in its EXPIRY_DATABASE_URL): that is how the soak tells expiry's
sessions apart, since expiry names none of its own.

While the soak runs, bench/soak.py's feeder inserts --insert-rate rows/s (70%
expiring within --expire-within seconds, 15% revoked, 15% live for 30 days), a
reader runs point queries (the foreground), and every 5-60 s (--gap) a fault
is injected, dealt from a shuffled deck of the --faults kinds (seeded, --seed)
so that every kind comes round:

    kill                  SIGKILL of a random expiry process, started again at once
    stop                  SIGSTOP of a random process for longer than the lease, then SIGCONT
    pg-restart-fast       pg_ctl restart -m fast
    pg-restart-immediate  pg_ctl restart -m immediate (crash recovery)
    pg-down               the server stopped (-m immediate) for a while (--pg-down), then started
    terminate             pg_terminate_backend of every expiry session (application_name)
    row-lock              an expired row held FOR UPDATE from before the next run opens
                          until lock_timeout + 1-8 s after
    idle-tx               a session idle in transaction holding 5 expired rows (--idle-hold)
    workers-down          every worker SIGTERMed (one of them twice), down for 2 P + 5-15 s,
                          then started again

Each fault is printed with its time; the database's down times and the workers'
are outage windows. A process that exits without being told to is counted and
started again (as a process manager would). Every --every seconds the soak
samples the watermark (the age of the oldest expired row still present, the
``where`` applied, by the database's clock; rows the soak itself holds locked are
left out), and prints p50/p99/max of it over the run once warm (--warmup seconds
in, no fault before, and the backlog cleared), once over every sample and once
outside the outages (each window extended by --recovery seconds, the time a
sound system needs to catch up), against the target P + 60 s; and how long a run
stayed open at most. A line every --show seconds gives the watermark, due and
running jobs, dead jobs, runs opened and open, the oldest open run's age and the
rows deleted (the ledger).

At the end the faults and the load stop, every process is running, the last fed
rows are left to expire, the policy is paused, one final run is triggered and
the soak waits (--quiesce, 300 s) for every job and run to end. Then every
process gets SIGTERM, and the soak checks with its own SQL, printing one line
and its figure for each: no row deleted before a run's cutoff covered it (the
trigger's record), no protected row deleted, no window applied twice (no
overlapping ledger ranges, no id deleted twice), rows gone == the ledger ==
the trigger's record, no row left below the last finished run's cutoff, no job
lost (each completed, dead with a reason, or cancelled), no run left open, no
dead job, and every process exited 0 within 30 s of SIGTERM.
tests/drills/_invariants.py's checker runs too. The exit status is 1 when an
invariant fails; the watermark's target is printed, never asserted.

--quick: 100 s of load (the first 10 s a warm-up without faults), a 20,000-row
backlog, faults every 2-5 s, lease 10 s, the server down 5-10 s, idle
transactions of 15-25 s, and a run triggered through the API every 10 s (P = 10
s; cron's resolution is a minute, so a short form cannot wait for it);
quiescence bounded at 60 s. tests/bench/test_chaos_smoke.py runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg

import soak

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
POLICY, WHERE = soak.POLICY, soak.WHERE
LOCK_TIMEOUT = 2.0
"""The policy's lock_timeout (seconds): the row-lock fault holds its row past it."""
SIGTERM_GRACE = 30.0
"""A process must exit this long after SIGTERM; past it, it hangs (and is killed)."""
APP_NAME = "expiry-"
"""The prefix of every expiry process's application_name."""
FAULTS = (
    "kill",
    "stop",
    "pg-restart-fast",
    "pg-restart-immediate",
    "pg-down",
    "terminate",
    "row-lock",
    "idle-tx",
    "workers-down",
)


def load_module(name: str, path: Path) -> ModuleType:
    """A module of tests/ by its path (tests/ is not a package on sys.path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


clusters = load_module("chaos_clusters", ROOT / "tests" / "clusters.py")


# -- the timeline: faults, outages, rows held ----------------------------------------


@dataclass
class Timeline:
    """What the soak did and when (seconds since the load started)."""

    started: float = field(default_factory=time.monotonic)
    faults: list[tuple[float, str, str]] = field(default_factory=list)
    outages: list[list[Any]] = field(default_factory=list)
    """[start, end or None while it lasts, what]"""
    held: set[int] = field(default_factory=set)
    """ids of rows the soak holds locked (left out of the watermark)"""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return time.monotonic() - self.started

    def note(self, kind: str, detail: str) -> None:
        at = self.now()
        with self.lock:
            self.faults.append((at, kind, detail))
        stamp = time.strftime("%H:%M:%S")
        print(f"  !! {stamp} {at:7.1f}s  {kind}: {detail}", flush=True)

    @contextlib.contextmanager
    def outage(self, what: str) -> Iterator[None]:
        window: list[Any] = [self.now(), None, what]
        with self.lock:
            self.outages.append(window)
        try:
            yield
        finally:
            window[1] = self.now()

    def in_outage(self, at: float, recovery: float) -> bool:
        with self.lock:
            return any(
                start <= at and (end is None or at <= end + recovery)
                for start, end, _ in self.outages
            )

    def hold(self, ids: list[int]) -> None:
        with self.lock:
            self.held.update(ids)

    def release(self, ids: list[int]) -> None:
        with self.lock:
            self.held.difference_update(ids)

    def release_all(self) -> None:
        """The server went down: every session's locks went with it."""
        with self.lock:
            self.held.clear()

    def held_ids(self) -> list[int]:
        with self.lock:
            return sorted(self.held)


# -- the processes -------------------------------------------------------------------


@dataclass
class Process(soak.Proc):
    """soak.Proc whose log is appended to across restarts."""

    starts: int = 0

    def start(self) -> None:
        if self.log is None:
            self.log = self.log_path.open("a")
        self.starts += 1
        self.log.write(f'{{"level": "info", "message": "--- chaos: start #{self.starts}"}}\n')
        self.log.flush()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "expiry", *self.args],
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )


class Fleet:
    """The expiry processes. Processes the soak took down on purpose are in ``down``;
    any other that is not running exited on its own and is started again."""

    def __init__(self, procs: list[Process], timeline: Timeline) -> None:
        self.procs, self.timeline = procs, timeline
        self.down: set[str] = set()
        self.own_exits: list[str] = []
        self.sigterm_failures: list[str] = []
        """processes alive SIGTERM_GRACE after a SIGTERM (killed then), or that
        exited nonzero after one"""
        self.lock = threading.Lock()

    @property
    def workers(self) -> list[Process]:
        return [p for p in self.procs if p.name.startswith("worker")]

    def up(self) -> list[Process]:
        with self.lock:
            return [p for p in self.procs if p.name not in self.down]

    def revive(self) -> None:
        with self.lock:
            for p in self.procs:
                if p.name not in self.down and not p.alive():
                    code = p.popen.returncode if p.popen else None
                    self.own_exits.append(f"{p.name} exited {code}")
                    self.timeline.note("exit", f"{p.name} exited {code} on its own; started again")
                    p.start()

    def kill(self, p: Process) -> str:
        with self.lock:
            old = p.pid
            p.popen.kill()  # type: ignore[union-attr]
            p.popen.wait(10)  # type: ignore[union-attr]
            p.start()
        return f"{p.name} (pid {old}) SIGKILL; started again as pid {p.pid}"

    def pause(self, p: Process, seconds: float, stopping: threading.Event) -> None:
        os.kill(p.pid, signal.SIGSTOP)
        try:
            stopping.wait(seconds)
        finally:
            os.kill(p.pid, signal.SIGCONT)

    def stop_workers(self, twice: Process) -> list[str]:
        """SIGTERM every worker, a second one to ``twice`` a second later (an
        impatient operator); the workers still alive SIGTERM_GRACE after."""
        workers = self.workers
        with self.lock:
            self.down.update(p.name for p in workers)
        for p in workers:
            p.popen.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        time.sleep(1.0)
        twice.popen.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + SIGTERM_GRACE
        notes = []
        for p in workers:
            how = f"workers-down, SIGTERM{' x2' if p is twice else ''}"
            try:
                code = p.popen.wait(max(0.1, deadline - time.monotonic()))  # type: ignore[union-attr]
                notes.append(f"{p.name} exited {code}")
                if code != 0:
                    self.sigterm_failures.append(f"{p.name} exited {code} ({how})")
            except subprocess.TimeoutExpired:
                self.sigterm_failures.append(f"{p.name} hung ({how})")
                notes.append(f"{p.name} still alive {SIGTERM_GRACE:.0f} s after SIGTERM: killed")
                p.popen.kill()  # type: ignore[union-attr]
                p.popen.wait(10)  # type: ignore[union-attr]
        return notes

    def start_workers(self) -> None:
        with self.lock:
            for p in self.workers:
                if not p.alive():
                    p.start()
                self.down.discard(p.name)

    def stop_all(self) -> None:
        """SIGTERM to every process; those alive SIGTERM_GRACE after are hung."""
        for p in self.procs:
            if p.alive():
                p.popen.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + SIGTERM_GRACE
        for p in self.procs:
            if p.popen is None:
                continue
            try:
                code = p.popen.wait(max(0.1, deadline - time.monotonic()))
                if code != 0:
                    self.sigterm_failures.append(f"{p.name} exited {code} (final stop)")
            except subprocess.TimeoutExpired:
                self.sigterm_failures.append(f"{p.name} hung (final stop)")
            p.stop(timeout=1.0)  # closes the log; SIGKILL if still alive


# -- the faults ----------------------------------------------------------------------


class Injector(threading.Thread):
    """Deals faults from a shuffled deck of the chosen kinds, one every --gap seconds."""

    def __init__(
        self,
        args: argparse.Namespace,
        fleet: Fleet,
        cluster: Any,
        url: str,
        timeline: Timeline,
        stopping: threading.Event,
    ) -> None:
        super().__init__(name="faults", daemon=True)
        self.args, self.fleet, self.cluster, self.url = args, fleet, cluster, url
        self.timeline, self.stopping = timeline, stopping
        self.rng = random.Random(args.seed)
        self.holds: list[threading.Thread] = []
        self.dealt: dict[str, int] = {}

    def run(self) -> None:
        deck: list[str] = []
        if self.stopping.wait(self.args.warmup):
            return
        while not self.stopping.wait(self.rng.uniform(*self.args.gap)):
            if not deck:
                deck = list(self.args.faults)
                self.rng.shuffle(deck)
            kind = deck.pop()
            self.dealt[kind] = self.dealt.get(kind, 0) + 1
            try:
                getattr(self, "fault_" + kind.replace("-", "_"))()
            except Exception as exc:  # a fault that could not be injected is noted, not fatal
                self.timeline.note(kind, f"could not be injected: {type(exc).__name__}: {exc}")

    def fault_kill(self) -> None:
        p = self.rng.choice(self.fleet.up())
        self.timeline.note("kill", self.fleet.kill(p))

    def fault_stop(self) -> None:
        p = self.rng.choice(self.fleet.up())
        seconds = self.args.lease + self.rng.uniform(2.0, 10.0)
        self.timeline.note("stop", f"{p.name} (pid {p.pid}) SIGSTOP for {seconds:.1f} s")
        self.fleet.pause(p, seconds, self.stopping)
        self.timeline.note("stop", f"{p.name} SIGCONT")

    def fault_pg_restart_fast(self) -> None:
        self._restart("fast")

    def fault_pg_restart_immediate(self) -> None:
        self._restart("immediate")

    def _restart(self, mode: str) -> None:
        started = time.monotonic()
        with self.timeline.outage(f"pg_ctl restart -m {mode}"):
            self.timeline.release_all()
            self.cluster.restart(mode)
        took = time.monotonic() - started
        self.timeline.note(f"pg-restart-{mode}", f"pg_ctl restart -m {mode}: {took:.1f} s")

    def fault_pg_down(self) -> None:
        seconds = self.rng.uniform(*self.args.pg_down)
        self.timeline.note("pg-down", f"server stopped (-m immediate) for {seconds:.1f} s")
        with self.timeline.outage("server down"):
            self.timeline.release_all()
            self.cluster.stop()
            try:
                self.stopping.wait(seconds)
            finally:
                self.cluster.start()
        self.timeline.note("pg-down", "server started")

    def fault_terminate(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "select application_name, pg_terminate_backend(pid) from pg_stat_activity"
                " where application_name like %s and pid <> pg_backend_pid()",
                (APP_NAME + "%",),
            ).fetchall()
        by_name: dict[str, int] = {}
        for name, done in rows:
            by_name[name] = by_name.get(name, 0) + bool(done)
        detail = ", ".join(f"{n.removeprefix(APP_NAME)} {k}" for n, k in sorted(by_name.items()))
        self.timeline.note("terminate", f"{sum(by_name.values())} expiry sessions ({detail})")

    def fault_row_lock(self) -> None:
        self._hold("row-lock", rows=1, seconds=None)

    def fault_idle_tx(self) -> None:
        self._hold("idle-tx", rows=5, seconds=self.rng.uniform(*self.args.idle_hold))

    def _hold(self, kind: str, rows: int, seconds: float | None) -> None:
        extra = self.rng.uniform(1.0, 8.0)
        hold = Hold(self.url, kind, rows, seconds, extra, self.args, self.timeline, self.stopping)
        hold.start()
        self.holds.append(hold)

    def fault_workers_down(self) -> None:
        workers = self.fleet.workers
        twice = self.rng.choice(workers)
        seconds = 2 * self.args.period + self.rng.uniform(5.0, 15.0)
        with self.timeline.outage("workers down"):
            notes = self.fleet.stop_workers(twice)
            self.timeline.note(
                "workers-down",
                f"SIGTERM to {len(workers)} workers ({twice.name} twice): {'; '.join(notes)};"
                f" down for {seconds:.0f} s",
            )
            try:
                self.stopping.wait(seconds)
            finally:
                self.fleet.start_workers()
        self.timeline.note("workers-down", "workers started again")


class Hold(threading.Thread):
    """A session holding expired rows locked: ``row-lock`` FOR UPDATE from before
    the next run opens until lock_timeout + ``extra`` seconds after it (bounded by
    2 P + 30 s); ``idle-tx`` UPDATEd and then idle in transaction for ``seconds``.
    The rows are expired or expire within 2 s, so the next run's window meets them."""

    PICK = (
        "select id from sessions where expires_at < now() + interval '2 seconds'"
        " and revoked_at is null order by expires_at desc limit %s for update skip locked"
    )

    def __init__(
        self,
        url: str,
        kind: str,
        rows: int,
        seconds: float | None,
        extra: float,
        args: argparse.Namespace,
        timeline: Timeline,
        stopping: threading.Event,
    ) -> None:
        super().__init__(name=kind, daemon=True)
        self.url, self.kind, self.rows, self.seconds, self.extra = url, kind, rows, seconds, extra
        self.args, self.timeline, self.stopping = args, timeline, stopping

    def run(self) -> None:
        ids: list[int] = []
        try:
            with psycopg.connect(self.url) as conn:
                ids = [r[0] for r in conn.execute(self.PICK, (self.rows,))]
                if not ids:
                    self.timeline.note(self.kind, "no expired row to lock")
                    return
                self.timeline.hold(ids)
                if self.kind == "idle-tx":
                    conn.execute("update sessions set note = note where id = any(%s)", (ids,))
                self.timeline.note(self.kind, f"holding ids {ids} {self._how()}")
                held = self._wait(conn)
                conn.rollback()
            self.timeline.note(self.kind, f"released ids {ids} after {held:.1f} s")
        except psycopg.Error as exc:  # the server restarted under it: the lock is gone
            self.timeline.note(self.kind, f"ended by {type(exc).__name__}: {soak.first_line(exc)}")
        finally:
            self.timeline.release(ids)

    def _how(self) -> str:
        if self.seconds is not None:
            return f"idle in transaction for {self.seconds:.1f} s"
        return f"FOR UPDATE until lock_timeout + {self.extra:.1f} s after the next run opens"

    def _wait(self, conn: psycopg.Connection[Any]) -> float:
        started = time.monotonic()
        if self.seconds is not None:
            self.stopping.wait(self.seconds)
            return time.monotonic() - started
        deadline = started + 2 * self.args.period + 30.0
        opened = None
        while opened is None and time.monotonic() < deadline and not self.stopping.is_set():
            row = conn.execute("select 1 from expiry.runs where opened_at > now() limit 1")
            opened = row.fetchone()
            self.stopping.wait(0.5)
        self.stopping.wait(LOCK_TIMEOUT + self.extra)
        return time.monotonic() - started


# -- the foreground --------------------------------------------------------------------


@dataclass
class ReadStats:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0


class Reader(threading.Thread):
    """Point reads of random ids, 50 a second: the application's foreground."""

    def __init__(self, url: str, feeder: soak.Feeder, seed: int, stop: threading.Event) -> None:
        super().__init__(name="reader", daemon=True)
        self.url, self.feeder, self.stopping = url, feeder, stop
        self.rng = random.Random(seed)
        self.stats = ReadStats()

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self.stopping.wait(0.02):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
                started = time.monotonic()
                conn.execute(
                    "select id, expires_at from sessions where id = %s",
                    (self.rng.randrange(1, self.feeder.next_id),),
                ).fetchall()
                self.stats.latencies.append(time.monotonic() - started)
            except psycopg.Error:
                self.stats.errors += 1
                if conn is not None:
                    conn.close()
                    conn = None
                self.stopping.wait(0.5)
        if conn is not None:
            conn.close()


# -- sampling --------------------------------------------------------------------------


class Watch(soak.Monitor):
    """soak.Monitor without its restart notice: here the soak restarts the server."""

    def _restarted(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        pass


WATERMARK = (
    "select coalesce(extract(epoch from now() - min(expires_at)), 0)::float8 from sessions"
    f" where expires_at < now() and ({WHERE}) and not (id = any(%s::bigint[]))"
)
STATE = """
select (select count(*) from expiry.jobs where state in ('scheduled', 'available', 'retryable')
          and run_at <= now()),
       (select count(*) from expiry.jobs where state = 'running'),
       (select count(*) from expiry.jobs where state = 'dead'),
       (select count(*) from expiry.runs),
       (select count(*) from expiry.runs where state <> 'finished'),
       (select coalesce(extract(epoch from now() - min(opened_at)), 0)::float8
          from expiry.runs where state <> 'finished'),
       (select coalesce(sum(rows_affected), 0) from expiry.ledger where run_id is not null)
"""


@dataclass
class Sample:
    elapsed: float
    watermark: float
    due: int
    running: int
    dead: int
    runs: int
    open_runs: int
    oldest_open: float
    deleted: int
    outage: bool


def take_sample(watch: Watch, timeline: Timeline, recovery: float) -> Sample | None:
    """One reading; None when the database cannot be read (it is down)."""
    elapsed = timeline.now()
    held = timeline.held_ids()
    try:
        mark, state = watch.run(
            lambda c: (c.execute(WATERMARK, (held,)).fetchone(), c.execute(STATE).fetchone())
        )
    except psycopg.Error:
        watch.close()
        return None
    due, running, dead, runs, open_runs, oldest, deleted = state
    return Sample(
        elapsed,
        float(mark[0]),
        int(due),
        int(running),
        int(dead),
        int(runs),
        int(open_runs),
        float(oldest),
        int(deleted),
        timeline.in_outage(elapsed, recovery),
    )


HEADER = (
    f"{'elapsed':>8} {'watermark':>10} {'due':>5} {'running':>7} {'dead':>4}"
    f" {'runs':>5} {'open':>4} {'oldest open':>11} {'rows deleted':>12}  outage"
)


def line(s: Sample) -> str:
    return (
        f"{s.elapsed:7.0f}s {s.watermark:9.1f}s {s.due:>5} {s.running:>7} {s.dead:>4}"
        f" {s.runs:>5} {s.open_runs:>4} {s.oldest_open:10.1f}s {s.deleted:>12,}"
        f"  {'yes' if s.outage else ''}"
    )


# -- the soak --------------------------------------------------------------------------


@dataclass
class Soak:
    """Everything a run of the soak holds; built by ``start``."""

    args: argparse.Namespace
    cluster: Any
    url: str
    port: int
    env: dict[str, str]
    fleet: Fleet
    timeline: Timeline
    stopping: threading.Event
    incidents: soak.Incidents
    feeder: soak.Feeder
    reader: Reader
    injector: Injector
    triggerer: soak.Triggerer | None
    samples: list[Sample] = field(default_factory=list)
    quiesced: float | None = None
    """seconds the final drain took; None when it did not end in --quiesce"""


def app_url(url: str, name: str) -> str:
    return f"{url}?application_name={APP_NAME}{name}"


def write_config(path: Path, url: str, port: int, args: argparse.Namespace) -> Path:
    path.write_text(
        f"""[database]
url = {json.dumps(app_url(url, "cli"))}

[http]
listen = "127.0.0.1:{port}"

[worker]
lease = "{args.lease:g}s"

[[policy]]
name = {json.dumps(POLICY)}
table = "sessions"
key = "id"
timestamp = "expires_at"
retain = "0s"
where = {json.dumps(WHERE)}
window = 1000
lock_timeout = "{LOCK_TIMEOUT:g}s"
schedule = "* * * * *"
"""
    )
    return path


def make_fleet(env: dict[str, str], url: str, port: int, logs: Path, timeline: Timeline) -> Fleet:
    def proc(name: str, args: list[str], ready: str) -> Process:
        own = {**env, "EXPIRY_DATABASE_URL": app_url(url, name)}
        return Process(name, args, own, logs / f"{name}.log", ready)

    procs = [proc(f"worker-{n}", ["worker"], "worker started") for n in (1, 2, 3)]
    procs.append(proc("scheduler", ["scheduler"], "scheduler started"))
    listen = ["serve", "--no-workers", "--listen", f"127.0.0.1:{port}"]
    procs.append(proc("serve", listen, "serving on"))
    return Fleet(procs, timeline)


def start_fleet(fleet: Fleet, port: int) -> bool:
    for p in fleet.procs:
        p.start()
    deadline = time.monotonic() + 120
    while not all(p.ready() for p in fleet.procs) or not soak.health(port):
        dead = [p for p in fleet.procs if not p.alive()]
        if dead or time.monotonic() > deadline:
            for p in dead or fleet.procs:
                print(f"{p.name} did not start:\n{p.tail()}", file=sys.stderr)
            return False
        time.sleep(0.2)
    print("processes ready: " + ", ".join(f"{p.name} {p.pid}" for p in fleet.procs), flush=True)
    return True


def setup(args: argparse.Namespace, url: str, invariants: ModuleType) -> int:
    """The table, its backlog and trigger (bench/soak.py's), the survivors' record."""
    soak.setup_target(url, args.rows)
    target = invariants.Target(policy=POLICY, where=WHERE)
    survivors = invariants.record_expected(url, [target])["sessions"]
    print(f"backlog loaded: {args.rows:,} rows, {survivors:,} protected or live", flush=True)
    with psycopg.connect(url) as conn:
        row = conn.execute("select coalesce(max(id), 0) + 1 from sessions").fetchone()
    return int(row[0]) if row else 1


def build(args: argparse.Namespace, cluster: Any, logs: Path, invariants: ModuleType) -> Soak:
    url = cluster.url
    first_id = setup(args, url, invariants)
    port = soak.free_port()
    config = write_config(logs / "expiry.toml", url, port, args)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    env.update(EXPIRY_CONFIG=str(config), EXPIRY_LOG_FORMAT="json")
    timeline, stopping, incidents = Timeline(), threading.Event(), soak.Incidents()
    fleet = make_fleet(env, url, port, logs, timeline)
    feeder = soak.Feeder(url, first_id, args.insert_rate, args.expire_within, stopping, incidents)
    feeder.rng = random.Random(args.seed + 1)
    triggerer = None
    if args.trigger_every:
        key = str(soak.cli(env, "keys", "create", "chaos-op")["key"])
        api = soak.Api(port, key)
        triggerer = soak.Triggerer(api, args.trigger_every, stopping, incidents)
    return Soak(
        args,
        cluster,
        url,
        port,
        env,
        fleet,
        timeline,
        stopping,
        incidents,
        feeder,
        Reader(url, feeder, args.seed + 2, stopping),
        Injector(args, fleet, cluster, url, timeline, stopping),
        triggerer,
    )


def load(s: Soak) -> None:
    """The load and the faults until --duration; a sample every --every seconds."""
    watch = Watch(s.url, s.incidents, patience=2.0)
    s.timeline.started = time.monotonic()
    threads = [s.feeder, s.reader, s.injector] + ([s.triggerer] if s.triggerer else [])
    for thread in threads:
        thread.start()
    print(HEADER, flush=True)
    shown = -1e9
    while s.timeline.now() < s.args.duration:
        s.fleet.revive()
        sample = take_sample(watch, s.timeline, s.args.recovery)
        if sample is not None:
            s.samples.append(sample)
            if sample.elapsed - shown >= s.args.show - 1e-6:
                print(line(sample), flush=True)
                shown = sample.elapsed
        s.stopping.wait(max(0.0, s.args.every - (s.timeline.now() % s.args.every)))
    watch.close()


def stop_load(s: Soak) -> None:
    """Faults and load stop; every process is running and no row is held."""
    s.stopping.set()
    for thread in [s.injector, *s.injector.holds, s.feeder, s.reader, s.triggerer]:
        if thread is not None:
            thread.join(SIGTERM_GRACE * 3 + 60)
    s.fleet.revive()


def drain(s: Soak) -> None:
    """The last fed rows expire, the policy is paused, one final run, and the soak
    waits (at most --quiesce seconds) for every job and run to end."""
    watch = Watch(s.url, s.incidents, patience=60.0)
    row = watch.run(
        lambda c: c.execute(
            "select coalesce(extract(epoch from max(expires_at) - now()), 0)::float8"
            " from sessions where expires_at < now() + interval '1 day'"
        ).fetchone()
    )
    wait = max(0.0, float(row[0]) if row else 0.0) + 1.5
    print(f"\nfaults and load stopped; waiting {wait:.1f} s for the last fed rows to expire")
    time.sleep(wait)
    try:
        soak.cli(s.env, "pause", POLICY)
        final = soak.cli(s.env, "trigger", POLICY)["run_id"]
    except RuntimeError as exc:  # the checks still run, and say what is left
        final = f"not opened: {exc}"
    started = time.monotonic()
    while time.monotonic() - started < s.args.quiesce:
        s.fleet.revive()
        if not any(watch.run(lambda c: (soak.pending_jobs(c), soak.unfinished_runs(c)))):
            s.quiesced = time.monotonic() - started
            break
        time.sleep(0.5)
    took = f"in {s.quiesced:.1f} s" if s.quiesced is not None else "NOT reached"
    print(f"policy paused; final run {final}; quiescent {took} (bound {s.args.quiesce:.0f} s)")
    sample = take_sample(watch, s.timeline, 0.0)
    if sample is not None:
        s.samples.append(sample)
        print(line(sample), flush=True)
    watch.close()


# -- the report ------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    if not values:
        return "no samples"
    p50, p99 = soak.percentile(values, 0.5), soak.percentile(values, 0.99)
    return f"p50 {p50:.1f} / p99 {p99:.1f} / max {max(values):.1f} s ({len(values)} samples)"


def settled(s: Soak, target: float) -> float:
    """When the warm-up ends: --warmup seconds in, and the backlog cleared (the
    first sample at or below the target after it; --warmup if there is none)."""
    under_load = [x for x in s.samples if s.args.warmup <= x.elapsed <= s.args.duration]
    return next((x.elapsed for x in under_load if x.watermark <= target), s.args.warmup)


def report_watermark(s: Soak) -> None:
    target = s.args.period + 60.0
    start = settled(s, target)
    steady = [x for x in s.samples if start <= x.elapsed <= s.args.duration]
    outside = [x.watermark for x in steady if not x.outage]
    p99 = soak.percentile(outside, 0.99)
    print(
        f"\nwatermark, period P = {s.args.period:.0f} s (from {start:.0f} s: the {s.args.warmup:.0f} s"
        " warm-up, and the backlog cleared)"
    )
    print(f"  all samples:     {spread([x.watermark for x in steady])}")
    print(f"  outside outages: {spread(outside)} (each outage + {s.args.recovery:.0f} s recovery)")
    print(
        f"  longest a run stayed open: {max((x.oldest_open for x in s.samples), default=0):.1f} s"
    )
    verdict = "-" if p99 is None else f"{p99:.1f} s {'met' if p99 <= target else 'MISSED'}"
    print(
        f"target (printed, not asserted): watermark p99 outside outages <= P + 60 s"
        f" = {target:.0f} s: {verdict}"
    )


def report_faults(s: Soak) -> None:
    dealt = s.injector.dealt
    text = ", ".join(f"{k} {n}" for k, n in sorted(dealt.items()))
    print(f"\nfaults injected: {sum(dealt.values())} ({text or 'none'}); seed {s.args.seed}")
    db = [o for o in s.timeline.outages if o[2] != "workers down"]
    workers = [o for o in s.timeline.outages if o[2] == "workers down"]
    print(
        f"outages: {len(s.timeline.outages)} (database down {len(db)} times,"
        f" {sum((e or 0) - b for b, e, _ in db):.1f} s in all; workers down {len(workers)}"
        f" times, {sum((e or 0) - b for b, e, _ in workers):.1f} s in all)"
    )
    for start, end, what in s.timeline.outages:
        print(f"  {start:7.1f}s - {(end or 0):7.1f}s  {what}")
    exits = ", ".join(s.fleet.own_exits) or "none"
    print(f"processes that exited on their own (started again): {exits}")


def report_load(s: Soak) -> None:
    f, r = s.feeder.stats, s.reader.stats
    print(
        f"load: {f.inserted:,} rows inserted ({f.expiring:,} expiring, {f.protected:,} revoked,"
        f" {f.live:,} live), failed batches {f.failed_batches}; {len(r.latencies):,} reads"
        f" (p50 {1000 * (soak.percentile(r.latencies, 0.5) or 0):.1f} ms, p99"
        f" {1000 * (soak.percentile(r.latencies, 0.99) or 0):.1f} ms), read errors {r.errors}"
    )
    if s.triggerer is not None:
        t = s.triggerer.stats
        print(f"API triggers: {len(t.runs)} ({t.created} opened a run), failed {t.failed}")


# -- the invariants ----------------------------------------------------------------------

EARLY = """
select count(*) filter (where newest_cutoff is null or expires_at >= newest_cutoff),
       count(*) filter (where revoked_at is not null),
       (select count(*) from drill_survivors s where s.tbl = 'sessions'
          and not exists (select 1 from sessions t where t.id = s.id))
from soak_deleted
"""
TWICE = """
select (select count(*) from (
          select lo, hi, lag(hi) over (partition by run_id order by lo, hi) as prev_hi
          from expiry.ledger where run_id is not null) x where lo >= hi or lo < prev_hi),
       (select count(*) from (select id from soak_deleted group by id having count(*) > 1) y),
       (select count(*) from (select key from expiry.ledger group by key having count(*) > 1) z)
"""
EFFECT = """
select (select rows from drill_baseline where tbl = 'sessions') - (select count(*) from sessions),
       (select coalesce(sum(rows_affected), 0) from expiry.ledger where policy = %(policy)s),
       (select count(*) from soak_deleted)
"""
LEFT = f"""
with last as (select max(cutoff) as cutoff from expiry.runs
              where policy = %(policy)s and state = 'finished')
select (select cutoff from last),
       (select count(*) from sessions, last where expires_at < last.cutoff and ({WHERE}))
"""
JOBS = """
select state, count(*), count(*) filter (where coalesce(last_error, '') = '')
from expiry.jobs group by state
"""
OPEN_RUNS = """
select r.id, r.state, extract(epoch from now() - r.opened_at)::float8,
       (select format('%s, attempt %s, due in %s s%s', j.state, j.attempt,
                      round(extract(epoch from j.run_at - now())::numeric, 1),
                      coalesce(', last error: ' || j.last_error, ''))
        from expiry.jobs j where j.run_id = r.id and j.handler = 'expiry.plan'
        order by j.id desc limit 1)
from expiry.runs r where r.state <> 'finished' order by r.opened_at
"""
DEAD = """
select coalesce(last_error_kind, '?'), left(coalesce(last_error, ''), 120), count(*)
from expiry.jobs where state = 'dead' group by 1, 2 order by 3 desc limit 3
"""


@dataclass
class Check:
    label: str
    figure: str
    ok: bool

    def __str__(self) -> str:
        return f"  {'ok  ' if self.ok else 'FAIL'}  {self.label}: {self.figure}"


def check_rows(c: psycopg.Connection[Any]) -> list[Check]:
    early, revoked, missing = c.execute(EARLY).fetchone()  # type: ignore[misc]
    ranges, ids, keys = c.execute(TWICE).fetchone()  # type: ignore[misc]
    gone, ledger, recorded = c.execute(EFFECT, {"policy": POLICY}).fetchone()  # type: ignore[misc]
    cutoff, left = c.execute(LEFT, {"policy": POLICY}).fetchone()  # type: ignore[misc]
    return [
        Check("live rows deleted before their run's cutoff", f"{early}", early == 0),
        Check(
            "protected rows deleted",
            f"{revoked + missing} (revoked {revoked}, survivors missing {missing})",
            revoked + missing == 0,
        ),
        Check(
            "windows applied twice",
            f"{ranges + ids + keys} (overlapping ledger ranges {ranges}, ids deleted twice {ids},"
            f" ledger keys twice {keys})",
            ranges + ids + keys == 0,
        ),
        Check(
            "rows gone vs the ledger",
            f"{gone:,} gone, {ledger:,} in the ledger, {recorded:,} by the delete trigger",
            gone == ledger == recorded,
        ),
        Check(
            "rows left below the last finished run's cutoff",
            f"{left} (cutoff {cutoff})" if cutoff is not None else "no run finished",
            cutoff is not None and left == 0,
        ),
    ]


def check_work(c: psycopg.Connection[Any], fleet: Fleet) -> list[Check]:
    states = {state: (int(n), int(blank)) for state, n, blank in c.execute(JOBS)}
    pending = {s: n for s, (n, _) in states.items() if s not in ("completed", "dead", "cancelled")}
    silent = states.get("dead", (0, 0))[1]
    runs = c.execute(OPEN_RUNS).fetchall()
    dead = c.execute(DEAD).fetchall()
    lost = sum(pending.values()) + silent
    oldest = (
        f"; oldest {runs[0][0]} {runs[0][1]} for {runs[0][2]:.0f} s, its plan job: {runs[0][3]}"
        if runs
        else ""
    )
    reasons = "; ".join(f"{n} x {kind}: {text}" for kind, text, n in dead)
    return [
        Check(
            "jobs lost (not completed, dead with a reason, or cancelled)",
            f"{lost} (pending {pending or 0}, dead without a reason {silent})",
            lost == 0,
        ),
        Check("runs left open or stalled", f"{len(runs)}{oldest}", not runs),
        Check(
            "dead jobs",
            f"{states.get('dead', (0, 0))[0]}{' (' + reasons + ')' if dead else ''}",
            not dead,
        ),
        Check(
            f"processes not exited 0 within {SIGTERM_GRACE:.0f} s of SIGTERM",
            f"{len(fleet.sigterm_failures)} ({', '.join(fleet.sigterm_failures) or 'none'})",
            not fleet.sigterm_failures,
        ),
    ]


def report_invariants(s: Soak, invariants: ModuleType) -> bool:
    """Print each invariant with its figure; True when all hold."""
    with psycopg.connect(s.url, autocommit=True) as conn:
        checks = check_rows(conn) + check_work(conn, s.fleet)
    drills = invariants.violations(s.url, [invariants.Target(policy=POLICY, where=WHERE)])
    print("\ninvariants")
    for check in checks:
        print(check)
    print(f"  drills checker (tests/drills/_invariants.py): {drills}")
    failed = [c.label for c in checks if not c.ok]
    if drills.violations:
        failed.append("the drills checker")
    if failed:
        print(f"\nchaos: {len(failed)} invariants FAILED: {'; '.join(failed)}")
    else:
        print("\nchaos: all invariants hold")
    return not failed


def report_logs(fleet: Fleet) -> None:
    print("\nprocess logs (lines by level; warnings and errors, numbers folded to N)")
    for p in fleet.procs:
        levels, messages = p.log_summary()
        print(f"  {p.name:<10} starts {p.starts}, {levels}")
        for message, count in sorted(messages.items(), key=lambda kv: -kv[1])[:5]:
            print(f"      {count:>5} x {' '.join(message.split())[:150]}")


# -- main ------------------------------------------------------------------------------


def run(args: argparse.Namespace, cluster: Any, logs: Path) -> int:
    invariants = soak.load_invariants()
    s = build(args, cluster, logs, invariants)
    try:
        if not start_fleet(s.fleet, s.port):
            return 1
        load(s)
        stop_load(s)
        drain(s)
    finally:
        s.stopping.set()
        s.fleet.stop_all()
    report_watermark(s)
    report_faults(s)
    report_load(s)
    report_logs(s.fleet)
    return 0 if report_invariants(s, invariants) else 1


def parse_faults(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown fault kinds {unknown}: choose from {', '.join(FAULTS)}"
            if unknown
            else "name at least one fault kind"
        )
    return kinds


def pair(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition("-")
    try:
        low, high = float(lo), float(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write LOW-HIGH seconds, e.g. 5-60") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: 0 <= LOW <= HIGH please")
    return low, high


QUICK = {
    "duration": 100.0,
    "rows": 20_000,
    "expire_within": 10.0,
    "gap": (2.0, 5.0),
    "lease": 10.0,
    "trigger_every": 10.0,
    "warmup": 10.0,
    "every": 2.0,
    "show": 10.0,
    "recovery": 10.0,
    "quiesce": 60.0,
    "idle_hold": (15.0, 25.0),
    "pg_down": (5.0, 10.0),
}
FULL = {
    "duration": 1800.0,
    "rows": 200_000,
    "expire_within": 30.0,
    "gap": (5.0, 60.0),
    "lease": 30.0,
    "trigger_every": 0.0,
    "warmup": 60.0,
    "every": 5.0,
    "show": 30.0,
    "recovery": 30.0,
    "quiesce": 300.0,
    "idle_hold": (90.0, 180.0),
    "pg_down": (10.0, 45.0),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="about 2 minutes: 100 s of load, P = 10 s")
    add("--duration", type=float, help="seconds of load and faults (1800; quick 100)")
    add("--seed", type=int, default=1, help="the faults' and the load's random seed (1)")
    add("--faults", type=parse_faults, default=list(FAULTS), help="comma list: " + ",".join(FAULTS))
    add("--gap", type=pair, help="seconds between faults, LOW-HIGH (5-60; quick 2-5)")
    add("--rows", type=int, help="backlog rows (200000; quick 20000)")
    add("--insert-rate", type=float, default=200.0, help="rows/s fed (200)")
    add("--expire-within", type=float, help="fed rows expire within (30 s; quick 10)")
    add("--lease", type=float, help="the workers' lease, seconds (30; quick 10)")
    add("--trigger-every", type=float, help="API trigger every N s, 0 for none (0; quick 10)")
    add("--warmup", type=float, help="no faults and no figures before (60 s; quick 10)")
    add("--every", type=float, help="seconds between samples (5; quick 2)")
    add("--show", type=float, help="seconds between printed lines (30; quick 10)")
    add("--recovery", type=float, help="seconds after an outage left out too (30; quick 10)")
    add("--quiesce", type=float, help="bound on the final drain, seconds (300; quick 60)")
    add("--idle-hold", type=pair, help="idle-tx hold, LOW-HIGH seconds (90-180; quick 15-25)")
    add("--pg-down", type=pair, help="pg-down time, LOW-HIGH seconds (10-45; quick 5-10)")
    add("--logs", help="keep expiry.toml, the process logs and server.log in this directory")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.period = min(60.0, args.trigger_every) if args.trigger_every else 60.0
    if min(args.duration, args.every, args.show, args.lease, args.insert_rate) <= 0:
        parser.error("--duration, --every, --show, --lease and --insert-rate: positive please")
    if args.rows < 0 or args.trigger_every < 0 or args.expire_within <= 0.5:
        parser.error("--rows >= 0, --trigger-every >= 0 and --expire-within > 0.5 please")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"chaos: {args.duration:.0f} s of load and faults ({', '.join(args.faults)}), seed"
        f" {args.seed}; 3 workers + scheduler + serve --no-workers on a private PostgreSQL;"
        f" P = {args.period:.0f} s (cron every minute"
        + (f", API trigger every {args.trigger_every:.0f} s" if args.trigger_every else "")
        + f"); lease {args.lease:.0f} s; faults every {args.gap[0]:.0f}-{args.gap[1]:.0f} s;"
        f" cpus {os.cpu_count()}, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    with (
        clusters.private_cluster() as cluster,
        tempfile.TemporaryDirectory(prefix="expiry_chaos_") as tmpdir,
    ):
        logs = Path(args.logs) if args.logs else Path(tmpdir)
        logs.mkdir(parents=True, exist_ok=True)
        try:
            return run(args, cluster, logs)
        finally:
            if args.logs:
                with contextlib.suppress(OSError):
                    shutil.copy(cluster.data / "server.log", logs / "server.log")


if __name__ == "__main__":
    raise SystemExit(main())
