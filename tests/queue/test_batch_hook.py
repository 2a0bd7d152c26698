"""A handler's ``after_batch`` hook: called once per claimed batch with that
handler's jobs of the batch, whatever their outcome, after the last of them."""

from __future__ import annotations

import random
from typing import Any

from expiry.app import App
from expiry.errors import PermanentError
from expiry.queue.jobs import new_job
from expiry.queue.worker import Worker
from expiry.types import Job


def make_worker(app: App, **kwargs: Any) -> Worker:
    options: dict[str, Any] = {
        "until_idle": True,
        "claim_hold": None,  # claim the whole batch at once
        "poll": 0.05,
        "rng": random.Random(0),
    }
    return app.worker(**{**options, **kwargs})


def test_after_batch_gets_each_handlers_jobs_of_the_batch_once(app: App) -> None:
    events: list[tuple[str, list[str]]] = []

    def ran(job: Job, tx: Any) -> None:
        events.append(("ran", [job.key]))
        if job.payload.get("fail"):
            raise PermanentError("no")

    def batch(name: str) -> Any:
        return lambda jobs: events.append((f"batch {name}", [j.key for j in jobs]))

    app.handler("a", after_batch=batch("a"))(ran)
    app.handler("b", after_batch=batch("b"))(ran)
    app.handler("c")(ran)  # no hook
    app.queue.enqueue_many(
        [
            new_job("a", {}, None, "a0", priority=0),
            new_job("b", {}, None, "b1", priority=1),
            new_job("a", {"fail": True}, None, "a2", priority=2),
            new_job("c", {}, None, "c3", priority=3),
        ]
    )

    assert make_worker(app, batch=16).run() == 0

    # Every job of the batch ran first, then each hook once.
    assert events[:4] == [("ran", [key]) for key in ("a0", "b1", "a2", "c3")]
    assert sorted(events[4:]) == [("batch a", ["a0", "a2"]), ("batch b", ["b1"])]


def test_process_is_a_batch_of_one_and_a_failing_hook_is_logged(app: App) -> None:
    seen: list[list[str]] = []

    def hook(jobs: list[Job]) -> None:
        seen.append([j.key for j in jobs])
        raise RuntimeError("the hook's database is down")

    app.handler("a", after_batch=hook)(lambda job, tx: None)
    app.queue.enqueue("a", {}, None, "one")
    [job] = app.queue.claim(1, 60, owner="test")

    app.worker().process(job)

    assert seen == [["one"]]
    done = app.queue.get("one")
    assert done is not None and done.state.value == "completed"
