"""The pull queue over HTTP: publish, receive, ack, nack, heartbeat, the DLQ and
batches, against a live server on each engine."""

from __future__ import annotations

import time

from _http_live import Live, assert_error

from expiry.types import JobState


def receive(live: Live, queue: str = "emails", **extra: object) -> list[dict[str, object]]:
    response = live.client.post("/v1/queue/receive", json={"queue": queue, **extra})
    assert response.status_code == 200, response.text
    jobs: list[dict[str, object]] = response.json()["jobs"]
    return jobs


def test_publish_receive_ack(live: Live) -> None:
    body = {"queue": "emails", "message": {"user_id": 42}, "key": "welcome:42"}
    first = live.client.post("/v1/queue/publish", json=body)
    assert first.status_code == 200, first.text
    assert first.json() == {"key": "welcome:42", "queue": "emails", "enqueued": True}
    again = live.client.post("/v1/queue/publish", json=body)
    assert again.json() == {"key": "welcome:42", "queue": "emails", "enqueued": False}

    assert receive(live, "other-queue") == []
    [job] = receive(live, max=10, lease_seconds=30)
    assert job["key"] == "welcome:42" and job["queue"] == "emails"
    assert job["message"] == {"user_id": 42}
    assert job["attempt"] == 1 and job["max_attempts"] == 8
    assert job["lease_expires_at"]
    assert receive(live) == [], "a leased job is not handed out twice"

    heartbeat = live.client.post(
        "/v1/queue/heartbeat", json={"receipt": job["receipt"], "lease_seconds": 60}
    )
    assert heartbeat.status_code == 200, heartbeat.text
    assert heartbeat.json()["state"] == "running"

    ack = live.client.post("/v1/queue/ack", json={"receipt": job["receipt"]})
    assert ack.status_code == 200, ack.text
    assert ack.json()["state"] == "completed"
    stored = live.app.queue.get("emails/welcome:42")  # message_key
    assert stored is not None and stored.state is JobState.COMPLETED

    # A second ack of the same receipt changes nothing and says so.
    assert_error(live.client.post("/v1/queue/ack", json={"receipt": job["receipt"]}), 409)
    # A completed key still deduplicates.
    assert live.client.post("/v1/queue/publish", json=body).json()["enqueued"] is False


def test_a_delayed_message_is_not_received_early(live: Live) -> None:
    for body in (
        {"queue": "emails", "message": {"n": 1}, "delay_seconds": 3600},
        {"queue": "emails", "message": {"n": 2}, "run_at": "2999-01-01T00:00:00Z"},
        # An offset ISO-8601 allows and PostgreSQL would not: stored as UTC.
        {"queue": "emails", "message": {"n": 3}, "run_at": "2999-06-19T23:58:45.8-17:39"},
    ):
        response = live.client.post("/v1/queue/publish", json=body)
        assert response.status_code == 200, response.text
    assert receive(live, max=10) == []
    assert live.app.queue.pending("emails") == 3


def test_ack_after_the_lease_was_rescued_is_409_and_not_applied(live: Live) -> None:
    live.client.post("/v1/queue/publish", json={"queue": "emails", "message": {}, "key": "j"})
    [first] = receive(live, lease_seconds=0.2)
    time.sleep(0.5)
    assert live.app.queue.rescue() == 1
    rescued = live.app.queue.get("emails/j")
    assert rescued is not None and rescued.state in (JobState.AVAILABLE, JobState.RETRYABLE)

    message = assert_error(
        live.client.post("/v1/queue/ack", json={"receipt": first["receipt"]}),
        409,
        "receipt_expired",
    )
    assert "not acknowledged" in message
    stored = live.app.queue.get("emails/j")
    assert stored is not None and stored.state is rescued.state, "the late ack applied"
    # nack and heartbeat with the stale receipt are refused the same way.
    for path in ("/v1/queue/nack", "/v1/queue/heartbeat"):
        assert_error(
            live.client.post(path, json={"receipt": first["receipt"]}), 409, "receipt_expired"
        )

    [second] = receive(live)
    assert second["attempt"] == 2 and second["receipt"] != first["receipt"]
    ok = live.client.post("/v1/queue/ack", json={"receipt": second["receipt"]})
    assert ok.status_code == 200, ok.text


def test_ack_after_another_consumer_received_the_job_is_409(live: Live) -> None:
    live.client.post("/v1/queue/publish", json={"queue": "emails", "message": {}, "key": "j"})
    [first] = receive(live, lease_seconds=0.2)
    time.sleep(0.5)
    live.app.queue.rescue()
    [second] = receive(live, lease_seconds=30)  # another consumer now holds it
    assert_error(
        live.client.post("/v1/queue/ack", json={"receipt": first["receipt"]}),
        409,
        "receipt_expired",
    )
    stored = live.app.queue.get("emails/j")
    assert stored is not None and stored.state is JobState.RUNNING
    assert stored.attempt == 2
    assert live.client.post("/v1/queue/ack", json={"receipt": second["receipt"]}).status_code == 200
    stored = live.app.queue.get("emails/j")
    assert stored is not None and stored.state is JobState.COMPLETED


def test_ack_batch_acknowledges_many_in_one_transaction_and_names_the_expired(
    live: Live,
) -> None:
    keys = [f"b{i}" for i in range(4)]
    body = {"queue": "emails", "messages": [{"n": i} for i in range(4)], "keys": keys}
    assert live.client.post("/v1/queue/publish_batch", json=body).status_code == 200
    held = {str(j["key"]): str(j["receipt"]) for j in receive(live, max=3, lease_seconds=0.3)}
    assert len(held) == 3
    time.sleep(0.5)
    live.app.queue.rescue()  # the three leases expired: b0..b2 are back in the queue
    fresh = {str(j["key"]): str(j["receipt"]) for j in receive(live, max=10, lease_seconds=30)}
    assert sorted(fresh) == keys
    stale = held["b2"]  # its job now leased again, under a new receipt
    receipts = [fresh["b0"], fresh["b1"], stale, fresh["b3"]]

    response = live.client.post("/v1/queue/ack_batch", json={"receipts": receipts})

    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer == {"acked": [fresh["b0"], fresh["b1"], fresh["b3"]], "expired": [stale]}
    states = {key: live.app.queue.get(f"emails/{key}").state for key in keys}  # type: ignore[union-attr]
    assert states == {
        "b0": JobState.COMPLETED,
        "b1": JobState.COMPLETED,
        "b2": JobState.RUNNING,  # the stale receipt changed nothing: still leased
        "b3": JobState.COMPLETED,
    }
    # Acknowledged receipts are spent: acking them again acknowledges nothing.
    again = live.client.post("/v1/queue/ack_batch", json={"receipts": [fresh["b0"]]})
    assert again.json() == {"acked": [], "expired": [fresh["b0"]]}
    assert live.client.post("/v1/queue/ack", json={"receipt": fresh["b2"]}).status_code == 200


def test_ack_batch_with_a_malformed_receipt_is_422_and_acknowledges_none(live: Live) -> None:
    live.client.post("/v1/queue/publish", json={"queue": "emails", "message": {}, "key": "j"})
    [job] = receive(live, lease_seconds=30)
    bad = live.client.post(
        "/v1/queue/ack_batch", json={"receipts": [job["receipt"], "not-a-receipt"]}
    )
    assert_error(bad, 422)
    assert_error(live.client.post("/v1/queue/ack_batch", json={"receipts": []}), 422)
    twice = {"receipts": [job["receipt"], f"{str(job['receipt']).split('.')[0]}.1.other"]}
    assert "same job" in assert_error(live.client.post("/v1/queue/ack_batch", json=twice), 422)
    stored = live.app.queue.get("emails/j")
    assert stored is not None and stored.state is JobState.RUNNING


def test_nack_retries_then_a_permanent_nack_dead_letters(live: Live) -> None:
    live.client.post(
        "/v1/queue/publish", json={"queue": "emails", "message": {"to": "a@b"}, "key": "mail:1"}
    )
    [first] = receive(live)
    nack = live.client.post(
        "/v1/queue/nack",
        json={"receipt": first["receipt"], "delay_seconds": 0, "error": "smtp timeout"},
    )
    assert nack.status_code == 200, nack.text
    assert nack.json()["state"] == "retryable"

    [second] = receive(live)
    assert second["key"] == "mail:1" and second["attempt"] == 2
    dead = live.client.post(
        "/v1/queue/nack",
        json={"receipt": second["receipt"], "permanent": True, "error": "mailbox does not exist"},
    )
    assert dead.status_code == 200, dead.text
    assert dead.json()["state"] == "dead"
    assert receive(live) == []

    dlq = live.client.get("/v1/dlq", params={"queue": "emails"})
    assert dlq.status_code == 200, dlq.text
    [entry] = dlq.json()
    assert entry["key"] == "mail:1" and entry["queue"] == "emails"
    assert entry["error"] == "mailbox does not exist"
    assert entry["kind"] == "nack_permanent"
    assert entry["attempt"] == 2
    assert entry["payload"] == {"to": "a@b"}
    assert [e["error"] for e in entry["errors"]] == ["smtp timeout", "mailbox does not exist"]
    assert live.client.get("/v1/dlq", params={"queue": "elsewhere"}).json() == []

    # Redrive sends it back with a fresh budget.
    redriven = live.client.post("/v1/dlq/redrive", json={"keys": ["mail:1"]})
    assert redriven.status_code == 200, redriven.text
    assert redriven.json() == {"keys": ["mail:1"]}
    assert live.client.get("/v1/dlq").json() == []
    [third] = receive(live)
    assert third["key"] == "mail:1"
    assert live.client.post("/v1/queue/ack", json={"receipt": third["receipt"]}).status_code == 200


def test_a_nack_with_default_backoff_is_retryable(live: Live) -> None:
    live.client.post("/v1/queue/publish", json={"queue": "emails", "message": {}, "key": "b"})
    [job] = receive(live)
    nack = live.client.post("/v1/queue/nack", json={"receipt": job["receipt"]})
    assert nack.status_code == 200, nack.text
    assert nack.json()["state"] == "retryable"
    stored = live.app.queue.get("emails/b")
    assert stored is not None and stored.last_error == "nacked by consumer"


def test_discard_cancels_a_dead_job(live: Live) -> None:
    live.client.post("/v1/queue/publish", json={"queue": "emails", "message": {}, "key": "x"})
    [job] = receive(live)
    live.client.post("/v1/queue/nack", json={"receipt": job["receipt"], "permanent": True})
    discarded = live.client.post("/v1/dlq/discard", json={"keys": ["x", "never-existed"]})
    assert discarded.status_code == 200, discarded.text
    assert discarded.json() == {"keys": ["x"]}
    stored = live.app.queue.get("emails/x")
    assert stored is not None and stored.state is JobState.CANCELLED


def test_publish_batch_reports_duplicates(live: Live) -> None:
    live.client.post("/v1/queue/publish", json={"queue": "cleanup", "message": {}, "key": "r1:0"})
    body = {
        "queue": "cleanup",
        "messages": [{"start_id": 0}, {"start_id": 50000}, {"start_id": 100000}],
        "keys": ["r1:0", "r1:50000", "r1:100000"],
    }
    first = live.client.post("/v1/queue/publish_batch", json=body)
    assert first.status_code == 200, first.text
    assert first.json() == {
        "results": [
            {"key": "r1:0", "queue": "cleanup", "enqueued": False},
            {"key": "r1:50000", "queue": "cleanup", "enqueued": True},
            {"key": "r1:100000", "queue": "cleanup", "enqueued": True},
        ],
        "enqueued": 2,
        "duplicates": 1,
    }
    again = live.client.post("/v1/queue/publish_batch", json=body).json()
    assert (again["enqueued"], again["duplicates"]) == (0, 3)
    assert [r["enqueued"] for r in again["results"]] == [False, False, False]
    assert live.app.queue.pending("cleanup") == 3

    # The same key twice in one batch is enqueued once.
    twice = live.client.post(
        "/v1/queue/publish_batch",
        json={"queue": "cleanup", "messages": [{"n": 1}, {"n": 2}], "keys": ["d", "d"]},
    )
    assert twice.status_code == 200, twice.text
    assert (twice.json()["enqueued"], twice.json()["duplicates"]) == (1, 1)
    assert live.app.queue.pending("cleanup") == 4

    # Without keys every message is new.
    fresh = live.client.post(
        "/v1/queue/publish_batch", json={"queue": "cleanup", "messages": [{}, {}]}
    ).json()
    assert fresh["enqueued"] == 2 and fresh["duplicates"] == 0
    assert len({r["key"] for r in fresh["results"]}) == 2

    jobs = receive(live, "cleanup", max=100)
    assert sorted(str(j["key"]) for j in jobs if str(j["key"]).startswith("r1:")) == [
        "r1:0",
        "r1:100000",
        "r1:50000",
    ]


def test_publish_batch_with_the_wrong_number_of_keys_is_422(sqlite_live: Live) -> None:
    live = sqlite_live  # validation, before any database work
    response = live.client.post(
        "/v1/queue/publish_batch", json={"queue": "q", "messages": [{}, {}], "keys": ["only-one"]}
    )
    message = assert_error(response, 422, "invalid_request")
    assert "keys has 1 items for 2 messages" in message
    assert live.app.queue.pending() == 0
