#!/usr/bin/env python3
"""Write (or check) each engine's schema snapshot: the schema its numbered
migrations build, as a reviewer reads it.

    python tools/schema.py           # rewrite src/expiry/engines/*/schema.sql
    python tools/schema.py --check   # exit 1 if a snapshot differs from the migrations

PostgreSQL's snapshot is pg_dump's schema-only output of the ``expiry`` schema
(headers, SET lines and comments dropped), from a scratch database migrated
from scratch on the server at EXPIRY_TEST_POSTGRES_URL; SQLite's is the CREATE
statements of a scratch file migrated from scratch; MySQL's is SHOW CREATE
TABLE and SHOW CREATE TRIGGER of a scratch database on the server at
EXPIRY_TEST_MYSQL_URL (the counter and the definer dropped). tests/engines/
test_schema_snapshot.py compares the same way, so a migration without its
snapshot (or the reverse) fails the suite, and a review shows the schema's diff.
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
import pymysql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from expiry.engines import open_engine  # noqa: E402

SNAPSHOTS = {
    "postgres": ROOT / "src/expiry/engines/postgres/schema.sql",
    "sqlite": ROOT / "src/expiry/engines/sqlite/schema.sql",
    "mysql": ROOT / "src/expiry/engines/mysql/schema.sql",
}
MYSQL_URL = os.environ.get("EXPIRY_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/")
ADMIN_URL = os.environ.get(
    "EXPIRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def postgres_schema(url: str) -> str:
    """The ``expiry`` schema of the database at ``url``, as pg_dump prints it,
    without the lines that vary by server or session."""
    params = conninfo_to_dict(url)
    env = {**os.environ, "PGCONNECT_TIMEOUT": "5"}
    dump = subprocess.run(
        [
            "pg_dump",
            "--schema-only",
            "--schema=expiry",
            "--no-owner",
            "--no-privileges",
            "--no-comments",
            make_conninfo(**params),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    varying = ("--", "SET ", "SELECT pg_catalog.set_config", "\\restrict", "\\unrestrict")
    kept: list[str] = []
    for line in dump.splitlines():
        if line.startswith(varying) or (not line.strip() and (not kept or not kept[-1])):
            continue  # server- and dump-specific lines; runs of blank lines
        kept.append(line.rstrip())
    return "\n".join(kept).strip() + "\n"


def sqlite_schema(path: str) -> str:
    """The CREATE statements of expiry's tables, indexes and triggers in ``path``."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "select sql from sqlite_master where name like 'expiry%' and sql is not null"
            " order by type, name"
        ).fetchall()
    finally:
        conn.close()
    return "".join(f"{sql};\n\n" for (sql,) in rows)


def mysql_schema(url: str) -> str:
    """SHOW CREATE TABLE of expiry's tables and SHOW CREATE TRIGGER of its
    triggers in the database at ``url``, without the AUTO_INCREMENT counter and
    the trigger's definer (they vary by run and by user)."""
    from expiry.engines.mysql.sessions import parse_url

    conn = pymysql.connect(**parse_url(url))
    parts: list[str] = []
    try:
        with conn.cursor() as cur:
            cur.execute(
                "select table_name from information_schema.tables where table_schema = database()"
                " and table_name like 'expiry%%' order by table_name"
            )
            for (table,) in cur.fetchall():
                cur.execute(f"show create table `{table}`")
                text = cur.fetchone()[1]
                parts.append(re.sub(r" AUTO_INCREMENT=\d+", "", text))
            cur.execute(
                "select trigger_name from information_schema.triggers"
                " where trigger_schema = database() order by trigger_name"
            )
            for (trigger,) in cur.fetchall():
                cur.execute(f"show create trigger `{trigger}`")
                text = cur.fetchone()[2]
                parts.append(re.sub(r" DEFINER=`[^`]*`@`[^`]*`", "", text))
    finally:
        conn.close()
    return "".join(f"{text};\n\n" for text in parts)


def built_mysql() -> str:
    from expiry.engines.mysql.sessions import parse_url

    name = f"expiry_schema_{uuid.uuid4().hex[:8]}"
    params = parse_url(MYSQL_URL.rstrip("/") + "/mysql")
    params.pop("database")
    admin = pymysql.connect(**params, autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute(f"create database `{name}`")
        url = MYSQL_URL.rstrip("/") + "/" + name
        engine = open_engine(url)
        engine.migrate()
        engine.close()
        return mysql_schema(url)
    finally:
        with admin.cursor() as cur:
            cur.execute(f"drop database if exists `{name}`")
        admin.close()


def built_postgres() -> str:
    name = f"expiry_schema_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'create database "{name}"')
    try:
        params = conninfo_to_dict(ADMIN_URL)
        params["dbname"] = name
        url = make_conninfo(**params)
        engine = open_engine(
            f"postgresql://{params.get('user', 'postgres')}@"
            f"{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/{name}"
        )
        engine.migrate()
        engine.close()
        return postgres_schema(url)
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')


def built_sqlite() -> str:
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "schema.db")
        engine = open_engine(f"sqlite:///{path}")
        engine.migrate()
        engine.close()
        return sqlite_schema(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare; change nothing")
    args = parser.parse_args()
    differ = 0
    built_all = (
        ("postgres", built_postgres()),
        ("sqlite", built_sqlite()),
        ("mysql", built_mysql()),
    )
    for dialect, built in built_all:
        path = SNAPSHOTS[dialect]
        if args.check:
            if not path.exists() or path.read_text() != built:
                print(f"{path.relative_to(ROOT)} differs from the migrations")
                differ = 1
        else:
            path.write_text(built)
            print(f"wrote {path.relative_to(ROOT)}")
    return differ


if __name__ == "__main__":
    sys.exit(main())
