"""Runs end to end on both engines: what is deleted, what survives, and the
ledger, queue and audit records that prove each window was applied once."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import expiry.cleanup.runs
import expiry.defaults
from expiry.app import App
from expiry.errors import TransientError
from expiry.types import Job

from ._support import (
    LIVE,
    Db,
    assert_run_clean,
    claim_plan,
    cli,
    cli_env,
    doomed,
    drain,
    expected_windows,
    expiry_cmd,
    run_worker,
    standard_rows,
    wait_for,
    write_config,
)

Apps = Callable[..., App]
POLICY = "expired-sessions"


def seed(db: Db, n: int = 1000) -> tuple[set[int], set[int]]:
    """The standard table; returns (all ids, ids a cleanup must delete)."""
    db.create_sessions()
    rows = standard_rows(n)
    db.insert_sessions(rows)
    return {i for i, _, _ in rows}, doomed(rows)


def test_end_to_end(db: Db, apps: Apps) -> None:
    all_ids, gone = seed(db)
    before = {row[0]: row for row in db.table()}
    app = apps(db.url)
    cleanup = app.cleanup
    assert cleanup is not None
    assert cleanup.watermark(POLICY) > 3600

    opened = cleanup.open_run(POLICY)
    assert opened.created and opened.run_id.startswith(f"{POLICY}:")
    again = cleanup.open_run(POLICY, opened.cutoff)
    assert again.run_id == opened.run_id and not again.created
    assert len(db.jobs(run_id=opened.run_id)) == 1  # one planning job, not two
    assert db.audit("run.opened") == 1

    run_worker(app, concurrency=2)

    survivors = all_ids - gone
    assert db.ids() == survivors
    # Every survivor is untouched, column for column.
    assert db.table() == [before[i] for i in sorted(survivors)]
    assert cleanup.watermark(POLICY) == 0
    assert_run_clean(db, opened.run_id)
    ledger = db.ledger(opened.run_id)
    assert sum(row["rows"] for row in ledger) == len(gone)
    assert len(ledger) == len(expected_windows(gone, 100))
    # Each ledger row is its window's record: the rows deleted in its range.
    for row in ledger:
        assert row["action"] == "delete"
        assert row["rows"] == len({i for i in gone if row["lo"] < i <= row["hi"]})
    assert db.audit("window.duplicate") == 0

    # Opening the same cutoff after the run finished is still the same run.
    counts = db.expiry_counts()
    assert not cleanup.open_run(POLICY, opened.cutoff).created
    assert db.expiry_counts() == counts


def test_rows_at_the_cutoff_are_kept(db: Db, apps: Apps) -> None:
    """Expired means timestamp < cutoff, strictly."""
    db.create_sessions()
    app = apps(db.url)
    assert app.cleanup is not None
    cutoff = app.engine.now().replace(microsecond=0) - timedelta(hours=1)
    for key, seconds in ((1, -1), (2, 0), (3, 1)):
        value = cutoff + timedelta(seconds=seconds)
        stored = db.stored(value)
        db.execute("insert into sessions (id, expires_at) values (%s, %s)", [key, stored])
    app.cleanup.open_run(POLICY, cutoff)
    run_worker(app)
    assert db.ids() == {2, 3}


def snapshot(db: Db) -> dict[str, Any]:
    return {"sessions": db.table(), **db.expiry_counts()}


def test_dry_run_reports_and_mutates_nothing(db: Db, apps: Apps, tmp_path: Path) -> None:
    all_ids, gone = seed(db)
    windows = expected_windows(gone, 100)
    app = apps(db.url)
    assert app.cleanup is not None
    before = snapshot(db)

    preview = app.cleanup.preview(POLICY, limit=1000)
    assert preview.candidates == len(gone)
    assert preview.windows == len(windows)
    assert [(s.lo, s.hi) for s in preview.first_windows] == windows

    config = write_config(tmp_path / "expiry.toml", db.url)
    for command in (["plan", POLICY], ["trigger", POLICY, "--dry-run"]):
        result = cli("--config", str(config), "--json", *command, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["dry_run"] is True
        assert data["candidates"] == len(gone)
        assert data["windows"] == len(windows)
        assert [(w["lo"], w["hi"]) for w in data["first_windows"]] == windows[:10]
    text = cli("--config", str(config), "plan", POLICY, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    words = " ".join(text.stdout.split())  # rich wraps long lines
    assert f"{len(gone)} candidate rows in {len(windows)} windows" in words
    assert "nothing changed" in words

    assert snapshot(db) == before


def test_duplicate_delivery_changes_nothing(db: Db, apps: Apps) -> None:
    all_ids, gone = seed(db)
    app = apps(db.url)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)
    assert_run_clean(db, opened.run_id)
    ledger_before = db.ledger()

    # Pick a window and put one of its deleted rows back, still expired: a
    # second application of the window would delete it again.
    window = db.windows(opened.run_id)[1]
    lo, hi = window["payload"]["lo"], window["payload"]["hi"]
    victim = min(i for i in gone if lo < i <= hi)
    db.insert_sessions([(victim, -7200.0, False)])
    table_before = db.table()

    db.redeliver(window["key"])
    run_worker(app)

    assert db.table() == table_before
    assert victim in db.ids()
    assert db.audit("window.duplicate", window["key"]) == 1
    assert db.ledger() == ledger_before
    again = next(j for j in db.windows() if j["key"] == window["key"])
    assert again["state"] == "completed" and again["attempt"] == 2
    keys = [row["key"] for row in db.ledger()]
    assert len(keys) == len(set(keys)) == len(db.windows())


def test_row_revived_after_planning_survives(db: Db, apps: Apps) -> None:
    all_ids, gone = seed(db)
    app = apps(db.url)
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    claim_plan(app)
    windows = db.windows(opened.run_id)
    assert len(windows) == len(expected_windows(gone, 100))
    assert {w["state"] for w in windows} == {"available"}

    # Planned, not yet applied: some candidates get a new deadline, one is revoked.
    revived = {i for i in gone if i % 11 == 0}
    revoked = min(gone - revived)
    marks = ", ".join(str(i) for i in sorted(revived))
    db.execute(
        f"update sessions set expires_at = {{now}} + {db.seconds('600')} where id in ({marks})"
    )
    db.execute("update sessions set revoked_at = {now} where id = %s", [revoked])
    assert all(any(w["payload"]["lo"] < i <= w["payload"]["hi"] for w in windows) for i in revived)

    run_worker(app)

    assert db.ids() == (all_ids - gone) | revived | {revoked}
    assert_run_clean(db, opened.run_id)
    assert sum(row["rows"] for row in db.ledger()) == len(gone) - len(revived) - 1
    assert app.cleanup.watermark(POLICY) == 0


def test_archive_moves_exactly_the_deleted_rows(db: Db, apps: Apps) -> None:
    all_ids, gone = seed(db, 600)
    db.create_sessions_archive()
    moving = [row for row in db.table() if row[0] in gone]
    app = apps(db.url, {"action": "archive", "archive_table": "sessions_archive"})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)

    assert db.ids() == all_ids - gone
    assert db.ids("sessions_archive") == gone
    assert db.count("sessions_archive") == len(gone)
    assert db.table("sessions_archive") == moving
    assert_run_clean(db, opened.run_id)
    assert {row["action"] for row in db.ledger()} == {"archive"}
    assert sum(row["rows"] for row in db.ledger()) == len(gone)


@pytest.mark.parametrize("action", ["delete", "archive"])
def test_a_where_predicate_with_a_percent_sign_is_applied_as_written(
    db: Db, apps: Apps, action: str
) -> None:
    """The predicate reaches the database unchanged whichever way the window's
    statement is sent (on PostgreSQL as text that window_apply executes)."""
    db.create_sessions()
    rows = standard_rows(300)
    db.insert_sessions(rows)
    db.create_sessions_archive()
    archive = {"action": "archive", "archive_table": "sessions_archive"}
    app = apps(db.url, {"where": "id % 2 = 0", **(archive if action == "archive" else {})})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)

    gone = {i for i, offset, _ in rows if offset < 0 and i % 2 == 0}
    assert 0 < len(gone) < len(rows) / 2
    assert db.ids() == {i for i, _, _ in rows} - gone
    assert db.ids("sessions_archive") == (gone if action == "archive" else set())
    assert sum(row["rows"] for row in db.ledger()) == len(gone)
    assert_run_clean(db, opened.run_id)


@pytest.mark.parametrize("windows", ["key", "auto"])
def test_sparse_keys_cost_one_job_per_nonempty_window(db: Db, apps: Apps, windows: str) -> None:
    """Key windows skip empty stretches of the key space: one job per non-empty
    window, not one per window of the range. Chosen by the data ("auto"), such
    sparse keys get time windows: one job per ``window`` expired rows."""
    db.create_sessions()
    clusters = [1, 250, 251, 10_000, 10_099, 10_100, 10_101, 5_000_000, 2**40, 2**40 + 7]
    rows = [(k + d, -3600.0, False) for k in clusters for d in (0, 3)]
    rows += [(k + 50, LIVE, False) for k in clusters]  # live rows between the expired ones
    db.insert_sessions(rows)
    gone = doomed(rows)
    spans = expected_windows(gone, 100)
    assert len(spans) == 6  # {1,4,251,254}: 2; {10000..10104}: 2; 5e6: 1; 2**40: 1

    app = apps(db.url, {"windows": windows, "window": 15})
    assert app.cleanup is not None
    if windows == "key":
        spans = expected_windows(gone, 15)
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)

    jobs = db.windows(opened.run_id)
    if windows == "key":
        assert sorted((j["payload"]["lo"], j["payload"]["hi"]) for j in jobs) == spans
        assert len(jobs) == len(spans)  # not (2**40 / 15) jobs
    else:
        assert all(j["payload"]["windows"] == "time" for j in jobs)
        assert len(jobs) == math.ceil(len(gone) / 15) == 2
    assert all(row["rows"] > 0 for row in db.ledger(opened.run_id))  # none was empty
    assert db.ids() == {i for i, _, _ in rows} - gone
    assert_run_clean(db, opened.run_id)


@pytest.mark.parametrize("scan", ["recursive", "stepwise"])
def test_planning_in_pages_gives_the_same_windows(
    db: Db, apps: Apps, monkeypatch: pytest.MonkeyPatch, scan: str
) -> None:
    """The planner's windows, as one recursive statement and one probe at a time
    (Engine.recursive_scans; MySQL's way), against the rule they follow."""
    db.create_sessions()
    # 17 windows of 10 keys, in clusters with gaps of every size.
    keys = [k for start in range(0, 17) for k in (start * 37 + 1, start * 37 + 9)]
    keys += [10_000 + 3 * i for i in range(20)]
    rows = [(k, -3600.0, False) for k in keys] + [(k + 1, LIVE, False) for k in keys]
    db.insert_sessions(rows)
    gone = doomed(rows)
    # Key windows by the policy: these keys are sparse, so the data would choose time windows.
    app = apps(db.url, {"window": 10, "windows": "key"})
    assert app.cleanup is not None
    monkeypatch.setattr(type(app.engine), "recursive_scans", scan == "recursive")
    one_page = app.cleanup.preview(POLICY, limit=1000)
    assert [(s.lo, s.hi) for s in one_page.first_windows] == expected_windows(gone, 10)

    monkeypatch.setattr(expiry.defaults, "PLAN_PAGE", 3)
    assert app.cleanup.preview(POLICY, limit=1000).first_windows == one_page.first_windows
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)

    plans = db.jobs(expiry.cleanup.runs.PLAN, opened.run_id)
    assert len(plans) == len(one_page.first_windows) // 3 + 1
    jobs = sorted((j["payload"]["lo"], j["payload"]["hi"]) for j in db.windows(opened.run_id))
    assert jobs == [(s.lo, s.hi) for s in one_page.first_windows]  # no gaps, duplicates
    assert all(a[1] <= b[0] for a, b in zip(jobs, jobs[1:], strict=False))
    for key in gone:
        assert sum(lo < key <= hi for lo, hi in jobs) == 1
    assert db.ids() == {i for i, _, _ in rows} - gone
    assert_run_clean(db, opened.run_id)
    windows_planned = db.scalar("select windows_planned from expiry.runs")
    assert windows_planned == len(jobs)


def test_a_runs_first_page_is_short_and_the_rest_follows_it(
    db: Db, apps: Apps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first planning job queues FIRST_PLAN_PAGE windows, so that workers
    start at once, and the next page's job ahead of them, so that it is planned
    while they run; later pages queue the next one ahead of their second half.
    The windows are the same."""
    db.create_sessions()
    rows = standard_rows(400)
    db.insert_sessions(rows)
    gone = doomed(rows)
    app = apps(db.url, {"window": 10})
    assert app.cleanup is not None
    monkeypatch.setattr(expiry.defaults, "FIRST_PLAN_PAGE", 4)
    monkeypatch.setattr(expiry.defaults, "PLAN_PAGE", 25)
    opened = app.cleanup.open_run(POLICY)

    def waiting() -> list[str]:
        """The run's waiting jobs in claim order: "plan" or a window's lo."""
        return [
            "plan" if j["handler"] == expiry.cleanup.runs.PLAN else j["payload"]["lo"]
            for j in db.jobs(run_id=opened.run_id)
            if j["state"] == "available"
        ]

    [first] = app.queue.claim(1, queues=app.worked_queues())
    app.worker().process(first)
    assert len(db.windows(opened.run_id)) == 4
    plans = db.jobs(expiry.cleanup.runs.PLAN, opened.run_id)
    assert [p["state"] for p in plans] == ["completed", "available"]
    first_page = [j["payload"]["lo"] for j in db.windows(opened.run_id)]
    assert waiting() == ["plan", *first_page]

    [second] = app.queue.claim(1, queues=app.worked_queues())
    assert second.handler == expiry.cleanup.runs.PLAN
    app.worker().process(second)
    second_page = [j["payload"]["lo"] for j in db.windows(opened.run_id)[4:]]  # id order: as queued
    assert len(second_page) == 25
    assert waiting() == [*first_page, *second_page[:12], "plan", *second_page[12:]]

    run_worker(app)
    planned = expected_windows(gone, 10)
    assert len(planned) > 4 + 25  # three pages at least
    jobs = sorted((j["payload"]["lo"], j["payload"]["hi"]) for j in db.windows(opened.run_id))
    assert jobs == planned
    pages = 1 + -(-(len(planned) - 4) // 25)  # 4, then pages of 25
    assert len(db.jobs(expiry.cleanup.runs.PLAN, opened.run_id)) == pages + (
        (len(planned) - 4) % 25 == 0
    )
    assert db.ids() == {i for i, _, _ in rows} - gone
    assert_run_clean(db, opened.run_id)


def load_example(monkeypatch: pytest.MonkeyPatch, url: str) -> Any:
    monkeypatch.setenv("EXPIRY_DATABASE_URL", url)
    path = Path(__file__).resolve().parents[2] / "examples" / "listings.py"
    spec = importlib.util.spec_from_file_location("listings_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_custom_handler_with_once_has_one_effect(
    db: Db, monkeypatch: pytest.MonkeyPatch, apps: Apps
) -> None:
    """The shipped example: a second job for the same listing revision does nothing."""
    db.execute(
        "create table listings (id integer primary key, revision integer not null,"
        " state text not null)"
    )
    db.execute("create table listing_updates (listing integer, state text)")
    if db.dialect == "postgres":
        db.execute(
            "create function count_update() returns trigger language plpgsql as $$ begin"
            " insert into listing_updates values (new.id, new.state); return new; end $$"
        )
        db.execute(
            "create trigger count_update after update on listings"
            " for each row execute function count_update()"
        )
    elif db.dialect == "mysql":
        db.execute(
            "create trigger count_update after update on listings for each row"
            " insert into listing_updates values (new.id, new.state)"
        )
    else:
        db.execute(
            "create trigger count_update after update on listings begin"
            " insert into listing_updates values (new.id, new.state); end"
        )
    db.execute("insert into listings values (1, 1, 'live'), (2, 1, 'live'), (3, 1, 'live')")
    example = load_example(monkeypatch, db.url)
    app: App = example.app
    try:
        app.migrate()
        for key, listing in [("a", 1), ("b", 1), ("c", 2)]:  # b repeats a's operation
            app.queue.enqueue("expire_listing", {"listing_id": listing, "revision": 1}, key=key)
        again = app.queue.enqueue("expire_listing", {"listing_id": 3, "revision": 1}, key="a")
        assert not again.enqueued  # a repeated job key is not enqueued again
        run_worker(app)
        # A redelivered job (lost acknowledgement) has no effect either.
        db.redeliver("c")
        run_worker(app)
        # Listing 2 is relisted at revision 2: expiring that is a new operation.
        db.execute("update listings set revision = 2, state = 'live' where id = 2")
        app.queue.enqueue("expire_listing", {"listing_id": 2, "revision": 2}, key="d")
        run_worker(app)
    finally:
        app.close()

    expirations = "select listing, count(*) from listing_updates where state = 'expired'"
    assert db.rows(expirations + " group by listing order by 1") == [(1, 1), (2, 2)]
    assert db.rows("select id, state from listings order by id") == [
        (1, "expired"),
        (2, "expired"),
        (3, "live"),
    ]
    ops = sorted(k for (k,) in db.rows("select key from expiry.ledger"))
    assert ops == [
        "expire-listing:1:revision-1",
        "expire-listing:2:revision-1",
        "expire-listing:2:revision-2",
    ]
    assert {j["key"]: j["state"] for j in db.jobs()} == {k: "completed" for k in "abcd"}


def test_once_rolls_back_with_a_failed_transaction(db: Db, apps: Apps) -> None:
    """A failure after once() leaves no ledger row; the retry applies the effect once."""
    db.execute("create table counters (id integer primary key, n integer not null)")
    db.execute("insert into counters values (1, 0)")
    app = apps(db.url)
    mark = "?" if db.dialect == "sqlite" else "%s"
    failures = {"left": 1}

    @app.handler("bump")
    def bump(job: Job, tx: Any) -> None:
        first, second = f"bump:{job.payload['op']}:1", f"bump:{job.payload['op']}:2"
        if app.once(tx, first):
            tx.execute(f"update counters set n = n + 1 where id = {mark}", (1,))
        if failures["left"]:
            failures["left"] -= 1
            raise TransientError("the network blinked")
        if app.once(tx, second):
            tx.execute(f"update counters set n = n + 10 where id = {mark}", (1,))

    app.migrate()
    app.queue.enqueue("bump", {"op": "x"}, key="bump-x")
    app.queue.enqueue("bump", {"op": "x"}, key="bump-x-again")
    drain(app)
    assert db.scalar("select n from counters") == 11
    assert sorted(k for (k,) in db.rows("select key from expiry.ledger")) == [
        "bump:x:1",
        "bump:x:2",
    ]
    jobs = {j["key"]: j for j in db.jobs()}
    assert {j["state"] for j in jobs.values()} == {"completed"}
    assert sorted(j["attempt"] for j in jobs.values()) == [1, 2]


def test_concurrent_workers_on_postgres(pg_db: Db, apps: Apps) -> None:
    pg_db.create_sessions()
    rows = standard_rows(20_000)
    pg_db.insert_sessions(rows)
    gone = doomed(rows)
    app = apps(pg_db.url, {"window": 50})
    other = apps(pg_db.url, {"window": 50})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)

    workers = [
        a.worker(concurrency=4, batch=2, until_idle=True, poll=0.05, rescue_every=0.2)
        for a in (app, other)
    ]
    threads = [threading.Thread(target=w.run) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive()

    assert pg_db.ids() == {i for i, _, _ in rows} - gone
    assert_run_clean(pg_db, opened.run_id)
    windows = pg_db.windows(opened.run_id)
    assert len(windows) == len(expected_windows(gone, 50))
    assert {w["attempt"] for w in windows} == {1}
    assert pg_db.audit("window.duplicate") == 0
    assert sum(row["rows"] for row in pg_db.ledger()) == len(gone)
    plans = pg_db.jobs(expiry.cleanup.runs.PLAN, opened.run_id)
    assert len(plans) == 2  # a short first page, then the rest
    assert sum(w.processed for w in workers) == len(windows) + len(plans)
    assert app.cleanup.watermark(POLICY) == 0


def test_a_finished_run_wakes_whoever_waits_for_it(db: Db, apps: Apps) -> None:
    """PostgreSQL hints LISTEN expiry_runs when a run finishes, so `trigger --wait`
    (or the benchmark) returns at once rather than at its next poll; SQLite has no
    hints, and the wait sleeps its timeout."""
    db.create_sessions()
    db.insert_sessions(standard_rows(200))
    app = apps(db.url, {"window": 50})
    assert app.cleanup is not None

    started = time.monotonic()
    app.engine.wait_for_runs(0.3)  # nothing finishes: the wait lasts its timeout
    assert time.monotonic() - started >= 0.3

    opened = app.cleanup.open_run(POLICY)
    run_worker(app)  # finishes the run; the hint waits on the listener
    assert db.scalar("select state from expiry.runs where id = %s", [opened.run_id]) == ("finished")
    started = time.monotonic()
    app.engine.wait_for_runs(2.0)
    waited = time.monotonic() - started
    if db.dialect == "postgres":
        assert waited < 1.0
    else:
        assert waited >= 2.0


def test_a_window_that_fails_for_good_ends_dead_and_the_run_still_finishes(
    db: Db, apps: Apps
) -> None:
    """Every job ends completed or dead, with its reason; the run does not hang."""
    all_ids, gone = seed(db, 300)
    if db.dialect == "postgres":
        db.execute("create table sessions_archive (like sessions including constraints)")
        db.execute("alter table sessions_archive add primary key (id)")
    elif db.dialect == "mysql":
        db.execute("create table sessions_archive like sessions")
    else:
        db.execute(
            "create table sessions_archive (id integer primary key, user_id integer,"
            " expires_at real, revoked_at real, note text)"
        )
    # A row already in the archive makes its window's move fail: a permanent error.
    blocker = max(gone)  # in the last window, so no later window finishes the run
    db.execute("insert into sessions_archive select * from sessions where id = %s", [blocker])
    app = apps(
        db.url, {"action": "archive", "archive_table": "sessions_archive", "max_attempts": 2}
    )
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    drain(app)

    windows = db.windows(opened.run_id)
    dead = [w for w in windows if w["state"] == "dead"]
    assert len(dead) == 1 and dead[0]["payload"]["lo"] < blocker <= dead[0]["payload"]["hi"]
    assert dead[0]["kind"] in ("uniqueviolation", "integrityerror")  # the reason is kept
    assert "unique" in dead[0]["error"].lower() or "duplicate entry" in dead[0]["error"].lower()
    assert dead[0]["attempt"] == 1  # permanent: no retry spent on it
    assert {w["state"] for w in windows if w is not dead[0]} == {"completed"}
    lo, hi = dead[0]["payload"]["lo"], dead[0]["payload"]["hi"]
    # Nothing of the dead window was applied; everything else was.
    assert db.ids() == (all_ids - gone) | {i for i in gone if lo < i <= hi}
    assert dead[0]["key"] not in {row["key"] for row in db.ledger()}
    assert db.run_state(opened.run_id) == "finished"


def test_trigger_wait_reports_the_run(db: Db, tmp_path: Path) -> None:
    all_ids, gone = seed(db, 300)
    config = write_config(tmp_path / "expiry.toml", db.url)
    started = time.monotonic()
    worker = subprocess.Popen(
        expiry_cmd("--config", str(config), "worker", "--concurrency", "2"),
        env=cli_env(),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        result = cli("--config", str(config), "--json", "trigger", POLICY, "--wait", cwd=tmp_path)
    finally:
        worker.terminate()
        worker.wait(10)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["state"] == "finished"
    assert summary["rows_affected"] == len(gone)
    assert summary["jobs_done"] == summary["jobs_total"] == len(expected_windows(gone, 100))
    assert db.ids() == all_ids - gone
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("declared", "expired", "live"),
    [
        ("text", "datetime('now', '-1 hour')", "datetime('now', '+1 hour')"),
        (
            "timestamp",
            "strftime('%Y-%m-%dT%H:%M:%f', 'now', '-1 hour')",
            "strftime('%Y-%m-%dT%H:%M:%f', 'now', '+1 hour')",
        ),
        ("integer", "cast(unixepoch('now') as integer) - 3600", "unixepoch('now') + 3600"),
    ],
)
def test_sqlite_timestamps_as_text_or_epoch(
    sqlite_url: str, apps: Apps, declared: str, expired: str, live: str
) -> None:
    db = Db(sqlite_url)
    try:
        db.execute(f"create table sessions (id integer primary key, expires_at {declared})")
        db.execute("create index sessions_expires_at on sessions (expires_at)")
        for i in range(1, 101):
            db.execute(f"insert into sessions values (%s, {expired if i % 2 else live})", [i])
        app = apps(sqlite_url, {"where": None})
        assert app.cleanup is not None
        assert app.cleanup.watermark(POLICY) > 0
        opened = app.cleanup.open_run(POLICY)
        run_worker(app)
        assert db.ids() == set(range(2, 101, 2))
        assert app.cleanup.watermark(POLICY) == 0
        assert_run_clean(db, opened.run_id)
    finally:
        db.close()


@pytest.mark.parametrize(
    ("declared", "expired", "live"),
    [
        ("timestamptz", "now() - interval '1 hour'", "now() + interval '1 hour'"),
        (
            "timestamp",
            "(now() at time zone 'UTC') - interval '1 hour'",
            "(now() at time zone 'UTC') + interval '1 hour'",
        ),
        ("date", "current_date - 2", "current_date + 2"),
    ],
)
def test_postgres_timestamp_types(
    pg_db: Db, apps: Apps, declared: str, expired: str, live: str
) -> None:
    pg_db.execute(f"create table sessions (id integer primary key, expires_at {declared})")
    pg_db.execute("create index sessions_expires_at on sessions (expires_at)")
    pg_db.execute(
        "insert into sessions select g,"
        f" case when g % 2 = 1 then {expired} else {live} end"
        " from generate_series(1, 100) g"
    )
    app = apps(pg_db.url, {"where": None})
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    run_worker(app)
    assert pg_db.ids() == set(range(2, 101, 2))
    assert app.cleanup.watermark(POLICY) == 0
    assert_run_clean(pg_db, opened.run_id)


def test_a_policy_added_by_a_reload_is_worked_by_the_running_worker(db: Db, tmp_path: Path) -> None:
    """A config reload (SIGHUP) that adds a policy: the worker already running
    claims the new policy's queue at once, no restart."""
    db.create_sessions()
    db.create_sessions("tokens")
    db.insert_sessions(standard_rows(100), "tokens")
    path = write_config(tmp_path / "expiry.toml", db.url)
    app = App.from_config(path)
    try:
        worker = app.worker(poll=0.05)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        write_config(path, db.url, {}, {"name": "tokens", "table": "tokens"})
        assert app.reload()
        assert app.cleanup is not None
        opened = app.cleanup.open_run("tokens")
        wait_for(lambda: db.run_state(opened.run_id) == "finished", 20, "the new policy's run")
        assert db.ids("tokens") == set(range(1, 101)) - doomed(standard_rows(100))
        worker.stop()
        thread.join(10)
    finally:
        app.close()


def test_inclusive_deletes_the_rows_at_the_cutoff_and_none_after(db: Db, apps: Apps) -> None:
    """inclusive = true: expired means timestamp <= cutoff. The row at the cutoff
    goes; a row a microsecond (the finest any storage holds) past it stays."""
    db.create_sessions()
    app = apps(db.url, {"inclusive": True})
    assert app.cleanup is not None
    cutoff = app.engine.now().replace(microsecond=0) - timedelta(hours=1)
    offsets = {1: -1.0, 2: 0.0, 3: 0.000001, 4: 1.0}
    for key, seconds in offsets.items():
        stored = db.stored(cutoff + timedelta(seconds=seconds))
        db.execute("insert into sessions (id, expires_at) values (%s, %s)", [key, stored])
    preview = app.cleanup.preview(POLICY, cutoff)
    assert preview.candidates == 2
    opened = app.cleanup.open_run(POLICY, cutoff)
    run_worker(app)
    assert db.ids() == {3, 4}
    assert sum(row["rows"] for row in db.ledger(opened.run_id)) == 2
