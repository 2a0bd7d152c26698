"""The seam's part for the database's health: the signals the throttle reads
every check (WAL position, replicas, replay lag, active backends, the
application's own sessions at work, a Galera cluster's flow control), and
the most rows a cluster lets one transaction write."""

from __future__ import annotations

import abc
from typing import Any

from ...types import (
    FlowControl,
    Replica,
)
from .primitives import Primitives


class HealthSeam(Primitives):
    """The database's health signals."""

    @abc.abstractmethod
    def health_wal_position(self, conn: Any) -> int | None:
        """The primary's current WAL position in bytes (None: no WAL to speak of,
        or a standby)."""

    @abc.abstractmethod
    def health_replicas(self, conn: Any) -> list[Replica]:
        """The standbys streaming from this primary ([] for none, or SQLite)."""

    @abc.abstractmethod
    def health_replay_lag(self, conn: Any) -> float | None:
        """On a standby: seconds its replay is behind what it received (0 when it
        has replayed all of it; infinite when it is behind but has replayed no
        transaction since it started, to date the lag by); None on a primary or
        SQLite."""

    @abc.abstractmethod
    def health_active_backends(self, conn: Any) -> int | None:
        """Client backends running a statement now, this one aside (None: SQLite)."""

    @abc.abstractmethod
    def health_foreground_sessions(self, conn: Any, within: float) -> int | None:
        """The sessions that are not expiry's and ran a statement in the last
        ``within`` seconds or run one now: the application at work, which a
        policy's nice_ratio rests for (None: the database cannot say, SQLite).
        A sample of the running statements alone would miss most short ones.
        PostgreSQL tells expiry's sessions by their application_name (this
        session's); MySQL by this process's own connections and by statements
        that name expiry's tables (``expiry_*``): another expiry process's idle
        connections count, which only makes it rest as it would under load."""

    @abc.abstractmethod
    def health_flow_control(self, conn: Any) -> FlowControl | None:
        """A Galera node's flow control (MariaDB with wsrep on): the pause so far
        and the write sets waiting to be applied here. None where the database
        is no Galera node (PostgreSQL, SQLite, MySQL without wsrep)."""

    @abc.abstractmethod
    def write_set_limit(self, conn: Any) -> int | None:
        """The most rows one transaction may write (a Galera cluster's
        wsrep_max_ws_rows, where it is set); None: no such limit."""
