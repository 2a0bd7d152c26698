"""Drill: expiry behind pgbouncer in transaction mode, as large deployments
and managed PostgreSQL front the database.

A pgbouncer of the test's own (tests/poolers.py, Debian's package) lends two
server connections to every client in turn. expiry runs as deployed, `expiry
trigger` and `expiry worker` processes with ``[database] pooler =
"transaction"``: no prepared statements, no session settings outside a
transaction, polling instead of LISTEN. The database's own default time zone
is Asia/Tokyo, so a server connection that did not carry expiry's UTC would
read the naive UTC deadlines nine hours early and delete live rows; the
oracle is the rows' own offsets, computed apart from any session. After the
run nothing of expiry's is left on the lent server connections (no
lock_timeout, no prepared statement) for the pooler's other clients.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from cleanup._support import cli_env, expiry_cmd
from expiry.app import App
from poolers import pgbouncer

ROWS = 6000
STEP_SECONDS = 6
GAP = 600
"""Rows within 10 minutes of now are left out: the run's cutoff is the
database's now() when it is triggered, a few seconds after the load."""


def load_tokens(url: str) -> tuple[int, set[int]]:
    """ids 1..ROWS with naive UTC deadlines from 5 h ago to 5 h ahead (none
    within GAP of now); returns how many were loaded and the ids that are live
    (deadline ahead)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "create table tokens (id bigint primary key,"
            " expires_at timestamp without time zone not null, note text)"
        )
        offsets = {i: (i - ROWS // 2) * STEP_SECONDS for i in range(1, ROWS + 1)}
        kept = {i: o for i, o in offsets.items() if abs(o) >= GAP}
        with conn.cursor() as cur:
            cur.executemany(
                "insert into tokens values"
                " (%s, (now() at time zone 'UTC') + make_interval(secs => %s), 'token')",
                list(kept.items()),
            )
        conn.execute("create index tokens_expires_at on tokens (expires_at)")
        conn.execute("analyze tokens")
    return len(kept), {i for i, o in kept.items() if o > 0}


def write_config(path: Path, url: str, pooler: str = "transaction") -> Path:
    path.write_text(
        "[database]\n"
        f'url = "{url}"\n'
        f'pooler = "{pooler}"\n'
        "\n[worker]\nconcurrency = 2\n"
        "\n[[policy]]\n"
        'name = "expired-tokens"\n'
        'table = "tokens"\n'
        'key = "id"\n'
        'timestamp = "expires_at"\n'
        "window = 300\n"
        'lock_timeout = "1500ms"\n'
    )
    return path


def expiry(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        expiry_cmd(*args, "--config", str(config)),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, f"expiry {' '.join(args)}: {done.stdout}{done.stderr}"
    for word in ("Traceback", "prepared statement", "DuplicatePreparedStatement"):
        assert word not in done.stderr, done.stderr
    return done


def test_a_run_through_pgbouncer_in_transaction_mode_deletes_exactly_the_expired_rows(
    pg_url: str, tmp_path: Path
) -> None:
    neighbour, servers = clean_through("transaction", pg_url, tmp_path)
    assert neighbour.turns > 10 and neighbour.saw == set(), neighbour.saw
    assert 1 <= servers <= 2  # two server connections, lent in turn


def test_a_run_through_pgbouncer_in_session_mode_needs_nothing_but_its_connections(
    pg_url: str, tmp_path: Path
) -> None:
    """Session mode: each expiry session keeps a server connection of its own
    (pooler = "session" changes nothing), and the pooler resets it before
    another client gets it."""
    neighbour, servers = clean_through("session", pg_url, tmp_path)
    assert neighbour.turns > 10 and neighbour.saw == set(), neighbour.saw
    assert servers >= 3  # expiry's sessions and the neighbour's, each its own


def clean_through(mode: str, pg_url: str, tmp_path: Path) -> tuple[Neighbour, int]:
    """Trigger, work until idle and read the status through a pgbouncer in
    ``mode`` with an application session beside them, on a database whose own
    zone is Asia/Tokyo; check exactly the expired rows went, as the ledger
    books, and that nothing of expiry's is left on the server connections.
    Returns the neighbour and how many server connections the pooler held."""
    dbname = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"alter database \"{dbname}\" set timezone = 'Asia/Tokyo'")
    loaded, live = load_tokens(pg_url)
    # Session mode lends a server connection for a whole session: room for all.
    with pgbouncer(mode, pool_size=2 if mode == "transaction" else 30) as bouncer:
        config = write_config(tmp_path / "expiry.toml", bouncer.url(dbname), pooler=mode)
        with Neighbour(bouncer.url(dbname)) as neighbour:
            expiry("trigger", "expired-tokens", config=config)
            expiry("worker", "--until-idle", config=config)
            servers = len(bouncer.admin("show servers"))
        status = expiry("status", "--json", config=config)
        assert '"state": "finished"' in status.stdout
        leftovers = after_expiry(bouncer.url(dbname))
    with psycopg.connect(pg_url) as conn:
        left = {r[0] for r in conn.execute("select id from tokens")}
        [(booked,)] = conn.execute(
            "select coalesce(sum(rows_affected), 0) from expiry.ledger"
            " where policy = 'expired-tokens'"
        ).fetchall()
    assert left == live, (
        f"{len(live - left)} live rows deleted, {len(left - live)} expired rows left"
    )
    assert booked == loaded - len(live)
    assert leftovers == {"lock_timeout": "0", "statement_timeout": "0", "prepared": 0}
    return neighbour, servers


class Neighbour(threading.Thread):
    """The application on the same pooler during the run: its own session in
    Asia/Tokyo (a SET that pgbouncer carries to whichever server connection it
    lends it, as it carries expiry's UTC), and at every turn a look for what
    expiry could leave on a lent server connection: a lock_timeout or
    statement_timeout, a prepared statement."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.turns = 0
        self.saw: set[str] = set()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True, prepare_threshold=None) as conn:
            conn.execute("set timezone = 'Asia/Tokyo'")
            while not self.stop.wait(0.02):
                row = conn.execute(
                    "select current_setting('lock_timeout'), current_setting('statement_timeout'),"
                    " (select count(*) from pg_prepared_statements)"
                ).fetchone()
                assert row is not None
                if row[0] != "0":
                    self.saw.add(f"lock_timeout {row[0]}")
                if row[1] != "0":
                    self.saw.add(f"statement_timeout {row[1]}")
                if row[2]:
                    self.saw.add("a prepared statement")
                self.turns += 1

    def __enter__(self) -> Neighbour:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(10)


def after_expiry(url: str, lent: int = 2) -> dict[str, Any]:
    """What the pooler's next clients find on the server connections expiry
    used: its settings and prepared statements, read on every lent connection
    at once (each client holds one in a transaction, so that the pooler lends
    the next client another; one after the other, it lends the same one)."""
    seen: dict[str, Any] = {"lock_timeout": "0", "statement_timeout": "0", "prepared": 0}
    conns = [psycopg.connect(url, autocommit=True, prepare_threshold=None) for _ in range(lent)]
    try:
        for conn in conns:
            conn.execute("begin")
        for conn in conns:
            for setting in ("lock_timeout", "statement_timeout"):
                value = conn.execute(f"show {setting}").fetchone()[0]  # type: ignore[index]
                if value != "0":
                    seen[setting] = value
            (n,) = conn.execute("select count(*) from pg_prepared_statements").fetchone()  # type: ignore[misc]
            seen["prepared"] += n
    finally:
        for conn in conns:
            conn.close()
    return seen


def test_queue_jobs_through_pgbouncer_run_once_each(pg_url: str) -> None:
    """Four worker threads and a publisher through two lent server connections:
    every job's transactional effect lands exactly once."""
    dbname = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("create table effects (job text primary key)")
    with pgbouncer("transaction", pool_size=2) as bouncer:
        app = App(bouncer.url(dbname), pooler="transaction")
        try:

            @app.handler("record")
            def record(job: Any, tx: Any) -> None:
                tx.execute("insert into effects values (%s)", (job.key,))

            for n in range(300):
                app.queue.enqueue("record", {"n": n}, key=f"job-{n}", queue="work")
            worker = app.worker(queues=("work",), concurrency=4, poll=0.05, until_idle=True)
            thread = threading.Thread(target=worker.run)
            thread.start()
            thread.join(120)
            assert not thread.is_alive()
        finally:
            app.close()
    with psycopg.connect(pg_url) as conn:
        [(effects,)] = conn.execute("select count(*) from effects").fetchall()
        states = dict(conn.execute("select state, count(*) from expiry.jobs group by 1").fetchall())
    assert effects == 300 and states == {"completed": 300}, (effects, states)


def test_behind_pgbouncer_without_the_setting_nothing_dead_letters_and_the_log_says_the_fix(
    pg_url: str, tmp_path: Path
) -> None:
    """Statements prepared on lent server connections fail (taken by another
    client, or gone): a failure of the set-up, not of the job. The worker says
    the fix (once in its log, or as its last word if it meets the failure while
    starting) and no job is dead-lettered (with the setting, the runs above
    finish)."""
    dbname = pg_url.rsplit("/", 1)[1]
    _, live = load_tokens(pg_url)
    with pgbouncer("transaction", pool_size=2) as bouncer:
        wrong = write_config(tmp_path / "wrong.toml", bouncer.url(dbname), pooler="none")
        expiry("migrate", config=write_config(tmp_path / "right.toml", bouncer.url(dbname)))
        run = subprocess.run(
            expiry_cmd("trigger", "expired-tokens", "--config", str(wrong)),
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        worker = subprocess.Popen(
            expiry_cmd("worker", "--config", str(wrong)),
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(6)
        finally:
            worker.terminate()
            _, err = worker.communicate(timeout=30)
        assert 'set [database] pooler = "transaction"' in err, err[-3000:]
        # Said once by the engine's log, or as the worker's last word when the
        # failure met it before its loop (it exits 1 with the fix, not silently).
        said = [line for line in err.splitlines() if "ERROR expiry.engine" in line]
        assert len(said) <= 1, said
        with psycopg.connect(pg_url) as conn:
            [(dead,)] = conn.execute(
                "select count(*) from expiry.jobs where state = 'dead'"
            ).fetchall()
        assert dead == 0
        assert run.returncode == 0 or "pooler" in run.stderr, run.stderr
    with psycopg.connect(pg_url) as conn:
        left = {r[0] for r in conn.execute("select id from tokens")}
    assert live <= left  # nothing live went meanwhile
