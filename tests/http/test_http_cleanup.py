"""Cleanup over HTTP: dry-run and real triggers, runs, policies, pause/resume, and
/metrics after a real run (rows affected equal the rows deleted, watermark zero)."""

from __future__ import annotations

from urllib.parse import quote

from _http_live import Live, Serve, assert_error
from prometheus_client.parser import text_string_to_metric_families

POLICY = "expired-sessions"


def metrics(live: Live) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics (no key needed), parsed: {(sample name, sorted labels): value}."""
    response = live.new_client().get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_trigger_dry_run_then_real_run(live: Live) -> None:
    live.db.insert_sessions(expired=250, live=50)

    dry = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY, "dry_run": True})
    assert dry.status_code == 200, dry.text
    preview = dry.json()
    assert preview["dry_run"] is True and preview["run_id"] is None
    assert preview["candidates"] == 250
    assert preview["windows"] == 3
    assert [{"lo": w["lo"], "hi": w["hi"]} for w in preview["first_windows"]] == [
        {"lo": 0, "hi": 100},
        {"lo": 100, "hi": 200},
        {"lo": 200, "hi": 300},
    ]
    assert preview["cutoff"].endswith("Z")
    assert live.db.count() == 300, "a dry run mutates nothing"
    assert live.client.get("/v1/runs").json() == []

    before = metrics(live)
    assert before[("expiry_watermark_seconds", (("policy", POLICY),))] >= 3500

    real = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY})
    assert real.status_code == 200, real.text
    opened = real.json()
    assert opened["dry_run"] is False and opened["created"] is True
    run_id = opened["run_id"]
    assert run_id == f"{POLICY}:{opened['cutoff']}"
    # The same cutoff again opens nothing new.
    again = live.client.post(
        "/v1/cleanup/trigger", json={"policy": POLICY, "cutoff": opened["cutoff"]}
    )
    assert again.json()["run_id"] == run_id and again.json()["created"] is False

    [listed] = live.client.get("/v1/runs").json()
    assert listed["id"] == run_id and listed["state"] != "finished"
    assert listed["opened_by"] == "api"

    assert live.app.worker(until_idle=True, poll=0.05, rescue_every=0.2).run() == 0
    assert live.db.count() == 50

    summary = live.client.get(f"/v1/runs/{quote(run_id, safe='')}")
    assert summary.status_code == 200, summary.text
    run = summary.json()
    assert run["state"] == "finished"
    assert run["rows_affected"] == 250
    assert run["windows_applied"] == 3 and run["windows_planned"] == 3
    assert run["jobs_done"] == 3 and run["jobs_dead"] == 0
    # The raw id works as the path too (it has colons, no slashes).
    assert live.client.get(f"/v1/runs/{run_id}").json()["id"] == run_id
    assert live.client.get("/v1/runs", params={"policy": POLICY}).json()[0]["id"] == run_id
    assert live.client.get("/v1/runs", params={"policy": "other"}).json() == []
    assert len(live.client.get("/v1/runs", params={"limit": 0}).json()) == 1

    [policy] = live.client.get("/v1/policies").json()
    assert policy["name"] == POLICY and policy["table"] == "sessions"
    assert policy["watermark_seconds"] == 0
    assert policy["last_run"]["id"] == run_id

    after = metrics(live)
    assert after[("expiry_rows_affected_total", (("action", "delete"), ("policy", POLICY)))] == 250
    assert after[("expiry_windows_applied_total", (("policy", POLICY),))] == 3
    assert after[("expiry_watermark_seconds", (("policy", POLICY),))] == 0
    assert after[("expiry_dead_letter_jobs", ())] == 0


def test_pause_and_resume_a_policy(live: Live) -> None:
    paused = live.client.post(f"/v1/policies/{POLICY}/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json() == {"name": POLICY, "paused": True}
    assert live.client.get("/v1/policies").json()[0]["paused"] is True
    resumed = live.client.post(f"/v1/policies/{POLICY}/resume")
    assert resumed.json() == {"name": POLICY, "paused": False}
    assert live.client.get("/v1/policies").json()[0]["paused"] is False

    message = assert_error(live.client.post("/v1/policies/expired-session/pause"), 404)
    assert "did you mean 'expired-sessions'" in message
    assert_error(live.client.post("/v1/cleanup/trigger", json={"policy": "nope"}), 404, "not_found")


def test_cancel_a_run_over_http(live: Live) -> None:
    live.db.insert_sessions(expired=250, live=50)
    opened = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY}).json()

    cancelled = live.client.post("/v1/runs/cancel", json={"run_id": opened["run_id"]})
    assert cancelled.status_code == 200, cancelled.text
    body = cancelled.json()
    assert body["outcome"] == "cancelled" and body["jobs_cancelled"] == 1
    assert body["cancelled_by"].startswith("api:")
    assert live.db.count() == 300  # nothing ran: nothing deleted

    again = live.client.post("/v1/runs/cancel", json={"run_id": opened["run_id"]})
    assert_error(again, 409, "run_finished")
    missing = live.client.post("/v1/runs/cancel", json={"run_id": f"{POLICY}:nope"})
    assert_error(missing, 404, "not_found")
    bad = live.client.post("/v1/runs/cancel", json={})
    assert bad.status_code == 422


def test_a_table_renamed_under_a_running_server_is_shown_broken_never_a_500(live: Live) -> None:
    """The server read the policy (its table checked, its watermark known); the
    table is renamed under it: /v1/policies and /metrics keep
    answering, the policy shown quarantined with the database's words and its
    watermark series kept; renamed back, it is read as before."""
    live.db.insert_sessions(expired=20, live=5)
    assert live.client.get("/v1/policies").status_code == 200  # checked and read once
    live.db.execute("alter table sessions rename to sessions_moved")

    listed = live.client.get("/v1/policies")
    assert listed.status_code == 200, listed.text
    [policy] = listed.json()
    assert policy["broken"] and "sessions" in policy["broken"]
    assert policy["watermark_seconds"] is not None  # the last reading, kept
    samples = metrics(live)
    assert samples[("expiry_policy_quarantined", (("policy", POLICY),))] == 1.0
    assert ("expiry_watermark_seconds", (("policy", POLICY),)) in samples

    live.db.execute("alter table sessions_moved rename to sessions")
    [back] = live.client.get("/v1/policies").json()
    assert back["broken"] is None and back["watermark_seconds"] >= 3500


def test_evidence_over_http_is_what_the_run_deleted_for_a_read_key(live: Live) -> None:
    live.db.insert_sessions(expired=250, live=50)
    assert live.client.get(f"/v1/evidence/{POLICY}").json() == []
    opened = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY}).json()
    assert live.app.worker(until_idle=True, poll=0.05, rescue_every=0.2).run() == 0
    assert live.db.count() == 50

    reader = live.new_client(live.app.keys.create("auditor", ["read"]))
    answer = reader.get(f"/v1/evidence/{POLICY}")
    assert answer.status_code == 200, answer.text
    [run] = answer.json()
    assert (run["run_id"], run["cutoff"], run["table"]) == (
        opened["run_id"],
        opened["cutoff"],
        "sessions",
    )
    assert run["rows_affected"] == 250 == sum(op["rows"] for op in run["operations"])
    assert [op["range"] for op in run["operations"]] == [
        "keys (0, 100]",
        "keys (100, 200]",
        "keys (200, 300]",
    ]
    # At most limit operations, oldest first; the next page starts at the last one's time.
    [page] = reader.get(f"/v1/evidence/{POLICY}", params={"limit": 2}).json()
    assert [op["range"] for op in page["operations"]] == ["keys (0, 100]", "keys (100, 200]"]
    assert_error(reader.get(f"/v1/evidence/{POLICY}", params={"limit": 0}), 422)
    later = reader.get(f"/v1/evidence/{POLICY}", params={"since": "2999-01-01T00:00:00Z"})
    assert later.json() == []
    assert len(reader.get(f"/v1/evidence/{POLICY}", params={"since": "1h"}).json()) == 1
    message = assert_error(
        reader.get(f"/v1/evidence/{POLICY}", params={"since": "soon"}), 422, "invalid_since"
    )
    assert "30d" in message
    assert_error(live.new_client(None).get(f"/v1/evidence/{POLICY}"), 401)
    publisher = live.new_client(live.app.keys.create("pub", ["queue:publish:*"]))
    assert_error(publisher.get(f"/v1/evidence/{POLICY}"), 403)


def test_holds_are_listed_with_the_rows_they_keep_and_the_dry_run_counts_them(
    db_url: str, serve: Serve
) -> None:
    hold = {"name": "first-20", "table": "sessions", "where": "id <= 20", "reason": "case 20"}
    live = serve(db_url, holds=(hold,))
    live.db.insert_sessions(expired=250, live=50)

    listed = live.client.get("/v1/holds")
    assert listed.status_code == 200, listed.text
    assert listed.json() == [
        {
            "name": "first-20",
            "table": "sessions",
            "rows": "id <= 20",
            "reason": "case 20",
            "kept": {POLICY: 20},
        }
    ]
    dry = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY, "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert dry.json()["candidates"] == 230 and dry.json()["held"] == {"first-20": 20}
    assert_error(live.new_client().get("/v1/holds"), 401)


def test_approve_a_run_over_http_with_the_approve_scope_only(serve: Serve, db_url: str) -> None:
    """A policy with approve = true: its run stops after its preview (nothing
    deleted); a key without cleanup:approve gets 403, cleanup:trigger included;
    one with it approves (audited with its name) and the run deletes exactly the
    expired rows. Approving again once finished: 409; no such run: 404."""
    live = serve(db_url, policies=({"approve": True},))
    live.db.insert_sessions(expired=120, live=30)
    opened = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY}).json()
    run_id = opened["run_id"]
    assert live.app.worker(until_idle=True, poll=0.05, rescue_every=0.2).run() == 0
    assert live.db.count() == 150  # previewed, nothing deleted

    shown = live.client.get(f"/v1/runs/{quote(run_id, safe='')}").json()
    assert shown["outcome"] == "awaiting approval", shown
    assert shown["approval"]["state"] == "awaiting"
    assert shown["approval"]["preview"]["candidates"] == 120
    gauge = ("expiry_run_awaiting_approval", (("policy", POLICY),))
    assert metrics(live)[gauge] == 1.0
    [policy] = live.client.get("/v1/policies").json()
    assert policy["awaiting_approval"] == run_id

    trigger = live.new_client(live.app.keys.create("ops", ["cleanup:trigger", "read"]))
    assert_error(trigger.post("/v1/runs/approve", json={"run_id": run_id}), 403)
    approver = live.new_client(live.app.keys.create("dpo", ["cleanup:approve"]))
    missing = approver.post("/v1/runs/approve", json={"run_id": f"{POLICY}:nope"})
    assert_error(missing, 404, "not_found")
    approved = approver.post("/v1/runs/approve", json={"run_id": run_id})
    assert approved.status_code == 200, approved.text
    body = approved.json()
    assert body["approval"]["state"] == "approved" and body["approval"]["approved_by"] == "api:dpo"

    assert live.app.worker(until_idle=True, poll=0.05, rescue_every=0.2).run() == 0
    assert live.db.count() == 30
    done = live.client.get(f"/v1/runs/{quote(run_id, safe='')}").json()
    assert done["outcome"] == "finished" and done["rows_affected"] == 120
    assert metrics(live)[gauge] == 0.0
    again = approver.post("/v1/runs/approve", json={"run_id": run_id})
    assert_error(again, 409, "not_approvable")
    assert approver.post("/v1/runs/approve", json={}).status_code == 422
