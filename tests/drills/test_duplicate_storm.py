"""Drill 7: every window delivered twice, concurrently.

After planning, each window job is claimed by worker A, forced back to
available by SQL (as a broker that redelivers an unacknowledged message would),
and claimed again by worker B: two workers now hold it. Both deliveries run
through the real worker code (Worker.process) at the same moment, each worker
with its own App and connection pool. The effect happens once, there is one
ledger row per key, and every second delivery leaves an audit record.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cleanup._support import drain
from expiry.app import App
from expiry.cleanup.runs import WINDOW
from expiry.queue.worker import Worker
from expiry.types import Job

from ._harness import connect, dialect, load_sessions, plan_only, scale
from ._invariants import check, record_expected

ROWS = scale(20_000, 1_000_000)
WINDOW_KEYS = 500


def claim_all(app: App, owner: str) -> dict[str, Job]:
    jobs: dict[str, Job] = {}
    while batch := app.queue.claim(500, 300, owner=owner, queues=app.worked_queues(), limits={}):
        jobs.update({job.key: job for job in batch})
    return jobs


def test_every_window_delivered_twice_concurrently_applies_once(
    server_url: str, apps: Callable[..., App]
) -> None:
    pg_url = server_url  # PostgreSQL, then MariaDB
    mysql = dialect(pg_url) == "mysql"
    load_sessions(pg_url, ROWS)
    record_expected(pg_url)
    policy = {"window": WINDOW_KEYS}
    app_a, app_b = apps(pg_url, policy), apps(pg_url, policy)
    assert app_a.cleanup is not None
    opened = app_a.cleanup.open_run("expired-sessions")
    worker_a = app_a.worker(name="drill-worker-a")
    worker_b = app_b.worker(name="drill-worker-b")
    assert plan_only(app_a) > ROWS // WINDOW_KEYS // 2

    first = claim_all(app_a, worker_a.name)
    with connect(pg_url) as conn:
        forced = conn.execute(
            "update expiry.jobs set state = 'available' where state = 'running' and handler = %s",
            (WINDOW,),
        ).rowcount
    second = claim_all(app_b, worker_b.name)
    assert forced == len(first) == len(second) > ROWS // WINDOW_KEYS // 2
    assert first.keys() == second.keys()
    assert all(second[k].attempt == 2 for k in second)

    for key in sorted(first):
        start = threading.Barrier(2)

        def deliver(worker: Worker, job: Job, start: threading.Barrier = start) -> None:
            start.wait()
            worker.process(job)

        pair = [
            threading.Thread(target=deliver, args=(worker_a, first[key])),
            threading.Thread(target=deliver, args=(worker_b, second[key])),
        ]
        for thread in pair:
            thread.start()
        for thread in pair:
            thread.join(60)
            assert not thread.is_alive()

    # A window whose transaction ran long applied part of its range and enqueued the
    # rest as a continuation job: those are ordinary single deliveries.
    drain(app_b)

    aggregate = (
        "group_concat(action order by action)" if mysql else "array_agg(action order by action)"
    )
    with connect(pg_url) as conn:
        per_key = {
            key: actions.split(",") if mysql else actions
            for key, actions in conn.execute(
                f"select job_key, {aggregate} from expiry.audit"
                " where job_key is not null and action not like 'run.%%' group by job_key"
            ).fetchall()
        }
        owners = dict(conn.execute("select key, worker from expiry.ledger").fetchall())
    # One ledger row per key (its primary key): each window booked exactly once.
    applied = set(owners)
    assert applied >= first.keys()
    # The second delivery of every window is on the record: A's lease was taken over,
    # so whether it ran first (and rolled back) or second (and found the ledger row,
    # rolled back too), its worker audited the lost lease, once.
    assert all(per_key[k].count("job.lease_lost") == 1 for k in first), {
        k: per_key[k] for k in list(first)[:5]
    }
    print(
        f"{len(first)} windows delivered twice, each applied once;"
        f" {len(applied) - len(first)} continuations"
    )
    # Only B held a valid lease, so every effect is B's.
    assert {owners[k] for k in first} == {worker_b.name}
    report = check(pg_url)
    assert set(report.jobs) == {"completed"}
    assert opened.run_id
