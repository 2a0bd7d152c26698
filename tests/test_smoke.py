from expiry.app import App
from expiry.types import JobState


def test_enqueue_claim_complete(app: App) -> None:
    app.migrate()
    first = app.queue.enqueue("noop", {"n": 1}, None, "k1")
    again = app.queue.enqueue("noop", {"n": 1}, None, "k1")
    assert first.enqueued and not again.enqueued
    [job] = app.queue.claim(5, 30)
    assert job.key == "k1" and job.attempt == 1
    app.queue.complete(job)
    assert app.queue.get("k1").state is JobState.COMPLETED  # type: ignore[union-attr]
