"""Helpers for the cleanup tests.

``Db`` is a plain driver connection to the test database (autocommit) used to
arrange target tables and to read what the database really holds. Statements
are written once with ``%s`` placeholders and expiry's PostgreSQL table names
(``expiry.jobs``, ``expiry.ledger``, ``expiry.runs``, ``expiry.audit``) and
``{now}`` for the database clock; for SQLite and MySQL they are translated
(MySQL quotes the column ``key``, a reserved word there).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any

import psycopg
import pymysql

from dialects import dialect, dialect_of
from expiry.app import App
from expiry.config import parse_config
from expiry.queue.worker import Worker

EXPIRY_TABLES = ("jobs", "ledger", "runs", "audit")

POLICY: dict[str, Any] = {
    "name": "expired-sessions",
    "table": "sessions",
    "key": "id",
    "timestamp": "expires_at",
    "where": "revoked_at is null",
    "window": 100,
}

LIVE = 86_400.0
"""Offset of a row that expires a day from now."""


class MySQLConn:
    """A PyMySQL connection in autocommit, used as the other drivers' are:
    ``execute`` returns a cursor of tuples."""

    def __init__(self, url: str) -> None:
        from expiry.engines.mysql.sessions import parse_url

        self.raw = pymysql.connect(
            **parse_url(url), autocommit=True, init_command="set session time_zone = '+00:00'"
        )

    def execute(self, statement: str, params: Sequence[Any] | None = None) -> Any:
        cur = self.raw.cursor()
        cur.execute(statement, params)
        return cur

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> Any:
        cur = self.raw.cursor()
        cur.executemany(statement, rows)
        return cur

    def close(self) -> None:
        self.raw.close()


class Db:
    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = dialect_of(url)
        self.conn: Any
        if self.dialect == "postgres":
            self.conn = psycopg.connect(url, autocommit=True)
        elif self.dialect == "mysql":
            self.conn = MySQLConn(url)
        else:
            self.conn = sqlite3.connect(
                url.removeprefix("sqlite:///"), isolation_level=None, timeout=30
            )

    def close(self) -> None:
        self.conn.close()

    # -- SQL ---------------------------------------------------------------------

    def sql(self, statement: str) -> str:
        return dialect(self.dialect).translate(statement)

    def _run(self, statement: str, params: Sequence[Any]) -> Any:
        # Without parameters the statement is sent as written ('%' needs no escape).
        if params:
            return self.conn.execute(self.sql(statement), tuple(params))
        return self.conn.execute(self.sql(statement))

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        return int(self._run(statement, params).rowcount)

    def rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._run(statement, params).fetchall()]

    def scalar(self, statement: str, params: Sequence[Any] = ()) -> Any:
        row = self._run(statement, params).fetchone()
        return None if row is None else row[0]

    @property
    def time_type(self) -> str:
        """The column type this dialect's tests store a time in."""
        return dialect(self.dialect).time_type

    def quote(self, name: str) -> str:
        """An identifier quoted as this dialect writes one (MySQL: backticks)."""
        return f"`{name}`" if self.dialect == "mysql" else f'"{name}"'

    def stored(self, value: Any) -> Any:
        """An aware datetime as a time column of this dialect's tests holds it:
        itself (PostgreSQL), epoch seconds (SQLite), naive UTC (MySQL's DATETIME)."""
        if self.dialect == "sqlite":
            return value.timestamp()
        if self.dialect == "mysql":
            return value.astimezone(UTC).replace(tzinfo=None)
        return value

    def seconds(self, expr: str) -> str:
        """An SQL expression of ``expr`` seconds that adds to a timestamp column."""
        if self.dialect == "mysql":
            return f"interval round(({expr}) * 1000000) microsecond"
        return f"make_interval(secs => {expr})" if self.dialect == "postgres" else expr

    # -- target tables -------------------------------------------------------------

    def create_sessions(self, table: str = "sessions", *, index: bool = True) -> None:
        if self.dialect == "postgres":
            self.execute(
                f"create table {table} (id bigint primary key, user_id integer not null default 0,"
                " expires_at timestamptz not null, revoked_at timestamptz, note text)"
            )
        elif self.dialect == "mysql":
            self.execute(
                f"create table {table} (id bigint primary key, user_id integer not null default 0,"
                " expires_at datetime(6) not null, revoked_at datetime(6), note text)"
            )
        else:
            self.execute(
                f"create table {table} (id integer primary key, user_id integer not null default 0,"
                " expires_at real not null, revoked_at real, note text)"
            )
        if index:
            self.execute(f"create index {table}_expires_at on {table} (expires_at)")

    def create_sessions_archive(self) -> None:
        """``sessions_archive``: the columns of ``sessions``, without keys or indexes."""
        if self.dialect == "postgres":
            self.execute("create table sessions_archive (like sessions)")
        elif self.dialect == "mysql":
            self.execute(
                "create table sessions_archive (id bigint, user_id integer,"
                " expires_at datetime(6), revoked_at datetime(6), note text)"
            )
        else:
            self.execute(
                "create table sessions_archive (id integer, user_id integer, expires_at real,"
                " revoked_at real, note text)"
            )

    def insert_sessions(
        self, rows: Iterable[tuple[int, float, bool]], table: str = "sessions"
    ) -> None:
        """Insert (id, seconds from now until it expires, revoked) rows."""
        rows = list(rows)
        if self.dialect == "postgres":
            self.execute(
                f"insert into {table} (id, expires_at, revoked_at, note)"
                " select u.id, now() + make_interval(secs => u.off),"
                " case when u.rev then now() end, 'row ' || u.id"
                " from unnest(%s::bigint[], %s::float8[], %s::bool[]) as u(id, off, rev)",
                ([r[0] for r in rows], [float(r[1]) for r in rows], [r[2] for r in rows]),
            )
            return
        if self.dialect == "mysql":
            self.conn.executemany(
                f"insert into {table} (id, expires_at, revoked_at, note) values (%s,"
                " utc_timestamp(6) + interval round(%s * 1000000) microsecond,"
                " case when %s then utc_timestamp(6) end, concat('row ', %s))",
                [(r[0], float(r[1]), r[2], r[0]) for r in rows],
            )
            return
        self.conn.execute("begin")
        self.conn.executemany(
            self.sql(
                f"insert into {table} (id, expires_at, revoked_at, note)"
                " values (%s, {now} + %s, case when %s then {now} end, 'row ' || %s)"
            ),
            [(r[0], float(r[1]), r[2], r[0]) for r in rows],
        )
        self.conn.execute("commit")

    def ids(self, table: str = "sessions") -> set[int]:
        return {int(r[0]) for r in self.rows(f"select id from {table}")}

    def table(self, table: str = "sessions") -> list[tuple[Any, ...]]:
        return self.rows(f"select * from {table} order by id")

    def count(self, table: str) -> int:
        return int(self.scalar(f"select count(*) from {table}"))

    # -- expiry's own tables ---------------------------------------------------------

    def expiry_counts(self) -> dict[str, int]:
        return {t: self.count(f"expiry.{t}") for t in EXPIRY_TABLES}

    def jobs(self, handler: str | None = None, run_id: str | None = None) -> list[dict[str, Any]]:
        found = self.rows(
            "select key, handler, state, attempt, payload, run_id, last_error_kind, last_error,"
            " errors from expiry.jobs order by id"
        )
        out = []
        for key, name, state, attempt, payload, rid, kind, error, errors in found:
            data = payload if isinstance(payload, dict) else json.loads(payload)
            if (handler is None or name == handler) and (run_id is None or rid == run_id):
                out.append(
                    {
                        "key": key,
                        "handler": name,
                        "state": state,
                        "attempt": attempt,
                        "payload": data,
                        "run_id": rid,
                        "kind": kind,
                        "error": error,
                        "errors": errors if isinstance(errors, list) else json.loads(errors),
                    }
                )
        return out

    def windows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        return self.jobs("expiry.window", run_id)

    def ledger(self, run_id: str | None = None) -> list[dict[str, Any]]:
        found = self.rows(
            "select key, run_id, lo, hi, rows_affected, action from expiry.ledger order by key"
        )
        return [
            {"key": k, "run_id": r, "lo": lo, "hi": hi, "rows": n, "action": a}
            for k, r, lo, hi, n, a in found
            if run_id is None or r == run_id
        ]

    def audit(self, action: str, job_key: str | None = None) -> int:
        if job_key is None:
            return int(self.scalar("select count(*) from expiry.audit where action = %s", [action]))
        return int(
            self.scalar(
                "select count(*) from expiry.audit where action = %s and job_key = %s",
                [action, job_key],
            )
        )

    def run_state(self, run_id: str) -> str:
        return str(self.scalar("select state from expiry.runs where id = %s", [run_id]))

    def redeliver(self, key: str) -> None:
        """Put a finished job back as a broker would after a lost acknowledgement."""
        changed = self.execute(
            "update expiry.jobs set state = 'available', run_at = {now}, finished_at = null"
            " where key = %s",
            [key],
        )
        assert changed == 1


# -- data sets -------------------------------------------------------------------


def standard_rows(n: int) -> list[tuple[int, float, bool]]:
    """ids 1..n: every fifth live, the rest expired; every seventh expired one revoked."""
    rows = []
    for i in range(1, n + 1):
        if i % 5 == 0:
            rows.append((i, LIVE, False))
        else:
            rows.append((i, -(3600.0 + i), i % 7 == 0))
    return rows


def doomed(rows: Iterable[tuple[int, float, bool]]) -> set[int]:
    """The ids a cleanup with the standard policy must delete."""
    return {i for i, offset, revoked in rows if offset < 0 and not revoked}


def expected_windows(candidates: Iterable[int], window: int) -> list[tuple[int, int]]:
    """The planner's windows, by its rule: each starts just below the next candidate."""
    out: list[tuple[int, int]] = []
    for key in sorted(candidates):
        if not out or key > out[-1][1]:
            out.append((key - 1, key - 1 + window))
    return out


# -- apps and workers ------------------------------------------------------------


def config_data(
    url: str, *policies: dict[str, Any], worker: dict[str, Any] | None = None
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "database": {"url": url},
        "policy": [{**POLICY, **p} for p in (policies or ({},))],
    }
    if worker:
        data["worker"] = worker
    return data


def grant_expiry_tables(conn: Any, role: str) -> None:
    """What a worker role needs of expiry's own tables on PostgreSQL (the
    README's grants): the policies' tables are granted by each test."""
    conn.execute(f"grant usage on schema expiry to {role}")
    conn.execute(f"grant select, insert, update, delete on all tables in schema expiry to {role}")
    conn.execute(f"grant usage, select on all sequences in schema expiry to {role}")


def make_app(url: str, *policies: dict[str, Any], pool_size: int = 8) -> App:
    return App(config=parse_config(config_data(url, *policies)), pool_size=pool_size)


def run_worker(app: App, concurrency: int = 1, **kwargs: Any) -> Worker:
    """Run a worker in this process until nothing is due or running."""
    options: dict[str, Any] = {"poll": 0.05, "rescue_every": 0.2, **kwargs}
    worker = app.worker(until_idle=True, concurrency=concurrency, **options)
    assert worker.run() == 0
    return worker


def drain(app: App, timeout: float = 60.0, **kwargs: Any) -> None:
    """Run workers until no job is left waiting at all (snoozed or backed-off ones too)."""
    deadline = time.monotonic() + timeout
    while True:
        run_worker(app, **kwargs)
        if app.queue.pending() == 0:
            return
        assert time.monotonic() < deadline, "jobs still pending after the timeout"
        time.sleep(0.05)


def assert_run_clean(db: Db, run_id: str) -> None:
    """Every job of the run completed, one ledger row per window job, run finished."""
    jobs = db.jobs(run_id=run_id)
    assert jobs, "the run has no jobs"
    assert {j["state"] for j in jobs} == {"completed"}, jobs
    window_keys = sorted(j["key"] for j in jobs if j["handler"] == "expiry.window")
    assert [row["key"] for row in db.ledger(run_id)] == window_keys
    assert db.run_state(run_id) == "finished"


# -- the command line ------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def write_config(
    path: Path, url: str, *policies: dict[str, Any], worker: dict[str, Any] | None = None
) -> Path:
    data = config_data(url, *policies, worker=worker)
    lines = ["[database]", f"url = {toml_value(url)}", ""]
    if worker:
        lines += ["[worker]", *(f"{k} = {toml_value(v)}" for k, v in worker.items()), ""]
    for policy in data["policy"]:
        values = {k: v for k, v in policy.items() if v is not None}
        lines += ["[[policy]]", *(f"{k} = {toml_value(v)}" for k, v in values.items()), ""]
    path.write_text("\n".join(lines))
    return path


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def expiry_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "expiry", *args]


def cli(
    *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        expiry_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=cli_env(),
        check=False,
    )


def wait_for(
    condition: Callable[[], Any], timeout: float = 20.0, what: str = "the condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def claim_plan(app: App) -> None:
    """Claim exactly the planning job that is due and run it, nothing else."""
    from expiry.cleanup.runs import PLAN

    jobs = app.queue.claim(100, 60, owner="test-planner", queues=app.worked_queues())
    assert [job.handler for job in jobs] == [PLAN]
    app.worker().process(jobs[0])
