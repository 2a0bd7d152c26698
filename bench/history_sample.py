"""What the per-minute history costs: one History.sample() (every policy's
backlog, retries, dead letters, oldest expired row's age and throttle hold,
health/history.py), next to the queue's aggregate it reads (job_stats, the
same one /metrics and `expiry status` read) and to another process's try in
the same minute, which finds the minute sampled and does nothing more.

    .venv/bin/python bench/history_sample.py                 # 5 policies, 500,000 jobs
    .venv/bin/python bench/history_sample.py --policies 20 --jobs 2000000 --rounds 5

A scratch database on the shared PostgreSQL (dropped at the end): each policy
a table of 200,000 rows with an index on its timestamp, and ``--jobs``
finished jobs spread over the policies' queues (what a week of pruning keeps).
Once a minute one process pays the first figure; every other worker, the
scheduler and each overview shown pay the last.
"""

from __future__ import annotations

import argparse
import os
import time

import psycopg

from expiry.app import App
from expiry.config import parse_config
from scratch import scratch_database

ADMIN = os.environ.get("EXPIRY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", type=int, default=5)
    parser.add_argument("--rows", type=int, default=200_000, help="rows a policy's table")
    parser.add_argument("--jobs", type=int, default=500_000, help="finished jobs")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with scratch_database(ADMIN, "expiry_bench_history") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            for i in range(args.policies):
                conn.execute(f"create table t{i} (id bigint primary key, ts timestamptz not null)")
                conn.execute(
                    f"insert into t{i} select g, now() - make_interval(secs => g)"
                    " from generate_series(1, %s::int) g",
                    (args.rows,),
                )
                conn.execute(f"create index on t{i} (ts)")
        policies = [
            {"name": f"p{i}", "table": f"t{i}", "key": "id", "timestamp": "ts"}
            for i in range(args.policies)
        ]
        app = App(config=parse_config({"database": {"url": url}, "policy": policies}))
        app.migrate()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "insert into expiry.jobs (queue, handler, key, payload, state, run_at,"
                " finished_at, max_attempts) select 'expiry.policy.p' || (g %% %s),"
                " 'expiry.cleanup_window', 'k' || g, '{}', 'completed', now(), now(), 5"
                " from generate_series(1, %s::int) g",
                (args.policies, args.jobs),
            )
            conn.execute("analyze")
        history = app.history
        assert history is not None
        print(f"{args.policies} policies of {args.rows:,} rows, {args.jobs:,} finished jobs")
        for n in range(1, args.rounds + 1):
            app.engine.sample_prune(0)
            history._sampled = None
            began = time.perf_counter()
            kept = history.sample()
            first = time.perf_counter() - began
            began = time.perf_counter()
            app.engine.job_stats()
            stats = time.perf_counter() - began
            other = type(history)(app.engine, history.cleanup, history.keep_seconds)
            began = time.perf_counter()
            again = other.sample()
            late = time.perf_counter() - began
            print(
                f"round {n}: the minute's sample {first * 1000:.1f} ms ({kept} kept); "
                f"job_stats alone {stats * 1000:.1f} ms; "
                f"another process's try {late * 1000:.2f} ms ({again} kept)"
            )
        app.close()


if __name__ == "__main__":
    main()
