"""What the drills share: the scale (CI or long), a big sessions table made on
the server, `expiry` subprocesses, and waiting on the database. Most drills run
on PostgreSQL; the crash drill and the duplicate storm also on MariaDB, whose
SQL ``connect`` translates (``expiry_`` tables, the column ``key`` quoted).

The long forms run with EXPIRY_DRILL_LONG=1 (``bench/drills.py --long``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psycopg
import pymysql

from cleanup._support import cli_env, write_config
from dialects import dialect_of

from ._invariants import Translating

LONG = os.environ.get("EXPIRY_DRILL_LONG", "") not in ("", "0")
TESTS = Path(__file__).resolve().parents[1]
FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
)


def scale(ci: int, long: int) -> int:
    return long if LONG else ci


def connect(url: str) -> Any:
    """An autocommit connection: psycopg's on PostgreSQL, a translating one on MariaDB."""
    if dialect_of(url) == "mysql":
        return Translating(url)
    return psycopg.connect(url, autocommit=True)


def dialect(url: str) -> str:
    return dialect_of(url)


def load_sessions(
    url: str,
    n: int,
    *,
    table: str = "sessions",
    live_every: int = 5,
    revoked_every: int = 7,
) -> None:
    """ids 1..n, made on the server: every ``live_every``-th row expires a day from
    now, the others expired an hour or more ago, and every ``revoked_every``-th of
    those is revoked (excluded by the policy's ``where``)."""
    if dialect_of(url) == "mysql":
        _load_mysql(url, n, table, live_every, revoked_every)
        return
    with connect(url) as conn:
        conn.execute(
            f"create table {table} (id bigint primary key, user_id integer not null default 0,"
            " expires_at timestamptz not null, revoked_at timestamptz, note text)"
        )
        conn.execute(
            f"insert into {table} (id, expires_at, revoked_at, note)"
            " select i,"
            "   case when i %% %(live)s = 0 then now() + interval '1 day'"
            "        else now() - interval '1 hour' - i * interval '1 ms' end,"
            "   case when i %% %(live)s <> 0 and i %% %(rev)s = 0 then now() end,"
            "   'row ' || i"
            " from generate_series(1, %(n)s) as i",
            {"n": n, "live": live_every, "rev": revoked_every},
        )
        conn.execute(f"create index {table}_expires_at on {table} (expires_at)")
        conn.execute(f"analyze {table}")


def _load_mysql(url: str, n: int, table: str, live_every: int, revoked_every: int) -> None:
    """load_sessions on MariaDB: the same rows, from its sequence engine."""
    with connect(url) as conn:
        conn.execute(
            f"create table {table} (id bigint primary key, user_id integer not null default 0,"
            " expires_at datetime(6) not null, revoked_at datetime(6), note text)"
        )
        conn.execute(
            f"insert into {table} (id, expires_at, revoked_at, note)"
            " select seq,"
            "   case when seq %% %(live)s = 0 then utc_timestamp(6) + interval 1 day"
            "        else utc_timestamp(6) - interval 1 hour - interval seq * 1000 microsecond end,"
            "   case when seq %% %(live)s <> 0 and seq %% %(rev)s = 0 then utc_timestamp(6) end,"
            "   concat('row ', seq)"
            f" from seq_1_to_{int(n)}",
            {"live": live_every, "rev": revoked_every},
        )
        conn.execute(f"create index {table}_expires_at on {table} (expires_at)")
        conn.execute(f"analyze table {table}").fetchall()


def config(
    path: Path, url: str, *policies: dict[str, Any], worker: dict[str, Any] | None = None
) -> Path:
    return write_config(path, url, *policies, worker=worker)


def drill_env(config_path: Path, **extra: str) -> dict[str, str]:
    env = cli_env(EXPIRY_CONFIG=str(config_path), **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env["PYTHONPATH"]])
    return env


@dataclass
class Proc:
    """An `expiry` subprocess with its log file."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    log: TextIO | None = None
    starts: int = 0

    def start(self) -> None:
        if self.log is None:
            self.log = self.log_path.open("a")
        self.log.write(f"--- start #{self.starts + 1}\n")
        self.log.flush()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "expiry", *self.args],
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.popen is not None
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not stop in time; returns the exit code."""
        if self.popen is None:
            return None
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.log is not None:
            self.log.close()
            self.log = None
        return self.popen.returncode

    def tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def worker_proc(
    tmp: Path,
    config_path: Path,
    n: int,
    *,
    app: str | None = None,
    env: dict[str, str] | None = None,
) -> Proc:
    args = ["worker", "--config", str(config_path)]
    if app:
        args += ["--app", app]
    return Proc(args, env or drill_env(config_path), tmp / f"worker-{n}.log")


def trigger(config_path: Path, policy: str = "expired-sessions", *extra: str) -> str:
    """`expiry trigger POLICY --json`; returns the run id."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "expiry",
            "trigger",
            policy,
            "--json",
            "--config",
            str(config_path),
        ],
        env=drill_env(config_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["run_id"])


def pending(url: str) -> int:
    """Jobs not yet final (waiting, backing off, snoozed or running)."""
    with connect(url) as conn:
        row = conn.execute(
            "select count(*) from expiry.jobs"
            " where state in ('scheduled', 'available', 'retryable', 'running')"
        ).fetchone()
    return int(row[0]) if row else 0


def runs_open(url: str) -> int:
    """Runs not finished. A worker killed after its run's last commit leaves the
    run open until a rescuer's sweep (every few seconds) finishes it."""
    with connect(url) as conn:
        row = conn.execute("select count(*) from expiry.runs where state <> 'finished'").fetchone()
    return int(row[0]) if row else 0


def job_states(url: str) -> dict[str, int]:
    with connect(url) as conn:
        return {
            s: int(n)
            for s, n in conn.execute("select state, count(*) from expiry.jobs group by state")
        }


def wait_until(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    *,
    every: float = 0.2,
    on_timeout: Callable[[], str] | None = None,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except (psycopg.OperationalError, pymysql.err.OperationalError):
            value = None  # the server is restarting: ask again
        if value:
            return value
        if time.monotonic() > deadline:
            detail = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{detail}")
        time.sleep(every)


def run_done(url: str, run_id: str) -> bool:
    """The run is planned and none of the database's jobs is pending."""
    with connect(url) as conn:
        row = conn.execute("select state from expiry.runs where id = %s", (run_id,)).fetchone()
    return bool(row and row[0] in ("running", "finished") and pending(url) == 0)


def plan_only(app: Any, owner: str = "drill-planner") -> int:
    """Run every planning page of the due runs and no window; returns the number of
    window jobs waiting. The windows each page emits are held back (run_at an hour
    ahead) so that the next claim finds the next page, then all made due at once."""
    from expiry.cleanup.runs import PLAN

    planner = app.worker(name=owner)
    mysql = app.engine.dialect == "mysql"
    jobs_table = "expiry_jobs" if mysql else "expiry.jobs"
    later = "utc_timestamp(6) + interval 1 hour" if mysql else "now() + interval '1 hour'"
    hold = (
        f"update {jobs_table} set run_at = {later}"
        " where handler = 'expiry.window' and state = 'available'"
    )
    while True:
        with app.engine.transaction() as conn:
            conn.execute(hold)
        jobs = app.queue.claim(1, 60, owner=owner, queues=app.worked_queues(), limits={})
        if not jobs:
            break
        assert jobs[0].handler == PLAN, jobs[0]
        planner.process(jobs[0])
    if mysql:
        with app.engine.transaction() as conn:
            return int(
                conn.execute(
                    "update expiry_jobs set run_at = utc_timestamp(6)"
                    " where handler = 'expiry.window' and state = 'available'"
                ).rowcount
            )
    with app.engine.transaction() as conn:
        row = conn.execute(
            "with due as (update expiry.jobs set run_at = now()"
            " where handler = 'expiry.window' and state = 'available' returning 1)"
            " select count(*) as n from due"
        ).fetchone()
    return int(row["n"])


def faketime_lib() -> str:
    for path in FAKETIME_LIBS:
        if Path(path).exists():
            return path
    raise AssertionError(
        "libfaketime is required for the clock-skew drill: apt-get install faketime"
        " (.ci/run installs it)"
    )


def skewed_env(env: dict[str, str], offset: str) -> dict[str, str]:
    """The process clock ``offset`` off (e.g. "-5h"), the database's untouched."""
    return {
        **env,
        "LD_PRELOAD": faketime_lib(),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }
