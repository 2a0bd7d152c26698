"""Rows a RESTRICT foreign key refuses to let go: what two runs cost around them.

    .venv/bin/python bench/referenced_rows.py                  # 20,000 rows, 1,000 referenced
    .venv/bin/python bench/referenced_rows.py --rows 10000 --referenced 300 --rounds 1
    .venv/bin/python bench/referenced_rows.py --code /tmp/old  # a worktree of an older commit

``sessions`` (80% expired, interleaved) is referenced by ``orders`` through
``session_id ... references sessions (id) on delete restrict`` (indexed), one
order for each of ``--referenced`` expired sessions spread evenly over the keys.
A policy on ``sessions`` is run as a user deploys it: ``expiry migrate``, an
idle ``expiry worker --concurrency 2`` (listening), then ``expiry trigger
--wait`` twice, the second after the first finished (a later run meets the same
referenced rows again). For each run it prints the run's own span in
``expiry.runs`` (opened_at to finished_at), the jobs the run had, the rows its
ledger booked as deleted and as kept (``rows_kept``, or on code without that
column the ledger rows ``blocked`` names). Beside it, in the same round, on an
identical table pair, the hand-written alternative: a primary-key-window loop
whose DELETE leaves out the referenced rows (``and not exists (select 1 from
orders2 r where r.session_id = t.id)``).

After each run and after the loop the oracle is checked, and a failure stops
the bench: exactly the unreferenced expired rows are gone, the referenced and
the live ones remain, and the ledger booked exactly the rows that went (the
first run all of them, the second none). A scratch database on the shared
server (dropped at the end); window 1,000, nice_ratio 0, 3 rounds.
"""

from __future__ import annotations

import argparse
import os
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
WINDOW = 1000

TABLE = """
create table {name} (
    id bigint primary key,
    expires_at timestamptz not null,
    note text
);
insert into {name} (id, expires_at)
select g, case when g %% 5 = 0 then now() + interval '30 days'
               else now() - interval '1 hour' + g * interval '1 millisecond' end
from generate_series(1, %(rows)s) as g;
create table {refs} (
    id bigint primary key,
    session_id bigint not null references {name} (id) on delete restrict
);
create index on {refs} (session_id);
insert into {refs} (id, session_id)
select n, s from unnest(%(referenced)s::bigint[]) with ordinality as u (s, n);
analyze {name};
analyze {refs};
"""

LOOP = """
delete from {name} t
where id > %(lo)s and id <= %(hi)s and expires_at < %(cutoff)s
  and not exists (select 1 from {refs} r where r.session_id = t.id)
"""

RUN = """
select r.id, extract(epoch from r.finished_at - r.opened_at),
       (select count(*) from expiry.jobs j where j.run_id = r.id),
       (select coalesce(sum(l.rows_affected), 0) from expiry.ledger l where l.run_id = r.id),
       (select {kept} from expiry.ledger l where l.run_id = r.id)
from expiry.runs r where r.id = %s
"""


def config(path: Path, url: str) -> Path:
    path.write_text(
        f"""[database]
url = "{url}"

[[policy]]
name = "referenced"
table = "sessions"
key = "id"
timestamp = "expires_at"
retain = "0s"
window = {WINDOW}
nice_ratio = 0
"""
    )
    return path


def referenced_ids(rows: int, n: int) -> list[int]:
    """``n`` expired keys spread evenly over the table (every fifth key is live)."""
    expired = [g for g in range(1, rows + 1) if g % 5 != 0]
    if n > len(expired):
        raise SystemExit(f"--referenced {n} is more than the {len(expired):,} expired rows")
    step = len(expired) / n if n else 0
    return [expired[int(i * step)] for i in range(n)]


def make(conn: psycopg.Connection, table: str, refs: str, rows: int, ids: list[int]) -> None:
    conn.execute(f"drop table if exists {refs}")
    conn.execute(f"drop table if exists {table}")
    params = {"rows": rows, "referenced": ids}
    for statement in TABLE.format(name=table, refs=refs).split(";"):
        if statement.strip():
            used = {k: v for k, v in params.items() if f"%({k})s" in statement}
            conn.execute(statement, used or None)


def oracle(conn: psycopg.Connection, table: str, rows: int, ids: list[int]) -> str:
    """Exactly the unreferenced expired rows are gone; fails loudly otherwise."""
    left = {r[0] for r in conn.execute(f"select id from {table}")}
    live = {g for g in range(1, rows + 1) if g % 5 == 0}
    want = live | set(ids)
    if left != want:
        gone = sorted(want - left)
        extra = sorted(left - want)
        raise SystemExit(
            f"ORACLE FAILED on {table}: {len(left):,} rows left, {len(want):,} expected;"
            f" {len(gone):,} live or referenced rows gone (first {gone[:5]}),"
            f" {len(extra):,} unreferenced expired rows left (first {extra[:5]})"
        )
    return f"oracle ok ({len(live):,} live + {len(ids):,} referenced left)"


def kept_expression(conn: psycopg.Connection) -> str:
    """The ledger's count of kept rows: ``rows_kept`` where the code has it,
    else its rows that name a block (the code before kept one row a block)."""
    has = conn.execute(
        "select 1 from information_schema.columns where table_schema = 'expiry'"
        " and table_name = 'ledger' and column_name = 'rows_kept'"
    ).fetchone()
    return (
        "coalesce(sum(l.rows_kept), 0)" if has else "count(*) filter (where l.blocked is not null)"
    )


def trigger(env: dict[str, str], timeout: str) -> None:
    done = subprocess.run(
        [EXPIRY, "trigger", "referenced", "--wait", "--timeout", timeout],
        env=env,
        capture_output=True,
    )
    if done.returncode != 0:
        print(done.stdout.decode(), done.stderr.decode(), file=sys.stderr)


def last_run(conn: psycopg.Connection) -> str:
    row = conn.execute("select id from expiry.runs order by opened_at desc limit 1").fetchone()
    if row is None:
        raise SystemExit("no run was opened")
    return str(row[0])


def measure(
    conn: psycopg.Connection, run_id: str, args: argparse.Namespace, ids: list[int], before: int
) -> tuple[float, int, int, int, str]:
    """A finished run's figures, and the oracle on the table it left; ``before``
    the rows earlier runs of the round booked as deleted."""
    query = RUN.format(kept=kept_expression(conn))
    row = conn.execute(query, (run_id,)).fetchone()
    if row is None:
        raise SystemExit(f"no run {run_id}")
    _, span, jobs, deleted, kept = row
    if span is None:
        raise SystemExit(f"run {run_id} did not finish (--timeout {args.timeout})")
    verdict = oracle(conn, "sessions", args.rows, ids)
    expected = args.rows - args.rows // 5 - len(ids)
    if before + deleted != expected:
        raise SystemExit(
            f"ORACLE FAILED: the ledger booked {before + deleted:,} rows deleted, {expected:,} went"
        )
    return float(span), int(jobs), int(deleted), int(kept), verdict


def expiry_round(
    url: str, cfg: Path, args: argparse.Namespace, ids: list[int]
) -> list[tuple[float, int, int, int, str]]:
    env = {**os.environ, "EXPIRY_CONFIG": str(cfg)}
    if args.code:  # another checkout's code, e.g. a git worktree of an earlier commit
        env["PYTHONPATH"] = str(Path(args.code).resolve() / "src")
    with psycopg.connect(url, autocommit=True) as conn:
        make(conn, "sessions", "orders", args.rows, ids)
    subprocess.run([EXPIRY, "migrate"], env=env, check=True, capture_output=True)
    worker = subprocess.Popen(
        [EXPIRY, "worker", "--concurrency", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runs: list[str] = []
    figures: list[tuple[float, int, int, int, str]] = []
    try:
        time.sleep(2.0)  # the worker is up and listening
        with psycopg.connect(url, autocommit=True) as conn:
            for n in range(2):
                if n:
                    time.sleep(1.1)  # run ids count whole seconds: a second later, a new run
                trigger(env, args.timeout)
                runs.append(last_run(conn))
                if n and runs[0] == runs[1]:
                    raise SystemExit(f"the second trigger opened no new run ({runs[0]})")
                figures.append(measure(conn, runs[-1], args, ids, sum(f[2] for f in figures)))
    finally:
        worker.terminate()
        worker.wait(60)
    return figures


def loop_round(url: str, args: argparse.Namespace, ids: list[int]) -> tuple[float, int, str]:
    taken = 0
    with psycopg.connect(url, autocommit=True) as conn:
        make(conn, "sessions2", "orders2", args.rows, ids)
        cutoff = conn.execute("select now()").fetchall()[0][0]
        statement = LOOP.format(name="sessions2", refs="orders2")
        started = time.monotonic()
        for lo in range(0, args.rows, WINDOW):
            cur = conn.execute(statement, {"lo": lo, "hi": lo + WINDOW, "cutoff": cutoff})
            taken += cur.rowcount
        span = time.monotonic() - started
        verdict = oracle(conn, "sessions2", args.rows, ids)
    return span, taken, verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument(
        "--referenced", type=int, default=1_000, help="expired rows orders reference"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", default="30m", help="each trigger --wait's timeout")
    parser.add_argument("--code", help="run expiry from this checkout (its src/) instead")
    args = parser.parse_args()
    ids = referenced_ids(args.rows, args.referenced)
    with (
        scratch_database(ADMIN, "expiry_bench_referenced") as url,
        tempfile.TemporaryDirectory() as tmp,
    ):
        cfg = config(Path(tmp) / "expiry.toml", url)
        expired = args.rows - args.rows // 5
        print(
            f"{args.rows:,} rows ({expired:,} expired), {len(ids):,} of them referenced by orders"
            f" (on delete restrict, indexed), window {WINDOW:,}, nice_ratio 0,"
            f" worker --concurrency 2; code: {args.code or ROOT}",
            flush=True,
        )
        print(
            f"{'round':<6}{'what':<18}{'span s':>9}{'jobs':>8}{'deleted':>10}{'kept':>8}  oracle",
            flush=True,
        )
        for n in range(args.rounds):
            first_loop = n % 2 == 1
            if first_loop:
                loop = loop_round(url, args, ids)
            runs = expiry_round(url, cfg, args, ids)
            if not first_loop:
                loop = loop_round(url, args, ids)
            for i, (span, jobs, deleted, kept, verdict) in enumerate(runs):
                print(
                    f"{n + 1 if i == 0 else '':<6}{f'expiry run {i + 1}':<18}{span:9.2f}"
                    f"{jobs:8,}{deleted:10,}{kept:8,}  {verdict}",
                    flush=True,
                )
            span, taken, verdict = loop
            print(
                f"{'':<6}{'not-exists loop':<18}{span:9.2f}{'':>8}{taken:10,}{'':>8}  {verdict}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
