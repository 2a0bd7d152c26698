"""The `expiry` command, run as a real subprocess against real databases.

Each command in its human form and its --json form, with its exit code (0 ok,
1 runtime failure, 2 bad usage or bad config), against a SQLite file and a
config written to tmp_path; status, trigger and dlq also against PostgreSQL.
Bad input exits 2 with one line on stderr and no traceback.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from expiry.app import App
from expiry.engines import open_engine
from expiry.times import format_time

POLICY = "expired-sessions"
EXPIRED, LIVE = 500, 100
"""Rows 1..500 expired a day ago; rows 501..600 expire in a day. Window 100: 5 windows."""
ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    env["COLUMNS"] = "200"  # wide enough that rich does not truncate names in tables
    return env


def expiry(*args: str | Path, timeout: float = 120) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "expiry", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment(),
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_usage_error(result: Result, *needles: str) -> None:
    """Exit 2, nothing on stdout, and one line on stderr that says what is wrong."""
    assert result.code == 2, result
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    for needle in needles:
        assert needle in lines[0]


def config_text(url: str, table: str = "sessions", schedule: str = "*/15 * * * *") -> str:
    return (
        f'[database]\nurl = "{url}"\n\n'
        f'[[policy]]\nname = "{POLICY}"\ntable = "{table}"\nkey = "id"\n'
        f'timestamp = "expires_at"\nwindow = 100\nschedule = "{schedule}"\n'
    )


@dataclass
class Workspace:
    url: str
    config: Path
    tmp: Path

    def run(self, *args: str | Path, timeout: float = 120) -> Result:
        return expiry("--config", self.config, *args, timeout=timeout)

    def ok(self, *args: str | Path) -> Result:
        result = self.run(*args)
        assert result.code == 0, result
        assert "Traceback" not in result.err
        return result

    def json(self, *args: str | Path) -> Any:
        return self.ok("--json", *args).json()

    def scalar(self, sql: str) -> Any:
        app = App(self.url)
        try:
            with app.engine.transaction() as conn:
                row = conn.execute(sql).fetchone()
        finally:
            app.close()
        return next(iter(row.values())) if isinstance(row, dict) else row[0]

    def table(self, name: str) -> str:
        return f"expiry.{name}" if self.url.startswith("postgres") else f"expiry_{name}"

    @property
    def dialect(self) -> str:
        return self.url.split(":", 1)[0].replace("postgresql", "postgres")

    def execute(self, sql: str) -> None:
        app = App(self.url)
        try:
            with app.engine.transaction() as conn:
                conn.execute(sql)
        finally:
            app.close()

    def sessions_left(self) -> int:
        return int(self.scalar("select count(*) from sessions"))

    def runs(self) -> int:
        return int(self.scalar(f"select count(*) from {self.table('runs')}"))


def make_workspace(url: str, tmp: Path) -> Workspace:
    """Migrate (so no command logs migrations), seed the table, write the config."""
    app = App(url)
    app.migrate()
    now = time.time()
    with app.engine.transaction() as conn:
        if app.engine.dialect == "postgres":
            conn.execute(
                "create table sessions (id bigint primary key, expires_at timestamptz not null)"
            )
            conn.execute(
                "insert into sessions select i, case when i <= %s then now() - interval '1 day' "
                "else now() + interval '1 day' end from generate_series(1, %s) i",
                (EXPIRED, EXPIRED + LIVE),
            )
        elif app.engine.dialect == "mysql":
            conn.execute(
                "create table sessions (id bigint primary key, expires_at datetime(6) not null)"
            )
            conn.execute(
                "insert into sessions values "
                + ", ".join(
                    f"({i}, utc_timestamp(6) + interval {-86400 if i <= EXPIRED else 86400} second)"
                    for i in range(1, EXPIRED + LIVE + 1)
                )
            )
        else:
            conn.execute("create table sessions (id integer primary key, expires_at real not null)")
            conn.executemany(
                "insert into sessions values (?, ?)",
                [
                    (i, now - 86400 if i <= EXPIRED else now + 86400)
                    for i in range(1, EXPIRED + LIVE + 1)
                ],
            )
        conn.execute("create index sessions_expires_at on sessions (expires_at)")
    app.close()
    config = tmp / "expiry.toml"
    config.write_text(config_text(url))
    return Workspace(url, config, tmp)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """SQLite file + config in tmp_path."""
    return make_workspace(f"sqlite:///{tmp_path / 'cli.db'}", tmp_path)


@pytest.fixture(params=["sqlite", "postgres"])
def any_ws(request: pytest.FixtureRequest, tmp_path: Path) -> Workspace:
    """The same, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return make_workspace(f"sqlite:///{tmp_path / 'cli.db'}", tmp_path)
    return make_workspace(str(request.getfixturevalue("pg_url")), tmp_path)


def cutoff_now() -> str:
    return format_time(datetime.now(UTC).replace(microsecond=0))


def make_dead_job(ws: Workspace, key: str = "orphan-1") -> None:
    """A job for a handler nobody registered, one attempt: the worker dead-letters it."""
    app = App(ws.url)
    assert app.queue.enqueue("nobody-handles-this", {"n": 1}, key=key, max_attempts=1).enqueued
    app.close()
    ws.ok("worker", "--until-idle")


def job_state(ws: Workspace, key: str) -> str:
    app = App(ws.url)
    job = app.queue.get(key)
    app.close()
    assert job is not None
    return str(job.state.value)


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- migrate, check ------------------------------------------------------------------------


def test_migrate_applies_every_migration_once_human_then_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    config = tmp_path / "expiry.toml"
    config.write_text(config_text(url))
    probe = open_engine(url)  # not an App: an App on SQLite migrates on first use
    latest = probe.migrations[-1][0]
    probe.close()

    human = expiry("--config", config, "migrate")
    assert human.code == 0, human
    assert f"applied {list(range(1, latest + 1))}; schema version {latest}" in human.out

    again = expiry("--config", config, "migrate", "--json")
    assert again.code == 0, again
    assert again.json() == {"applied": [], "version": latest}


def test_check_validates_every_policy_against_the_live_schema(ws: Workspace) -> None:
    assert "ok: 1 policies" in ws.ok("check").out
    checked = ws.json("check")
    notes = checked.pop("notes")
    reading = checked.pop("timestamps")[POLICY]
    latest = App(ws.url).engine.migrations[-1][0]
    assert checked == {
        "ok": True,
        "policies": [POLICY],
        "warnings": [],
        "schema": {"version": latest, "needs": latest},
    }
    # How the column is read, its ends as stored and as read, beside the database clock.
    assert re.fullmatch(
        r"expires_at: epoch seconds, UTC by definition; oldest [0-9.]+ \(= \S+Z\), "
        r"newest [0-9.]+ \(= \S+Z\), now \S+Z",
        reading,
    ), reading
    # Dense serial ids: key windows, measured from the data.
    assert notes[POLICY][0].startswith("key windows: expired keys are dense"), notes

    ws.config.write_text(config_text(ws.url, table="no_such_table"))
    assert_usage_error(ws.run("check"), "no_such_table")
    assert_usage_error(ws.run("check", "--json"), "no_such_table")
    error = json.loads(ws.run("check", "--json").err)  # machines get JSON errors too
    assert error["exit"] == 2 and error["kind"] == "SchemaError"
    assert "no_such_table" in error["error"]


def test_check_refuses_a_config_with_a_bad_cron_expression(ws: Workspace) -> None:
    ws.config.write_text(config_text(ws.url, schedule="61 * * * *"))
    assert_usage_error(ws.run("check"), f"policy '{POLICY}'", "'61 * * * *'", "schedule")


# -- plan, trigger -----------------------------------------------------------------------


def test_plan_shows_candidates_and_windows_and_mutates_nothing(ws: Workspace) -> None:
    human = ws.ok("plan", POLICY).out
    assert f"{EXPIRED} candidate rows in 5 windows (dry run: nothing changed)" in human
    assert "window keys (0, 100]" in human and "window keys (400, 500]" in human

    data = ws.json("plan", POLICY, "--cutoff", cutoff_now())
    assert data["candidates"] == EXPIRED and data["windows"] == 5 and data["dry_run"] is True
    assert data["first_windows"][0] == {"lo": 0, "hi": 100, "range": "keys (0, 100]"}
    assert data["timestamp_storage"].startswith("expires_at: epoch seconds, UTC by definition;")
    assert data["warnings"] == []
    assert ISO_Z.match(data["cutoff"])
    assert ws.sessions_left() == EXPIRED + LIVE
    assert ws.runs() == 0
    assert ws.json("runs") == []


def test_trigger_dry_run_previews_without_opening_a_run(ws: Workspace) -> None:
    human = ws.ok("trigger", POLICY, "--dry-run").out
    assert f"{EXPIRED} candidate rows in 5 windows (dry run: nothing changed)" in human

    data = ws.json("trigger", POLICY, "--dry-run")
    assert (data["candidates"], data["windows"], data["dry_run"]) == (EXPIRED, 5, True)
    assert ws.runs() == 0
    assert ws.sessions_left() == EXPIRED + LIVE


def test_trigger_opens_one_run_per_cutoff_and_a_worker_finishes_it(any_ws: Workspace) -> None:
    cutoff = cutoff_now()
    run_id = f"{POLICY}:{cutoff}"

    human = any_ws.ok("trigger", POLICY, "--cutoff", cutoff, "--actor", "tester")
    assert f"run {run_id} opened" in human.out

    again = any_ws.json("trigger", POLICY, "--cutoff", cutoff, "--actor", "tester")
    assert again == {"run_id": run_id, "policy": POLICY, "cutoff": cutoff, "created": False}
    assert any_ws.runs() == 1

    any_ws.ok("worker", "--until-idle")
    assert any_ws.sessions_left() == LIVE

    shown = any_ws.json("runs", "show", run_id)
    assert shown["state"] == "finished"
    assert (shown["jobs_total"], shown["jobs_done"], shown["jobs_dead"]) == (5, 5, 0)
    assert shown["rows_affected"] == EXPIRED and shown["opened_by"] == "cli"
    text = any_ws.ok("runs", "show", run_id).out
    assert re.search(r"state: finished", text) and re.search(r"rows_affected: 500", text)


def trigger_wait_with_a_worker(ws: Workspace, cutoff: str) -> Result:
    """`trigger --wait --json` in the background; once its run is open, a worker
    runs until idle; then the waiting trigger's result."""
    waiting = subprocess.Popen(
        [sys.executable, "-m", "expiry", "--config", str(ws.config), "--json"]
        + ["trigger", POLICY, "--cutoff", cutoff, "--wait", "--actor", "tester"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(),
    )
    try:
        wait_for(lambda: ws.runs() == 1, 30, "the run to open")
        assert waiting.poll() is None  # still waiting: no worker has run yet
        ws.ok("worker", "--until-idle")
        out, err = waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    return Result(waiting.returncode, out, err)


def test_trigger_wait_exits_0_once_every_window_has_finished(any_ws: Workspace) -> None:
    cutoff = cutoff_now()
    run_id = f"{POLICY}:{cutoff}"

    result = trigger_wait_with_a_worker(any_ws, cutoff)

    assert result.code == 0, result.err
    summary = result.json()
    assert summary["id"] == run_id and summary["state"] == "finished"
    assert summary["jobs_done"] == 5 and summary["jobs_dead"] == 0
    assert summary["rows_affected"] == EXPIRED
    assert any_ws.sessions_left() == LIVE
    # The same cutoff again, human form: the finished run, at once.
    human = any_ws.ok("trigger", POLICY, "--cutoff", cutoff, "--wait", "--actor", "tester").out
    assert re.search(rf"id: {re.escape(run_id)}", human) and "state: finished" in human


def test_trigger_wait_exits_1_when_windows_die(ws: Workspace) -> None:
    """A table that refuses deletes, one attempt per window: every window dies,
    and `trigger --wait` stops waiting and exits 1 (it used to wait forever, as
    the run of a dead last window was never marked finished)."""
    ws.config.write_text(config_text(ws.url) + "max_attempts = 1\n")
    app = App(ws.url)
    with app.engine.transaction() as conn:
        conn.execute(
            "create trigger frozen before delete on sessions "
            "begin select raise(abort, 'deletes are frozen'); end"
        )
    app.close()

    result = trigger_wait_with_a_worker(ws, cutoff_now())

    assert result.code == 1, result.err
    summary = result.json()
    assert summary["state"] == "finished"
    assert summary["jobs_dead"] == 5 and summary["jobs_done"] == 0
    # Not the green "finished" of a clean run, and no retry was made (one attempt each).
    assert summary["outcome"] == "finished with 5 dead"
    assert summary["retries"] == 0
    assert ws.sessions_left() == EXPIRED + LIVE
    assert len(ws.json("dlq", "list")) == 5


# -- status, runs ------------------------------------------------------------------------


def test_status_shows_policies_watermarks_queue_and_dlq(any_ws: Workspace) -> None:
    before = any_ws.json("status")
    [policy] = before["policies"]
    assert policy["name"] == POLICY and policy["schedule"] == "*/15 * * * *"
    assert policy["paused"] is False and policy["last_run"] is None
    assert policy["watermark_seconds"] > 86000  # the oldest expired row: a day ago
    assert ISO_Z.match(policy["next_fire"])
    assert before["queue"]["dead"] == 0
    human = any_ws.ok("status").out
    assert "policies" in human and POLICY in human and "dead-letter depth: 0" in human

    any_ws.ok("trigger", POLICY, "--actor", "tester")
    any_ws.ok("worker", "--until-idle")
    make_dead_job(any_ws)

    after = any_ws.json("status")
    [policy] = after["policies"]
    assert policy["watermark_seconds"] == 0 and policy["watermark"] == "0s"
    assert policy["last_run"]["state"] == "finished"
    assert policy["last_run"]["rows_affected"] == EXPIRED
    assert after["queue"]["dead"] == 1
    assert after["queue"]["jobs_by_queue_and_state"]["default"]["dead"] == 1
    human = any_ws.ok("status").out
    assert "finished 5/5" in human and "dead-letter depth: 1" in human


def test_runs_lists_recent_runs_and_filters_by_policy(ws: Workspace) -> None:
    cutoff = cutoff_now()
    ws.ok("trigger", POLICY, "--cutoff", cutoff, "--actor", "tester")
    ws.ok("worker", "--until-idle")

    [run] = ws.json("runs")
    assert run["id"] == f"{POLICY}:{cutoff}" and run["state"] == "finished"
    assert ws.json("runs", POLICY) == [run]
    human = ws.ok("runs").out
    assert f"{POLICY}:{cutoff}" in human and "finished" in human and "5/5" in human


# -- dlq ---------------------------------------------------------------------------------


def test_dlq_list_show_redrive_and_discard(any_ws: Workspace) -> None:
    make_dead_job(any_ws)

    listed = any_ws.json("dlq", "list")
    [dead] = listed
    assert dead["key"] == "orphan-1" and dead["handler"] == "nobody-handles-this"
    assert dead["attempt"] == 1 and "no handler" in dead["error"]
    assert ISO_Z.match(dead["failed_at"]), dead["failed_at"]
    human = any_ws.ok("dlq", "list").out
    assert "dead-letter queue (1)" in human and "orphan-1" in human and "no handler" in human

    shown = any_ws.json("dlq", "show", "orphan-1")
    assert shown["state"] == "dead" and shown["payload"] == {"n": 1}
    assert shown["max_attempts"] == 1 and len(shown["errors"]) == 1
    assert "no handler" in shown["errors"][0]["error"]
    assert "orphan-1" in any_ws.ok("dlq", "show", "orphan-1").out

    # Redrive (human): back in the queue with a fresh budget; the worker kills it again.
    assert "1 jobs redriven" in any_ws.ok("dlq", "redrive", "orphan-1", "--actor", "tester").out
    assert job_state(any_ws, "orphan-1") == "available"
    any_ws.ok("worker", "--until-idle")
    assert job_state(any_ws, "orphan-1") == "dead"
    # Redrive --all (json), then discard it before it runs again.
    assert any_ws.json("dlq", "redrive", "--all", "--actor", "tester") == {"redriven": ["orphan-1"]}

    assert "1 jobs discarded" in any_ws.ok("dlq", "discard", "orphan-1", "--actor", "tester").out
    assert job_state(any_ws, "orphan-1") == "cancelled"
    assert any_ws.json("dlq", "discard", "orphan-1") == {"discarded": []}
    assert any_ws.json("dlq", "list") == []
    audit = any_ws.table("audit")
    assert any_ws.scalar(f"select count(*) from {audit} where action = 'job.redriven'") == 2
    assert any_ws.scalar(f"select count(*) from {audit} where action = 'job.discarded'") == 1


# -- pause, resume ---------------------------------------------------------------------


def test_pause_and_resume_a_policy(ws: Workspace) -> None:
    # A scheduler already running (its first pass registers the schedule).
    app = App.from_config(ws.config)
    now = app.engine.now()
    clock = {"now": now}
    scheduler = app.scheduler(clock=lambda: clock["now"])
    assert scheduler.tick() == []

    human = ws.ok("pause", POLICY, "--actor", "tester").out
    assert f"policy {POLICY} paused" in human
    assert ws.json("status")["policies"][0]["paused"] is True
    assert ws.json("pause", POLICY, "--actor", "tester") == {"policy": POLICY, "paused": True}
    # Paused means the schedule fires nothing: a pass an hour on opens no run.
    clock["now"] = now + timedelta(hours=1)
    assert scheduler.tick() == []
    assert ws.runs() == 0

    assert f"policy {POLICY} resumed" in ws.ok("resume", POLICY, "--actor", "tester").out
    assert ws.json("resume", POLICY, "--actor", "tester") == {"policy": POLICY, "paused": False}
    assert ws.scalar(f"select paused from {ws.table('schedules')}") == 0
    # Resumed, it fires again.
    clock["now"] = now + timedelta(hours=2)
    try:
        assert scheduler.tick() != []
    finally:
        app.close()
    assert ws.runs() == 1
    audit = ws.table("audit")
    actions = ws.scalar(
        f"select group_concat(action, ',') from (select action from {audit} "
        "where actor = 'tester' order by id)"
    )
    assert actions == "policy.paused,policy.paused,policy.resumed,policy.resumed"


# -- worker, keys, serve, demo -------------------------------------------------------------


def test_worker_until_idle_exits_0_when_nothing_is_due(ws: Workspace) -> None:
    started = time.monotonic()
    result = ws.ok("worker", "--until-idle")
    assert time.monotonic() - started < 30
    assert "worker started" in result.err and "worker stopped" in result.err


def test_keys_create_list_and_revoke(ws: Workspace) -> None:
    human = ws.ok("keys", "create", "ci-bot").out
    assert re.search(r"key ci-bot \(admin\): exp_\S+", human) and "shown once" in human
    created = ws.json("keys", "create", "dashboard")
    assert created["name"] == "dashboard" and created["key"].startswith("exp_")
    assert created["key"] not in ws.ok("keys", "list").out  # the secret is never shown again

    listed = ws.json("keys", "list")
    assert [(k["name"], k["revoked"]) for k in sorted(listed, key=lambda k: k["name"])] == [
        ("ci-bot", False),
        ("dashboard", False),
    ]
    assert "key ci-bot revoked" in ws.ok("keys", "revoke", "ci-bot").out
    assert ws.json("keys", "revoke", "dashboard") == {"name": "dashboard", "revoked": True}
    assert "ci-bot  revoked" in ws.ok("keys", "list").out
    assert_usage_error(ws.run("keys", "create", "ci-bot"), "exists already")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Running:
    """A long-running command (`serve`, `worker`) in its own process, and its
    /metrics at ``port``; stopped with SIGTERM (killed if it will not stop)."""

    def __init__(self, ws: Workspace, port: int, *args: str) -> None:
        self.port = port
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "expiry", "--config", str(ws.config), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(),
        )

    def metrics(self) -> str:
        """/metrics as it answers now ("" while nothing listens yet)."""
        assert self.proc.poll() is None, self.proc.communicate()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    def stop(self) -> tuple[int, str]:
        """SIGTERM, then its exit code and stderr."""
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, err

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def test_serve_answers_http_and_stops_cleanly_on_sigterm(ws: Workspace) -> None:
    port = free_port()
    with Running(ws, port, "serve", "--listen", f"127.0.0.1:{port}") as serve:
        wait_for(lambda: serve.metrics() != "", 30, "serve to answer /metrics")
        wait_for(
            lambda: ws.scalar(f"select count(*) from {ws.table('schedules')}") == 1,
            10,
            "the scheduler thread to register the schedule",
        )
        code, err = serve.stop()
    assert code == 0, err
    assert "Traceback" not in err


def test_a_worker_serves_its_own_metrics_when_asked(ws: Workspace) -> None:
    """`worker --metrics-listen`: a worker run apart from `serve` shows its job
    durations and rows per window (histograms live in the process that ran
    the jobs) on /metrics; a taken address is refused before anything runs."""
    port = free_port()
    with Running(ws, port, "worker", "--metrics-listen", f"127.0.0.1:{port}") as worker:
        wait_for(lambda: "expiry_job_duration_seconds" in worker.metrics(), 30, "its /metrics")
        ws.ok("trigger", POLICY, "--wait")
        done = f'expiry_window_rows_sum{{policy="{POLICY}"}} {float(EXPIRED)}'
        wait_for(lambda: done in worker.metrics(), 30, "the windows' rows on its /metrics")
        text = worker.metrics()
        completed = 'expiry_job_duration_seconds_count{handler="expiry.window",outcome="completed"}'
        assert completed in text and "process_resident_memory_bytes" in text
        taken = ws.run("worker", "--metrics-listen", f"127.0.0.1:{port}", "--until-idle")
        assert taken.code == 1 and "cannot listen on" in taken.err, taken
        code, err = worker.stop()
    assert code == 0, err
    assert f"worker metrics on http://127.0.0.1:{port}/metrics" in err


def test_demo_cleans_four_policies_to_a_zero_watermark(tmp_path: Path) -> None:
    result = expiry("demo", "--rows", "20000", "--path", tmp_path / "demo.db", "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert len(report["policies"]) == 4
    for policy in report["policies"]:
        assert policy["watermark_before_seconds"] > 0, policy
        assert policy["watermark_after_seconds"] == 0, policy
        assert policy["duplicates_skipped"] >= 1, policy
        assert policy["dead"] == 0 and policy["rows_affected"] > 0, policy
    assert sum(report["rows_built"].values()) == 20000

    human = expiry("demo", "--rows", "2000", "--path", tmp_path / "small.db")
    assert human.code == 0, human.err
    assert "expiry demo: cleaned in" in human.out
    for policy in report["policies"]:
        assert policy["policy"] in human.out


# -- bad input -------------------------------------------------------------------------------


BAD_INPUT: list[tuple[list[str], list[str]]] = [
    (["trigger", "expired-sesions"], ["did you mean 'expired-sessions'"]),
    (["plan", "expired-sesions"], ["did you mean 'expired-sessions'"]),
    (["pause", "expird-sessions"], ["did you mean 'expired-sessions'"]),
    (["resume", "expired-session"], ["did you mean 'expired-sessions'"]),
    (["trigger", POLICY, "--cutoff", "next tuesday"], ["--cutoff 'next tuesday'", "ISO-8601"]),
    (["plan", POLICY, "--cutoff", "2030-13-45"], ["--cutoff '2030-13-45'", "ISO-8601"]),
    (["dlq", "redrive"], ["usage: expiry dlq redrive"]),
    (["dlq", "discard"], ["usage: expiry dlq discard"]),
    (["dlq", "frob"], ["invalid choice: 'frob'"]),
    (["dlq", "show", "nope"], ["no job with key 'nope'"]),
    (["runs", "show", "no-such-run"], ["no run 'no-such-run'"]),
    (["runs", "show"], ["usage: expiry runs show RUN_ID"]),
    (["keys", "revoke", "nobody"], ["no active key named 'nobody'"]),
    (["keys", "create"], ["usage: expiry keys create NAME"]),
    (["frobnicate"], ["invalid choice: 'frobnicate'"]),
    (["trigger"], ["required: policy"]),
    (["worker", "--concurrency", "many"], ["'many' is not a whole number"]),
]


@pytest.mark.parametrize(
    ("args", "needles"), BAD_INPUT, ids=[" ".join(args) for args, _ in BAD_INPUT]
)
def test_bad_input_exits_2_with_one_line_on_stderr(
    ws: Workspace, args: list[str], needles: list[str]
) -> None:
    assert_usage_error(ws.run(*args), *needles)
    assert ws.runs() == 0


@pytest.mark.parametrize("args", [["trigger", "expired-sesions"], ["frobnicate"]])
def test_bad_input_with_json_is_still_one_line_on_stderr(ws: Workspace, args: list[str]) -> None:
    assert_usage_error(ws.run("--json", *args), args[-1])


@pytest.mark.parametrize("command", [["status"], ["trigger", POLICY], ["dlq", "list"]])
def test_a_missing_config_file_exits_2(tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "nowhere.toml"
    assert_usage_error(
        expiry("--config", missing, *command), f"no config file at {missing}", "--config PATH"
    )


def test_worker_without_queue_works_the_queues_of_its_apps_handlers(any_ws: Workspace) -> None:
    (any_ws.tmp / "digest_app.py").write_text(
        "from expiry import App\n"
        f"app = App({any_ws.url!r})\n"
        "@app.handler('send_digest')\n"
        "def send_digest(job, tx):\n"
        "    return None\n"
    )
    app = App(any_ws.url)
    try:
        # As POST /v1/queue/publish stores a message: queue and handler both "send_digest".
        app.queue.enqueue("send_digest", {"digest": 7}, None, "digest-7", queue="send_digest")
        app.queue.enqueue("send_digest", {"digest": 8}, None, "digest-8")
        app.queue.enqueue("unknown", {}, None, "elsewhere", queue="other-runtime")
    finally:
        app.close()
    proc = subprocess.run(
        [sys.executable, "-m", "expiry", "worker", "--app", "digest_app:app", "--until-idle"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(),
        cwd=any_ws.tmp,
    )
    assert proc.returncode == 0, proc.stderr
    assert job_state(any_ws, "digest-7") == "completed"
    assert job_state(any_ws, "digest-8") == "completed"
    # A queue no handler of this app names is left to its own consumers.
    assert job_state(any_ws, "elsewhere") == "available"


def test_trigger_wait_without_a_worker_says_so_and_stops_at_its_timeout(ws: Workspace) -> None:
    """No worker runs: `trigger --wait --timeout` prints progress lines (stderr
    is not a terminal here), a hint after 10 s that nothing was done, and exits
    1 at its timeout; the run stays open for a worker to come."""
    started = time.monotonic()
    result = ws.run("trigger", POLICY, "--cutoff", cutoff_now(), "--wait", "--timeout", "11s")
    elapsed = time.monotonic() - started
    assert result.code == 1, result
    assert 11 <= elapsed < 30
    assert "nothing done after 10 s; is `expiry worker` running" in result.err
    assert re.search(r"run \S+: 0 of \d+ windows done", result.err), result.err
    assert "stopped waiting after 11s" in result.err
    assert ws.sessions_left() == EXPIRED + LIVE
    bad = ws.run("trigger", POLICY, "--timeout", "soon")
    assert_usage_error(bad, "--timeout 'soon'")
    assert_usage_error(ws.run("trigger", POLICY, "--timeout", "5s"), "--timeout bounds --wait")


def test_rough_edges_are_usage_errors_of_one_line(ws: Workspace) -> None:
    """Each used to print a traceback, exit 0, or do something else than asked."""
    assert_usage_error(ws.run("--log-level", "LOUD", "status"), "--log-level", "'LOUD'")
    assert_usage_error(ws.run("serve", "--listen", "bad"), "--listen 'bad'", "HOST:PORT")
    # ":8080" would bind every interface while the config refuses that spelling.
    assert_usage_error(ws.run("serve", "--listen", ":8080"), "--listen ':8080'")
    assert_usage_error(ws.run("dlq", "redrive", "no-such-key"), "no dead job with key")

    def with_env(name: str, value: str, *args: str) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "expiry", "--config", str(ws.config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**environment(), name: value},
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    bad = with_env("EXPIRY_CONCURRENCY", "four", "worker", "--until-idle")
    assert_usage_error(bad, "--concurrency", "'four'")
    # EXPIRY_DEBUG=0 means no: an error stays one line, without a traceback.
    assert_usage_error(with_env("EXPIRY_DEBUG", "0", "trigger", "nope"), "no policy named")
    assert_usage_error(with_env("EXPIRY_DEBUG", "maybe", "status"), "EXPIRY_DEBUG='maybe'")


def test_serve_on_a_taken_address_fails_at_once(ws: Workspace) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = ws.run("serve", "--listen", f"127.0.0.1:{port}", timeout=30)
        assert result.code == 1, result
        assert time.monotonic() - started < 20
        [line] = result.err.strip().splitlines()[-1:]
        assert f"cannot listen on 127.0.0.1:{port}" in line and "in use" in line


def test_runs_and_dead_letters_keep_whole_ids_on_an_80_column_terminal(ws: Workspace) -> None:
    """`runs` and `dlq list` at 80 columns: the ids `show` takes are folded onto
    more lines, never cut with an ellipsis."""
    opened = ws.json("trigger", POLICY, "--cutoff", cutoff_now())
    make_dead_job(ws, key="a-rather-long-dead-letter-key-that-would-not-fit-80-columns")
    for args, wanted in (
        (["runs"], opened["run_id"]),
        (["dlq", "list"], "a-rather-long-dead-letter-key-that-would-not-fit-80-columns"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "expiry", "--config", str(ws.config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**environment(), "COLUMNS": "80"},
        )
        assert proc.returncode == 0, proc.stderr
        assert "…" not in proc.stdout
        # The id, read back from the first column's folded pieces.
        first = "".join(
            line.split("│")[1].strip() for line in proc.stdout.splitlines() if line.count("│") > 2
        )
        assert wanted in first, proc.stdout


def test_off_a_terminal_a_table_is_as_wide_as_its_rows(ws: Workspace) -> None:
    """Piped, with no $COLUMNS (a CI log, `| grep`), nothing wraps: each run and
    each dead letter is one line, its id whole on it beside its state."""
    opened = ws.json("trigger", POLICY, "--cutoff", cutoff_now())
    key = "a-rather-long-dead-letter-key-that-would-not-fit-80-columns"
    make_dead_job(ws, key=key)
    env = {k: v for k, v in environment().items() if k != "COLUMNS"}
    for args, wanted, beside in (
        (["runs"], opened["run_id"], "expired-sessions:"),
        (["dlq", "list"], key, "nobody-handles-this"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "expiry", "--config", str(ws.config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr
        [line] = [x for x in proc.stdout.splitlines() if wanted in x]
        header = next(x for x in proc.stdout.splitlines() if "┃" in x)
        assert beside in line and line.count("│") == header.count("┃"), proc.stdout


def test_worker_until_idle_exits_3_while_windows_wait_for_a_retry(
    pg_url: str, tmp_path: Path
) -> None:
    """Live traffic holds a row lock past lock_timeout: the window fails
    transiently and waits for its retry. `worker --until-idle` used to exit 0
    then, the run unfinished and its rows still there."""
    pg = make_workspace(pg_url, tmp_path)
    pg.config.write_text(config_text(pg.url) + 'lock_timeout = "50ms"\n')
    assert pg.run("trigger", POLICY, "--cutoff", cutoff_now()).code == 0
    with psycopg.connect(pg.url) as traffic:
        traffic.execute("select id from sessions where id = 1 for update")
        worked = pg.run("worker", "--until-idle")
    assert worked.code == 3, worked
    assert "1 jobs wait for a retry and 0 of the policies' jobs are snoozed: exit 3" in worked.err
    jobs = pg.table("jobs")
    assert pg.scalar(f"select count(*) from {jobs} where state = 'retryable'") >= 1


# -- evidence -----------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def every_ws(request: pytest.FixtureRequest, tmp_path: Path) -> Workspace:
    """A workspace on each engine."""
    if request.param == "sqlite":
        return make_workspace(f"sqlite:///{tmp_path / 'cli.db'}", tmp_path)
    fixture = {"postgres": "pg_url", "mysql": "mysql_url"}[request.param]
    return make_workspace(str(request.getfixturevalue(fixture)), tmp_path)


def test_evidence_lists_what_each_run_deleted_as_the_table_lost_it(every_ws: Workspace) -> None:
    """The oracle is the table: each run's rows in the evidence are the rows it
    lost, and every deleted key lies in exactly one booked range."""
    ws = every_ws
    assert ws.ok("evidence", POLICY).out.strip() == (
        f"policy {POLICY}: no run of it booked anything in the ledger kept"
    )
    first = cutoff_now()
    ws.ok("trigger", POLICY, "--cutoff", first)
    ws.ok("worker", "--until-idle")
    assert ws.sessions_left() == LIVE
    # A second run: 50 rows more, expired a day ago.
    ws.execute(
        {
            "postgres": "insert into sessions select i, now() - interval '1 day'"
            " from generate_series(601, 650) i",
            "mysql": "insert into sessions select seq, utc_timestamp(6) - interval 1 day"
            " from seq_601_to_650",
            "sqlite": "with recursive n(i) as (select 601 union all select i + 1 from n"
            " where i < 650) insert into sessions select i, unixepoch() - 86400 from n",
        }[ws.dialect]
    )
    time.sleep(1.1)  # a later cutoff (to the second)
    second = cutoff_now()
    ws.ok("trigger", POLICY, "--cutoff", second)
    ws.ok("worker", "--until-idle")

    runs = ws.json("evidence", POLICY)
    assert [r["cutoff"] for r in runs] == [first, second]
    assert all(r["table"] == "sessions" and r["policy"] == POLICY for r in runs)
    assert runs[0]["rows_affected"] == EXPIRED and runs[1]["rows_affected"] == 50
    assert ws.sessions_left() == LIVE
    assert runs[0]["rows_by_action"] == {"delete": EXPIRED}
    assert sum(op["rows"] for op in runs[0]["operations"]) == EXPIRED
    covered = [
        i
        for op in runs[0]["operations"]
        for i in range(1, EXPIRED + LIVE + 1)
        if op["rows"] and _in_range(op["range"], i)
    ]
    assert sorted(covered) == list(range(1, EXPIRED + 1)), "each deleted key in one range"
    assert all(op["worker"] and ISO_Z.match(op["applied_at"]) for op in runs[0]["operations"])

    csv_out = ws.ok("evidence", POLICY, "--format", "csv").out.splitlines()
    assert csv_out[0] == (
        "run_id,policy,table,cutoff,key,action,range,rows,applied_at,worker,kept,blocked"
    )
    assert len(csv_out) - 1 == sum(len(r["operations"]) for r in runs)
    text = ws.ok("evidence", POLICY).out
    assert f"{EXPIRED:,} deleted in {len(runs[0]['operations'])} operations" in text
    assert f"policy {POLICY}: {sum(r['rows_affected'] for r in runs):,} rows in 2 runs" in text

    # --since: from the second run's first booking on; a duration reads the database clock.
    since = runs[1]["operations"][0]["applied_at"]
    assert [r["cutoff"] for r in ws.json("evidence", POLICY, "--since", since)] == [second]
    assert len(ws.json("evidence", POLICY, "--since", "1h")) == 2
    assert ws.json("evidence", POLICY, "--since", "2999-01-01T00:00:00Z") == []
    assert_usage_error(ws.run("evidence", POLICY, "--since", "last tuesday"), "--since", "30d")

    # A run still open (its windows being applied, or redriven) shows what it
    # has booked so far: the evidence does not wait for its end.
    ws.execute(
        f"update {ws.table('runs')} set state = 'running', finished_at = null"
        f" where id = '{runs[1]['run_id']}'"
    )
    shown = ws.json("evidence", POLICY)
    assert [(r["run_id"], r["outcome"]) for r in shown] == [
        (runs[0]["run_id"], runs[0]["outcome"]),
        (runs[1]["run_id"], "running"),
    ]
    assert [r["operations"] for r in shown] == [r["operations"] for r in runs]


def _in_range(text: str, key: int) -> bool:
    """Whether ``key`` lies in a booked ``keys (lo, hi]`` range."""
    match = re.fullmatch(r"keys \((-?\d+), (-?\d+)\]", text)
    assert match, text
    return int(match.group(1)) < key <= int(match.group(2))


def test_the_worker_prunes_evidence_past_retention_ledger_never_an_open_run(
    any_ws: Workspace,
) -> None:
    ws = any_ws
    ws.config.write_text(config_text(ws.url) + '\n[retention]\nledger = "1d"\n')
    ws.ok("trigger", POLICY, "--cutoff", cutoff_now())
    ws.ok("worker", "--until-idle")
    [finished] = ws.json("evidence", POLICY)
    # A second run left open (no worker), opened long ago: kept (its ledger rows
    # too: tests/engines/test_conformance_ledger_audit.py).
    time.sleep(1.1)
    ws.execute(
        {
            "postgres": "insert into sessions select i, now() - interval '1 day'"
            " from generate_series(601, 610) i",
            "sqlite": "insert into sessions values (601, unixepoch() - 86400)",
        }[ws.dialect]
    )
    opened = ws.json("trigger", POLICY, "--cutoff", cutoff_now())
    shift = (
        "finished_at - interval '2 days'" if ws.dialect == "postgres" else "finished_at - 172800"
    )
    ws.execute(f"update {ws.table('runs')} set finished_at = {shift}")
    ws.execute(
        f"update {ws.table('runs')} set opened_at = opened_at"
        + (" - interval '3 days'" if ws.dialect == "postgres" else " - 259200")
    )
    app = App.from_config(ws.config)
    try:
        prune = app.hooks.prune  # what the worker's rescuer runs every 5 minutes
        assert prune is not None
        prune()
    finally:
        app.close()
    assert ws.json("evidence", POLICY) == []
    remaining = ws.json("runs")
    assert [r["id"] for r in remaining] == [opened["run_id"]], "the finished run is gone"
    assert finished["rows_affected"] == EXPIRED

    ws.config.write_text(config_text(ws.url) + '\n[retention]\nledger = "1h"\n')
    assert_usage_error(ws.run("check"), "retention", "ledger")
