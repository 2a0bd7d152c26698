"""A MariaDB Galera cluster of a test's own: three nodes on this machine
(Debian's mariadb-server and galera-4), each with its own data directory in a
temporary folder and its own ports (SQL, group communication, IST, SST), run as
the mysql user, and stopped and removed afterwards. Nothing touches the shared
server on 3306 or its configuration.

    with galera_cluster() as nodes:
        nodes[0].url("drill")   # mysql://root@127.0.0.1:PORT/drill
        nodes[2].kill()         # SIGKILL: a node crashes
        nodes[2].start()        # it rejoins (IST from a donor) and syncs
        nodes[1].launch(); nodes[2].launch()   # two at once: then wait_synced() each

The first node bootstraps the cluster (``--wsrep-new-cluster``); the others
join it and receive its data by rsync (SST). bench/galera.py loads this module
by its path.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pymysql

MARIADBD = Path(os.environ.get("EXPIRY_TEST_MARIADBD", "/usr/sbin/mariadbd"))
PROVIDER = Path(os.environ.get("EXPIRY_TEST_GALERA", "/usr/lib/galera/libgalera_smm.so"))
USER = "mysql"
START_TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_galera() -> None:
    """Fail (never skip) where the cluster cannot be made: .ci/run installs them."""
    missing = [str(p) for p in (MARIADBD, PROVIDER) if not p.exists()]
    if shutil.which("rsync") is None:
        missing.append("rsync (the state transfer)")
    if missing:
        raise AssertionError(
            f"the Galera drill needs {', '.join(missing)}: apt-get install mariadb-server "
            "galera-4 rsync (.ci/run installs them)"
        )


@dataclass
class Node:
    name: str
    home: Path
    port: int
    gcomm: int
    ist: int
    sst: int
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def url(self, database: str = "") -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def write_config(self, peers: list[int], settings: str) -> None:
        members = ",".join(f"127.0.0.1:{p}" for p in peers)
        (self.home / "my.cnf").write_text(
            f"""[mysqld]
datadir={self.home / "data"}
socket={self.home / "mysqld.sock"}
pid-file={self.home / "mysqld.pid"}
log-error={self.home / "error.log"}
port={self.port}
bind-address=127.0.0.1
skip-name-resolve
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
innodb_buffer_pool_size=64M
innodb_log_file_size=32M
innodb_flush_log_at_trx_commit=2
wsrep_on=ON
wsrep_provider={PROVIDER}
wsrep_cluster_name=expiry-test
wsrep_cluster_address=gcomm://{members}
wsrep_node_name={self.name}
wsrep_node_address=127.0.0.1:{self.gcomm}
wsrep_provider_options="base_port={self.gcomm};ist.recv_addr=127.0.0.1:{self.ist};gcache.size=64M"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:{self.sst}
{settings}"""
        )

    def start(self, bootstrap: bool = False) -> None:
        """Start the node and return once it is synced with the cluster."""
        self.launch(bootstrap)
        self.wait_synced()

    def launch(self, bootstrap: bool = False) -> None:
        """Start the node's process and return at once (wait_synced waits)."""
        args = [str(MARIADBD), f"--defaults-file={self.home / 'my.cnf'}", f"--user={USER}"]
        if bootstrap:
            args.append("--wsrep-new-cluster")
        with (self.home / "stdout.log").open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def wait_synced(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(pymysql.err.MySQLError):
                if self.status("wsrep_local_state_comment") == "Synced":
                    return
            time.sleep(0.25)
        raise RuntimeError(f"node {self.name} did not sync in {START_TIMEOUT:g} s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: the node crashes, no shutdown, its connections cut."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def connect(self, database: str | None = None) -> pymysql.connections.Connection:
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            database=database,
            autocommit=True,
            connect_timeout=2,
        )

    def sql(self, statement: str, database: str | None = None) -> list[tuple[object, ...]]:
        conn = self.connect(database)
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
                return list(cur.fetchall())
        finally:
            conn.close()

    def status(self, name: str) -> str:
        rows = self.sql(f"show global status like '{name}'")
        return str(rows[0][1]) if rows else ""

    def log(self, lines: int = 40) -> str:
        path = self.home / "error.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def galera_cluster(size: int = 3, settings: str = "") -> Iterator[list[Node]]:
    """``size`` nodes, all synced; ``settings`` appended to each node's [mysqld]."""
    require_galera()
    root = Path(tempfile.mkdtemp(prefix="expiry-galera-"))
    mysql = pwd.getpwnam(USER)
    nodes = [
        Node(
            f"node{i + 1}",
            root / f"node{i + 1}",
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        )
        for i in range(size)
    ]
    try:
        for node in nodes:
            (node.home / "data").mkdir(parents=True)
            node.write_config([n.gcomm for n in nodes], settings)
        for path in [root, *root.rglob("*")]:
            os.chown(path, mysql.pw_uid, mysql.pw_gid)
        done = subprocess.run(
            [
                "mariadb-install-db",
                f"--defaults-file={nodes[0].home / 'my.cnf'}",
                f"--user={USER}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {done.stdout}{done.stderr}")
        nodes[0].start(bootstrap=True)
        for node in nodes[1:]:
            node.start()
        yield nodes
    finally:
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(root, ignore_errors=True)
