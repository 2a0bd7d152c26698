"""Cleanup on a MariaDB Galera cluster of three nodes: expiry's workers on one
node and on all three, against a hand-written ``DELETE ... LIMIT`` loop on one
node, and what Galera's lack of cross-node row locks costs.

    .venv/bin/python bench/galera.py                     # 300,000 rows, window 5,000, 3 rounds
    .venv/bin/python bench/galera.py --rows 60000 --rounds 1    # the suite's short form

The cluster is the drill's (tests/galera.py: three mariadbd processes with
Debian's galera-4 on their own ports and data directories, on this machine).
Each round builds ``sessions`` (ids 1..N, 80% expired and interleaved, an index
on ``expires_at``) on node 1, lets the cluster settle, and cleans it with one
method; the order of the methods turns each round:

* loop: ``DELETE FROM sessions WHERE expires_at < cutoff LIMIT window``, each
  its own transaction (autocommit) on node 1, until one deletes nothing, as
  pt-archiver's purge and most hand-written cron jobs do;
* one node: an `expiry worker --concurrency 2` on node 1, idle before the clock,
  then `expiry trigger --wait`; the time is the run's span in expiry_runs;
* three nodes: one such worker on each node (its URL naming its node, as a proxy
  that pins each client to one node would), 6 threads in all.

Beside each expiry method: the certification conflicts the cluster counted
(wsrep_local_cert_failures + wsrep_local_bf_aborts over the nodes) and the
claims that lost to another node's and were made again (the workers' log).
Every method must leave exactly the live rows (checked after each).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pymysql

ROOT = Path(__file__).resolve().parents[1]
EXPIRY = str(Path(sys.executable).with_name("expiry"))
POLICY = "expired-sessions"
CONFLICTS = ("wsrep_local_cert_failures", "wsrep_local_bf_aborts")


def load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


galera = load_module("bench_galera_cluster", ROOT / "tests" / "galera.py")


def connect(node: Any) -> pymysql.connections.Connection:
    return pymysql.connect(
        host="127.0.0.1",
        port=node.port,
        user="root",
        database="bench",
        autocommit=True,
        init_command="set session time_zone = '+00:00'",
    )


def build(node: Any, rows: int) -> int:
    conn = connect(node)
    with conn.cursor() as cur:
        cur.execute("drop table if exists sessions")
        cur.execute(
            "create table sessions (id bigint primary key, expires_at datetime(6) not null,"
            " payload varchar(100) not null, key sessions_expires_at (expires_at))"
        )
        # In slices: one write set of a million rows would strain the 2-core cluster.
        for lo in range(0, rows, 50_000):
            cur.execute(
                "insert into sessions select seq,"
                " case when (seq * 2654435761) % 1000 < 800"
                "   then utc_timestamp(6) - interval 1 + seq % 86400 second"
                "   else utc_timestamp(6) + interval 1 day end,"
                " repeat('x', 100)"
                f" from seq_{lo + 1}_to_{min(rows, lo + 50_000)}"
            )
        cur.execute("analyze table sessions")
        cur.fetchall()
        cur.execute("select count(*) from sessions where expires_at < utc_timestamp(6)")
        (expired,) = cur.fetchone()
    conn.close()
    return int(expired)


def settle(nodes: list[Any]) -> None:
    """Until every node has applied what it received."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if all(int(n.status("wsrep_local_recv_queue") or 0) == 0 for n in nodes):
            return
        time.sleep(0.2)


def conflicts(nodes: list[Any]) -> int:
    return sum(int(n.status(c) or 0) for n in nodes for c in CONFLICTS)


def oracle(node: Any, rows: int, expired: int, method: str) -> None:
    conn = connect(node)
    with conn.cursor() as cur:
        cur.execute("select count(*), sum((id * 2654435761) % 1000 < 800) from sessions")
        left, expired_left = cur.fetchone()
    conn.close()
    if int(left) != rows - expired or int(expired_left or 0):
        raise RuntimeError(
            f"{method}: {left} rows left ({expired_left} of them expired), "
            f"expected {rows - expired} live rows"
        )


def loop(node: Any, window: int) -> tuple[float, int]:
    conn = connect(node)
    deleted = 0
    with conn.cursor() as cur:
        cur.execute("select utc_timestamp(6)")
        (cutoff,) = cur.fetchone()
        started = time.perf_counter()
        while True:
            n = cur.execute(
                f"delete from sessions where expires_at < %s limit {int(window)}", (cutoff,)
            )
            deleted += n
            if n == 0:
                break
        seconds = time.perf_counter() - started
    conn.close()
    return seconds, deleted


def write_config(path: Path, node: Any, window: int) -> Path:
    path.write_text(
        f"""[database]
url = "{node.url("bench")}"

[[policy]]
name = "{POLICY}"
table = "sessions"
key = "id"
timestamp = "expires_at"
retain = "0s"
window = {window}
nice_ratio = 0
"""
    )
    return path


def expiry(nodes: list[Any], on: list[Any], window: int, tmp: Path) -> tuple[float, int, int, int]:
    """Workers on the nodes ``on``, the run triggered on node 1: its span, rows,
    certification conflicts, claims made again after a conflict."""
    cfgs = [write_config(tmp / f"{n.name}.toml", n, window) for n in on]
    env = {**os.environ}
    env.pop("EXPIRY_DATABASE_URL", None)
    logs = [tmp / f"worker-{n.name}.log" for n in on]
    workers = []
    before = conflicts(nodes)
    for cfg, log in zip(cfgs, logs, strict=True):
        with log.open("wb") as sink:
            workers.append(
                subprocess.Popen(
                    [EXPIRY, "worker", "--concurrency", "2", "--config", str(cfg)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=sink,
                )
            )
    try:
        conn = connect(nodes[0])
        deadline = time.monotonic() + 60
        with conn.cursor() as cur:
            while time.monotonic() < deadline:
                cur.execute("select count(*) from expiry_workers")
                if cur.fetchone()[0] >= len(on):
                    break
                time.sleep(0.1)
        time.sleep(1.0)  # idle, listening (polling): as deployed
        done = subprocess.run(
            [EXPIRY, "trigger", POLICY, "--wait", "--timeout", "15m", "--config", str(cfgs[0])],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"expiry trigger --wait: {done.stdout} {done.stderr}")
        with conn.cursor() as cur:
            cur.execute(
                "select timestampdiff(microsecond, opened_at, finished_at) / 1e6,"
                " (select coalesce(sum(rows_affected), 0) from expiry_ledger l"
                "  where l.run_id = r.id)"
                " from expiry_runs r where state = 'finished' order by opened_at desc limit 1"
            )
            seconds, rows = cur.fetchone()
        conn.close()
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
    again = sum(log.read_text(errors="replace").count("claim conflicted") for log in logs)
    return float(seconds), int(rows), conflicts(nodes) - before, again


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--window", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        f"galera: 3 nodes on this machine ({os.cpu_count()} cpus), {args.rows:,} rows, "
        f"80% expired, window {args.window:,}, {args.rounds} round(s)",
        flush=True,
    )
    results: dict[str, list[float]] = {"loop": [], "one node": [], "three nodes": []}
    with galera.galera_cluster() as nodes, tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        nodes[0].sql("create database bench")
        subprocess.run(
            [EXPIRY, "migrate", "--config", str(write_config(tmp / "m.toml", nodes[0], 1))],
            check=True,
            capture_output=True,
        )
        methods = list(results)
        for r in range(args.rounds):
            order = methods[r % 3 :] + methods[: r % 3]
            line = []
            for method in order:
                expired = build(nodes[0], args.rows)
                settle(nodes)
                if method == "loop":
                    seconds, rows = loop(nodes[0], args.window)
                    extra = ""
                else:
                    on = nodes[:1] if method == "one node" else nodes
                    seconds, rows, certs, again = expiry(nodes, on, args.window, tmp)
                    extra = f", {certs} certification conflicts, {again} claims made again"
                settle(nodes)
                oracle(nodes[0], args.rows, expired, method)
                if rows != expired:
                    raise RuntimeError(f"{method}: deleted {rows} of {expired}")
                results[method].append(seconds)
                line.append(f"{method} {seconds:.2f} s ({rows / seconds:,.0f} rows/s{extra})")
            print(f"round {r + 1}: " + "; ".join(line), flush=True)
    loop_s = statistics.median(results["loop"])
    for method in ("one node", "three nodes"):
        ratios = [b / a for a, b in zip(results[method], results["loop"], strict=True)]
        print(
            f"{method}: median {statistics.median(ratios):.2f}x the loop's speed "
            f"({', '.join(f'{x:.2f}' for x in ratios)}); median {statistics.median(results[method]):.2f} s "
            f"against {loop_s:.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
