"""The library's first use (issue #19, point 8): an App on a new SQLite file
migrates itself; on a PostgreSQL database whose schema is missing or older,
every entry point raises MigrationError saying to run `expiry migrate`."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import psycopg
import pytest

from expiry import App
from expiry.errors import DatabaseUnavailable, MigrationError

READER = f"expiry_reader_{os.getpid()}"


def test_an_app_on_a_new_sqlite_file_migrates_itself(tmp_path: Path) -> None:
    config = tmp_path / "expiry.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "app.db"}"\n')
    app = App.from_config(config)  # the README's Python example, without migrate()
    try:
        result = app.queue.enqueue("emails.send", {"to": "a@example.com"}, key="first")
        assert result.enqueued
        assert app.queue.pending() == 1
    finally:
        app.close()


def test_a_server_database_without_the_schema_says_to_migrate(bare_pg_url: str) -> None:
    app = App(bare_pg_url)
    try:
        with pytest.raises(MigrationError, match="run `expiry migrate`"):
            app.queue.enqueue("emails.send", {}, key="k")
        assert app.migrate()  # the owner migrates: then it works
        assert app.queue.enqueue("emails.send", {}, key="k").enqueued
    finally:
        app.close()


def test_an_older_schema_says_to_migrate_and_an_up_to_date_one_creates_nothing(
    pg_url: str,
) -> None:
    owner = App(pg_url)
    owner.migrate()
    latest = owner.engine.migrations[-1][0]
    owner.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("delete from expiry.schema_migrations where version = %s", (latest,))
    app = App(pg_url)
    try:
        with pytest.raises(
            MigrationError, match=f"version {latest - 1} and this expiry needs {latest}"
        ):
            app.queue.pending()
    finally:
        app.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("insert into expiry.schema_migrations (version) values (%s)", (latest,))
        # A role that may not create anything still "migrates" an up-to-date schema.
        conn.execute(f"drop role if exists {READER}")
        conn.execute(f"create role {READER} login")
        conn.execute(f"grant usage on schema expiry to {READER}")
        conn.execute(f"grant select on all tables in schema expiry to {READER}")
    reader_url = re.sub(r"//[^@]+@", f"//{READER}@", pg_url)
    reader = App(reader_url)
    try:
        assert reader.migrate() == []
        assert reader.queue.pending() == 0
    finally:
        reader.close()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"drop owned by {READER}")
            conn.execute(f"drop role {READER}")


def test_a_read_only_role_runs_plan_and_status(pg_url: str, tmp_path: Path) -> None:
    """Least privilege: after the owner migrated, a role that may only read
    runs `plan` and `status` (the README's expiry_reader grants)."""
    import subprocess
    import sys

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("create table sessions (id bigint primary key, expires_at timestamptz)")
        conn.execute("create index on sessions (expires_at)")
        conn.execute(
            "insert into sessions select g, now() - interval '1 hour' from generate_series(1, 50) g"
        )
        conn.execute(f"drop role if exists {READER}")
        conn.execute(f"create role {READER} login")
        conn.execute(f"grant usage on schema expiry to {READER}")
        conn.execute(f"grant select on all tables in schema expiry to {READER}")
        conn.execute(f"grant select on sessions to {READER}")
    reader_url = re.sub(r"//[^@]+@", f"//{READER}@", pg_url)
    config = tmp_path / "expiry.toml"
    config.write_text(
        f'[database]\nurl = "{reader_url}"\n\n[[policy]]\nname = "sessions"\n'
        'table = "sessions"\nkey = "id"\ntimestamp = "expires_at"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    out = {}
    try:
        for command in (["plan", "sessions"], ["status"]):
            done = subprocess.run(
                [sys.executable, "-m", "expiry", "--config", str(config), "--json", *command],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            out[command[0]] = json.loads(done.stdout)
        assert out["plan"]["candidates"] == 50 and out["plan"]["dry_run"] is True
        assert [p["name"] for p in out["status"]["policies"]] == ["sessions"]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"drop owned by {READER}")
            conn.execute(f"drop role {READER}")


def test_a_database_that_does_not_exist_fails_at_once_with_the_servers_words(
    pg_url: str, tmp_path: Path
) -> None:
    """Not a 30 s wait ending in PoolTimeout: the server's own message, exit 1."""
    import subprocess
    import sys
    import time

    missing = pg_url.rsplit("/", 1)[0] + "/expiry_no_such_database"
    app = App(missing)
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match='database "expiry_no_such_database" does not'):
        app.queue.pending()
    assert time.monotonic() - started < 5
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    done = subprocess.run(
        [sys.executable, "-m", "expiry", "--database-url", missing, "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("expiry: cannot connect to PostgreSQL at ") and "does not exist" in line
