"""Rows held by another transaction: how long a run takes around them.

    .venv/bin/python bench/held_rows.py                  # 40,000 rows, 5 held, 3 rounds
    .venv/bin/python bench/held_rows.py --held 1 --pick random --rounds 1
    .venv/bin/python bench/held_rows.py --code /tmp/old   # a worktree of an older commit

An application session updates a few expired rows and stays idle in transaction
(the chaos soak's ``idle-tx`` fault) while a run of the policy is triggered,
measured as a user deploys it: an idle ``expiry worker --concurrency 2``
(listening), then ``expiry trigger --wait``; the time is the run's own span in
``expiry.runs`` (opened_at to finished_at). Beside it, in the same round, on an
identical table, the best hand-written alternative: a primary-key-window loop
whose DELETE takes only the rows it can lock at once (``where id in (select id
... for update skip locked)``), so it never waits on a held row.

It prints, a round each: the run's span, the rows it deleted, the rows it kept
as blocked (the ledger's ``blocked``), and the loop's span; the held rows must
survive both (they are expired: a later run takes them once they are free).
A scratch database on the shared server (dropped at the end); window 1,000,
``lock_timeout = "2s"`` as in the chaos soak.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from scratch import scratch_database

ROOT = Path(__file__).resolve().parents[1]
EXPIRY = str(ROOT / ".venv" / "bin" / "expiry")
ADMIN = os.environ.get("EXPIRY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

TABLE = """
create table {name} (
    id bigint primary key,
    expires_at timestamptz not null,
    note text not null default ''
);
insert into {name} (id, expires_at)
select g, case when g %% 5 = 0 then now() + interval '30 days'
               else now() - interval '1 hour' + g * interval '1 millisecond' end
from generate_series(1, %(rows)s) as g;
analyze {name};
"""

LOOP = """
delete from {name} where id in (
    select id from {name}
    where id > %(lo)s and id <= %(hi)s and expires_at < %(cutoff)s
    for update skip locked)
"""


def config(path: Path, url: str, lock_timeout: float) -> Path:
    path.write_text(
        f"""[database]
url = "{url}"

[[policy]]
name = "held"
table = "sessions"
key = "id"
timestamp = "expires_at"
retain = "0s"
window = 1000
nice_ratio = 0
lock_timeout = "{lock_timeout:g}s"
"""
    )
    return path


def make(conn: psycopg.Connection, table: str, rows: int) -> None:
    for statement in TABLE.format(name=table).split(";"):
        if statement.strip():
            conn.execute(statement, {"rows": rows} if "%(rows)s" in statement else None)


def pick(conn: psycopg.Connection, table: str, how: str, n: int, seed: int) -> list[int]:
    expired = [r[0] for r in conn.execute(f"select id from {table} where expires_at < now()")]
    if how == "newest":
        return sorted(expired)[-n:]
    return sorted(random.Random(seed).sample(expired, n))


def hold(url: str, table: str, ids: list[int]) -> psycopg.Connection:
    conn = psycopg.connect(url)
    conn.execute(f"update {table} set note = note where id = any(%s)", (ids,))
    return conn  # idle in transaction until closed


def expiry_round(
    url: str, cfg: Path, args: argparse.Namespace, seed: int
) -> tuple[float, int, int]:
    env = {**os.environ, "EXPIRY_CONFIG": str(cfg)}
    if args.code:  # another checkout's code, e.g. a git worktree of an earlier commit
        env["PYTHONPATH"] = str(Path(args.code).resolve() / "src")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("drop table if exists sessions")
        make(conn, "sessions", args.rows)
        ids = pick(conn, "sessions", args.pick, args.held, seed)
    subprocess.run([EXPIRY, "migrate"], env=env, check=True, capture_output=True)
    worker = subprocess.Popen(
        [EXPIRY, "worker", "--concurrency", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    holder = hold(url, "sessions", ids)
    try:
        time.sleep(2.0)  # the worker is up and listening
        done = subprocess.run(
            [EXPIRY, "trigger", "held", "--wait", "--timeout", "15m"], env=env, capture_output=True
        )
        if done.returncode != 0:
            print(done.stdout.decode(), done.stderr.decode(), file=sys.stderr)
    finally:
        holder.close()
        worker.terminate()
        worker.wait(60)
    with psycopg.connect(url, autocommit=True) as conn:
        span, taken = conn.execute(
            "select extract(epoch from r.finished_at - r.opened_at),"
            " (select sum(rows_affected) from expiry.ledger l where l.run_id = r.id)"
            " from expiry.runs r order by r.opened_at desc limit 1"
        ).fetchone()
        blocked = conn.execute(
            "select count(*) from expiry.ledger where blocked is not null"
            " and run_id = (select id from expiry.runs order by opened_at desc limit 1)"
        ).fetchone()[0]
        kept = conn.execute("select count(*) from sessions where id = any(%s)", (ids,)).fetchone()
        assert kept[0] == len(ids), f"a held row was deleted: {kept[0]} of {len(ids)} left"
    return float(span), int(taken or 0), int(blocked)


def loop_round(url: str, args: argparse.Namespace, seed: int) -> tuple[float, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("drop table if exists loop_sessions")
        make(conn, "loop_sessions", args.rows)
        ids = pick(conn, "loop_sessions", args.pick, args.held, seed)
    holder = hold(url, "loop_sessions", ids)
    taken = 0
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"set lock_timeout = '{args.lock_timeout:g}s'")
            cutoff = conn.execute("select now()").fetchone()[0]
            started = time.monotonic()
            for lo in range(0, args.rows, 1000):
                cur = conn.execute(
                    LOOP.format(name="loop_sessions"), {"lo": lo, "hi": lo + 1000, "cutoff": cutoff}
                )
                taken += cur.rowcount
            span = time.monotonic() - started
    finally:
        holder.close()
    return span, taken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--held", type=int, default=5, help="rows held idle in transaction")
    parser.add_argument("--pick", choices=("newest", "random"), default="newest")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lock-timeout", type=float, default=2.0)
    parser.add_argument("--code", help="run expiry from this checkout (its src/) instead")
    args = parser.parse_args()
    with scratch_database(ADMIN, "expiry_bench_held") as url, tempfile.TemporaryDirectory() as tmp:
        cfg = config(Path(tmp) / "expiry.toml", url, args.lock_timeout)
        print(
            f"{args.rows:,} rows, {args.held} held ({args.pick}), window 1,000, "
            f"lock_timeout {args.lock_timeout:g}s, worker --concurrency 2",
            flush=True,
        )
        for n in range(args.rounds):
            first_loop = n % 2 == 1
            if first_loop:
                loop = loop_round(url, args, n)
            span, taken, blocked = expiry_round(url, cfg, args, n)
            if not first_loop:
                loop = loop_round(url, args, n)
            print(
                f"round {n + 1}: expiry run {span:6.2f} s ({taken:,} rows, {blocked} kept as"
                f" blocked); skip-locked loop {loop[0]:5.2f} s ({loop[1]:,} rows)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
