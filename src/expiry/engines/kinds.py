"""What each kind of database is and can do, known before any driver is
imported: its URL schemes, whether it is embedded (the application's own file),
whether it has the health signals the throttle reads (replicas, backends,
vacuum), what may stand between expiry and it (poolers), and whether it can
be a replica that max_replica_lag reads. The config, the App and open_engine
ask here rather than reading a URL's scheme themselves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    dialect: str
    schemes: tuple[str, ...]
    example: str
    """A URL of this kind, as the error messages show it."""
    embedded: bool = False
    """The application's own file: expiry migrates it on first use (unless read-only)."""
    health_signals: bool = True
    """It has replicas, client backends and vacuum statistics to read."""
    poolers: tuple[str, ...] = ("none", "session")
    """What may stand between expiry and the database ([database] pooler):
    nothing, a pooler in session mode (a session keeps its server connection:
    nothing changes), or, for PostgreSQL, one in transaction mode (each
    transaction may get another server connection: no prepared statements, no
    session settings, no LISTEN)."""
    replica: bool = True
    """A replica of it can be a [[replica]] whose lag max_replica_lag reads."""
    galera: bool = False
    """It can be a node of a Galera cluster (MariaDB): max_flow_control and
    max_recv_queue read its wsrep status."""


POSTGRES = Kind(
    "postgres",
    ("postgresql://", "postgres://"),
    "postgresql://host/db",
    poolers=("none", "session", "transaction"),
)
MYSQL = Kind("mysql", ("mysql://", "mariadb://"), "mysql://user@host/db", galera=True)
SQLITE = Kind(
    "sqlite",
    ("sqlite:///",),
    "sqlite:///path/to/file.db",
    embedded=True,
    health_signals=False,
    replica=False,
)
KINDS = (POSTGRES, MYSQL, SQLITE)

SUPPORTED = "use " + ", ".join(k.example for k in KINDS[:-1]) + f" or {KINDS[-1].example}"
"""What a URL of no known kind is told."""


def kind_of(url: str) -> Kind | None:
    """The kind of database ``url`` names (None: none expiry knows)."""
    return next((k for k in KINDS if url.startswith(k.schemes)), None)
