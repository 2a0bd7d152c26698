"""Drill 6: rows revived while their window is pending survive.

After planning, some candidate rows get a deadline in the future before any
window runs; then, while workers delete, other rows are revived concurrently,
each revival recording its row as protected in the same transaction. A revival
that commits before its window's DELETE reaches the row keeps the row (the
predicate is evaluated at execution time, and re-checked on the new row
version); one that comes after finds the row gone and protects nothing.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from expiry.app import App

from ._harness import connect, load_sessions, plan_only, scale
from ._invariants import add_survivors, check, record_expected

ROWS = scale(60_000, 2_000_000)
WINDOW = 500


def revive(url: str, ids: list[int]) -> list[int]:
    """Move expired rows' deadlines an hour ahead; protect those it reached."""
    with connect(url) as conn, conn.transaction():
        found = [
            r[0]
            for r in conn.execute(
                "update sessions set expires_at = now() + interval '1 hour'"
                " where id = any(%s) and expires_at < now() returning id",
                (ids,),
            )
        ]
        add_survivors(conn, "sessions", found)
    return found


def test_rows_revived_after_planning_or_during_the_run_survive(
    pg_url: str, apps: Callable[..., App]
) -> None:
    load_sessions(pg_url, ROWS)
    record_expected(pg_url)
    app = apps(pg_url, {"window": WINDOW})
    assert app.cleanup is not None
    opened = app.cleanup.open_run("expired-sessions")
    assert plan_only(app) >= ROWS // WINDOW // 2  # planned; no window has run yet

    rng = random.Random(6)
    candidates = [i for i in range(1, ROWS + 1) if i % 5 and i % 7]
    before = revive(pg_url, rng.sample(candidates, len(candidates) // 50))
    assert before

    worker = app.worker(concurrency=2, poll=0.05, rescue_every=0.5, until_idle=True)
    runner = threading.Thread(target=worker.run)
    runner.start()
    during: list[int] = []
    rounds = 0
    while runner.is_alive():
        during += revive(pg_url, rng.sample(candidates, 40))
        rounds += 1
        time.sleep(0.01)
    runner.join()
    print(
        f"revived {len(before)} rows after planning, {len(during)} during the run"
        f" ({rounds} rounds of 40 tries; the rest had been deleted already)"
    )
    assert during, "no revival raced the workers"

    report = check(pg_url)
    assert set(report.jobs) == {"completed"}
    with connect(pg_url) as conn:
        kept = conn.execute(
            "select count(*) from sessions where id = any(%s)", (before + during,)
        ).fetchone()
        state = conn.execute("select state from expiry.runs where id = %s", (opened.run_id,))
        assert state.fetchone() == ("finished",)
    assert kept == (len(set(before + during)),)
