"""Each engine's committed schema.sql is exactly what its migrations build (so a
migration without its snapshot, or the reverse, fails here, and a review shows
the schema's diff), and every engine stands at the same migration numbers."""

from __future__ import annotations

import sys
from pathlib import Path

from expiry.engines import open_engine

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import schema  # noqa: E402  (tools/schema.py: the snapshot writer)

FIX = "; run `python tools/schema.py` to rewrite it, and review the diff"


def test_postgres_snapshot_matches_the_migrations(pg_url: str) -> None:
    built = schema.postgres_schema(pg_url)
    assert built == schema.SNAPSHOTS["postgres"].read_text(), "postgres/schema.sql differs" + FIX


def test_sqlite_snapshot_matches_the_migrations(sqlite_url: str) -> None:
    built = schema.sqlite_schema(sqlite_url.removeprefix("sqlite:///"))
    assert built == schema.SNAPSHOTS["sqlite"].read_text(), "sqlite/schema.sql differs" + FIX


def test_mysql_snapshot_matches_the_migrations(mysql_url: str) -> None:
    built = schema.mysql_schema(mysql_url)
    assert built == schema.SNAPSHOTS["mysql"].read_text(), "mysql/schema.sql differs" + FIX


def test_every_engine_has_the_same_migration_numbers(
    pg_url: str, sqlite_url: str, mysql_url: str
) -> None:
    numbers = {}
    for url in (pg_url, sqlite_url, mysql_url):
        engine = open_engine(url)
        numbers[engine.dialect] = [version for version, _ in engine.migrations]
        assert engine.schema_version() == numbers[engine.dialect][-1]
        engine.close()
    assert numbers["postgres"] == numbers["sqlite"] == numbers["mysql"]
    assert numbers["postgres"] == list(range(1, len(numbers["postgres"]) + 1))
