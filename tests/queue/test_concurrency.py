"""Claims under real concurrency, and claims abandoned by a killed process.

Every worker here is its own OS process (tests/queue/_proc.py), started with this
interpreter, on the same PostgreSQL database or the same SQLite file.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from _support import finish, spawn, wait_for

from expiry.app import App
from expiry.queue.jobs import new_job
from expiry.queue.worker import Worker
from expiry.types import Job, JobState

CLAIMERS = 4
JOBS = 2_000


def test_no_job_is_claimed_twice_by_concurrent_processes(
    db_url: str, app: App, tmp_path: Path
) -> None:
    app.queue.enqueue_many(new_job("noop", {"i": i}, None, f"c{i}") for i in range(JOBS))
    ids = {job.id for job in app.queue.engine.job_list(JobState.AVAILABLE, limit=JOBS)}
    assert len(ids) == JOBS
    go = tmp_path / "go"
    outs = [tmp_path / f"claimed-{n}.json" for n in range(CLAIMERS)]
    procs = [spawn("claimer", db_url, "--go", str(go), "--out", str(out)) for out in outs]
    go.touch()  # all claimers start together

    for proc in procs:
        code, err = finish(proc, timeout=120)
        assert code == 0, err

    per_process = [json.loads(out.read_text()) for out in outs]
    print("claims per process:", [len(ids) for ids in per_process])
    claimed: list[int] = [i for ids in per_process for i in ids]
    assert len(claimed) == len(set(claimed)), "a job was claimed twice"
    assert set(claimed) == ids
    stats = app.queue.stats()
    assert stats.by_state == {"default": {"completed": JOBS}}
    rows = app.queue.engine.job_list(JobState.COMPLETED, limit=JOBS)
    assert {job.attempt for job in rows} == {1}


def run_rescuer(app: App, lease: float = 5.0) -> Worker:
    worker = app.worker(until_idle=True, lease=lease, poll=0.05, rescue_every=0.2)
    started = time.monotonic()
    assert worker.run() == 0
    assert time.monotonic() - started < 30
    return worker


def test_a_killed_workers_claim_is_rescued_and_completed(
    db_url: str, app: App, tmp_path: Path
) -> None:
    app.queue.enqueue("sleep_forever", {}, None, "stuck", max_attempts=3)
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = spawn("worker", db_url, "--lease", "1", "--marks", str(marks))
    wait_for(lambda: (marks / "stuck.1.started").exists(), what="the job to start")
    proc.send_signal(signal.SIGKILL)
    code, _ = finish(proc)
    assert code == -signal.SIGKILL
    assert app.queue.get("stuck").state is JobState.RUNNING  # type: ignore[union-attr]
    ran: list[int] = []

    @app.handler("sleep_forever")
    def finish_it(job: Job, tx: Any) -> None:
        ran.append(job.attempt)

    run_rescuer(app)

    job = app.queue.get("stuck")
    assert job is not None
    assert ran == [2]
    assert job.state is JobState.COMPLETED and job.attempt == 2
    assert [e["kind"] for e in job.errors] == ["lease_expired"]


def test_a_job_that_kills_every_worker_ends_dead(db_url: str, app: App, tmp_path: Path) -> None:
    app.queue.enqueue("kill_self", {}, None, "poison", max_attempts=2)
    marks = tmp_path / "marks"
    marks.mkdir()
    for attempt in (1, 2):  # the second worker rescues the first one's claim, then dies too
        proc = spawn("worker", db_url, "--lease", "1", "--marks", str(marks))
        code, err = finish(proc)
        assert code == -signal.SIGKILL, err
        assert (marks / f"poison.{attempt}.started").exists()
    ran: list[int] = []

    @app.handler("kill_self")
    def must_not_run(job: Job, tx: Any) -> None:
        ran.append(job.attempt)

    run_rescuer(app)

    job = app.queue.get("poison")
    assert job is not None
    assert ran == []
    assert job.state is JobState.DEAD and job.attempt == 2
    assert job.last_error_kind == "lease_expired"
    assert [e["attempt"] for e in job.errors] == [1, 2]
    # A worker started now has nothing to do and exits at once.
    code, err = finish(spawn("worker", db_url, "--lease", "1", "--until-idle"), timeout=30)
    assert code == 0, err
    assert sorted(p.name for p in marks.iterdir()) == ["poison.1.started", "poison.2.started"]
