"""Safe to expose: each finding of an outsider holding one ordinary key, tried
again against the real server over a socket. expiry's own jobs cannot be
named, received or mistaken for a run's; keys do what their scopes say; cron
calls reach only global addresses, within one deadline, on threads of their
own; a poison message hurts nobody else; and requests without a key cost the
server nothing before their 401 or 429."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from _http_live import Live, Serve, assert_error

from expiry.keys import Keys
from expiry.queue.jobs import new_job
from expiry.times import format_time
from expiry.types import JobState

POLICY = "expired-sessions"


def key(live: Live, name: str, *scopes: str) -> httpx.Client:
    """A client with a new key holding ``scopes`` (made through the server's own
    key cache, so it works at once)."""
    return live.new_client(live.app.keys.create(name, scopes))


# -- two worlds in one queue -----------------------------------------------------------


def test_expirys_own_queues_cannot_be_published_to_or_received_from(live: Live) -> None:
    live.db.insert_sessions(expired=300, live=10)
    opened = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY}).json()
    for queue in ("expiry.cron", f"expiry.policy.{POLICY}"):
        received = live.client.post("/v1/queue/receive", json={"queue": queue, "max": 100})
        assert "reserved" in assert_error(received, 422, "invalid_request")
        published = live.client.post("/v1/queue/publish", json={"queue": queue, "message": {}})
        assert "reserved" in assert_error(published, 422, "invalid_request")
    # A consumer of "default" (where expiry's jobs used to wait) gets none of them.
    default = live.client.post("/v1/queue/receive", json={"queue": "default", "max": 100})
    assert default.json()["jobs"] == []
    assert live.app.worker(until_idle=True, poll=0.05).run() == 0
    summary = live.client.get(f"/v1/runs/{opened['run_id']}").json()
    assert summary["state"] == "finished" and live.db.count() == 10


def test_publish_without_a_queue_goes_to_the_public_default_queue(live: Live) -> None:
    """As the seed articles' clients send it; expiry's own work is not there
    (its queues are reserved), and a key scoped to other queues may not."""
    one = live.client.post("/v1/queue/publish", json={"message": {"n": 1}})
    assert one.status_code == 200 and one.json()["queue"] == "default", one.text
    batch = live.client.post("/v1/queue/publish_batch", json={"messages": [{"n": 2}, {"n": 3}]})
    assert batch.status_code == 200, batch.text
    assert {r["queue"] for r in batch.json()["results"]} == {"default"}
    got = live.client.post("/v1/queue/receive", json={"max": 10}).json()["jobs"]
    assert sorted(j["message"]["n"] for j in got) == [1, 2, 3]
    assert {j["queue"] for j in got} == {"default"}
    scoped = key(live, "orders-only", "queue:publish:orders.*")
    refused = scoped.post("/v1/queue/publish", json={"message": {}})
    assert "queue:publish:default" in assert_error(refused, 403)


def test_a_published_message_is_never_part_of_a_run(live: Live) -> None:
    """A message carrying an earlier run's id, delayed ten years, does not make
    later runs wait for it; a message keyed like a run's planning job is its
    queue's own key and does not take the run's place; a queue named like one
    of expiry's own keys is refused."""
    live.db.insert_sessions(expired=50, live=0)
    first = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY}).json()
    assert live.app.worker(until_idle=True, poll=0.05).run() == 0
    squatter = live.client.post(
        "/v1/queue/publish",
        json={
            "queue": "mail",
            "message": {"run_id": first["run_id"], "policy": POLICY},
            "delay_seconds": 10 * 365 * 86400,
        },
    )
    assert squatter.status_code == 200, squatter.text
    live.db.insert_sessions(expired=40)  # the first run deleted ids 1..50
    time.sleep(1.1)  # a later cutoff (whole seconds) than the first run's
    later = live.app.engine.now().replace(microsecond=0)
    plan_key = f"{POLICY}:{format_time(later)}:plan"
    mine = live.client.post(
        "/v1/queue/publish", json={"queue": "mail", "message": {}, "key": plan_key}
    )
    assert mine.json() == {"key": plan_key, "queue": "mail", "enqueued": True}
    shaped = live.client.post(
        "/v1/queue/publish", json={"queue": "cron:x", "message": {}, "key": "k"}
    )
    assert "expiry's own job keys" in assert_error(shaped, 422)
    second = live.client.post(
        "/v1/cleanup/trigger", json={"policy": POLICY, "cutoff": format_time(later)}
    ).json()
    assert live.app.worker(until_idle=True, poll=0.05).run() == 0
    summary = live.client.get(f"/v1/runs/{second['run_id']}").json()
    assert summary["state"] == "finished", summary
    assert live.db.count() == 0
    assert live.app.queue.pending() == 2  # the squatter and the plan-keyed message wait


def test_a_run_whose_planning_key_is_taken_says_so(live: Live) -> None:
    """A job holding a run's planning key (enqueued by the application's own
    code, which the API refuses) makes the trigger fail with the reason
    instead of a run that stays in planning forever."""
    live.db.insert_sessions(expired=5, live=0)
    cutoff = live.app.engine.now().replace(microsecond=0)
    live.app.queue.enqueue_many(
        [new_job("mine", {}, key=f"{POLICY}:{format_time(cutoff)}:plan", queue="mine")]
    )
    refused = live.client.post(
        "/v1/cleanup/trigger", json={"policy": POLICY, "cutoff": format_time(cutoff)}
    )
    assert "held by another job" in assert_error(refused, 409, "key_conflict")
    assert live.client.get("/v1/runs").json() == []


# -- scoped keys --------------------------------------------------------------------


def test_a_queue_scoped_key_publishes_and_consumes_only_its_queues(live: Live) -> None:
    orders = key(live, "orders", "queue:publish:orders.*", "queue:consume:orders.*")
    ok = orders.post("/v1/queue/publish", json={"queue": "orders.paid", "message": {"n": 1}})
    assert ok.status_code == 200, ok.text
    other = orders.post("/v1/queue/publish", json={"queue": "emails", "message": {}})
    assert "queue:publish:emails" in assert_error(other, 403, "forbidden")
    assert_error(orders.post("/v1/queue/receive", json={"queue": "emails"}), 403)
    [job] = orders.post("/v1/queue/receive", json={"queue": "orders.paid"}).json()["jobs"]
    assert orders.post("/v1/queue/ack", json={"receipt": job["receipt"]}).status_code == 200
    for route, body in (
        ("/v1/cleanup/trigger", {"policy": POLICY}),
        (
            "/v1/cron/create",
            {"name": "x", "http_url": "https://example.com/", "schedule": "@daily"},
        ),
        ("/v1/dlq/redrive", {"all": True}),
        ("/v1/runs/cancel", {"run_id": "x"}),
    ):
        assert_error(orders.post(route, json=body), 403, "forbidden")
    assert_error(orders.get("/v1/runs"), 403, "forbidden")
    assert_error(orders.get("/v1/cron"), 403, "forbidden")


def test_cron_targets_belong_to_the_key_that_made_them(serve: Serve, sqlite_url: str) -> None:
    live = serve(sqlite_url, http={"allowed_hosts": ["127.0.0.1:*"]})
    alice = key(live, "alice", "cron:manage")
    bob = key(live, "bob", "cron:manage")
    made = alice.post(
        "/v1/cron/create",
        json={"name": "alices", "http_url": "http://127.0.0.1:9/", "schedule": "@daily"},
    )
    assert made.status_code == 201 and made.json()["owner"] == "alice"
    assert [t["name"] for t in alice.get("/v1/cron").json()] == ["alices"]
    assert bob.get("/v1/cron").json() == []
    for method, path in (
        ("GET", "/v1/cron/alices"),
        ("GET", "/v1/cron/alices/calls"),
        ("POST", "/v1/cron/alices/pause"),
        ("POST", "/v1/cron/alices/resume"),
        ("DELETE", "/v1/cron/alices"),
    ):
        assert_error(bob.request(method, path), 404, "not_found")
    assert live.client.get("/v1/cron/alices").status_code == 200  # admin sees every target
    assert alice.delete("/v1/cron/alices").status_code == 200


def test_a_key_owns_at_most_its_quota_of_cron_targets(serve: Serve, sqlite_url: str) -> None:
    """Past [http] max_cron_targets_per_key a key's create gets 403
    quota_exceeded naming the limit; another key and the operator's CLI still
    create; deleting one makes room again."""
    live = serve(sqlite_url, http={"allowed_hosts": ["127.0.0.1:*"], "max_cron_targets_per_key": 2})
    alice = key(live, "alice", "cron:manage")
    bob = key(live, "bob", "cron:manage")

    def create(client: httpx.Client, name: str) -> httpx.Response:
        body = {"name": name, "http_url": "http://127.0.0.1:9/", "schedule": "@daily"}
        return client.post("/v1/cron/create", json=body)

    assert [create(alice, n).status_code for n in ("a1", "a2")] == [201, 201]
    refused = assert_error(create(alice, "a3"), 403, "quota_exceeded")
    assert "max_cron_targets_per_key = 2" in refused and "'alice' owns 2" in refused
    assert create(bob, "b1").status_code == 201
    live.app.crons.create("operators", "http://127.0.0.1:9/", "@daily")  # no owner
    assert alice.delete("/v1/cron/a1").status_code == 200
    assert create(alice, "a3").status_code == 201
    assert live.app.engine.cron_get("a3") is not None


def test_a_read_key_reads_and_changes_nothing(live: Live) -> None:
    reader = key(live, "grafana", "read")
    assert reader.get("/v1/runs").status_code == 200
    assert reader.get("/v1/policies").status_code == 200
    assert_error(reader.post("/v1/cleanup/trigger", json={"policy": POLICY}), 403)
    assert_error(reader.post(f"/v1/policies/{POLICY}/pause"), 403)
    assert_error(reader.post("/v1/queue/publish", json={"queue": "q", "message": {}}), 403)


def test_a_consumer_works_the_dead_jobs_of_its_queues_only(live: Live) -> None:
    live.app.queue.enqueue("orders.paid", {}, key="o-1", queue="orders.paid", max_attempts=1)
    live.app.queue.enqueue("emails", {}, key="e-1", queue="emails", max_attempts=1)
    assert live.app.worker(queues=("orders.paid", "emails"), until_idle=True).run() == 0
    orders = key(live, "orders", "queue:consume:orders.*")
    assert [j["key"] for j in orders.get("/v1/dlq").json()] == ["o-1"]
    assert_error(orders.get("/v1/dlq", params={"queue": "emails"}), 403)
    # Another queue's job is answered as one that is not there: nothing done,
    # nothing told (it used to be 403, which said the key exists).
    for verb in ("discard", "redrive"):
        for name in ("e-1", "no-such-job"):
            answer = orders.post(f"/v1/dlq/{verb}", json={"keys": [name]})
            assert answer.status_code == 200 and answer.json()["keys"] == [], (verb, name)
    assert orders.post("/v1/dlq/redrive", json={"keys": ["o-1"]}).json()["keys"] == ["o-1"]
    assert sorted(j["key"] for j in live.client.get("/v1/dlq").json()) == ["e-1"]


def test_keys_made_before_scopes_keep_working_as_admin(live: Live) -> None:
    """The fixture's key was made as keys were before migration 0009 (no scope
    named): it may do everything."""
    [tests] = [k for k in Keys(live.app.engine).all() if k.name == "tests"]
    assert tests.scopes == ("admin",)
    assert live.client.get("/v1/cron").status_code == 200
    assert live.client.get("/v1/runs").status_code == 200


# -- outgoing calls ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://100.64.0.1/",  # shared address space (carrier-grade NAT)
        "http://100.100.100.200/latest/meta-data/",  # a cloud's metadata service
        "http://192.88.99.1/",  # the 6to4 relay anycast block
        "http://[2002:7f00:1::]/",  # 6to4 wrapping 127.0.0.1
        "http://[fec0::1]/",  # IPv6 site-local
        "http://[64:ff9b::7f00:1]/",  # NAT64 wrapping 127.0.0.1
        "http://[::127.0.0.1]/",  # IPv4-compatible IPv6 wrapping 127.0.0.1
        "http://127.0.0.1:2/",  # allowed is port 1 only
    ],
)
def test_a_non_global_target_is_refused_unless_its_host_and_port_are_allowed(
    serve: Serve, sqlite_url: str, url: str
) -> None:
    live = serve(sqlite_url, http={"allowed_hosts": ["127.0.0.1:1"]})
    refused = live.client.post(
        "/v1/cron/create", json={"name": "probe", "http_url": url, "schedule": "@daily"}
    )
    assert "allowed_hosts" in assert_error(refused, 422)
    ok = live.client.post(
        "/v1/cron/create",
        json={"name": "fine", "http_url": "http://127.0.0.1:1/", "schedule": "@daily"},
    )
    assert ok.status_code == 201, ok.text


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/a b", "http://127.0.0.1:1/a\r\nX-Evil: 1"])
def test_a_cron_url_with_a_space_or_a_line_break_is_refused(
    serve: Serve, sqlite_url: str, url: str
) -> None:
    """Such a URL was stored, then every call failed (or split the request)."""
    live = serve(sqlite_url, http={"allowed_hosts": ["127.0.0.1:1"]})
    refused = live.client.post(
        "/v1/cron/create", json={"name": "spaced", "http_url": url, "schedule": "@daily"}
    )
    assert "percent-encode" in assert_error(refused, 422)
    assert live.app.engine.cron_get("spaced") is None


@contextmanager
def dripping_target(interval: float) -> Iterator[int]:
    """A server that answers every request with one byte every ``interval``
    seconds, forever; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000:
                if stop.wait(interval):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed as the test ends
                return
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def test_a_dripping_target_is_cut_at_the_deadline_and_never_holds_cleanup(
    serve: Serve, pg_url: str
) -> None:
    """Two targets that drip a byte every half second: each call ends at its
    2 s deadline, and a cleanup run on the same worker finishes meanwhile
    (cron calls have threads of their own)."""
    live = serve(pg_url, http={"allowed_hosts": ["127.0.0.1:*"], "call_timeout": "2s"})
    live.db.insert_sessions(expired=2000, live=10)
    with dripping_target(0.5) as port:
        for name in ("slow-a", "slow-b"):
            made = live.client.post(
                "/v1/cron/create",
                json={"name": name, "http_url": f"http://127.0.0.1:{port}/", "schedule": "@daily"},
            )
            assert made.status_code == 201, made.text
            now = live.app.engine.now()
            assert live.app.crons.call_now(name, now, actor="test")
        worker = live.app.worker(concurrency=1, poll=0.05)
        thread = threading.Thread(target=worker.run)
        began = time.monotonic()
        thread.start()
        try:
            opened = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY}).json()
            summary = live.app.runs.wait(opened["run_id"], timeout=20)
            cleaned_in = time.monotonic() - began
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not all(
                live.client.get(f"/v1/cron/{n}/calls").json() for n in ("slow-a", "slow-b")
            ):
                time.sleep(0.1)
        finally:
            worker.stop()
            thread.join(30)
    assert summary["state"] == "finished" and live.db.count() == 10
    assert cleaned_in < 2.0, cleaned_in  # not behind the two 2 s calls
    for name in ("slow-a", "slow-b"):
        calls = live.client.get(f"/v1/cron/{name}/calls").json()
        assert calls, name
        for call in calls:  # the first, and any retry begun before the worker stopped
            assert call["error"].startswith("TimeoutError") and "2 s" in call["error"], call
            assert 1900 <= call["duration_ms"] < 3500, call


def test_a_cron_targets_own_timeout_cuts_its_calls_and_can_be_changed_back(
    serve: Serve, pg_url: str
) -> None:
    """A target's timeout_seconds is its calls' deadline instead of [http]
    call_timeout; changed over the API (audited), the next call keeps the new
    one; null goes back to the config's; out of range is 422 and changes
    nothing."""
    live = serve(pg_url, http={"allowed_hosts": ["127.0.0.1:*"], "call_timeout": "1500ms"})
    with dripping_target(0.5) as port:
        url = f"http://127.0.0.1:{port}/"
        for body in ({"timeout_seconds": 0}, {"timeout_seconds": 601}):
            refused = live.client.post(
                "/v1/cron/create",
                json={"name": "bad", "http_url": url, "schedule": "@daily", **body},
            )
            assert refused.status_code == 422, refused.text
        assert live.app.engine.cron_get("bad") is None
        made = live.client.post(
            "/v1/cron/create",
            json={"name": "short", "http_url": url, "schedule": "@daily", "timeout_seconds": 0.5},
        )
        assert made.status_code == 201 and made.json()["timeout_seconds"] == 0.5, made.text

        def call_once() -> dict[str, Any]:
            before = len(live.client.get("/v1/cron/short/calls").json())
            assert live.app.crons.call_now("short", live.app.engine.now(), actor="test")
            [job] = live.app.queue.claim(1, 60, owner="test", queues=("expiry.cron",))
            live.app.worker().process(job)
            calls = live.client.get("/v1/cron/short/calls").json()
            assert len(calls) == before + 1, calls
            return max(calls, key=lambda c: c["at"])

        first = call_once()
        assert first["error"].startswith("TimeoutError"), first
        assert 400 <= first["duration_ms"] < 1200, first  # its own 0.5 s, not 1.5 s

        changed = live.client.patch("/v1/cron/short", json={"timeout_seconds": 1.0})
        assert changed.status_code == 200 and changed.json()["timeout_seconds"] == 1.0
        assert 900 <= call_once()["duration_ms"] < 1400

        refused = live.client.patch("/v1/cron/short", json={"timeout_seconds": -1})
        assert refused.status_code == 422
        back = live.client.patch("/v1/cron/short", json={"timeout_seconds": None})
        assert back.status_code == 200 and back.json()["timeout_seconds"] is None
        assert 1400 <= call_once()["duration_ms"] < 2200  # [http] call_timeout again
    updates = [
        e.detail
        for e in live.app.engine.audit_list(limit=100)
        if e.action == "cron.updated" and e.detail.get("name") == "short"
    ]
    assert {"from": 0.5, "to": 1.0} in [u.get("timeout_seconds") for u in updates]
    assert {"from": 1.0, "to": None} in [u.get("timeout_seconds") for u in updates]


# -- limits before work ------------------------------------------------------------------


def test_a_poison_message_goes_to_the_dead_letters_alone(live: Live) -> None:
    """A message nested too deep to send (enqueued before messages were bounded,
    or by the application's own code): the batch it lands in is delivered
    without it, it is dead with the reason, and the DLQ still lists."""
    deep: dict[str, object] = {"leaf": 1}
    for _ in range(300):
        deep = {"a": deep}
    live.app.queue.enqueue_many(
        [
            new_job("q", {"n": 1}, key="good-1", queue="q"),
            new_job("q", deep, key="poison", queue="q"),
            new_job("q", {"n": 2}, key="good-2", queue="q"),
        ]
    )
    got = live.client.post("/v1/queue/receive", json={"queue": "q", "max": 10})
    assert got.status_code == 200, got.text
    assert sorted(j["key"] for j in got.json()["jobs"]) == ["good-1", "good-2"]
    poison = live.app.queue.get("poison")
    assert poison is not None and poison.state.value == "dead"
    assert poison.last_error_kind == "undeliverable"
    dlq = live.client.get("/v1/dlq")
    assert dlq.status_code == 200 and [j["key"] for j in dlq.json()] == ["poison"]


def test_a_request_without_a_key_is_answered_before_its_body_is_read(
    serve: Serve, sqlite_url: str
) -> None:
    live = serve(
        sqlite_url,
        http={
            "max_body_bytes": 32 * 1024 * 1024,
            "anonymous_rate_limit_per_second": 1,
            "anonymous_rate_limit_burst": 3,
        },
    )
    stranger = live.new_client()
    huge = b'{"queue": "q", "message": {"pad": "' + b"x" * 15_000_000 + b'"}}'
    began = time.monotonic()
    refused = stranger.post(
        "/v1/queue/publish", content=huge, headers={"Content-Type": "application/json"}
    )
    assert_error(refused, 401, "unauthorized")
    assert time.monotonic() - began < 2.0
    codes = [stranger.get("/v1/runs").status_code for _ in range(4)]
    assert codes[-1] == 429 and 429 not in codes[:2]
    assert live.client.get("/v1/runs").status_code == 200  # a key has its own bucket


def raw_request(live: Live, head: bytes, body: bytes) -> bytes:
    """Send bytes no HTTP client would (a header that is not UTF-8) over a socket."""
    host, port = live.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_bad_headers_and_identifiers_are_4xx_not_500(live: Live) -> None:
    publish = {"queue": "q", "message": {}}
    answer = raw_request(
        live,
        b"POST /v1/queue/publish HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: Bearer " + live.key.encode() + b"\r\n"
        b"Content-Type: application/json\r\nIdempotency-Key: \xff\xfe\r\n",
        b'{"queue": "q", "message": {}}',
    )
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"invalid_idempotency_key" in answer
    long = live.client.post(
        "/v1/queue/publish", json=publish, headers={"Idempotency-Key": "k" * 3000}
    )
    assert_error(long, 400, "invalid_idempotency_key")
    batch = {"queue": "q", "messages": [{}], "keys": ["k" * 3000]}
    assert_error(live.client.post("/v1/queue/publish_batch", json=batch), 422)
    for receipt in (f"{2**70}.1.x", "1.99999999999.x", "-5.1.x"):
        assert_error(live.client.post("/v1/queue/ack", json={"receipt": receipt}), 422)


def test_nack_after_the_lease_expired_is_409(live: Live) -> None:
    live.client.post("/v1/queue/publish", json={"queue": "q", "message": {}})
    [job] = live.client.post("/v1/queue/receive", json={"queue": "q", "lease_seconds": 0.2}).json()[
        "jobs"
    ]
    time.sleep(0.4)
    late = live.client.post("/v1/queue/nack", json={"receipt": job["receipt"]})
    assert_error(late, 409, "receipt_expired")


def test_a_chunked_body_over_the_limit_is_413(serve: Serve, sqlite_url: str) -> None:
    live = serve(sqlite_url, http={"max_body_bytes": 4096})

    def chunks() -> Iterator[bytes]:
        yield b'{"queue": "q", "message": {"pad": "'
        for _ in range(10):
            yield b"x" * 1024
        yield b'"}}'

    answer = live.client.post(
        "/v1/queue/publish", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert_error(answer, 413, "body_too_large")


def test_idempotent_replays_count_against_the_rate_limit(serve: Serve, sqlite_url: str) -> None:
    live = serve(sqlite_url, http={"rate_limit_per_second": 0.5, "rate_limit_burst": 3})
    publish = {"queue": "q", "message": {}}
    codes = [
        live.client.post(
            "/v1/queue/publish", json=publish, headers={"Idempotency-Key": "same"}
        ).status_code
        for _ in range(5)
    ]
    assert codes[:3] == [200, 200, 200] and codes[-1] == 429


def test_metrics_labels_are_bounded_and_can_need_a_key(
    serve: Serve, sqlite_url: str, tmp_path: Path
) -> None:
    live = serve(sqlite_url, http={"metrics_queues": ["emails"]})
    live.app.queue.enqueue_many(new_job("x", {}, queue=f"caller-{i}") for i in range(50))
    live.app.queue.enqueue("emails", {}, queue="emails")
    text = live.new_client().get("/metrics").text
    queues = {
        line.split('queue="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("expiry_jobs{")
    }
    assert queues == {"emails", "other"}
    assert 'expiry_jobs{queue="other",state="available"} 50.0' in text
    guarded = serve(f"sqlite:///{tmp_path / 'guarded.db'}", http={"metrics_key": True})
    assert_error(guarded.new_client().get("/metrics"), 401)
    assert guarded.client.get("/metrics").status_code == 200
    reader = key(guarded, "grafana", "read")
    assert reader.get("/metrics").status_code == 200
    assert_error(key(guarded, "writer", "queue:publish:*").get("/metrics"), 403)


def test_a_key_with_surrounding_white_space_is_422_and_shadows_nothing_on_mariadb(
    mysql_url: str, serve: Serve
) -> None:
    """MariaDB compares "invoice-43 " and "invoice-43" as one key (PAD SPACE): the
    first, published by one key, made another's publish of the second fail with
    500. Such a key is refused, on every engine, and the other's goes in."""
    live = serve(mysql_url)
    other = key(live, "billing", "queue:publish:billing")
    for body in (
        {"queue": "orders.x", "message": {}, "key": "invoice-43 "},
        {"queue": "orders.x", "messages": [{}], "keys": [" invoice-43"]},
    ):
        path = "/v1/queue/publish" if "message" in body else "/v1/queue/publish_batch"
        message = assert_error(live.client.post(path, json=body), 422)
        assert "white space" in message
    published = other.post(
        "/v1/queue/publish", json={"queue": "billing", "message": {}, "key": "invoice-43"}
    )
    assert published.status_code == 200, published.text
    assert published.json()["enqueued"] is True


def test_a_dedupe_key_is_its_queues_own(live: Live) -> None:
    """One publisher's key in its queue (ten years away) used to make another's
    publish of that key to its own queue answer 200 enqueued:false: dropped,
    its consumer never saw it, and the answer told that the key existed
    somewhere. Dedupe keys are now each queue's own: the same key in two queues
    is two messages, each received under the key its publisher gave, and a
    duplicate in the queue itself is still the dedupe working."""
    pub = key(live, "pub", "queue:publish:orders.*")
    other = key(live, "billing", "queue:publish:billing", "queue:consume:billing")
    year = 366 * 86400
    first = pub.post(
        "/v1/queue/publish",
        json={"queue": "orders.x", "message": {}, "key": "invoice-42", "delay_seconds": 10 * year},
    )
    assert first.json()["enqueued"] is True
    mine = other.post(
        "/v1/queue/publish",
        json={"queue": "billing", "message": {"n": 1}, "key": "invoice-42"},
    )
    assert mine.json() == {"key": "invoice-42", "queue": "billing", "enqueued": True}
    batch = other.post(
        "/v1/queue/publish_batch",
        json={
            "queue": "billing",
            "messages": [{"n": 2}, {"n": 3}],
            "keys": ["invoice-42", "invoice-44"],
        },
    ).json()
    # The seeds' shape: results, enqueued, duplicates, and nothing of other queues.
    assert batch == {
        "results": [
            {"key": "invoice-42", "queue": "billing", "enqueued": False},
            {"key": "invoice-44", "queue": "billing", "enqueued": True},
        ],
        "enqueued": 1,
        "duplicates": 1,
    }
    again = pub.post(
        "/v1/queue/publish", json={"queue": "orders.x", "message": {}, "key": "invoice-42"}
    )
    assert again.status_code == 200 and again.json()["enqueued"] is False
    assert live.app.queue.pending("billing") == 2 and live.app.queue.pending("orders.x") == 1
    got = other.post("/v1/queue/receive", json={"queue": "billing", "max": 10}).json()["jobs"]
    assert sorted((j["key"], j["message"]["n"]) for j in got) == [
        ("invoice-42", 1),
        ("invoice-44", 3),
    ]


def test_a_dead_message_is_redriven_by_its_key_in_its_queue_only(live: Live) -> None:
    """The same dedupe key dead in two queues: /v1/dlq lists each under the key
    its publisher gave; a consumer's redrive of that key reaches its own
    queue's job only, and an operator's names the queue, or reaches both."""
    billing = key(live, "billing", "queue:publish:billing", "queue:consume:billing")
    for queue in ("billing", "orders.x"):
        published = live.client.post(
            "/v1/queue/publish", json={"queue": queue, "message": {"q": queue}, "key": "inv-1"}
        )
        assert published.json()["enqueued"] is True
        [job] = live.client.post("/v1/queue/receive", json={"queue": queue}).json()["jobs"]
        live.client.post("/v1/queue/nack", json={"receipt": job["receipt"], "permanent": True})
    listed = billing.get("/v1/dlq").json()
    assert [(d["key"], d["queue"]) for d in listed] == [("inv-1", "billing")]

    assert billing.post("/v1/dlq/redrive", json={"keys": ["inv-1"]}).json() == {"keys": ["inv-1"]}
    states = {q: live.app.queue.get(f"{q}/inv-1").state for q in ("billing", "orders.x")}  # type: ignore[union-attr]
    assert states == {"billing": JobState.AVAILABLE, "orders.x": JobState.DEAD}
    other = live.client.post("/v1/dlq/discard", json={"keys": ["inv-1"], "queue": "billing"})
    assert other.json() == {"keys": ["inv-1"]}
    assert live.app.queue.get("orders.x/inv-1").state is JobState.DEAD  # type: ignore[union-attr]
    both = live.client.post("/v1/dlq/redrive", json={"keys": ["inv-1"]})
    assert both.json() == {"keys": ["inv-1"]}
    assert live.app.queue.get("orders.x/inv-1").state is JobState.AVAILABLE  # type: ignore[union-attr]


def test_a_receipt_is_bound_to_its_queue(live: Live) -> None:
    """A consumer of billing that got hold of an orders receipt (a log line, a
    shared cache) cannot ack, nack or heartbeat it: 409 as for an expired
    receipt, and the job stays leased to its consumer, who acks it."""
    billing = key(live, "billing", "queue:consume:billing")
    orders = key(live, "orders", "queue:consume:orders.*")
    live.client.post("/v1/queue/publish", json={"queue": "orders.x", "message": {}, "key": "o1"})
    [job] = orders.post("/v1/queue/receive", json={"queue": "orders.x"}).json()["jobs"]
    receipt = job["receipt"]
    for path in ("/v1/queue/ack", "/v1/queue/nack", "/v1/queue/heartbeat"):
        assert_error(billing.post(path, json={"receipt": receipt}), 409, "receipt_expired")
    batch = billing.post("/v1/queue/ack_batch", json={"receipts": [receipt]})
    assert batch.json() == {"acked": [], "expired": [receipt]}
    stored = live.app.queue.get("orders.x/o1")
    assert stored is not None and stored.state is JobState.RUNNING and stored.attempt == 1
    assert orders.post("/v1/queue/ack_batch", json={"receipts": [receipt]}).json() == {
        "acked": [receipt],
        "expired": [],
    }


@pytest.mark.parametrize("url", ["sqlite_url", "pg_url", "mysql_url"])
def test_a_key_publishes_within_its_quotas_of_queues_jobs_and_bytes(
    serve: Serve, url: str, request: pytest.FixtureRequest
) -> None:
    """One publish key used to make 1,500 queues in 28 s, with no bound on jobs
    or bytes. Past [http] max_queues_per_key, max_pending_per_key or
    max_pending_bytes_per_key a publish is 429 quota_exceeded, naming the
    limit, with Retry-After, and enqueues nothing; another key, and the
    operator's admin key, are not held by it; a queue that drains makes room."""
    limits = {"max_queues_per_key": 2, "max_pending_per_key": 5, "max_pending_bytes_per_key": 1024}
    live = serve(request.getfixturevalue(url), http=limits)
    pub = key(live, "pub", "queue:publish:orders.*", "queue:consume:orders.*")
    other = key(live, "other", "queue:publish:billing")

    def publish(client: httpx.Client, queue: str, **message: object) -> httpx.Response:
        return client.post("/v1/queue/publish", json={"queue": queue, "message": message})

    assert publish(pub, "orders.a").status_code == 200
    assert publish(pub, "orders.b").status_code == 200
    refused = publish(pub, "orders.c")
    assert "max_queues_per_key = 2" in assert_error(refused, 429, "quota_exceeded")
    assert refused.headers["Retry-After"] == "5"
    assert live.app.queue.pending("orders.c") == 0
    batch = pub.post(
        "/v1/queue/publish_batch", json={"queue": "orders.a", "messages": [{}, {}, {}, {}]}
    )
    assert "max_pending_per_key = 5" in assert_error(batch, 429, "quota_exceeded")
    assert live.app.queue.pending("orders.a") == 1  # the batch enqueued nothing
    large = publish(pub, "orders.a", text="x" * 1100)
    assert "max_pending_bytes_per_key = 1024" in assert_error(large, 429, "quota_exceeded")
    # Another key's queues, and the operator's key, are not held by pub's.
    assert publish(other, "billing").status_code == 200
    assert publish(live.client, "orders.z").status_code == 200

    [job] = pub.post("/v1/queue/receive", json={"queue": "orders.b"}).json()["jobs"]
    assert pub.post("/v1/queue/ack", json={"receipt": job["receipt"]}).status_code == 200
    time.sleep(1.1)  # the counts are read again at most once a second
    assert publish(pub, "orders.c").status_code == 429  # orders.z now holds a job too
    assert live.app.queue.pending("orders.z") == 1
    [job] = live.client.post("/v1/queue/receive", json={"queue": "orders.z"}).json()["jobs"]
    assert live.client.post("/v1/queue/ack", json={"receipt": job["receipt"]}).status_code == 200
    time.sleep(1.1)
    assert publish(pub, "orders.c").status_code == 200
