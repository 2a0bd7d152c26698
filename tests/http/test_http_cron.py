"""Cron over HTTP, end to end: a target created through the API on a local receiver,
a scheduler tick past the next minute, a worker that makes the signed call, the
receiver checking the Standard Webhooks signature, and the call history over HTTP.
Private addresses are refused unless listed in [http] allowed_hosts."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from _http_live import Live, Receiver, Serve, assert_error, make_app

from expiry.cron import webhooks
from expiry.times import parse_time
from expiry.types import JobState

LOCAL = {"allowed_hosts": ["127.0.0.1:*"]}


def fire_and_work(live: Live, minutes: int = 1) -> list[object]:
    """Tick the scheduler at the database's now + ``minutes`` and one second, then run
    a worker until nothing is due."""
    at = live.app.engine.now() + timedelta(minutes=minutes, seconds=1)
    fired = live.app.scheduler(clock=lambda: at).tick()
    assert live.app.worker(until_idle=True, poll=0.05, rescue_every=0.2).run() == 0
    return list(fired)


def test_a_cron_target_gets_a_signed_call(db_url: str, serve: Serve) -> None:
    live = serve(db_url, http=LOCAL)
    with Receiver() as receiver:
        url = f"http://127.0.0.1:{receiver.port}/hooks/digest?team=7"
        created = live.client.post(
            "/v1/cron/create",
            json={"name": "digest", "http_url": url, "schedule": "* * * * *"},
        )
        assert created.status_code == 201, created.text
        target = created.json()
        secret = target.pop("secret")
        assert secret.startswith("whsec_")
        assert target["name"] == "digest" and target["http_url"] == url
        assert target["schedule"] == "* * * * *" and target["timezone"] == "UTC"
        assert target["paused"] is False
        shown = live.client.get("/v1/cron/digest").json()
        assert "secret" not in shown and shown["name"] == "digest"
        assert [t["name"] for t in live.client.get("/v1/cron").json()] == ["digest"]
        assert live.client.get("/v1/cron/digest/calls").json() == []

        fired = fire_and_work(live)
        assert [f.policy for f in fired] == ["cron:digest"]  # type: ignore[attr-defined]

        [(headers, body)] = receiver.calls
        assert webhooks.verify(secret, headers, body)
        assert not webhooks.verify(webhooks.new_secret(), headers, body)
        assert not webhooks.verify(secret, headers, body + b" ")
        assert headers["content-type"] == "application/json"
        assert headers["user-agent"] == "expiry-cron"
        assert headers["webhook-id"].startswith("msg_")
        payload = json.loads(body)
        assert payload["name"] == "digest" and payload["attempt"] == 1
        fire_time = payload["fire_time"]

        [call] = live.client.get("/v1/cron/digest/calls").json()
        assert call["status"] == 200 and call["error"] is None
        assert call["fire_time"] == fire_time and call["attempt"] == 1
        assert call["response"] == '{"ok": true}'
        assert call["duration_ms"] >= 0
        assert live.client.get("/v1/cron/digest").json()["last_fire_at"] == fire_time

        # A tick again within the fire's minute fires nothing new: the fire time
        # was claimed (read from the fire itself: the clock may have crossed
        # into the next minute meanwhile, which would be a new fire).
        at = parse_time(fire_time) + timedelta(seconds=30)
        assert live.app.scheduler(clock=lambda: at).tick() == []
        assert len(receiver.calls) == 1


def test_a_failing_target_is_recorded_and_retried(pg_url: str, serve: Serve) -> None:
    live = serve(pg_url, http=LOCAL)
    with Receiver(status=503) as receiver:
        url = f"http://127.0.0.1:{receiver.port}/"
        live.client.post(
            "/v1/cron/create", json={"name": "flaky", "http_url": url, "schedule": "@hourly"}
        )
        fire_and_work(live, minutes=61)
        assert len(receiver.calls) == 1
    [call] = live.client.get("/v1/cron/flaky/calls").json()
    assert call["status"] == 503 and call["error"] == "HTTP 503"
    job = live.app.queue.get(f"cron:flaky:{call['fire_time']}")
    assert job is not None and job.state is JobState.RETRYABLE
    assert job.last_error is not None and "HTTP 503" in job.last_error


@pytest.mark.parametrize(("schedule", "dead"), [("* * * * *", False), ("daily", True)])
def test_a_call_failing_at_its_last_attempt_gives_way_to_a_fire_soon_or_is_dead_lettered(
    pg_url: str, serve: Serve, schedule: str, dead: bool
) -> None:
    """A per-minute target that is down: each call that fails its last attempt
    is recorded and audited (cron.failed) and gives way to the next fire, which
    calls again, rather than one dead letter a minute. A daily target's call
    is dead-lettered, for an operator to redrive. Either way /metrics says the
    target is failing."""
    live = serve(pg_url, http=LOCAL)
    if schedule == "daily":  # at the hour half a day away: its next fire is never within the hour
        schedule = f"0 {(live.app.engine.now().hour + 12) % 24} * * *"
    with Receiver(status=503) as receiver:
        url = f"http://127.0.0.1:{receiver.port}/"
        live.client.post(
            "/v1/cron/create", json={"name": "down", "http_url": url, "schedule": schedule}
        )
        fire_and_work(live, minutes=24 * 60 + 1 if dead else 1)
        [job] = [j for j in live.app.engine.job_list(JobState.RETRYABLE, "expiry.cron")]
        with live.app.engine.transaction() as conn:  # its last attempt, due now
            conn.execute(
                "update expiry.jobs set attempt = max_attempts - 1, run_at = now() where id = %s",
                (job.id,),
            )
        assert live.app.worker(until_idle=True, poll=0.05, rescue_every=0.2).run() == 0
        assert len(receiver.calls) == 2
    ended = live.app.queue.get(job.key)
    assert ended is not None
    assert ended.state is (JobState.DEAD if dead else JobState.COMPLETED), ended
    failed = [e for e in live.app.engine.audit_list(limit=50) if e.action == "cron.failed"]
    assert len(failed) == (0 if dead else 1)
    if failed:
        assert failed[0].detail["name"] == "down" and "HTTP 503" in failed[0].detail["error"]
    metrics = live.client.get("/metrics").text
    assert 'expiry_cron_target_failing{target="down"} 1.0' in metrics


def test_pause_resume_and_delete(sqlite_url: str, serve: Serve) -> None:
    live = serve(sqlite_url, http=LOCAL)
    with Receiver() as receiver:
        url = f"http://127.0.0.1:{receiver.port}/"
        live.client.post(
            "/v1/cron/create", json={"name": "tidy", "http_url": url, "schedule": "* * * * *"}
        )
        paused = live.client.post("/v1/cron/tidy/pause")
        assert paused.status_code == 200 and paused.json() == {"name": "tidy", "paused": True}
        assert live.client.get("/v1/cron/tidy").json()["paused"] is True
        assert fire_and_work(live) == []
        assert receiver.calls == []
        resumed = live.client.post("/v1/cron/tidy/resume")
        assert resumed.json() == {"name": "tidy", "paused": False}
        assert len(fire_and_work(live)) == 1
        assert len(receiver.calls) == 1

        deleted = live.client.delete("/v1/cron/tidy")
        assert deleted.status_code == 200, deleted.text
        assert_error(live.client.get("/v1/cron/tidy"), 404, "not_found")
        assert_error(live.client.delete("/v1/cron/tidy"), 404, "not_found")
        assert_error(live.client.post("/v1/cron/tidy/pause"), 404, "not_found")
        assert fire_and_work(live, minutes=2) == []
        assert len(receiver.calls) == 1
    # Every change through the API is audited with the key that made it.
    events = [
        (e.action, e.actor)
        for e in live.app.engine.audit_list(limit=50)
        if e.action.startswith("cron.") and e.detail.get("name") == "tidy"
    ]
    actor = "api:tests"  # the key the fixture made
    for action in ("cron.created", "cron.paused", "cron.resumed", "cron.deleted"):
        assert (action, actor) in events, events


def test_a_target_is_pointed_at_another_url_schedule_or_zone(db_url: str, serve: Serve) -> None:
    """PATCH /v1/cron/NAME changes what is given, checked as at create (422
    naming the field); the next call goes to the new URL with the same secret;
    the change is audited with what it was and is; another key's target is 404."""
    live = serve(db_url, http=LOCAL)
    with Receiver() as old, Receiver() as new:
        created = live.client.post(
            "/v1/cron/create",
            json={
                "name": "digest",
                "http_url": f"http://127.0.0.1:{old.port}/",
                "schedule": "0 3 * * *",
            },
        ).json()
        url = f"http://127.0.0.1:{new.port}/v2"
        changed = live.client.patch("/v1/cron/digest", json={"http_url": url})
        assert changed.status_code == 200, changed.text
        shown = changed.json()
        assert (shown["http_url"], shown["schedule"], shown["timezone"]) == (
            url,
            "0 3 * * *",
            "UTC",
        )
        assert "secret" not in shown
        again = live.client.patch(
            "/v1/cron/digest", json={"schedule": "* * * * *", "timezone": "Europe/Paris"}
        ).json()
        assert (again["http_url"], again["schedule"], again["timezone"]) == (
            url,
            "* * * * *",
            "Europe/Paris",
        )
        for body, field in (
            ({"schedule": "61 * * * *"}, "schedule"),
            ({"timezone": "Mars/Olympus"}, "timezone"),
            ({"http_url": "http://10.1.2.3/hook"}, "http_url"),
        ):
            message = assert_error(live.client.patch("/v1/cron/digest", json=body), 422)
            assert field in message, (body, message)
        assert_error(live.client.patch("/v1/cron/digest", json={}), 422)
        assert_error(live.client.patch("/v1/cron/nope", json={"schedule": "@daily"}), 404)
        other = live.new_client(live.app.keys.create("other", ["cron:manage"]))
        assert_error(other.patch("/v1/cron/digest", json={"schedule": "@daily"}), 404)
        assert live.client.get("/v1/cron/digest").json()["schedule"] == "* * * * *"

        assert len(fire_and_work(live)) == 1
        assert old.calls == []
        [(headers, body)] = new.calls
        assert webhooks.verify(created["secret"], headers, body)
    [first, second] = [
        e.detail
        for e in reversed(live.app.engine.audit_list(limit=50))
        if e.action == "cron.updated"
    ]
    assert first["http_url"] == {"from": f"http://127.0.0.1:{old.port}/", "to": url}
    assert set(second) == {"name", "schedule", "timezone"}


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://10.1.2.3/hook", "allowed_hosts"),
        ("http://192.168.0.10:8080/", "allowed_hosts"),
        ("http://169.254.169.254/latest/meta-data/", "allowed_hosts"),
        ("http://[::1]:8080/", "allowed_hosts"),
        ("http://0.0.0.0/", "allowed_hosts"),
        ("http://[::ffff:127.0.0.1]/", "allowed_hosts"),
        ("http://localhost:8080/", "allowed_hosts"),
        ("ftp://example.com/file", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("https://user:pass@example.com/", "credentials"),
        ("http://example.com:99999/", "not a valid URL"),
        ("http://example.com:port/", "not a valid URL"),
        ("http://[::1/", "not a valid URL"),
        ("http://" + "a" * 64 + ".example/", "does not resolve"),
        ("not a url", "http:// or https://"),
    ],
)
def test_an_unsafe_target_is_refused_with_the_reason(
    sqlite_live: Live, url: str, reason: str
) -> None:
    response = sqlite_live.client.post(
        "/v1/cron/create", json={"name": "evil", "http_url": url, "schedule": "@daily"}
    )
    message = assert_error(response, 422, "invalid_request")
    assert message.startswith("http_url:"), message
    assert reason in message, message
    assert sqlite_live.client.get("/v1/cron").json() == []


def test_allowed_hosts_lets_a_named_private_host_through(sqlite_url: str, serve: Serve) -> None:
    live = serve(sqlite_url, http={"allowed_hosts": ["127.0.0.1:*"]})
    create = {"schedule": "@daily"}
    ok = live.client.post(
        "/v1/cron/create", json={**create, "name": "a", "http_url": "http://127.0.0.1:1/"}
    )
    assert ok.status_code == 201, ok.text
    # The host as written is what is allowed, not where it points.
    refused = live.client.post(
        "/v1/cron/create", json={**create, "name": "b", "http_url": "http://localhost:1/"}
    )
    assert "allowed_hosts" in assert_error(refused, 422)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("schedule", "every tuesday", "schedule"),
        ("schedule", "61 * * * *", "schedule"),
        ("timezone", "Mars/Olympus", "timezone"),
        ("timezone", "../../etc/passwd", "timezone"),
        ("name", "UPPER", "name"),
    ],
)
def test_a_bad_schedule_or_timezone_is_422(
    sqlite_live: Live, field: str, value: str, named: str
) -> None:
    body = {"name": "ok", "http_url": "https://example.com/", "schedule": "@daily", field: value}
    message = assert_error(sqlite_live.client.post("/v1/cron/create", json=body), 422)
    assert message.startswith(named), message


def test_a_host_no_longer_allowed_is_refused_at_call_time(pg_url: str, serve: Serve) -> None:
    live = serve(pg_url, http=LOCAL)
    with Receiver() as receiver:
        url = f"http://127.0.0.1:{receiver.port}/"
        created = live.client.post(
            "/v1/cron/create", json={"name": "was-ok", "http_url": url, "schedule": "* * * * *"}
        )
        assert created.status_code == 201, created.text
        # The scheduler and worker now run with a config that no longer allows it.
        strict = make_app(pg_url)
        try:
            at = strict.engine.now() + timedelta(minutes=1, seconds=1)
            assert len(strict.scheduler(clock=lambda: at).tick()) == 1
            assert strict.worker(until_idle=True, poll=0.05).run() == 0
        finally:
            strict.close()
        assert receiver.calls == []
    [call] = live.client.get("/v1/cron/was-ok/calls").json()
    assert call["status"] is None
    assert "UnsafeTarget" in call["error"] and "allowed_hosts" in call["error"]
