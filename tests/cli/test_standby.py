"""Least privilege on a hot standby: `migrate` is the only command that
writes expiry's schema; the reading commands (check, plan, trigger --dry-run,
status, runs, runs show, dlq list and show, keys list), the dashboard's reading
pages and the HTTP API's GET routes answer from a streaming standby (a cluster
of the test's own, initdb and pg_basebackup in temporary folders) where every
write is refused."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import uvicorn

from cleanup._support import cli, run_worker, write_config
from clusters import Cluster, primary_and_standby
from dashboard.conftest import post_login
from expiry.app import App
from expiry.config import parse_config
from expiry.http import create_app
from expiry.keys import Keys

POLICY = {
    "name": "expired-sessions",
    "table": "sessions",
    "key": "id",
    "timestamp": "expires_at",
    "window": 100,
    "max_attempts": 1,
    "nice_ratio": 0,
    "where": None,  # write_config's default policy has one; this table has no such column
}


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[Cluster, Cluster]]:
    with primary_and_standby() as pair:
        yield pair


def seeded(primary: Cluster, standby: Cluster) -> tuple[App, str]:
    """On the primary: expiry migrated, a finished run, a dead job and an API
    key, all replayed by the standby. Returns the primary's App and the key."""
    with psycopg.connect(primary.url, autocommit=True) as conn:
        conn.execute("drop schema if exists expiry cascade")
        conn.execute("drop table if exists sessions")
        conn.execute("create table sessions (id bigint primary key, expires_at timestamptz)")
        conn.execute("create index on sessions (expires_at)")
        conn.execute(
            "insert into sessions select i, now() - interval '1 day' + i * interval '1 s'"
            " from generate_series(1, 450) i"
        )
    app = App(config=parse_config({"database": {"url": primary.url}, "policy": [POLICY]}))
    app.migrate()
    assert app.cleanup is not None
    app.cleanup.open_run("expired-sessions")
    run_worker(app)
    app.queue.enqueue("no-such-handler", {}, key="poison")
    app.worker(queues=("default",), until_idle=True, poll=0.05).run()
    key = Keys(app.engine).create("reader")
    standby.wait_caught_up(primary)
    return app, key


def test_the_reading_commands_answer_from_a_hot_standby(
    clusters: tuple[Cluster, Cluster], tmp_path: Path
) -> None:
    primary, standby = clusters
    app, _ = seeded(primary, standby)
    app.close()
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        standby.sql("create table probe (id int)")  # it is a standby indeed
    config = write_config(tmp_path / "expiry.toml", standby.url, POLICY)

    check = cli("--config", str(config), "check", "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["ok"] is True

    plan = cli("--config", str(config), "plan", "expired-sessions", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["candidates"] == 0  # the run cleaned them all
    dry = cli("--config", str(config), "trigger", "expired-sessions", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["dry_run"] is True

    status = cli("--config", str(config), "status", "--json")
    assert status.returncode == 0, status.stderr
    [policy] = json.loads(status.stdout)["policies"]
    assert policy["name"] == "expired-sessions" and not policy["broken"]

    runs = cli("--config", str(config), "runs", "--json")
    assert runs.returncode == 0, runs.stderr
    [run] = json.loads(runs.stdout)
    assert run["outcome"] == "finished"
    shown = cli("--config", str(config), "runs", "show", run["id"], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["jobs_done"] == run["jobs_done"]
    evidence = cli("--config", str(config), "evidence", "expired-sessions", "--json")
    assert evidence.returncode == 0, evidence.stderr
    [booked] = json.loads(evidence.stdout)
    assert booked["run_id"] == run["id"] and booked["rows_affected"] == run["rows_affected"]

    dead = cli("--config", str(config), "dlq", "list", "--json")
    assert dead.returncode == 0, dead.stderr
    assert [j["key"] for j in json.loads(dead.stdout)] == ["poison"]
    poison = cli("--config", str(config), "dlq", "show", "poison", "--json")
    assert poison.returncode == 0, poison.stderr
    assert json.loads(poison.stdout)["state"] == "dead"

    keys = cli("--config", str(config), "keys", "list", "--json")
    assert keys.returncode == 0, keys.stderr
    assert [k["name"] for k in json.loads(keys.stdout)] == ["reader"]

    # migrate is the one command that writes: on a standby it says why it cannot.
    with psycopg.connect(primary.url, autocommit=True) as conn:
        [(latest,)] = conn.execute("select max(version) from expiry.schema_migrations")
        conn.execute("delete from expiry.schema_migrations where version = %s", (latest,))
    standby.wait_caught_up(primary)
    refused = cli("--config", str(config), "migrate")
    assert refused.returncode == 1
    assert "read-only" in refused.stderr and "Traceback" not in refused.stderr
    # The reading commands migrate nothing: they say what to run (on the primary).
    behind = f"version {latest - 1} and this expiry needs {latest}: run `expiry migrate`"
    check = cli("--config", str(config), "check", "--json")
    assert check.returncode == 2, check.stderr
    assert json.loads(check.stdout)["ok"] is False and behind in check.stderr
    plan = cli("--config", str(config), "plan", "expired-sessions", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["candidates"] == 0 and behind in plan.stderr
    status = cli("--config", str(config), "status")
    assert status.returncode == 2, status.stderr
    assert status.stderr.strip() == (
        f"expiry: the database has expiry schema {behind} (or App.migrate()) first, "
        "as a role that may create tables"
    )
    with psycopg.connect(primary.url, autocommit=True) as conn:
        conn.execute("insert into expiry.schema_migrations (version) values (%s)", (latest,))


def test_the_dashboards_reading_pages_answer_from_a_hot_standby(
    clusters: tuple[Cluster, Cluster],
) -> None:
    primary, standby = clusters
    app, key = seeded(primary, standby)
    app.close()
    reader = App(config=parse_config({"database": {"url": standby.url}, "policy": [POLICY]}))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(reader), log_level="warning", lifespan="off"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            # Signing in is audited where the database can be written; here it
            # signs in all the same (the log says the audit row was not written).
            answer = post_login(client, key)
            assert answer.status_code == 303, answer.text
            [run] = reader.runs.recent()
            pages = ["/", "/runs", "/queue", "/jobs", "/dlq", "/audit", "/crons", "/workers"]
            for path in [*pages, f"/runs/{run['id']}", "/jobs/poison", "/dlq/bulk"]:
                page = client.get(path)
                assert page.status_code == 200, (path, page.text[:500])
            assert "poison" in client.get("/dlq").text
            bearer = {"Authorization": f"Bearer {key}"}
            routes = ["/v1/policies", "/v1/runs", f"/v1/runs/{run['id']}", "/v1/dlq"]
            for path in [*routes, "/v1/cron", "/v1/health", "/metrics", "/v1/discovery"]:
                api = client.get(path, headers=bearer)
                assert api.status_code == 200, (path, api.text[:500])
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        reader.close()
