"""Cleanup throughput as deployed: `expiry worker` and `expiry trigger --wait`
against a hand-written loop of PK-window DELETEs, and where a run's time goes.

    .venv/bin/python bench/deployed_throughput.py                  # 2,000,000 rows, window 10,000, 3 rounds
    .venv/bin/python bench/deployed_throughput.py --rows 1000000 --rounds 3
    .venv/bin/python bench/deployed_throughput.py --rows 100000 --rounds 1 --connections 1   # smoke
    .venv/bin/python bench/deployed_throughput.py --baseline loop,single     # and one unbounded DELETE
    .venv/bin/python bench/deployed_throughput.py --key text --baseline single   # Django's text key

The table is ``sessions (id bigint primary key, expires_at timestamptz not
null, payload text)`` with an index on ``expires_at``; exactly 800 of every
1,000 consecutive ids are expired (1 s to 1 day ago), the others expire a day
or more from now. It is built afresh (VACUUM ANALYZE, then a CHECKPOINT) before
each method, never reused, with autovacuum off on it so that a vacuum starting
during one method and not the other does not decide the result. With ``--key
text`` the key is Django's ``session_key`` (``varchar(40)``: 32 hex characters
of md5 of the row number, so key order is random against the heap's) and with
``--key uuid`` a ``uuid`` (the same md5 as a uuid); either way a column ``n``
(the row number) says which rows are expired, by the same rule. Per connection
count N (1, then 2) and round, in alternating order:

* expiry, as a user deploys it: a fresh ``expiry`` schema, an ``expiry.toml``
  with one delete policy (``retain = "0s"``, ``window = --window``,
  ``nice_ratio = 0``, the rest default), ``expiry migrate``, ONE idle
  ``expiry worker --concurrency N`` (waited for until its roll-call row is in
  ``expiry.workers``, then IDLE_SECONDS), then ``expiry trigger POLICY
  --wait``; SIGTERM to the worker after. The time is the run's own span in the
  database, ``expiry.runs.finished_at - opened_at``: no Python start-up.
* loop: N connections (threads) take PK windows ``(lo, lo + window]`` from a
  shared counter (from the expired rows' ``min(id) - 1`` to their ``max(id)``)
  and run ``DELETE FROM sessions WHERE id > lo AND id <= hi AND expires_at <
  cutoff`` (prepared), each its own autocommit transaction, timed from the
  first statement (the bounds) to the last. Each DELETE is also timed alone.
  An integer key only (``--key bigint``).
* single: one unbounded ``DELETE FROM sessions WHERE expires_at < now()`` on
  one connection, its own transaction (Django's clearsessions), timed from the
  statement's start to its commit, whatever N is.

After each method an oracle: the rows the method says it deleted equal the
expired rows, no row of an expired id is left and every live one is.

For the last round of each N, the expiry run's windows are taken apart from
what the database stores (expiry.runs, expiry.jobs, expiry.ledger), and the
stamps that are not stored are named. Every stamp is a PostgreSQL ``now()``,
the start of the transaction that wrote it: a job's ``attempted_at`` is its
claim's start (shared by the jobs of one claim), a window's ``finished_at``
(= ``updated_at``, = its ledger row's ``applied_at``) the start of its one
statement, which deletes, books and completes it in its own transaction.
A run's ``finished_at`` is the latest of its jobs' ``finished_at``: its span
ends as its last window statement starts. No stamp marks a statement's end.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from scratch import scratch_database

ROOT = Path(__file__).resolve().parents[1]
EXPIRY = str(ROOT / ".venv" / "bin" / "expiry")
ADMIN = os.environ.get("EXPIRY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
POLICY = "expired-sessions"
IDLE_SECONDS = 2.5
"""After the roll call: the job loops' first claims come back empty, and the
worker's health checks (one a second) read the database as it is idle, not
while the bench set it up: an idle worker, as deployed."""
START_TIMEOUT = 60.0

# Row i is expired iff (i * 2654435761) mod 1000 < 800: 2654435761 = 761 (mod 1000)
# and gcd(761, 1000) = 1, so every 1,000 consecutive ids hold exactly 800.
# With a bigint key the row number is the id; otherwise a column n holds it.
KEYS = {
    "bigint": ("id bigint primary key", "id", "i"),
    "text": ("id varchar(40) primary key, n bigint not null", "n", "md5(i::text)"),
    "uuid": ("id uuid primary key, n bigint not null", "n", "md5(i::text)::uuid"),
}
"""Per --key: the key's column declaration, the column holding the row number,
and the key's value for row i."""


def expired_rule(key: str) -> str:
    return f"({KEYS[key][1]} * 2654435761) % 1000 < 800"


def build_statements(key: str) -> list[str]:
    declare, number, value = KEYS[key]
    extra = ", n" if number == "n" else ""
    return [
        "drop table if exists sessions",
        f"create table sessions ({declare}, expires_at timestamptz not null,"
        " payload text) with (autovacuum_enabled = false)",
        f"insert into sessions (id{extra}, expires_at, payload)"
        f" select {value}{', i' if extra else ''}, case when (i * 2654435761) %% 1000 < 800"
        " then now() - make_interval(secs => 1 + i %% 86400)"
        " else now() + interval '1 day' + make_interval(secs => 1 + i %% 86400) end,"
        " md5(i::text) || md5((i + 1)::text) || md5((i + 2)::text) || 'sess'"
        " from generate_series(1, %(rows)s::bigint) as i",
        "create index sessions_expires_at on sessions (expires_at)",
        "vacuum analyze sessions",
        "checkpoint",
    ]


def oracle_query(key: str) -> str:
    return (
        "select count(*), count(*) filter (where " + expired_rule(key) + "),"
        " count(*) filter (where expires_at < now()) from sessions"
    )


SINGLE = "delete from sessions where expires_at < %(cutoff)s"
BOUNDS = "select min(id), max(id) from sessions where expires_at < %(cutoff)s"
DELETE = "delete from sessions where id > %(lo)s and id <= %(hi)s and expires_at < %(cutoff)s"

RUN = (
    "select id, extract(epoch from finished_at - opened_at)::float8, opened_at, planned_at,"
    " finished_at, windows_planned,"
    " (select coalesce(sum(rows_affected), 0) from expiry.ledger l where l.run_id = r.id)"
    " from expiry.runs r where policy = %s and state = 'finished'"
    " order by opened_at desc limit 1"
)
# Every stamp relative to the run's opening, in seconds.
JOBS = """
select j.id, j.handler, j.attempt,
       extract(epoch from j.created_at - r.opened_at)::float8,
       extract(epoch from j.attempted_at - r.opened_at)::float8,
       extract(epoch from j.finished_at - r.opened_at)::float8,
       extract(epoch from j.updated_at - r.opened_at)::float8,
       extract(epoch from l.applied_at - r.opened_at)::float8,
       j.lease_expires_at is null, l.rows_affected, l.lo, l.hi, l.worker, j.state
from expiry.jobs j
join expiry.runs r on r.id = j.run_id
left join expiry.ledger l on l.key = j.key
where j.run_id = %s
order by j.finished_at, j.id
"""


# -- results ---------------------------------------------------------------------------


@dataclass
class Measured:
    method: str  # "expiry" or "loop"
    seconds: float
    rows: int
    deletes: list[float] = field(default_factory=list)  # the loop's statements, each
    run_id: str = ""


@dataclass
class Window:
    """One window job of a run, its stamps in seconds from the run's opening."""

    job: int
    attempt: int
    created: float
    claimed: float  # attempted_at: its claim's start
    started: float  # finished_at: its statement's start
    updated: float
    applied: float | None  # the ledger row's applied_at
    lease_cleared: bool
    rows: int
    lo: int | None
    hi: int | None
    worker: str | None


class Mismatch(RuntimeError):
    """A method left other rows than exactly the live ones."""


# -- the table --------------------------------------------------------------------------


def build(url: str, rows: int, fresh_schema: bool, key: str = "bigint") -> int:
    """(Re)build ``sessions``; with ``fresh_schema``, drop expiry's schema first
    (a deploy from scratch: ``expiry migrate`` makes it again). The expired rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        if fresh_schema:
            conn.execute("drop schema if exists expiry cascade")
        for statement in build_statements(key):
            conn.execute(statement, {"rows": rows} if "%(rows)s" in statement else None)
        row = conn.execute("select count(*) from sessions where " + expired_rule(key)).fetchone()
    assert row is not None
    return int(row[0])


def oracle(
    url: str, method: str, rows: int, expired: int, deleted: int, key: str = "bigint"
) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        left, expired_left, past_due = conn.execute(oracle_query(key)).fetchone() or (0, 0, 0)
    if deleted != expired or expired_left or past_due or left != rows - expired:
        raise Mismatch(
            f"{method}: deleted {deleted:,} of {expired:,} expired rows; {left:,} rows left "
            f"({expired_left:,} of expired ids, {past_due:,} past due), expected {rows - expired:,}"
        )


# -- expiry, as deployed -------------------------------------------------------------------


PACINGS = {
    "zero": "nice_ratio = 0\n",
    "shipped": "",
    "always": 'nice_when = "always"\n',
    "blocks": 'nice_ratio = 0\nwindows = "blocks"\n',
}
"""The policy's pacing lines: no rests (the loop does not rest either), the
defaults as shipped (nice_ratio 1, resting only while the application's
sessions are at work), nice_ratio 1 resting after every window (the
default before nice_when), and no rests with the table's heap blocks as
windows (windows = "blocks": a range of row addresses, no key index read)."""


def write_config(path: Path, url: str, window: int, pacing: str = "zero") -> Path:
    path.write_text(
        f"""[database]
url = "{url}"

[[policy]]
name = "{POLICY}"
table = "sessions"
key = "id"
timestamp = "expires_at"
retain = "0s"
window = {window}
"""
        + PACINGS[pacing]
    )
    return path


def wait_listening(url: str, worker: subprocess.Popen[bytes], log: Path) -> None:
    """Until the worker's roll-call row is in expiry.workers (written after its
    LISTEN, before its job loops start), then IDLE_SECONDS."""
    deadline = time.monotonic() + START_TIMEOUT
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited {worker.returncode}: {log.read_text()}")
            if conn.execute("select count(*) from expiry.workers").fetchone() == (1,):
                time.sleep(IDLE_SECONDS)
                return
            time.sleep(0.05)
    raise RuntimeError(f"the worker did not start within {START_TIMEOUT:g} s")


def stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def expiry_run(url: str, cfg: Path, connections: int, tmp: Path) -> Measured:
    env = {**os.environ, "EXPIRY_CONFIG": str(cfg)}
    env.pop("EXPIRY_DATABASE_URL", None)
    subprocess.run([EXPIRY, "migrate"], env=env, check=True, capture_output=True)
    log = tmp / f"worker-{connections}.log"
    with log.open("wb") as sink:
        worker = subprocess.Popen(
            [EXPIRY, "worker", "--concurrency", str(connections)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
        try:
            wait_listening(url, worker, log)
            done = subprocess.run(
                [EXPIRY, "trigger", POLICY, "--wait", "--timeout", "15m"],
                env=env,
                capture_output=True,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"expiry trigger --wait exited {done.returncode}: "
                    f"{done.stdout.decode()} {done.stderr.decode()}"
                )
        finally:
            stop(worker)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(RUN, (POLICY,)).fetchone()
    if row is None:
        raise RuntimeError("no finished run in expiry.runs")
    return Measured("expiry", float(row[1]), int(row[6]), run_id=str(row[0]))


# -- the hand-written loop -----------------------------------------------------------------


def loop_run(url: str, window: int, connections: int) -> Measured:
    conns = [psycopg.connect(url, autocommit=True) for _ in range(connections)]
    try:
        cutoff = conns[0].execute("select now()").fetchone()[0]  # type: ignore[index]
        lock = threading.Lock()
        started = time.perf_counter()
        lo, hi = conns[0].execute(BOUNDS, {"cutoff": cutoff}).fetchone() or (None, None)
        lows = iter(range(lo - 1, hi, window) if lo is not None else ())

        def loop(conn: psycopg.Connection[Any]) -> tuple[int, list[float]]:
            rows, times = 0, []
            while True:
                with lock:
                    low = next(lows, None)
                if low is None:
                    return rows, times
                params = {"lo": low, "hi": low + window, "cutoff": cutoff}
                t0 = time.perf_counter()
                rows += conn.execute(DELETE, params, prepare=True).rowcount
                times.append(time.perf_counter() - t0)

        with ThreadPoolExecutor(max_workers=connections) as pool:
            done = [f.result() for f in [pool.submit(loop, c) for c in conns]]
        seconds = time.perf_counter() - started
    finally:
        for conn in conns:
            conn.close()
    return Measured("loop", seconds, sum(r for r, _ in done), [t for _, ts in done for t in ts])


def single_run(url: str) -> Measured:
    """One unbounded DELETE of every expired row, one transaction."""
    with psycopg.connect(url, autocommit=True) as conn:
        cutoff = conn.execute("select now()").fetchone()[0]  # type: ignore[index]
        started = time.perf_counter()
        rows = conn.execute(SINGLE, {"cutoff": cutoff}).rowcount
        seconds = time.perf_counter() - started
    return Measured("single", seconds, rows)


# -- the per-window breakdown ----------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p90(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return xs[0] if xs else float("nan")
    return statistics.quantiles(xs, n=10, method="inclusive")[8]


def ms(xs: Sequence[float]) -> str:
    return f"median {median(xs) * 1000:7.2f} ms, p90 {p90(xs) * 1000:7.2f} ms (n={len(xs)})"


def read_run(url: str, run_id: str) -> tuple[tuple[Any, ...], list[Window], list[tuple[Any, ...]]]:
    with psycopg.connect(url, autocommit=True) as conn:
        run = conn.execute(
            "select opened_at, planned_at, finished_at, windows_planned,"
            " extract(epoch from planned_at - opened_at)::float8,"
            " extract(epoch from finished_at - opened_at)::float8"
            " from expiry.runs where id = %s",
            (run_id,),
        ).fetchone()
        rows = conn.execute(JOBS, (run_id,)).fetchall()
    assert run is not None
    windows = [
        Window(r[0], r[2], r[3], r[4], r[5], r[6], r[7], r[8], int(r[9] or 0), r[10], r[11], r[12])
        for r in rows
        if r[1] == "expiry.window"
    ]
    others = [r for r in rows if r[1] != "expiry.window"]
    return run, windows, others


def claims(windows: list[Window]) -> list[list[Window]]:
    """The run's windows by claim (one attempted_at: one claim, run in order on
    one thread), each in the order its statements started, claims by their start."""
    by: dict[float, list[Window]] = {}
    for w in windows:
        by.setdefault(w.claimed, []).append(w)
    return [sorted(by[c], key=lambda w: w.started) for c in sorted(by)]


def print_stamps(
    run: tuple[Any, ...], windows: list[Window], others: list[tuple[Any, ...]]
) -> None:
    same = sum(1 for w in windows if w.applied is not None and abs(w.applied - w.started) < 1e-6)
    updated = sum(1 for w in windows if abs(w.updated - w.started) < 1e-6)
    print(
        f"  stamps: jobs.finished_at = ledger.applied_at for {same} of {len(windows)} windows,"
        f" = jobs.updated_at for {updated}; lease_expires_at null after completion for"
        f" {sum(w.lease_cleared for w in windows)}; ledger.worker values:"
        f" {len({w.worker for w in windows})}; retried windows:"
        f" {sum(1 for w in windows if w.attempt > 1)}"
    )
    for o in others:
        print(
            f"  {o[1]} job: created +{o[3]:.3f} s, claimed +{o[4]:.3f} s, its transaction began"
            f" +{o[5]:.3f} s (finished_at; its end is not stored); run planned_at +{run[4]:.3f} s"
        )


def print_cycles(groups: list[list[Window]], threads: int) -> list[float]:
    """Start-to-start intervals: within a claim (one thread, exact); across
    claims only where there is one thread. Returns the same-thread cycles."""
    inner = [b.started - a.started for g in groups for a, b in zip(g, g[1:], strict=False)]
    first = [g[0].started - g[0].claimed for g in groups]
    print(f"  claims: {len(groups)}, windows per claim {sorted(len(g) for g in groups)}")
    print(f"  claim start -> its first window's statement start:   {ms(first)}")
    print(f"  start -> next start, same thread, within a claim:    {ms(inner)}")
    if threads != 1:
        merged = sorted(w.started for g in groups for w in g)
        print(
            "  start -> next start, all threads merged:            "
            + ms([b - a for a, b in zip(merged, merged[1:], strict=False)])
        )
        return inner
    tail = [b[0].claimed - a[-1].started for a, b in zip(groups, groups[1:], strict=False)]
    across = [b[0].started - a[-1].started for a, b in zip(groups, groups[1:], strict=False)]
    print(f"  last start of a claim -> the next claim's start:     {ms(tail)}")
    print(f"  start -> next start, across a claim (one thread):    {ms(across)}")
    return inner + across


def breakdown(url: str, run_id: str, threads: int, deletes: list[float]) -> None:
    run, windows, others = read_run(url, run_id)
    span = float(run[5])
    groups = claims(windows)
    starts = sorted(w.started for w in windows)
    print()
    print(
        f"breakdown of expiry run {run_id} (N={threads}): span {span:.3f} s,"
        f" {len(windows)} window jobs ({run[3]} planned),"
        f" {sum(w.rows for w in windows):,} rows,"
        f" bounds in the ledger: {all(w.lo is not None for w in windows)}"
    )
    print_stamps(run, windows, others)
    print(f"  opened -> first window claimed:   {min(w.claimed for w in windows):.3f} s")
    print(f"  opened -> first window started:   {starts[0]:.3f} s")
    print(f"  first -> last window start:       {starts[-1] - starts[0]:.3f} s")
    print(f"  last window start -> finished_at: {span - starts[-1]:.3f} s")
    print(
        "  (the three add up to the span; runs.finished_at is max(jobs.finished_at) of the"
        " run, the last window statement's start, so the span leaves out that statement"
        " and the tail of any window still running then: about one window)"
    )
    claim_to_stamp = [w.started - w.claimed for w in windows]
    print(f"  window claim -> booking stamp (attempted_at -> finished_at): {ms(claim_to_stamp)}")
    cycles = print_cycles(groups, threads)
    if not deletes:
        print("  (no loop in this run: the bare DELETE a window is not measured, nor its share)")
        return
    bare = median(deletes)
    print(f"  the loop's bare DELETE, one window (N={threads}, same size): {ms(deletes)}")
    print(
        f"  same-thread start -> next start minus the bare DELETE median: "
        f"median {(median(cycles) - bare) * 1000:.2f} ms a window (estimate)"
    )
    busy = threads * (starts[-1] - starts[0])
    est = (len(windows) - threads) * bare
    print(
        f"  thread time between first and last start: {busy:.3f} s; of it the bare DELETE's"
        f" share at its median: {est:.3f} s ({est / busy:.0%}, estimate), the rest"
        f" {busy - est:.3f} s ({(busy - est) / busy:.0%}) beside the DELETE"
        if busy > 0
        else "  one window: no interval between starts"
    )
    print(
        "  not stored: a window statement's end (its commit): no column is written after"
        " now(), the statement's start, so a window's own span and the gap after it"
        " cannot be told apart, only their sum (start -> next start);"
        " lease_expires_at is nulled at completion;"
        + (
            ""
            if threads == 1
            else " the thread: lease_owner is nulled and ledger.worker names the process,"
            " so across claims only the merged sequence is known"
        )
    )


# -- the rounds ----------------------------------------------------------------------------


def one_round(
    url: str, cfgs: dict[str, Path], args: argparse.Namespace, n: int, r: int, tmp: Path
) -> dict[str, Measured]:
    """The baselines and expiry under each pacing, in an order that turns each round."""
    out: dict[str, Measured] = {}
    methods = [*args.baseline, *(f"expiry/{p}" for p in args.pacing)]
    order = methods[::-1] if r % 2 == 0 else methods
    for method in order:
        expired = build(url, args.rows, method.startswith("expiry"), args.key)
        if method == "loop":
            m = loop_run(url, args.window, n)
        elif method == "single":
            m = single_run(url)
        else:
            m = expiry_run(url, cfgs[method.split("/")[1]], n, tmp)
        oracle(url, method, args.rows, expired, m.rows, args.key)
        out[method] = m
    return out


def rate(m: Measured) -> float:
    return m.rows / m.seconds


BASELINES = ("loop", "single")


def print_round(n: int, r: int, got: dict[str, Measured]) -> dict[str, float]:
    """Each expiry pacing's rows/s over each baseline's (named "PACING" over the
    loop, "PACING/single" over one DELETE); with both, shipped over zero."""
    ratios: dict[str, float] = {}
    for base in BASELINES:
        if base in got:
            suffix = "" if base == "loop" else f"/{base}"
            for k, m in got.items():
                if k.startswith("expiry"):
                    ratios[k + suffix] = rate(m) / rate(got[base])
    if "expiry/shipped" in got and "expiry/zero" in got:
        ratios["shipped/zero"] = rate(got["expiry/shipped"]) / rate(got["expiry/zero"])
    each = "; ".join(f"{k} {m.seconds:.3f} s {rate(m):,.0f} rows/s" for k, m in got.items())
    said = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
    print(f"N={n} round {r + 1}: {each}; {said}", flush=True)
    return ratios


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows in sessions (2000000)")
    parser.add_argument("--window", type=int, default=10_000, help="keys per window (10000)")
    parser.add_argument(
        "--expiry-window",
        type=int,
        default=None,
        help="expiry's window setting, when it differs from the loop's (--window): key windows"
        " hold that many keys, block windows about that many rows (80%% of --window gives"
        " block windows the loop's rows per statement)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per N (3)")
    parser.add_argument(
        "--connections",
        type=lambda s: [int(x) for x in s.split(",") if x.strip()],
        default=[1, 2],
        help="comma separated N: worker threads and loop connections (1,2)",
    )
    parser.add_argument(
        "--pacing",
        type=lambda s: [x for x in s.split(",") if x.strip()],
        default=["zero"],
        help="comma separated expiry pacings, each run against the baselines: zero (nice_ratio 0),"
        " shipped (the defaults), always (nice_ratio 1 resting after every window) (zero)",
    )
    parser.add_argument(
        "--baseline",
        type=lambda s: [x for x in s.split(",") if x.strip()],
        default=None,
        help="comma separated: loop (PK-window DELETEs, N connections; bigint key only), single"
        " (one unbounded DELETE) (loop with --key bigint, else single)",
    )
    parser.add_argument(
        "--key", choices=list(KEYS), default="bigint", help="the key's type (bigint)"
    )
    parser.add_argument("--admin-url", default=ADMIN, help="server to create the scratch db on")
    args = parser.parse_args(argv)
    if unknown := set(args.pacing) - set(PACINGS):
        parser.error(f"--pacing: unknown {', '.join(sorted(unknown))}: use {', '.join(PACINGS)}")
    if args.baseline is None:
        args.baseline = ["loop"] if args.key == "bigint" else ["single"]
    if unknown := set(args.baseline) - set(BASELINES):
        parser.error(f"--baseline: unknown {', '.join(sorted(unknown))}: use loop, single")
    if "loop" in args.baseline and args.key != "bigint":
        parser.error("--baseline loop: its windows are integer ranges; use --key bigint or single")
    if min(args.rows, args.window, args.rounds, *args.connections) <= 0:
        parser.error("--rows, --window, --rounds and --connections must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"deployed throughput: {args.rows:,} rows, {args.key} key, 80% expired,"
        f" window {args.window:,} (expiry's {args.expiry_window or args.window:,}), baselines {','.join(args.baseline)},"
        f" N in {args.connections}, {args.rounds} round(s), {os.cpu_count()} cpus,"
        f" started {datetime.now().isoformat(timespec='seconds')}",
        flush=True,
    )
    with (
        scratch_database(args.admin_url, "expiry_bench_deployed") as url,
        tempfile.TemporaryDirectory() as tmpdir,
    ):
        tmp = Path(tmpdir)
        window = args.expiry_window or args.window
        cfgs = {p: write_config(tmp / f"expiry-{p}.toml", url, window, p) for p in args.pacing}
        for n in args.connections:
            ratios: dict[str, list[float]] = {}
            last: dict[str, Measured] = {}
            for r in range(args.rounds):
                try:
                    last = one_round(url, cfgs, args, n, r, tmp)
                except Mismatch as exc:
                    print(f"FAIL: {exc}", file=sys.stderr)
                    return 1
                for k, v in print_round(n, r, last).items():
                    ratios.setdefault(k, []).append(v)
            for k, vs in ratios.items():
                each = ", ".join(f"{x:.2f}x" for x in vs)
                print(f"N={n}: median {k} {statistics.median(vs):.2f}x (of {each})")
            # Each expiry method starts from a fresh schema: only the run of the
            # one that ran last in the round is still there to take apart.
            latest = [k for k in last if k.startswith("expiry")][-1]
            print(f"(the breakdown is of {latest}, the last expiry method of the round)")
            breakdown(url, last[latest].run_id, n, last["loop"].deletes if "loop" in last else [])
            print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
