"""The HTTP trigger's guard against a late cutoff: a cutoff later than now -
retain is a 422 cutoff_refused naming both times, and nothing opens; "force":
true opens it on purpose. A dry run may look at any cutoff."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from _http_live import Serve, assert_error

from expiry.times import format_time

POLICY = "expired-sessions"


def test_a_late_cutoff_is_refused_unless_forced(pg_url: str, serve: Serve) -> None:
    live = serve(pg_url, policies=({"retain": "1h"},))
    live.db.insert_sessions(expired=20, live=10)
    late = format_time(datetime.now(UTC) + timedelta(days=1))

    refused = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY, "cutoff": late})
    message = assert_error(refused, 422, "cutoff_refused")
    assert f"cutoff {late} is later than now - retain" in message
    assert " - 1h = " in message and '"force": true' in message
    assert live.client.get("/v1/runs").json() == []

    dry = live.client.post(
        "/v1/cleanup/trigger", json={"policy": POLICY, "cutoff": late, "dry_run": True}
    )
    assert dry.status_code == 200 and dry.json()["candidates"] == 30, dry.text

    forced = live.client.post(
        "/v1/cleanup/trigger", json={"policy": POLICY, "cutoff": late, "force": True}
    )
    assert forced.status_code == 200, forced.text
    assert forced.json()["created"] is True and forced.json()["cutoff"] == late
    assert live.db.count() == 30, "opening a run deletes nothing by itself"
