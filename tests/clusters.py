"""PostgreSQL clusters of a test's own: one server (``private_cluster``), or a
primary and a streaming hot standby (``primary_and_standby``), made with initdb
and pg_basebackup in temporary folders, on their own ports, run as the postgres
user, and stopped and removed afterwards. Nothing touches the shared server on
5432 or its configuration.

    with private_cluster() as cluster:
        ...  # cluster.url; cluster.restart("fast") or cluster.restart("immediate")
    with primary_and_standby() as (primary, standby):
        ...  # primary.url, standby.url; standby.pause_replay(), resume_replay()

bench/chaos.py loads this module by its path for its own server.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

BIN = Path(os.environ.get("EXPIRY_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_postgres(*command: str | Path) -> subprocess.CompletedProcess[str]:
    """Run a server binary as the postgres user (initdb refuses root)."""
    args = [str(c) for c in command]
    if os.geteuid() == 0:
        args = ["runuser", "-u", USER, "--", *args]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done


@dataclass
class Cluster:
    data: Path
    port: int
    sockets: Path

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self._pg_ctl("start")

    def restart(self, mode: str) -> None:
        """``pg_ctl restart -m MODE``: "fast" (sessions ended cleanly, a checkpoint)
        or "immediate" (no checkpoint: crash recovery at start). Returns once the
        server accepts connections again."""
        self._pg_ctl("restart", "-m", mode)

    def _pg_ctl(self, *action: str) -> None:
        as_postgres(
            BIN / "pg_ctl",
            "-D",
            self.data,
            "-l",
            self.data / "server.log",
            "-o",
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1",
            "-w",
            *action,
        )

    def promote(self) -> None:
        """A standby becomes a primary (``pg_ctl promote``); returns once it
        accepts writes."""
        as_postgres(BIN / "pg_ctl", "-D", self.data, "-w", "promote")

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):
            as_postgres(BIN / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def sql(self, statement: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(statement)
            return list(cur.fetchall()) if cur.description else []

    def pause_replay(self) -> None:
        self.sql("select pg_wal_replay_pause()")

    def resume_replay(self) -> None:
        self.sql("select pg_wal_replay_resume()")

    def wait_caught_up(self, primary: Cluster, timeout: float = 30.0) -> None:
        """Until the standby has replayed everything the primary has written."""
        [(target,)] = primary.sql("select pg_current_wal_lsn()::text")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            [(done,)] = self.sql(f"select pg_last_wal_replay_lsn() >= '{target}'::pg_lsn")
            if done:
                return
            time.sleep(0.05)
        raise TimeoutError("the standby did not catch up")


def _root() -> Path:
    """A temporary folder the postgres user owns (data directories and sockets)."""
    root = Path(tempfile.mkdtemp(prefix="expiry-clusters-"))
    postgres = pwd.getpwnam(USER)
    os.chown(root, postgres.pw_uid, postgres.pw_gid)
    return root


def _initdb(cluster: Cluster) -> None:
    as_postgres(BIN / "initdb", "-D", cluster.data, "-U", USER, "-A", "trust", "--no-sync")


@contextlib.contextmanager
def private_cluster(settings: str = "fsync = off\n") -> Iterator[Cluster]:
    """One server of the caller's own, ``settings`` appended to its postgresql.conf."""
    root = _root()
    cluster = Cluster(root / "data", free_port(), root)
    try:
        _initdb(cluster)
        with (cluster.data / "postgresql.conf").open("a") as conf:
            conf.write(settings)
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def primary_and_standby() -> Iterator[tuple[Cluster, Cluster]]:
    root = _root()
    made: list[Cluster] = []
    try:
        primary = Cluster(root / "primary", free_port(), root)
        _initdb(primary)
        with (primary.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "wal_level = replica\nmax_wal_senders = 4\nhot_standby = on\n"
                "fsync = off\nhot_standby_feedback = on\n"
                # the standby reports its replay position every second, not every 10 s
                "wal_receiver_status_interval = 1s\n"
            )
        with (primary.data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        primary.start()
        made.append(primary)
        standby = Cluster(root / "standby", free_port(), root)
        as_postgres(
            BIN / "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            USER,
            "-D",
            standby.data,
            "-R",
            "-X",
            "stream",
            "--no-sync",
        )
        standby.start()
        made.append(standby)
        yield primary, standby
    finally:
        for cluster in reversed(made):
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
