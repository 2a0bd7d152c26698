"""Engines: where expiry keeps its queue, ledger and audit log.

``open_engine`` is the one place that names a concrete engine.
"""

from __future__ import annotations

from ..errors import ConfigError
from .base import Engine
from .kinds import MYSQL, POSTGRES, SUPPORTED, kind_of


def open_engine(
    url: str, *, pool_size: int = 4, read_only: bool = False, pooler: str = "none"
) -> Engine:
    """Open the engine for a database URL: postgresql://..., mysql://... (or
    mariadb://...) or sqlite:///path. ``read_only``: for the commands that only
    read. An SQLite file is then taken as it is (a missing one is refused, not
    created) and refuses writes; a server's sessions are left as they are (a
    session setting would outlive the session behind a transaction pooler):
    there the reads use read_transaction() where it matters. ``pooler``: what
    stands between expiry and PostgreSQL ("none", "session", "transaction":
    kinds.Kind.poolers): the other engines take "none" or "session"."""
    kind = kind_of(url)
    if kind is None:
        raise ConfigError(f"database url {url!r} is not supported: {SUPPORTED}")
    if pooler not in kind.poolers:
        raise ConfigError(
            f"[database] pooler = {pooler!r} is for PostgreSQL behind pgbouncer or the "
            "like: remove it for this database"
        )
    if kind is POSTGRES:
        from .postgres import PostgresEngine

        return PostgresEngine(url, pool_size=pool_size, pooler=pooler)
    if kind is MYSQL:
        try:
            from .mysql import MySQLEngine
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"database url {url!r} needs the MySQL driver: pip install 'expiry[mysql]' ({exc})"
            ) from exc

        return MySQLEngine(url, pool_size=pool_size)
    from .sqlite import SQLiteEngine

    return SQLiteEngine(url, read_only=read_only)


__all__ = ["Engine", "open_engine"]
