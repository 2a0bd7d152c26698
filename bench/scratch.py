"""Scratch databases for the benchmarks: made on the server of an admin URL,
dropped at the end whatever happened."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql


def db_url(admin_url: str, dbname: str) -> str:
    """The admin URL with its database replaced: postgresql://user@host:port/dbname."""
    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{dbname}"))


@contextmanager
def scratch_database(admin_url: str, dbname: str) -> Iterator[str]:
    """A fresh database ``dbname``; yields its URL and drops it at the end."""
    name = sql.Identifier(dbname)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(name))
        admin.execute(sql.SQL("create database {}").format(name))
    try:
        yield db_url(admin_url, dbname)
    finally:
        # Retry for a while: the server may be restarting (the restart drill of
        # the test suite does that to a shared server).
        for attempt in range(30):
            try:
                with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
                    admin.execute(sql.SQL("drop database if exists {} with (force)").format(name))
                break
            except psycopg.OperationalError:
                if attempt == 29:
                    raise
                time.sleep(1.0)
