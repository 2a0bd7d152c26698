"""Idempotency-Key over a real socket: the first answer is replayed (status, body and
an ``idempotent-replayed`` header), a different body is refused with 422, and a
duplicate that arrives while the first is still running gets 409.

The in-flight case is made for real: a test connection holds an ACCESS EXCLUSIVE
lock on the policy's table, so the first dry-run trigger waits inside the server
on PostgreSQL until the lock is let go, while the duplicate arrives."""

from __future__ import annotations

import sqlite3
import threading
import time

import httpx
import psycopg
from _http_live import Live, Serve, assert_error, wait_for

from expiry.keys import Keys


def jobs_in(live: Live, queue: str) -> int:
    return int(live.db.scalar("select count(*) from expiry.jobs where queue = %s", (queue,)))


def test_a_repeated_request_replays_the_first_answer(live: Live) -> None:
    # No dedupe key: a second execution would enqueue a second job.
    body = {"queue": "emails", "message": {"user_id": 7}}
    headers = {"Idempotency-Key": "signup-7"}
    first = live.client.post("/v1/queue/publish", json=body, headers=headers)
    assert first.status_code == 200, first.text
    assert "idempotent-replayed" not in first.headers
    for _ in range(2):
        again = live.client.post("/v1/queue/publish", json=body, headers=headers)
        assert again.status_code == 200
        assert again.json() == first.json()
        assert again.headers["idempotent-replayed"] == "true"
        assert again.headers["content-type"] == "application/json"
    assert jobs_in(live, "emails") == 1

    # Without the header, the same body runs again.
    plain = live.client.post("/v1/queue/publish", json=body)
    assert plain.json()["key"] != first.json()["key"]
    assert jobs_in(live, "emails") == 2

    # An error answer is the first answer too.
    headers = {"Idempotency-Key": "unknown-policy"}
    missing = live.client.post("/v1/cleanup/trigger", json={"policy": "nope"}, headers=headers)
    assert_error(missing, 404, "not_found")
    again = live.client.post("/v1/cleanup/trigger", json={"policy": "nope"}, headers=headers)
    assert again.status_code == 404 and again.json() == missing.json()
    assert again.headers["idempotent-replayed"] == "true"


def test_a_retry_right_after_the_answer_is_replayed_never_in_flight(live: Live) -> None:
    """The answer is stored before it is sent: a client that has it and retries at
    once gets the replay, never "still in progress"."""
    for i in range(25):
        headers = {"Idempotency-Key": f"quick-{i}"}
        body = {"queue": "emails", "message": {"i": i}}
        first = live.client.post("/v1/queue/publish", json=body, headers=headers)
        again = live.client.post("/v1/queue/publish", json=body, headers=headers)
        assert first.status_code == 200, first.text
        assert again.status_code == 200, again.text
        assert again.headers["idempotent-replayed"] == "true"
    assert jobs_in(live, "emails") == 25


def test_a_created_status_is_replayed_with_its_body(db_url: str, serve: Serve) -> None:
    live = serve(db_url, http={"allowed_hosts": ["127.0.0.1:*"]})
    body = {"name": "digest", "http_url": "http://127.0.0.1:9/hook", "schedule": "@daily"}
    headers = {"Idempotency-Key": "create-digest"}
    first = live.client.post("/v1/cron/create", json=body, headers=headers)
    assert first.status_code == 201, first.text
    again = live.client.post("/v1/cron/create", json=body, headers=headers)
    assert again.status_code == 201
    assert again.json() == first.json()  # the secret too: it is the first answer
    assert again.headers["idempotent-replayed"] == "true"
    # Without the header the name is taken.
    assert_error(live.client.post("/v1/cron/create", json=body), 422, "invalid_request")


def test_the_same_key_with_a_different_body_is_422(live: Live) -> None:
    headers = {"Idempotency-Key": "k-1"}
    first = live.client.post(
        "/v1/queue/publish", json={"queue": "emails", "message": {"n": 1}}, headers=headers
    )
    assert first.status_code == 200
    for path, body in (
        ("/v1/queue/publish", {"queue": "emails", "message": {"n": 2}}),
        # The path is part of the request, too.
        ("/v1/queue/publish_batch", {"queue": "emails", "messages": [{"n": 1}]}),
    ):
        refused = live.client.post(path, json=body, headers=headers)
        message = assert_error(refused, 422, "idempotency_key_reused")
        assert "different request body" in message
    assert jobs_in(live, "emails") == 1
    # The original still replays.
    replay = live.client.post(
        "/v1/queue/publish", json={"queue": "emails", "message": {"n": 1}}, headers=headers
    )
    assert replay.json() == first.json() and replay.headers["idempotent-replayed"] == "true"


def test_idempotency_keys_belong_to_one_api_key(live: Live) -> None:
    body = {"queue": "emails", "message": {"n": 1}}
    headers = {"Idempotency-Key": "shared"}
    mine = live.client.post("/v1/queue/publish", json=body, headers=headers)
    other = live.new_client(Keys(live.app.engine).create("other"))
    theirs = wait_for(
        lambda: (
            (r := other.post("/v1/queue/publish", json=body, headers=headers)).status_code != 401
            and r
        ),
        timeout=3,
        what="the new key",
    )
    assert theirs.status_code == 200
    assert "idempotent-replayed" not in theirs.headers
    assert theirs.json()["key"] != mine.json()["key"]
    assert jobs_in(live, "emails") == 2


def test_a_duplicate_in_flight_is_409(pg_url: str, serve: Serve) -> None:
    live = serve(pg_url)
    live.db.insert_sessions(expired=50, live=10)
    body = {"policy": "expired-sessions", "dry_run": True}
    headers = {"Idempotency-Key": "preview-1"}
    answers: dict[str, httpx.Response] = {}

    def first_request() -> None:
        answers["first"] = live.new_client(live.key).post(
            "/v1/cleanup/trigger", json=body, headers=headers
        )

    with psycopg.connect(pg_url) as blocker:
        blocker.execute("lock table sessions in access exclusive mode")
        thread = threading.Thread(target=first_request)
        thread.start()
        # Wait until the first request is inside the server, blocked on the lock.
        wait_for(
            lambda: live.db.scalar(
                "select count(*) from pg_stat_activity"
                " where wait_event_type = 'Lock' and datname = current_database()"
            ),
            timeout=10,
            what="the first request to wait on the lock",
        )
        assert "first" not in answers
        duplicate = live.client.post("/v1/cleanup/trigger", json=body, headers=headers)
        message = assert_error(duplicate, 409, "idempotency_in_flight")
        assert "still in progress" in message
        # The server is not stuck behind the blocked request: other calls are answered.
        assert live.client.get("/v1/health").status_code == 200
        started = time.monotonic()
        blocker.rollback()  # let go of the lock
    thread.join(30)
    assert time.monotonic() - started < 30
    first = answers["first"]
    assert first.status_code == 200, first.text
    assert first.json()["candidates"] == 50
    assert "idempotent-replayed" not in first.headers

    replay = live.client.post("/v1/cleanup/trigger", json=body, headers=headers)
    assert replay.status_code == 200
    assert replay.json() == first.json()
    assert replay.headers["idempotent-replayed"] == "true"


def test_a_blocked_idempotency_store_does_not_stall_the_server(
    sqlite_url: str, serve: Serve
) -> None:
    """On SQLite a long write transaction (a worker's window) holds the write lock;
    a request with an Idempotency-Key waits for it, but other requests must not."""
    live = serve(sqlite_url)
    answers: dict[str, httpx.Response] = {}

    def keyed_request() -> None:
        answers["keyed"] = live.new_client(live.key).post(
            "/v1/queue/publish",
            json={"queue": "emails", "message": {}},
            headers={"Idempotency-Key": "while-locked"},
        )

    blocker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        blocker.execute("begin immediate")
        thread = threading.Thread(target=keyed_request)
        thread.start()
        time.sleep(0.3)
        assert "keyed" not in answers
        # (Every SQLite transaction takes the write lock: ask something that needs none.)
        open_route = live.new_client().get("/v1/discovery", timeout=3)
        assert open_route.status_code == 200
        blocker.execute("rollback")
    finally:
        blocker.close()
    thread.join(30)
    assert answers["keyed"].status_code == 200, answers["keyed"].text
