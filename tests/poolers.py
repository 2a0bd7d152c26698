"""A pgbouncer of a test's own (Debian's package, installed by .ci/run), in
front of the shared PostgreSQL on 127.0.0.1:5432, on its own port, in
transaction or session mode, run as the postgres user (pgbouncer refuses
root), and stopped and removed afterwards. The shared server is not touched.

    with pgbouncer("transaction", pool_size=2) as bouncer:
        bouncer.url("expiry_test_1")   # postgresql://postgres@127.0.0.1:PORT/expiry_test_1
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from clusters import _root, free_port

PGBOUNCER = Path(os.environ.get("EXPIRY_TEST_PGBOUNCER", "/usr/sbin/pgbouncer"))


@dataclass
class Bouncer:
    port: int
    mode: str
    log: Path

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def admin(self, command: str) -> list[tuple[object, ...]]:
        """A command on pgbouncer's admin console (SHOW POOLS, SHOW SERVERS)."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True) as conn:
            conn.prepare_threshold = None
            cur = conn.execute(command)
            return list(cur.fetchall())


@contextlib.contextmanager
def pgbouncer(mode: str = "transaction", *, pool_size: int = 4) -> Iterator[Bouncer]:
    """A pgbouncer in ``mode`` with ``pool_size`` server connections per
    database and user, forwarding every database name to 127.0.0.1:5432."""
    assert PGBOUNCER.exists(), f"pgbouncer is required ({PGBOUNCER}): apt-get install pgbouncer"
    root = _root()
    port = free_port()
    users = root / "userlist.txt"
    users.write_text('"postgres" ""\n')
    ini = root / "pgbouncer.ini"
    log = root / "pgbouncer.log"
    ini.write_text(
        "[databases]\n"
        "* = host=127.0.0.1 port=5432\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {users}\n"
        f"pool_mode = {mode}\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 500\n"
        "admin_users = postgres\n"
        f"logfile = {log}\n"
        f"pidfile = {root / 'pgbouncer.pid'}\n"
    )
    command = [str(PGBOUNCER), str(ini)]
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        for path in (users, ini):
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
        command = ["runuser", "-u", "postgres", "--", *command]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bouncer = Bouncer(port, mode, log)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                bouncer.admin("show version")
                break
            except psycopg.Error:
                if proc.poll() is not None or time.monotonic() > deadline:
                    text = log.read_text() if log.exists() else "(no log)"
                    raise RuntimeError(f"pgbouncer did not start: {text}") from None
                time.sleep(0.05)
        yield bouncer
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)
