"""Bearer keys over a real socket: 401 with a JSON error, revocation within about a
second, and 429 with Retry-After once a key is over its rate limit."""

from __future__ import annotations

import time

from _http_live import Live, Serve, assert_error, make_app, wait_for

from expiry.keys import Keys

PUBLISH = {"queue": "emails", "message": {"user_id": 42}}


def test_health_is_open_and_reports_the_engine(live: Live) -> None:
    response = live.new_client().get("/v1/health")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ok"] is True
    assert body["database"] == live.db.dialect


WRONG_AUTHORIZATION: list[dict[str, str]] = [
    {},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer exp_not-a-key-this-server-issued"},
    {"Authorization": "Basic dGVzdHM6c2VjcmV0"},
    {"Authorization": "exp_missing-the-bearer-word"},
]


def test_a_missing_or_wrong_key_is_401_json(live: Live) -> None:
    for headers in WRONG_AUTHORIZATION:
        client = live.new_client(**headers)
        for response in (
            client.get("/v1/policies"),
            client.get("/v1/dlq"),
            client.post("/v1/queue/publish", json=PUBLISH),
            # An Idempotency-Key does not let an unknown caller in, nor get stored for it.
            client.post("/v1/queue/publish", json=PUBLISH, headers={"Idempotency-Key": "i-1"}),
            client.get("/v1/discovery/queue.publish"),
        ):
            message = assert_error(response, 401, "unauthorized")
            assert "Authorization: Bearer" in message, headers
    assert live.app.queue.pending() == 0
    # The real key still works, and its Idempotency-Key i-1 was never taken.
    ok = live.client.post("/v1/queue/publish", json=PUBLISH, headers={"Idempotency-Key": "i-1"})
    assert ok.status_code == 200, ok.text
    assert "idempotent-replayed" not in ok.headers


def test_a_revoked_key_stops_working_within_a_second(live: Live) -> None:
    other_key = Keys(live.app.engine).create("other")
    client = live.new_client(other_key)
    assert client.get("/v1/policies").status_code == 200
    # Revoke from a separate App on the same database, as `expiry keys revoke` does.
    operator = make_app(live.db.url)
    try:
        assert Keys(operator.engine).revoke("other")
        assert not Keys(operator.engine).revoke("other")  # once
    finally:
        operator.close()
    revoked_at = time.monotonic()
    # A key made meanwhile is picked up as fast.
    newcomer = live.new_client(Keys(live.app.engine).create("newcomer"))
    wait_for(
        lambda: client.get("/v1/policies").status_code == 401,
        timeout=3,
        what="the revoked key to be refused",
    )
    assert time.monotonic() - revoked_at < 1.6
    assert newcomer.get("/v1/policies").status_code == 200
    assert_error(client.get("/v1/policies"), 401, "unauthorized")
    assert_error(client.post("/v1/queue/publish", json=PUBLISH), 401, "unauthorized")
    # The other key is untouched.
    assert live.client.get("/v1/policies").status_code == 200


def test_over_the_rate_limit_is_429_with_retry_after(sqlite_url: str, serve: Serve) -> None:
    # The buckets live in the server's memory: one engine is enough.
    live = serve(sqlite_url, http={"rate_limit_per_second": 1, "rate_limit_burst": 2})
    first, second = (live.client.get("/v1/policies") for _ in range(2))
    assert first.status_code == second.status_code == 200
    limited = live.client.post(
        "/v1/queue/publish", json=PUBLISH, headers={"Idempotency-Key": "after-429"}
    )
    message = assert_error(limited, 429, "rate_limited")
    assert "tests" in message
    retry_after = limited.headers["Retry-After"]
    assert retry_after.isdigit() and 1 <= int(retry_after) <= 2, retry_after
    assert live.app.queue.pending() == 0, "a refused request must not run"

    # The bucket is per key: another key has its own burst.
    other = live.new_client(Keys(live.app.engine).create("other"))
    wait_for(lambda: other.get("/v1/policies").status_code == 200, timeout=3, what="other key")

    # After Retry-After the same request goes through, and runs (the 429 was not stored
    # as the answer to its Idempotency-Key).
    time.sleep(int(retry_after))
    again = live.client.post(
        "/v1/queue/publish", json=PUBLISH, headers={"Idempotency-Key": "after-429"}
    )
    assert again.status_code == 200, again.text
    assert "idempotent-replayed" not in again.headers
    assert live.app.queue.pending() == 1
