"""Read-only means read-only (issue 37): the reading commands (check, plan,
trigger --dry-run, status, runs, runs show, dlq list, dlq show, keys list)
create and alter nothing, on every engine, as real processes.

On a database expiry was never migrated in, each runs as a role that may only
SELECT the application's table (PostgreSQL, MariaDB) and as the database's
owner (who could create the schema, and must not have it created by a read).
Each answers with its result (check, plan and the dry run read the
application's table and the catalog alone), or with one line saying to run
`expiry migrate` as a role that may create tables, exit 2: never a traceback
or the driver's InsufficientPrivilege. The catalog is the same afterwards.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from test_cli import Result, expiry

from cleanup._support import Db, write_config
from expiry.engines.mysql.sessions import parse_url

POLICY = {
    "name": "expired-sessions",
    "table": "sessions",
    "key": "id",
    "timestamp": "expires_at",
    "window": 10,
    "where": None,
}
EXPIRED, LIVE = 40, 10
ROLE = f"expiry_ro_{os.getpid()}"
PASSWORD = "read-only-test"

RESULTS = [("check",), ("plan", "expired-sessions"), ("trigger", "expired-sessions", "--dry-run")]
"""Read only the application's table and the catalog: they answer."""
MIGRATE_FIRST = [
    ("status",),
    ("runs",),
    ("runs", "show", "expired-sessions:2026-01-01T00:00:00Z"),
    ("evidence", "expired-sessions"),
    ("dlq", "list"),
    ("dlq", "show", "some-key"),
    ("keys", "list"),
]
"""Read expiry's own tables: they say to run `expiry migrate` first."""


def seed(url: str) -> None:
    """The application's table, as its owner: EXPIRED rows expired an hour
    ago, LIVE rows expire in an hour."""
    db = Db(url)
    try:
        db.create_sessions()
        db.insert_sessions([(i, -3600.0 if i <= EXPIRED else 3600.0, False) for i in range(1, 51)])
    finally:
        db.close()


def run_reads(config: Path) -> dict[tuple[str, ...], Result]:
    """Every reading command: those that answer in --json, the others as a
    person sees them."""
    done = {c: expiry("--config", config, "--json", *c) for c in RESULTS}
    done.update({c: expiry("--config", config, *c) for c in MIGRATE_FIRST})
    return done


def assert_read_only_answers(done: dict[tuple[str, ...], Result]) -> None:
    for command, result in done.items():
        assert "Traceback" not in result.err, (command, result.err)
        assert "InsufficientPrivilege" not in result.err, (command, result.err)
        assert "denied" not in result.err, (command, result.err)
    check = done[("check",)]
    assert check.code == 2, check
    answer = check.json()
    assert answer["policies"] == ["expired-sessions"] and answer["ok"] is False, answer
    assert answer["schema"] == {"version": 0, "needs": answer["schema"]["needs"]}
    assert "expiry migrate" in json.loads(check.err)["error"]
    for command in RESULTS[1:]:
        preview = done[command]
        assert preview.code == 0, (command, preview)
        assert preview.json()["candidates"] == EXPIRED and preview.json()["dry_run"] is True
        assert "expiry migrate" in preview.err, (command, preview.err)  # said, once
    for command in MIGRATE_FIRST:
        result = done[command]
        assert result.code == 2 and result.out == "", (command, result)
        [line] = result.err.strip().splitlines()
        assert line.startswith("expiry: expiry's own tables are not in this database yet"), line
        assert "run `expiry migrate`" in line and "as a role that may create tables" in line


# -- PostgreSQL -------------------------------------------------------------------


def pg_catalog(url: str) -> list[tuple[object, ...]]:
    """Every schema, relation, function and trigger outside the system's own."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "select 'schema', nspname, '' from pg_namespace"
            " union all select 'relation', n.nspname || '.' || c.relname, c.relkind::text"
            "  from pg_class c join pg_namespace n on n.oid = c.relnamespace"
            "  where n.nspname not in ('pg_catalog', 'information_schema', 'pg_toast')"
            " union all select 'function', n.nspname || '.' || p.proname, ''"
            "  from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
            "  where n.nspname not in ('pg_catalog', 'information_schema')"
            " union all select 'trigger', tgname, '' from pg_trigger where not tgisinternal"
            " order by 1, 2, 3"
        ).fetchall()


@pytest.fixture
def pg_reader(bare_pg_url: str) -> Iterator[str]:
    """A login role that may SELECT the application's table and nothing more."""
    with psycopg.connect(bare_pg_url, autocommit=True) as conn:
        conn.execute(f"drop role if exists {ROLE}")
        conn.execute(f"create role {ROLE} login")
    seed(bare_pg_url)
    with psycopg.connect(bare_pg_url, autocommit=True) as conn:
        conn.execute(f"grant select on sessions to {ROLE}")
    yield re.sub(r"//[^@]+@", f"//{ROLE}@", bare_pg_url)
    with psycopg.connect(bare_pg_url, autocommit=True) as conn:
        conn.execute(f"drop owned by {ROLE}")
        conn.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity where usename = %s", (ROLE,)
        )
        conn.execute(f"drop role {ROLE}")


@pytest.mark.parametrize("who", ["select-only role", "owner"])
def test_reading_commands_create_nothing_on_a_never_migrated_postgres(
    who: str, bare_pg_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if who == "owner":
        seed(bare_pg_url)
        url = bare_pg_url
    else:
        url = request.getfixturevalue("pg_reader")
    before = pg_catalog(bare_pg_url)
    config = write_config(tmp_path / "expiry.toml", url, POLICY)
    done = run_reads(config)
    after = pg_catalog(bare_pg_url)
    assert after == before, [x for x in after if x not in before][:5]
    assert ("schema", "expiry", "") not in after
    assert_read_only_answers(done)


# -- MariaDB ----------------------------------------------------------------------


def mysql_admin(url: str) -> Any:
    """A connection as the test database's owner (the server's root)."""
    return pymysql.connect(**parse_url(url), autocommit=True)


def mysql_catalog(url: str) -> list[tuple[object, ...]]:
    """The database's tables, routines and triggers."""
    name = url.rsplit("/", 1)[1]
    admin = mysql_admin(url)
    try:
        with admin.cursor() as cur:
            cur.execute(
                "select 'table', table_name from information_schema.tables"
                " where table_schema = %s"
                " union all select 'routine', routine_name from information_schema.routines"
                " where routine_schema = %s"
                " union all select 'trigger', trigger_name from information_schema.triggers"
                " where trigger_schema = %s order by 1, 2",
                (name, name, name),
            )
            return list(cur.fetchall())
    finally:
        admin.close()


@pytest.fixture
def mysql_reader(bare_mysql_url: str) -> Iterator[str]:
    """A user granted SELECT on the application's table alone."""
    name = bare_mysql_url.rsplit("/", 1)[1]
    seed(bare_mysql_url)
    admin = mysql_admin(bare_mysql_url)
    with admin.cursor() as cur:
        cur.execute(f"drop user if exists '{ROLE}'@'%'")
        cur.execute(f"create user '{ROLE}'@'%' identified by '{PASSWORD}'")
        cur.execute(f"grant select on `{name}`.`sessions` to '{ROLE}'@'%'")
    yield re.sub(r"//[^@/]+@", f"//{ROLE}:{PASSWORD}@", bare_mysql_url)
    with admin.cursor() as cur:
        cur.execute(f"drop user if exists '{ROLE}'@'%'")
    admin.close()


@pytest.mark.parametrize("who", ["select-only user", "owner"])
def test_reading_commands_create_nothing_on_a_never_migrated_mariadb(
    who: str, bare_mysql_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if who == "owner":
        seed(bare_mysql_url)
        url = bare_mysql_url
    else:
        url = request.getfixturevalue("mysql_reader")
    before = mysql_catalog(bare_mysql_url)
    config = write_config(tmp_path / "expiry.toml", url, POLICY)
    done = run_reads(config)
    after = mysql_catalog(bare_mysql_url)
    assert after == before, [t for t in after if t not in before]
    assert before == [("table", "sessions")]
    assert_read_only_answers(done)


# -- SQLite -----------------------------------------------------------------------


def sqlite_state(path: Path) -> tuple[list[tuple[object, ...]], str]:
    """The file's schema and its journal mode (both are written to the file)."""
    with sqlite3.connect(path) as conn:
        schema = conn.execute("select type, name from sqlite_master order by 1, 2").fetchall()
        [(mode,)] = conn.execute("pragma journal_mode").fetchall()
    return schema, mode


def test_reading_commands_create_nothing_in_an_application_sqlite_file(tmp_path: Path) -> None:
    """The application's own SQLite file is migrated by the commands that
    write; a read leaves it as it was, journal mode included."""
    path = tmp_path / "app.db"
    url = f"sqlite:///{path}"
    seed(url)
    before = sqlite_state(path)
    config = write_config(tmp_path / "expiry.toml", url, POLICY)
    done = run_reads(config)
    assert sqlite_state(path) == before
    assert before[1] == "delete"
    assert_read_only_answers(done)


def test_a_reading_command_creates_no_sqlite_file(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    result = expiry("--database-url", f"sqlite:///{missing}", "status")
    assert result.code == 2, result
    assert f"no SQLite database at {missing}" in result.err and "Traceback" not in result.err
    assert not missing.exists()


# -- after the owner migrated -----------------------------------------------------


def test_the_writing_commands_still_migrate(
    bare_pg_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """migrate, and a command that writes (trigger), create expiry's tables;
    the reading commands then answer as a select-only role with the README's
    grants for a reader."""
    seed(bare_pg_url)
    config = write_config(tmp_path / "expiry.toml", bare_pg_url, POLICY)
    opened = expiry("--config", config, "--json", "trigger", "expired-sessions")
    assert opened.code == 0, opened
    with psycopg.connect(bare_pg_url, autocommit=True) as conn:
        [(version,)] = conn.execute("select max(version) from expiry.schema_migrations")
        conn.execute(f"drop role if exists {ROLE}")
        conn.execute(f"create role {ROLE} login")
        conn.execute(f"grant usage on schema expiry to {ROLE}")
        conn.execute(f"grant select on all tables in schema expiry to {ROLE}")
        conn.execute(f"grant select on sessions to {ROLE}")
    assert version >= 14
    reader = write_config(
        tmp_path / "reader.toml", re.sub(r"//[^@]+@", f"//{ROLE}@", bare_pg_url), POLICY
    )
    request.addfinalizer(drop_role(bare_pg_url))
    before = pg_catalog(bare_pg_url)
    done = run_reads(reader)
    for command, result in done.items():
        assert result.code == 0 or command in (
            ("runs", "show", "expired-sessions:2026-01-01T00:00:00Z"),
            ("dlq", "show", "some-key"),
        ), (command, result)
        assert "Traceback" not in result.err and "expiry migrate" not in result.err
    assert done[("check",)].json()["ok"] is True
    assert "open" in done[("status",)].out or "expired-sessions" in done[("status",)].out
    assert pg_catalog(bare_pg_url) == before


def drop_role(url: str) -> Callable[[], None]:
    def drop() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"drop owned by {ROLE}")
            conn.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity where usename = %s",
                (ROLE,),
            )
            conn.execute(f"drop role {ROLE}")

    return drop
