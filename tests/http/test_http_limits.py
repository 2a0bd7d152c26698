"""Limits and bad input over a real socket: 413 for a message over 256 KiB and for a
body over [http] max_body_bytes (declared or streamed), 422 with a clear message for
bad JSON, wrong types and unknown fields, JSON errors for unknown routes, 503 with
Retry-After while the database cannot serve. Never 500."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
from _http_live import Live, Serve, assert_error
from psycopg.conninfo import make_conninfo

KIB = 1024


def test_a_message_over_256_kib_is_413_naming_the_limit(live: Live) -> None:
    big = {"blob": "x" * (256 * KIB)}
    for path, body in (
        ("/v1/queue/publish", {"queue": "emails", "message": big}),
        ("/v1/queue/publish_batch", {"queue": "emails", "messages": [{"n": 1}, big]}),
    ):
        message = assert_error(
            live.client.post(path, json=body, headers={"Idempotency-Key": path}),
            413,
            "message_too_large",
        )
        assert "256 KiB" in message and str(256 * KIB) in message
    assert live.app.queue.pending() == 0, "a batch is all or nothing"
    # Just under the limit is fine.
    fits = {"blob": "x" * (256 * KIB - 100)}
    ok = live.client.post("/v1/queue/publish", json={"queue": "emails", "message": fits})
    assert ok.status_code == 200, ok.text


def test_a_body_over_max_body_bytes_is_413(sqlite_url: str, serve: Serve) -> None:
    live = serve(sqlite_url, http={"max_body_bytes": 4096})
    body = json.dumps({"queue": "emails", "message": {"blob": "x" * 5000}}).encode()

    declared = live.client.post(
        "/v1/queue/publish", content=body, headers={"Content-Type": "application/json"}
    )
    message = assert_error(declared, 413, "body_too_large")
    assert "4096" in message

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    # Streamed (chunked, no Content-Length): counted as it arrives.
    streamed = live.client.post(
        "/v1/queue/publish",
        content=chunks(),
        headers={"Content-Type": "application/json", "Idempotency-Key": "big"},
    )
    assert "content-length" not in streamed.request.headers
    assert_error(streamed, 413, "body_too_large")
    assert live.app.queue.pending() == 0

    small = live.client.post(
        "/v1/queue/publish",
        json={"queue": "emails", "message": {"n": 1}},
        headers={"Idempotency-Key": "big"},
    )
    assert small.status_code == 200, small.text  # the refused body did not take the key


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("/v1/queue/publish", b'{"queue": "emails", "message": ', "JSON"),
    ("/v1/queue/publish", b"", ""),
    ("/v1/queue/publish", b"not json at all", "JSON"),
    ("/v1/queue/publish", b"\xff\xfe\x00garbage", ""),
    ("/v1/queue/publish", b"[]", ""),
    ("/v1/queue/publish", b"null", ""),
    ("/v1/queue/publish", b'{"queue": "emails", "message": "hello"}', "message"),
    ("/v1/queue/publish", b'{"queue": "emails", "message": {}, "colour": "red"}', "colour"),
    ("/v1/queue/publish", b'{"queue": "emails"}', "message"),
    ("/v1/queue/publish", b'{"queue": "has spaces", "message": {}}', "queue"),
    ("/v1/queue/publish", b'{"queue": "q", "message": {}, "delay_seconds": -1}', "delay_seconds"),
    (
        "/v1/queue/publish",
        b'{"queue": "q", "message": {}, "delay_seconds": "soon"}',
        "delay_seconds",
    ),
    ("/v1/queue/publish", b'{"queue": "q", "message": {}, "delay_seconds": NaN}', "delay_seconds"),
    (
        "/v1/queue/publish",
        b'{"queue": "q", "message": {}, "delay_seconds": Infinity}',
        "delay_seconds",
    ),
    ("/v1/queue/publish", b'{"queue": "q", "message": {}, "priority": 1e400}', "priority"),
    (
        "/v1/queue/publish",
        b'{"queue": "q", "message": {}, "priority": 10000000000000000000000}',
        "priority",
    ),
    ("/v1/queue/publish", b'{"queue": "q", "message": {}, "key": ""}', "key"),
    (
        "/v1/queue/publish",
        b'{"queue": "q", "message": {}, "run_at": "2030-01-01T00:00:00"}',
        "time zone",
    ),
    ("/v1/queue/publish", b'{"queue": "q", "message": {}, "run_at": "tomorrow"}', "run_at"),
    (
        "/v1/queue/publish",
        b'{"queue": "q", "message": {}, "run_at": "2030-01-01T00:00:00Z", "delay_seconds": 5}',
        "not both",
    ),
    # Scalars must have their JSON type: no "5" for a number, no "yes" or 1 for a boolean.
    ("/v1/queue/publish", b'{"queue": "q", "message": {}, "priority": "5"}', "priority"),
    ("/v1/queue/publish", b'{"queue": "q", "message": {}, "max_attempts": 2.0}', "max_attempts"),
    (
        "/v1/queue/publish",
        b'{"queue": "q", "message": {}, "delay_seconds": false}',
        "delay_seconds",
    ),
    ("/v1/queue/nack", b'{"receipt": "1.1.x", "permanent": 1}', "permanent"),
    ("/v1/cleanup/trigger", b'{"policy": "expired-sessions", "dry_run": "no"}', "dry_run"),
    ("/v1/dlq/redrive", b'{"all": "true"}', "all"),
    (
        "/v1/queue/publish",
        b'{"queue": "q", "message": {}, "run_at": "0001-01-01T00:00:00+14:00"}',
        "range",
    ),
    ("/v1/queue/publish_batch", b'{"messages": []}', "messages"),
    ("/v1/queue/publish_batch", b'{"messages": [1, 2]}', "messages"),
    ("/v1/queue/receive", b'{"queue": "emails", "max": 0}', "max"),
    ("/v1/queue/receive", b'{"queue": "emails", "lease_seconds": 0}', "lease_seconds"),
    ("/v1/queue/ack", b'{"receipt": "nonsense"}', "receipt"),
    ("/v1/queue/ack", b'{"receipt": 12345}', "receipt"),
    ("/v1/queue/nack", b'{"receipt": "1.x.y", "permanent": "maybe"}', "permanent"),
    (
        "/v1/cron/create",
        b'{"name": "Bad Name", "http_url": "https://a.b", "schedule": "@daily"}',
        "name",
    ),
    ("/v1/cleanup/trigger", b'{"policy": "expired-sessions", "dry_run": "yes please"}', "dry_run"),
    ("/v1/cleanup/trigger", b'{"policy": "expired-sessions", "cutoff": "last week"}', "cutoff"),
    ("/v1/dlq/redrive", b"{}", "keys"),
    ("/v1/dlq/discard", b'{"keys": []}', "keys"),
]


@pytest.mark.parametrize(
    ("path", "body", "named"), BAD_BODIES, ids=[f"{p}:{b[:30]!r}" for p, b, _ in BAD_BODIES]
)
def test_a_bad_body_is_422_with_a_clear_message(
    sqlite_live: Live, path: str, body: bytes, named: str
) -> None:
    response = sqlite_live.client.post(
        path, content=body, headers={"Content-Type": "application/json"}
    )
    message = assert_error(response, 422)
    assert response.json()["error"]["code"] in ("invalid_request", "invalid_receipt")
    assert named in message, message


def test_bad_bodies_on_postgres_are_422_too(pg_live: Live) -> None:
    for path, body, _ in BAD_BODIES:
        response = pg_live.client.post(
            path, content=body, headers={"Content-Type": "application/json"}
        )
        assert_error(response, 422)


def test_a_body_without_a_json_content_type_is_read_as_json(sqlite_live: Live) -> None:
    live = sqlite_live  # the routing and middleware do not depend on the engine
    body = json.dumps({"queue": "emails", "message": {"n": 1}})
    for content_type in (None, "application/x-www-form-urlencoded", "text/plain"):
        headers = {} if content_type is None else {"Content-Type": content_type}
        response = live.client.post("/v1/queue/publish", content=body, headers=headers)
        assert response.status_code == 200, (content_type, response.text)


def test_unknown_routes_and_methods_are_json_errors(sqlite_live: Live) -> None:
    live = sqlite_live  # the routing and middleware do not depend on the engine
    assert_error(live.client.get("/v1/nothing-here"), 404, "not_found")
    assert_error(live.client.get("/v1/queue/publish"), 405, "method_not_allowed")
    assert_error(live.client.delete("/v1/policies"), 405, "method_not_allowed")
    assert_error(live.client.get("/v1/runs/no-such-run"), 404, "not_found")
    assert_error(live.client.get("/v1/cron/no-such-target"), 404, "not_found")
    assert_error(live.client.post("/v1/policies/no-such-policy/pause"), 404, "not_found")


UNSTORABLE: list[tuple[str, bytes, str]] = [
    # Valid JSON that PostgreSQL's text and jsonb refuse: NUL and lone surrogates.
    ("/v1/queue/publish", rb'{"queue": "emails", "message": {"note": "a\u0000b"}}', "NUL"),
    ("/v1/queue/publish", rb'{"queue": "emails", "message": {"a\u0000": 1}}', "NUL"),
    ("/v1/queue/publish", rb'{"queue": "emails", "message": {"l": [["\u0000"]]}}', "NUL"),
    ("/v1/queue/publish", rb'{"queue": "emails", "message": {}, "key": "k\u0000"}', "key"),
    ("/v1/queue/publish", rb'{"queue": "emails", "message": {"s": "\ud800"}}', "surrogate"),
    ("/v1/queue/publish_batch", rb'{"queue": "q", "messages": [{"s": "\udfff x"}]}', "surrogate"),
    ("/v1/queue/publish_batch", rb'{"queue": "q", "messages": [{}], "keys": ["\u0000"]}', "keys"),
    ("/v1/queue/ack", rb'{"receipt": "1.1.a\u0000"}', "receipt"),
    ("/v1/queue/nack", rb'{"receipt": "1.1.a", "error": "\u0000"}', "error"),
    ("/v1/dlq/redrive", rb'{"keys": ["a\u0000"]}', "keys"),
    ("/v1/dlq/discard", rb'{"keys": ["\ud834"]}', "keys"),
    # Python's parser takes NaN and Infinity; they are not JSON numbers.
    ("/v1/queue/publish", b'{"queue": "emails", "message": {"x": NaN}}', "NaN"),
    ("/v1/queue/publish", b'{"queue": "emails", "message": {"x": [-Infinity]}}', "NaN"),
    # Nested deeper than the JSON parser goes.
    ("/v1/queue/publish", b'{"message": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001, "JSON"),
    ("/v1/queue/publish", b'{"message": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}", "JSON"),
    # Deeper than a message may be (a poison message that would break every
    # receive batch it lands in).
    (
        "/v1/queue/publish",
        b'{"queue": "q", "message": ' + b'{"a": ' * 300 + b"1" + b"}" * 301,
        "nested deeper than 32",
    ),
    # Cutoffs whose ISO-8601 text (in run ids and job payloads) would not parse back.
    (
        "/v1/cleanup/trigger",
        b'{"policy": "expired-sessions", "cutoff": "0001-01-01T00:00:00Z"}',
        "1970",
    ),
    (
        "/v1/cleanup/trigger",
        b'{"policy": "expired-sessions", "cutoff": "9999-12-31T23:59:59-14:00"}',
        "1970",
    ),
]


def test_what_the_database_cannot_store_is_422_not_500(live: Live) -> None:
    for path, body, named in UNSTORABLE:
        response = live.client.post(
            path, content=body, headers={"Content-Type": "application/json"}
        )
        message = assert_error(response, 422, "invalid_request")
        assert named in message, (body[:60], message)
    assert live.app.queue.pending() == 0
    assert live.client.get("/v1/runs").json() == []
    # Big integers and non-ASCII text are fine.
    ok = live.client.post(
        "/v1/queue/publish",
        json={"queue": "emails", "message": {"n": 10**30, "text": "déjà vu \U0001f600"}},
    )
    assert ok.status_code == 200, ok.text
    [job] = live.client.post("/v1/queue/receive", json={"queue": "emails"}).json()["jobs"]
    assert job["message"] == {"n": 10**30, "text": "déjà vu \U0001f600"}


def test_a_database_that_cannot_write_gets_503_with_retry_after_and_loses_nothing(
    pg_live: Live,
) -> None:
    dbname = pg_live.db.conn.info.dbname
    admin = psycopg.connect(make_conninfo(pg_live.db.url, dbname="postgres"), autocommit=True)
    try:
        admin.execute(f'alter database "{dbname}" set default_transaction_read_only = on')
        # Cut every session (the server's pool too), as a failover to a read-only node would.
        admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity"
            " where datname = %s and pid <> pg_backend_pid()",
            (dbname,),
        )
        body = {"queue": "emails", "message": {"n": 1}, "key": "mail-1"}
        for headers in ({}, {"Idempotency-Key": "retry-me"}):
            for _ in range(3):  # the first may meet a connection cut under it
                refused = pg_live.client.post("/v1/queue/publish", json=body, headers=headers)
                if refused.status_code == 503:
                    break
            message = assert_error(refused, 503, "unavailable")
            # A pooled connection back within the pool's idle-check second is not
            # checked: the request that meets it cut answers admin_shutdown.
            assert any(k in message for k in ("read_only", "connection_lost", "admin_shutdown"))
            assert refused.headers["retry-after"] == "1"
    finally:
        admin.execute(f'alter database "{dbname}" reset default_transaction_read_only')
        admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity"
            " where datname = %s and pid <> pg_backend_pid()",
            (dbname,),
        )
        admin.close()

    # The client's retry, with the same Idempotency-Key, is served once writes are back.
    for _ in range(3):
        ok = pg_live.client.post(
            "/v1/queue/publish", json=body, headers={"Idempotency-Key": "retry-me"}
        )
        if ok.status_code == 200:
            break
    assert ok.status_code == 200, ok.text
    assert ok.json()["enqueued"] is True
    assert pg_live.app.queue.pending() == 1
