"""Drill: a MariaDB Galera cluster of three nodes loses one to SIGKILL mid-run.

The test makes its own cluster (tests/galera.py: three mariadbd processes with
Debian's galera-4 provider, their own data directories and ports). expiry
reaches each node by its own URL, as behind a proxy that pins a client to one
node (MaxScale, HAProxy, ProxySQL):

- workers on one node: two `expiry worker` processes on node 1 while node 3, which
  none of them uses, is killed mid-run; the cluster goes on with two nodes;
- workers on all three: one `expiry worker` a node while node 3, with its worker
  connected, is killed mid-run and restarted a few seconds later (as systemd's
  Restart= would). Its worker is not touched: it reconnects when its node is back;
  meanwhile its leases expire and the other nodes' workers take its windows.

Galera has no cross-node row locks: ``SKIP LOCKED`` skips only the rows this node
holds, and two nodes may claim the same job. The certification at commit lets
one of them win; the other's claim fails with a deadlock error (1213) and is
retried. The drill counts them (the workers' log lines and each node's
wsrep_local_cert_failures and wsrep_local_bf_aborts) and prints them.

After each, every node must hold the same rows (CHECKSUM TABLE) and the
invariants of docs/drills.md hold on each of them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from expiry.engines import open_engine
from expiry.engines.common import OUTAGE_KINDS
from galera import Node, galera_cluster

from ._harness import (
    config,
    connect,
    drill_env,
    job_states,
    load_sessions,
    pending,
    run_done,
    scale,
    trigger,
    wait_until,
    worker_proc,
)
from ._invariants import check, record_expected

ROWS = scale(60_000, 1_000_000)
CONFLICT_COUNTERS = ("wsrep_local_cert_failures", "wsrep_local_bf_aborts")


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[Node]]:
    with galera_cluster() as nodes:
        yield nodes


def prepare(nodes: list[Node], database: str, rows: int = ROWS, note: int = 0) -> list[str]:
    """The database on the cluster, its sessions (each row's note ``note``
    bytes long, if given) and expiry's tables: the URLs of each node's copy."""
    nodes[0].sql(f"create database {database}")
    urls = [node.url(database) for node in nodes]
    load_sessions(urls[0], rows)
    if note:
        nodes[0].sql(f"update sessions set note = repeat('x', {int(note)})", database)
    record_expected(urls[0])
    engine = open_engine(urls[0])
    engine.migrate()
    engine.close()
    return urls


def conflicts(nodes: list[Node]) -> int:
    return sum(int(n.status(c) or 0) for n in nodes if n.alive() for c in CONFLICT_COUNTERS)


def applied(url: str, at_least: int) -> bool:
    with connect(url) as conn:
        row = conn.execute("select count(*) from expiry.ledger").fetchone()
    return bool(row and row[0] >= at_least)


def clean_under(node: Node, url: str, setting: str, reset: str, cfg: Path, tmp_path: Path) -> str:
    """A run on ``url`` cleaned by one worker while ``node`` has the global
    ``setting`` (then ``reset``): the worker's log."""
    node.sql(f"set global {setting}")
    try:
        worker = worker_proc(tmp_path, cfg, 0)
        worker.start()
        try:
            run = trigger(cfg)
            wait_until(lambda: run_done(url, run), 120, "the run", on_timeout=worker.tail)
        finally:
            worker.stop()
    finally:
        node.sql(f"set global {reset}")
    return worker.log_path.read_text(errors="replace")


def most_attempts(url: str) -> int:
    """The most attempts a completed job took."""
    with connect(url) as conn:
        row = conn.execute("select max(attempt) from expiry.jobs where state = 'completed'")
        return int(row.fetchone()[0])


def same_everywhere(nodes: list[Node], database: str) -> None:
    """Every node holds the same rows of the table and of expiry's records."""
    tables = "sessions, expiry_ledger, expiry_jobs, expiry_runs"
    sums = {n.name: n.sql(f"checksum table {tables}", database) for n in nodes}
    first = next(iter(sums.values()))
    assert all(s == first for s in sums.values()), f"the nodes differ: {sums}"


def test_workers_on_one_node_go_on_while_another_node_crashes(
    cluster: list[Node], tmp_path: Path
) -> None:
    urls = prepare(cluster, "drill_one")
    cfg = config(
        tmp_path / "expiry.toml",
        urls[0],
        {"window": 500, "max_rows_per_second": scale(6_000, 40_000)},
        worker={"lease": "3s", "concurrency": 2, "claim_batch": 4},
    )
    workers = [worker_proc(tmp_path, cfg, n) for n in range(2)]
    for proc in workers:
        proc.start()
    before = conflicts(cluster)
    try:
        trigger(cfg)
        wait_until(lambda: applied(urls[0], 10), 60, "windows", on_timeout=workers[0].tail)
        assert pending(urls[0]) > 0, "the run ended before the crash: make it bigger"
        crashed = time.monotonic()
        cluster[2].kill()
        wait_until(
            lambda: pending(urls[0]) == 0,
            scale(120, 1200),
            "every job to finish on the two nodes left",
            every=0.5,
            on_timeout=lambda: f"{job_states(urls[0])}\n{workers[0].tail()}",
        )
        print(f"every job done {time.monotonic() - crashed:.1f}s after node 3 crashed")
        assert all(proc.alive() and proc.starts == 1 for proc in workers)
    finally:
        for proc in workers:
            proc.stop()
    cluster[2].start()  # it rejoins and receives what it missed
    print(f"certification conflicts: {conflicts(cluster) - before} (workers on one node)")
    same_everywhere(cluster, "drill_one")
    for url in urls:
        report = check(url)
        assert set(report.jobs) == {"completed"}


def test_workers_on_every_node_hold_the_invariants_when_one_node_is_killed(
    cluster: list[Node], tmp_path: Path
) -> None:
    urls = prepare(cluster, "drill_all")
    cfgs = [
        config(
            tmp_path / f"expiry-{node.name}.toml",
            url,
            {"window": 500, "max_rows_per_second": scale(2_000, 15_000)},
            worker={"lease": "3s", "concurrency": 2, "claim_batch": 4},
        )
        for node, url in zip(cluster, urls, strict=True)
    ]
    workers = [worker_proc(tmp_path, cfg, n) for n, cfg in enumerate(cfgs)]
    for proc in workers:
        proc.start()
    before = conflicts(cluster)
    try:
        trigger(cfgs[0])
        wait_until(lambda: applied(urls[0], 10), 60, "windows", on_timeout=workers[0].tail)
        assert pending(urls[0]) > 0, "the run ended before the crash: make it bigger"
        crashed = time.monotonic()
        cluster[2].kill()  # its worker loses its connection, its claims their owner
        time.sleep(3)
        cluster[2].start()
        print(f"node 3 synced again {time.monotonic() - crashed:.1f}s after its crash")
        wait_until(
            lambda: pending(urls[0]) == 0,
            scale(180, 1800),
            "every job to finish",
            every=0.5,
            on_timeout=lambda: "\n".join([str(job_states(urls[0]))] + [w.tail() for w in workers]),
        )
        print(f"every job done {time.monotonic() - crashed:.1f}s after node 3 crashed")
        assert all(proc.alive() for proc in workers), "a worker exited instead of reconnecting"
        assert all(proc.starts == 1 for proc in workers)
    finally:
        for proc in workers:
            proc.stop()
    logs = [w.log_path.read_text(errors="replace") for w in workers]
    print(
        f"certification conflicts: {conflicts(cluster) - before} (workers on every node); "
        f"claims conflicted: {sum(log.count('claim conflicted') for log in logs)}"
    )
    # A claim that lost to another node's is claimed again at once, never
    # taken for a database gone away (a warning and a growing back-off).
    backed_off = [line for log in logs for line in log.splitlines() if "claim failed" in line]
    assert not [line for line in backed_off if "1213" in line], backed_off[:3]
    same_everywhere(cluster, "drill_all")
    for url in urls:
        report = check(url)
        assert set(report.jobs) == {"completed"}


def test_a_node_cut_off_from_the_majority_waits_and_the_run_finishes_once_it_heals(
    cluster: list[Node], tmp_path: Path
) -> None:
    """Nodes 2 and 3 are killed mid-run: node 1, alone, is out of the primary
    component and answers every statement with 1047. Its workers wait (claims
    back off; the jobs in hand fail, unrecorded, and their leases expire). Once
    nodes 2 and 3 are back the cluster makes itself whole again (every member of
    the last primary component returned: pc.recovery) and the run finishes. No
    one acts: no worker restarted, no job dead, the invariants on every node."""
    urls = prepare(cluster, "drill_quorum")
    cfg = config(
        tmp_path / "expiry.toml",
        urls[0],
        {"window": 500, "max_rows_per_second": scale(6_000, 40_000)},
        worker={"lease": "3s", "concurrency": 2, "claim_batch": 4},
    )
    worker = worker_proc(tmp_path, cfg, 0)
    worker.start()
    try:
        trigger(cfg)
        wait_until(lambda: applied(urls[0], 10), 60, "windows", on_timeout=worker.tail)
        assert pending(urls[0]) > 0, "the run ended before the crash: make it bigger"
        crashed = time.monotonic()
        cluster[1].kill()
        cluster[2].kill()
        wait_until(
            lambda: cluster[0].status("wsrep_cluster_status") == "non-Primary",
            60,
            "node 1 to leave the primary component",
        )
        time.sleep(3)  # the worker meets the refusals meanwhile
        for node in cluster[1:]:
            node.launch()
        for node in cluster[1:]:
            node.wait_synced()
        print(f"the cluster was whole again {time.monotonic() - crashed:.1f}s after the crash")
        wait_until(
            lambda: pending(urls[0]) == 0,
            scale(180, 1800),
            "every job to finish",
            every=0.5,
            on_timeout=lambda: f"{job_states(urls[0])}\n{worker.tail()}",
        )
        print(f"every job done {time.monotonic() - crashed:.1f}s after the crash")
        assert worker.alive() and worker.starts == 1
    finally:
        worker.stop()
    log = worker.log_path.read_text(errors="replace")
    assert "1047" in log, "the worker never met the cut-off node: make the outage longer"
    same_everywhere(cluster, "drill_quorum")
    for url in urls:
        report = check(url)
        assert set(report.jobs) == {"completed"}, report.jobs


def test_a_node_reports_its_flow_control_and_its_write_set_limit(cluster: list[Node]) -> None:
    """The engine's readings on a Galera node (on the shared servers both are
    None: tests/engines/test_conformance_health.py)."""
    cluster[0].sql("create database if not exists drill_conf")
    engine = open_engine(cluster[0].url("drill_conf"))
    try:
        with engine.transaction() as conn:
            flow = engine.health_flow_control(conn)
            assert engine.write_set_limit(conn) is None  # 0 by default: no limit
        assert flow is not None and flow.paused_ns >= 0 and flow.recv_queue >= 0
        cluster[0].sql("set global wsrep_max_ws_rows = 300")
        try:
            with engine.transaction() as conn:
                assert engine.write_set_limit(conn) == 300
        finally:
            cluster[0].sql("set global wsrep_max_ws_rows = 0")
    finally:
        engine.close()


def test_a_node_out_of_rotation_is_an_outage_not_a_failed_job(cluster: list[Node]) -> None:
    """A node that rejects queries (wsrep_reject_queries, as an operator takes
    it out of rotation; a node cut off from the majority says the same) answers
    1047: the database is out, the job is not at fault (an outage kind spends
    no attempt). Unclassified, it was the job's own transient failure: each
    attempt during the outage spent, then dead."""
    cluster[1].sql("create database if not exists drill_out")
    engine = open_engine(cluster[1].url("drill_out"))
    try:
        cluster[1].sql("set global wsrep_reject_queries = all")
        try:
            with pytest.raises(Exception) as failed:
                with engine.transaction() as conn:
                    conn.execute("select 1 as one").fetchone()
        finally:
            cluster[1].sql("set global wsrep_reject_queries = none")
        assert engine.classify(failed.value) == (True, "node_not_ready"), failed.value
        assert "node_not_ready" in OUTAGE_KINDS
    finally:
        engine.close()


def test_windows_over_the_write_set_limit_are_retried_smaller_and_none_dies(
    cluster: list[Node], tmp_path: Path
) -> None:
    """wsrep_max_ws_rows = 300 on the workers' node, windows of 500 keys (about
    340 rows): the cluster refuses such a transaction (1180); expiry retries it
    halved without spending an attempt, keeps the policy's later windows under
    it, and `expiry check` names the window that fits."""
    urls = prepare(cluster, "drill_ws")
    cfg = config(tmp_path / "expiry.toml", urls[0], {"window": 500})
    cluster[0].sql("set global wsrep_max_ws_rows = 300")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "expiry", "check", "--config", str(cfg)],
            env=drill_env(cfg),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "wsrep_max_ws_rows (300)" in done.stdout + done.stderr, done
        assert "fix: window = 292" in done.stdout + done.stderr, done
    finally:
        cluster[0].sql("set global wsrep_max_ws_rows = 0")
    log = clean_under(
        cluster[0], urls[0], "wsrep_max_ws_rows = 300", "wsrep_max_ws_rows = 0", cfg, tmp_path
    )
    refused = log.count("wsrep_max_ws_rows exceeded")
    print(f"transactions refused over wsrep_max_ws_rows: {refused}")
    assert refused >= 1, "no window was over the limit: make the windows bigger"
    # Once refused, the policy's windows stay under the limit (the pace's
    # ceiling): they do not grow back into it after each fast window.
    assert refused <= 2, f"{refused} transactions refused: the windows grew back past the limit"
    with connect(urls[0]) as conn:
        biggest = conn.execute("select max(rows_affected) from expiry.ledger").fetchone()[0]
    assert biggest <= 300, biggest
    report = check(urls[0])
    assert set(report.jobs) == {"completed"}, report.jobs
    assert most_attempts(urls[0]) == 1, "a refused window spent an attempt"


def test_windows_over_the_write_set_size_are_retried_smaller_and_none_dies(
    cluster: list[Node], tmp_path: Path
) -> None:
    """wsrep_max_ws_size = 512 KiB on the workers' node, rows of 4 KB: windows
    of 500 keys (about 340 rows, 1.4 MB) are over it, as are planning pages of
    500 jobs. The cluster refuses such a transaction (1105); expiry retries it
    halved, no attempt spent, keeps the policy's later windows and pages under
    it, and none dies. (expiry's own transactions, a claim of claim_batch jobs
    or a planning page, write some hundreds of KB: a limit under 1 MB is for
    this drill only.)"""
    urls = prepare(cluster, "drill_wsize", rows=8_000, note=4_000)
    cfg = config(tmp_path / "expiry.toml", urls[0], {"window": 500})
    limit, default = "wsrep_max_ws_size = 524288", "wsrep_max_ws_size = 2147483647"
    log = clean_under(cluster[0], urls[0], limit, default, cfg, tmp_path)
    refusals = [line for line in log.splitlines() if "Maximum writeset size exceeded" in line]
    pages = [line for line in refusals if re.search(r"job=\S+:plan\b", line)]
    windows = len(refusals) - len(pages)
    print(f"over wsrep_max_ws_size: {len(pages)} planning pages, {windows} windows refused")
    assert windows >= 1, "no window was over the limit: make them bigger"
    # Halved until it fits, and the later pages and windows start there: the
    # refusals are the first few windows' (each halved a few times until it
    # fits), never one a window.
    refused = {m.group(1) for line in refusals if (m := re.search(r"job=(\S+)", line))}
    assert len(pages) <= 6, f"{len(pages)} pages refused: later pages started too big again"
    assert len(refused) - 1 <= 8, f"{sorted(refused)} refused: later windows started too big"
    attempts = most_attempts(urls[0])
    report = check(urls[0])
    assert set(report.jobs) == {"completed"}, report.jobs
    assert attempts == 1, "a refused window spent an attempt"


def test_planning_pages_over_the_write_set_limit_are_halved_and_the_rest_start_there(
    cluster: list[Node], tmp_path: Path
) -> None:
    """wsrep_max_ws_rows = 200 and windows of 100 keys (about 70 rows, which
    fit): a planning page of 500 window jobs writes 500 rows and is refused.
    The page is retried halved until it fits (500, 250, 125), no attempt spent,
    and the run's later pages start at that size."""
    urls = prepare(cluster, "drill_pages")
    cfg = config(tmp_path / "expiry.toml", urls[0], {"window": 100})
    log = clean_under(
        cluster[0], urls[0], "wsrep_max_ws_rows = 200", "wsrep_max_ws_rows = 0", cfg, tmp_path
    )
    refusals = [line for line in log.splitlines() if "wsrep_max_ws_rows exceeded" in line]
    pages = [line for line in refusals if re.search(r"job=\S+:plan\b", line)]
    print(f"over wsrep_max_ws_rows: {len(pages)} planning pages of {len(refusals)} refusals")
    assert len(pages) == 2, pages  # 500 and 250 refused; 125 fits, and so do the rest
    report = check(urls[0])
    assert set(report.jobs) == {"completed"}, report.jobs
    attempts = most_attempts(urls[0])
    assert attempts == 1, "a refused page spent an attempt"


def test_flow_control_holds_the_policy_until_the_cluster_catches_up(
    cluster: list[Node], tmp_path: Path
) -> None:
    """A node that stops applying (FLUSH TABLES sessions WITH READ LOCK on node
    3: a global FTWRL would desync the node instead) fills its receive queue,
    and flow control pauses the cluster. The
    worker on node 1, with max_flow_control = 0.2, holds the policy on its
    next reading, and goes on once node 3 catches up."""
    urls = prepare(cluster, "drill_fc")
    cfg = config(
        tmp_path / "expiry.toml",
        urls[0],
        {"window": 200, "max_flow_control": 0.2, "max_rows_per_second": 4_000},
        worker={"health_interval": "200ms"},
    )
    worker = worker_proc(tmp_path, cfg, 0)
    worker.start()
    locker = cluster[2].connect("drill_fc")
    try:
        run = trigger(cfg)
        wait_until(lambda: applied(urls[0], 5), 60, "windows", on_timeout=worker.tail)
        with locker.cursor() as cur:
            cur.execute("flush tables sessions with read lock")
        held = wait_until(
            lambda: "policy held: flow_control" in worker.log_path.read_text(errors="replace"),
            60,
            "the policy to be held for flow control",
            on_timeout=worker.tail,
        )
        assert held
        assert pending(urls[0]) > 0, "the run ended before flow control: make it bigger"
        with locker.cursor() as cur:
            cur.execute("unlock tables")
        wait_until(lambda: run_done(urls[0], run), 120, "the run", on_timeout=worker.tail)
    finally:
        locker.close()
        worker.stop()
    log = worker.log_path.read_text(errors="replace")
    assert "policy unheld" in log, worker.tail()
    report = check(urls[0])
    assert set(report.jobs) == {"completed"}, report.jobs
