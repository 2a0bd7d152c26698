"""Drill 4: poison work. A custom handler that always raises PermanentError is
dead-lettered after one attempt with its reason; one that always fails
transiently spends exactly max_attempts, then is dead-lettered; once the cause
is fixed, `expiry dlq redrive` sends them back and they complete, each with one
effect. A cleanup run shares the queue meanwhile and is not held up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cleanup._support import cli, run_worker, write_config
from expiry.app import App
from expiry.errors import PermanentError, TransientError
from expiry.types import Job

from ._harness import connect, load_sessions
from ._invariants import check, record_expected

FLAKY_ATTEMPTS = 3


def fixed(tx: Any) -> bool:
    return bool(tx.execute("select exists (select 1 from drill_fixed)").fetchone()["exists"])


def register(app: App) -> None:
    @app.handler("drill.poison")
    def poison(job: Job, tx: Any) -> None:
        if not fixed(tx):
            raise PermanentError(f"item {job.payload['item']} has no owner: cannot be expired")
        with app.once(tx, f"drill-effect:{job.key}"):
            tx.execute("insert into drill_effects (job) values (%s)", (job.key,))

    @app.handler("drill.flaky")
    def flaky(job: Job, tx: Any) -> None:
        if not fixed(tx):
            raise TransientError("the archive service timed out")
        with app.once(tx, f"drill-effect:{job.key}"):
            tx.execute("insert into drill_effects (job) values (%s)", (job.key,))


def work_until_nothing_waits(app: App, url: str) -> None:
    """Run the worker; skip each retry's backoff by making retryable jobs due now."""
    for _ in range(20):
        run_worker(app)
        with connect(url) as conn:
            hurried = conn.execute(
                "update expiry.jobs set run_at = now() where state in ('retryable', 'scheduled')"
            ).rowcount
        if not hurried:
            return
    raise AssertionError("jobs kept retrying")


def job(url: str, key: str) -> dict[str, Any]:
    with connect(url) as conn:
        row = conn.execute(
            "select state, attempt, max_attempts, last_error, last_error_kind, errors"
            " from expiry.jobs where key = %s",
            (key,),
        ).fetchone()
    assert row is not None
    names = ("state", "attempt", "max_attempts", "last_error", "kind", "errors")
    return dict(zip(names, row, strict=True))


def test_poison_jobs_dead_letter_with_reasons_and_redrive_completes_them(
    pg_url: str, apps: Callable[..., App], tmp_path: Path
) -> None:
    load_sessions(pg_url, 5_000)
    record_expected(pg_url)
    with connect(pg_url) as conn:
        conn.execute("create table drill_fixed (at timestamptz default now())")
        conn.execute("create table drill_effects (job text not null)")
    app = apps(pg_url, {"window": 500})
    register(app)
    assert app.cleanup is not None
    app.cleanup.open_run("expired-sessions")
    app.queue.enqueue("drill.poison", {"item": 7}, key="drill-poison-7")
    app.queue.enqueue("drill.flaky", {"item": 8}, key="drill-flaky-8", max_attempts=FLAKY_ATTEMPTS)

    work_until_nothing_waits(app, pg_url)

    poison = job(pg_url, "drill-poison-7")
    assert poison["state"] == "dead" and poison["attempt"] == 1
    assert poison["kind"] == "PermanentError"
    assert poison["last_error"] == "PermanentError: item 7 has no owner: cannot be expired"
    assert len(poison["errors"]) == 1

    flaky = job(pg_url, "drill-flaky-8")
    assert flaky["state"] == "dead" and flaky["attempt"] == FLAKY_ATTEMPTS
    assert [e["attempt"] for e in flaky["errors"]] == list(range(1, FLAKY_ATTEMPTS + 1))
    assert {e["kind"] for e in flaky["errors"]} == {"TransientError"}
    assert flaky["last_error"] == "TransientError: the archive service timed out"

    # The cleanup run beside them was not held up; the dead jobs carry their reasons.
    check(pg_url)
    config = write_config(tmp_path / "expiry.toml", pg_url, {"window": 500})
    listed = cli("dlq", "list", "--json", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert "has no owner" in listed.stdout and "timed out" in listed.stdout

    # The fix, then the reviewed redrive.
    with connect(pg_url) as conn:
        conn.execute("insert into drill_fixed default values")
        assert conn.execute("select count(*) from drill_effects").fetchone() == (0,)
    redriven = cli("dlq", "redrive", "--all", "--json", "--config", str(config))
    assert redriven.returncode == 0, redriven.stderr
    assert "drill-poison-7" in redriven.stdout and "drill-flaky-8" in redriven.stdout
    work_until_nothing_waits(app, pg_url)

    for key in ("drill-poison-7", "drill-flaky-8"):
        done = job(pg_url, key)
        assert done["state"] == "completed" and done["attempt"] == 1, done
    with connect(pg_url) as conn:
        effects = sorted(r[0] for r in conn.execute("select job from drill_effects"))
        audited = conn.execute(
            "select count(*) from expiry.audit where action = 'job.redriven'"
        ).fetchone()
    assert effects == ["drill-flaky-8", "drill-poison-7"]
    assert audited == (2,)
    report = check(pg_url)
    assert set(report.jobs) == {"completed"}
