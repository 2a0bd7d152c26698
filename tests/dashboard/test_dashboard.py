"""The dashboard in a real headless Chromium, against a real server and database."""

from __future__ import annotations

import base64
import re
import time
from urllib.parse import quote

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from expiry.keys import Keys
from expiry.types import JobState

from .conftest import POLICY, Dashboard, csrf_of, post_login, screenshot, sign_in


def run_worker(dashboard: Dashboard, queue: str = "default") -> None:
    worker = dashboard.app.worker(queues=(queue,), until_idle=True, poll=0.05, rescue_every=0.2)
    assert worker.run() == 0


def dead_job(dashboard: Dashboard, key: str, queue: str = "default") -> None:
    """A job for a handler nobody registered, with one attempt: the worker kills it."""
    dashboard.app.queue.enqueue("no.such.handler", {"n": key}, key=key, queue=queue, max_attempts=1)
    run_worker(dashboard, queue)
    assert dashboard.job_state(key) == "dead"


def text(browser: WebDriver, css: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def wait_for(browser: WebDriver, words: str) -> None:
    """Wait for the page that a click loads to say ``words``."""
    WebDriverWait(browser, 10).until(lambda b: words in b.page_source)


def test_sign_in_with_a_wrong_key_is_refused(page: WebDriver, dashboard: Dashboard) -> None:
    sign_in(page, dashboard, key="exp_not-a-key")
    assert "/login" in page.current_url
    assert "not valid" in text(page, "#signin-error")
    assert page.find_element(By.ID, "key").get_attribute("aria-invalid") == "true"
    screenshot(page, "login-refused")
    with dashboard.client() as client:
        answer = post_login(client, "exp_wrong", "/")
        assert answer.status_code == 401
        assert "expiry_session" not in answer.cookies
        assert client.get("/dlq").status_code == 303  # still signed out


def test_sign_in_sets_a_strict_httponly_session(dashboard: Dashboard) -> None:
    with dashboard.client() as client:
        answer = post_login(client, dashboard.key, "/queue")
        assert answer.status_code == 303 and answer.headers["location"] == "/queue"
        cookie = answer.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert client.get("/queue").status_code == 200
        # an open redirect is not followed
        with dashboard.client() as fresh:
            again = post_login(fresh, dashboard.key, "//evil.example/")
            assert again.headers["location"] == "/"
        # revoking the key ends its sessions (the key list is re-read within a second)
        assert Keys(dashboard.app.engine).revoke(dashboard.key_name)
        time.sleep(1.1)
        assert client.get("/queue").headers["location"] == "/login?next=%2Fqueue"


def test_watermark_and_run_progress_after_a_real_cleanup(
    page: WebDriver, dashboard: Dashboard
) -> None:
    sign_in(page, dashboard)
    row = page.find_element(By.ID, "policy-expired-sessions")
    watermark = row.find_element(By.CSS_SELECTOR, ".watermark")
    # the oldest expired row expired 2 h ago: past the 1 h alert threshold
    assert "level-alert" in str(watermark.get_attribute("class"))
    assert float(str(watermark.get_attribute("data-watermark-seconds"))) > 3600
    assert "over alert" in watermark.text.lower()
    assert "no run yet" in row.text
    screenshot(page, "overview-before")

    opened = dashboard.app.cleanup.open_run("expired-sessions")  # type: ignore[union-attr]
    run_worker(dashboard)

    page.get(dashboard.url("/"))
    row = page.find_element(By.ID, "policy-expired-sessions")
    watermark = row.find_element(By.CSS_SELECTOR, ".watermark")
    assert "level-ok" in str(watermark.get_attribute("class"))
    assert float(str(watermark.get_attribute("data-watermark-seconds"))) == 0
    assert "falling" in row.text  # two samples: from 2 h to zero
    bar = row.find_element(By.TAG_NAME, "progress")
    assert bar.get_attribute("value") == bar.get_attribute("max") != "0"
    screenshot(page, "overview-after")

    row.find_element(By.PARTIAL_LINK_TEXT, "opened").click()
    wait_for(page, "Run of expired-sessions")
    assert opened.run_id in page.find_element(By.TAG_NAME, "h1").text + page.page_source
    progress = page.find_element(By.CSS_SELECTOR, ".run-progress progress")
    windows = int(str(progress.get_attribute("max")))
    assert windows == 5  # 450 expired keys in windows of 100
    assert progress.get_attribute("value") == str(windows)
    assert f"{windows} / {windows} windows (100%)" in text(page, ".run-progress")
    facts = text(page, "dl.facts")
    assert "Rows affected\n450" in facts
    screenshot(page, "run")


def test_a_window_jobs_page_shows_its_ledger_row(dashboard: Dashboard) -> None:
    """The ledger row is a window's record (no audit event per window): the job
    page shows it, and says so when a window has none."""
    opened = dashboard.app.cleanup.open_run("expired-sessions")  # type: ignore[union-attr]
    run_worker(dashboard)
    dead_job(dashboard, "no-ledger")
    with dashboard.signed_in_client() as client:
        applied = client.get(f"/jobs/{quote(opened.run_id + ':0', safe='')}")
        other = client.get("/jobs/no-ledger")
    assert applied.status_code == other.status_code == 200
    words = " ".join(re.sub(r"<[^>]+>", " ", applied.text).split())
    assert "100 rows deleted in keys (0, 100]" in words
    assert "No ledger row under this job's key." in other.text


def test_redrive_a_dead_job_by_clicking(page: WebDriver, dashboard: Dashboard) -> None:
    dead_job(dashboard, "lost-1")
    sign_in(page, dashboard)
    page.find_element(By.LINK_TEXT, "Dead letters").click()
    wait_for(page, "Dead-letter queue</h1>")
    assert "lost-1" in text(page, "table.jobs")
    screenshot(page, "dlq")
    page.find_element(By.LINK_TEXT, "lost-1").click()
    wait_for(page, "Failed attempts")
    attempts = text(page, "table.attempts")
    assert "no handler 'no.such.handler'" in attempts
    screenshot(page, "job-dead")
    page.find_element(By.CSS_SELECTOR, "button[aria-label='Redrive job lost-1']").click()
    confirm = WebDriverWait(page, 5).until(ec.alert_is_present())
    assert "fresh attempt budget" in confirm.text
    confirm.accept()
    wait_for(page, "Redrove 1 job.")
    assert dashboard.job_state("lost-1") in ("available", "completed")
    trail = text(page, "ul.events")
    assert "job.redriven by dashboard:ops" in trail
    # the redriven job dies again (still no handler): the history keeps both attempts
    run_worker(dashboard)
    assert dashboard.job_state("lost-1") == "dead"


def test_bulk_discard_says_how_many_and_asks(page: WebDriver, dashboard: Dashboard) -> None:
    for i in range(3):
        dead_job(dashboard, f"bulk-{i}", queue="mail")
    dead_job(dashboard, "other-0")
    sign_in(page, dashboard)
    page.get(dashboard.url("/dlq?queue=mail"))
    page.find_element(By.PARTIAL_LINK_TEXT, "Discard all 3 matching").click()
    wait_for(page, "Discard dead letters")
    assert "This will discard 3 dead jobs." in text(page, "#bulk-count")
    screenshot(page, "bulk-confirm")
    page.find_element(By.XPATH, "//button[normalize-space()='Discard 3 jobs']").click()
    alert = WebDriverWait(page, 5).until(ec.alert_is_present())
    assert alert.text == "Discard 3 dead jobs?"
    alert.accept()
    wait_for(page, "Discarded 3 jobs.")
    assert [dashboard.job_state(f"bulk-{i}") for i in range(3)] == ["cancelled"] * 3
    assert dashboard.job_state("other-0") == "dead"


def test_a_post_without_the_csrf_token_is_refused(dashboard: Dashboard) -> None:
    dead_job(dashboard, "lost-2")
    with dashboard.signed_in_client() as client:
        refused = client.post("/dlq/redrive", data={"key": "lost-2"})
        assert refused.status_code == 403
        forged = client.post("/dlq/redrive", data={"key": "lost-2", "csrf": "forged"})
        assert forged.status_code == 403
        for path, form in (
            ("/dlq/discard", {"key": "lost-2"}),
            ("/dlq/bulk", {"action": "discard", "expected": "1"}),
            ("/policies/pause", {"policy": "expired-sessions", "paused": "1"}),
            ("/logout", {}),
        ):
            assert client.post(path, data=form).status_code == 403, path
        assert dashboard.job_state("lost-2") == "dead"
        token = csrf_of(client.get("/dlq").text)
        done = client.post("/dlq/redrive", data={"key": "lost-2", "csrf": token})
        assert done.status_code == 303
        assert dashboard.job_state("lost-2") == "available"
    with dashboard.client() as stranger:  # no session at all: sent to sign in
        answer = stranger.post("/dlq/discard", data={"key": "lost-2", "csrf": token})
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login")
    assert dashboard.job_state("lost-2") == "available"


def test_pause_and_resume_a_policy(page: WebDriver, dashboard: Dashboard) -> None:
    sign_in(page, dashboard)
    page.find_element(By.CSS_SELECTOR, "button[aria-label='Pause policy expired-sessions']").click()
    WebDriverWait(page, 5).until(ec.alert_is_present()).accept()
    wait_for(page, "Paused policy expired-sessions.")
    assert "paused" in text(page, "#policy-expired-sessions")
    page.find_element(
        By.CSS_SELECTOR, "button[aria-label='Resume policy expired-sessions']"
    ).click()
    confirm = WebDriverWait(page, 5).until(ec.alert_is_present())
    assert "Resume the schedule of expired-sessions?" in confirm.text
    confirm.accept()
    wait_for(page, "Resumed policy expired-sessions.")
    actions = [e.action for e in dashboard.app.engine.audit_list("expired-sessions")]
    assert actions[:2] == ["policy.resumed", "policy.paused"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the script, not the engine
def test_live_pages_refresh_in_place(page: WebDriver, dashboard: Dashboard) -> None:
    sign_in(page, dashboard)
    page.get(dashboard.url("/queue"))
    assert "The queue is empty." in text(page, "main")
    page.execute_script("window.notReloaded = true;")
    dashboard.app.queue.enqueue("later.job", {}, key="later-1", queue="later")
    WebDriverWait(page, 15).until(lambda b: "later" in text(b, "table.stacked"))
    assert page.execute_script("return window.notReloaded === true;")  # swapped, not reloaded


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_audit_details_read_as_they_were_written(dashboard: Dashboard) -> None:
    """An event's detail shows "&" and ">" as themselves (they read \\u0026 and
    \\u003e), escaped for HTML only."""
    dashboard.app.crons.create("report", dashboard.url("/v1/health?a=1&b=>2"), "@daily")
    with dashboard.signed_in_client() as client:
        page = client.get("/audit").text
    assert "/v1/health?a=1&amp;b=&gt;2" in page
    assert "\\u0026" not in page and "\\u003e" not in page


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_live_page_says_when_the_server_stops_answering(
    page: WebDriver, dashboard: Dashboard
) -> None:
    """The footer's database time moves with each refresh; once the server
    stops, the page keeps its numbers but says how old they are and that the
    server is not answering (it used to go on under "Auto-refresh on")."""
    sign_in(page, dashboard)
    page.get(dashboard.url("/queue"))
    footer = text(page, "#footer")
    WebDriverWait(page, 25).until(lambda b: text(b, "#footer") != footer)
    assert not page.find_element(By.ID, "refresh-status").is_displayed()
    assert dashboard.server is not None
    dashboard.server.should_exit = True
    WebDriverWait(page, 30).until(lambda b: b.find_element(By.ID, "refresh-status").is_displayed())
    said = text(page, "#refresh-status")
    assert said.startswith("Last updated ") and "the server is not answering" in said, said
    assert "stale" in (page.find_element(By.TAG_NAME, "body").get_attribute("class") or "")
    screenshot(page, "queue-server-gone")


def test_sign_out_ends_the_session_on_the_server_and_sign_ins_are_audited(
    dashboard: Dashboard,
) -> None:
    """A copy of the cookie kept after sign-out is refused (it used to stay valid
    for 12 hours); every sign-in, refused sign-in and sign-out is audited."""
    with dashboard.signed_in_client() as client:
        kept = client.cookies.get("expiry_session")
        assert kept
        page = client.get("/queue")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf, page.text
        out = client.post("/logout", data={"csrf": csrf.group(1)})
        assert out.status_code == 303
    with dashboard.client() as thief:
        thief.cookies.set("expiry_session", kept)
        assert thief.get("/queue").headers["location"] == "/login?next=%2Fqueue"
        refused = post_login(thief, "not-a-key")
        assert refused.status_code == 401
    actions = [e.action for e in dashboard.app.engine.audit_list(limit=20)]
    assert "dashboard.signed_in" in actions and "dashboard.signed_out" in actions
    assert "dashboard.sign_in_refused" in actions
    signed_in = [
        e for e in dashboard.app.engine.audit_list(limit=20) if e.action == "dashboard.signed_in"
    ]
    assert signed_in[0].actor == f"dashboard:{dashboard.key_name}"


def test_the_sign_in_form_needs_its_own_token(dashboard: Dashboard) -> None:
    """A page of another site cannot sign a browser in (login CSRF): a post
    without the token the form's page set, or with another page's, is refused."""
    with dashboard.client() as client:
        bare = client.post("/login", data={"key": dashboard.key, "next": "/"})
        assert bare.status_code == 403 and "expiry_session" not in bare.cookies
        assert "did not come from this server" in bare.text
    with dashboard.client() as other, dashboard.client() as client:
        token = csrf_of(other.get("/login").text)  # another browser's form
        client.get("/login")
        forged = client.post("/login", data={"key": dashboard.key, "next": "/", "csrf": token})
        assert forged.status_code == 403
        assert post_login(client, dashboard.key).status_code == 303


def test_refused_sign_ins_are_rate_limited_per_address(dashboard: Dashboard) -> None:
    with dashboard.client() as client:
        codes = [post_login(client, f"guess-{i}", "/").status_code for i in range(12)]
        assert codes[:10] == [401] * 10
        assert codes[10:] == [429, 429]
        slow = post_login(client, dashboard.key, "/")
        assert slow.status_code == 429 and int(slow.headers["retry-after"]) >= 1
        assert "Too many sign-in attempts" in slow.text


def test_a_cookie_with_an_absurd_time_is_refused_not_a_500(dashboard: Dashboard) -> None:
    body = base64.urlsafe_b64encode(b'{"k":"ops","t":1e999,"n":"x"}').decode().rstrip("=")
    with dashboard.client() as client:
        client.cookies.set("expiry_session", body + ".c2ln")
        answer = client.get("/queue")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login")


def test_the_cron_page_shows_next_fire_overdue_last_response_and_calls_now(
    dashboard: Dashboard,
) -> None:
    app = dashboard.app
    app.crons.create("hourly", dashboard.url("/v1/health"), "0 * * * *")
    app.crons.create("minutely", dashboard.url("/v1/health"), "* * * * *")
    # Its last fire 10 minutes ago: the next one is 9 minutes overdue (no scheduler runs).
    with app.engine.transaction() as conn:
        if app.engine.dialect == "postgres":
            conn.execute(
                "update expiry.cron_targets set last_fire_at = now() - interval '10 minutes'"
                " where name = 'minutely'"
            )
        elif app.engine.dialect == "mysql":
            conn.execute(
                "update expiry_cron_targets set last_fire_at = utc_timestamp(6) - interval 10 minute"
                " where name = 'minutely'"
            )
        else:
            conn.execute(
                "update expiry_cron_targets set last_fire_at = last_fire_at - 600"
                " where name = 'minutely'"
            )
    app.engine.cron_call_insert(
        "hourly",
        app.engine.now(),
        1,
        status=200,
        duration_ms=3.0,
        response='{"ok": true}',
        error=None,
    )
    with dashboard.signed_in_client() as client:
        page = client.get("/crons").text
        hourly = page[page.index("hourly") :]
        assert "overdue" in page[page.index("minutely") :].split("</tr>")[0]
        assert "overdue" not in hourly.split("</tr>")[0]
        assert "&#34;ok&#34;: true" in page or '"ok": true' in page  # the body excerpt
        csrf = csrf_of(page)
        called = client.post("/crons/call", data={"csrf": csrf, "name": "hourly"})
        assert called.status_code == 303
    jobs = [
        j for j in app.engine.job_list(JobState.AVAILABLE) if j.key.startswith("cron:hourly:now:")
    ]
    assert len(jobs) == 1 and jobs[0].handler == "expiry.http_call"
    actions = [(e.action, e.actor) for e in app.engine.audit_list(limit=20)]
    assert ("cron.called", f"dashboard:{dashboard.key_name}") in actions


def test_a_read_key_sees_in_the_dashboard_only_what_the_api_shows_it(
    dashboard: Dashboard,
) -> None:
    """A read key sees the cleanup (runs, their windows' job pages) but not the
    jobs of a queue it may not consume (their pages answer 404, the lists and
    the dead-letter queue leave them out) nor another key's cron target or a
    key's events in the audit log; a key that may consume the queue sees its
    payload, an admin key everything."""
    app = dashboard.app
    keys = app.keys
    reader = keys.create("watcher", ["read"])
    biller = keys.create("biller", ["read", "queue:consume:billing"])
    app.queue.enqueue("charge", {"card": "4111-SECRET"}, 86400, key="invoice-42", queue="billing")
    dead_job(dashboard, "billing-dead", queue="billing")
    app.crons.create(
        "theirs", dashboard.url("/v1/health?token=CRON-SECRET"), "@daily", owner="someone"
    )
    run = app.cleanup.open_run("expired-sessions") if app.cleanup else None
    assert run is not None
    [window, *_] = [j for j in app.engine.job_list(JobState.AVAILABLE) if j.queue != "billing"]
    with dashboard.client() as client:
        assert post_login(client, reader).status_code == 303
        refused = client.get("/jobs/invoice-42")
        assert refused.status_code == 404 and "4111-SECRET" not in refused.text
        assert client.get("/jobs/billing-dead").status_code == 404
        for path in ("/jobs?state=scheduled", "/jobs?state=scheduled&queue=billing", "/dlq"):
            listed = client.get(path)
            assert listed.status_code == 200, path
            assert "invoice-42" not in listed.text and "billing-dead" not in listed.text, path
        audit = client.get("/audit").text
        assert "CRON-SECRET" not in audit and "biller" not in audit
        assert client.get(f"/jobs/{quote(window.key, safe='')}").status_code == 200
        assert run.run_id in client.get(f"/runs/{quote(run.run_id, safe='')}").text
    with dashboard.client() as client:
        assert post_login(client, biller).status_code == 303
        assert "4111-SECRET" in client.get("/jobs/invoice-42").text
        assert "billing-dead" in client.get("/dlq").text
        assert "CRON-SECRET" not in client.get("/audit").text
    with dashboard.signed_in_client() as admin:
        audit = admin.get("/audit").text
        assert "CRON-SECRET" in audit and "biller" in audit
        assert "4111-SECRET" in admin.get("/jobs/invoice-42").text


def test_the_dashboard_honours_the_keys_scopes(dashboard: Dashboard) -> None:
    """A read key reads every page and changes nothing (403 naming the scope it
    lacks); a key without read is refused the pages; cron targets show to
    their own key."""
    dead_job(dashboard, "lost-3")
    keys = dashboard.app.keys
    reader = keys.create("watcher", ["read"])
    publisher = keys.create("publisher", ["queue:publish:*"])
    dashboard.app.crons.create("theirs", dashboard.url("/v1/health"), "@daily", owner="someone")
    with dashboard.client() as client:
        assert post_login(client, reader).status_code == 303
        for path in ("/", "/runs", "/dlq", "/workers", "/crons", "/audit"):
            assert client.get(path).status_code == 200, path
        assert "theirs" not in client.get("/crons").text
        csrf = csrf_of(client.get("/dlq").text)
        refused = client.post("/dlq/redrive", data={"key": "lost-3", "csrf": csrf})
        assert refused.status_code == 403 and "dlq:manage" in refused.text
        assert dashboard.job_state("lost-3") == "dead"
    with dashboard.client() as client:
        assert post_login(client, publisher).status_code == 303
        page = client.get("/")
        assert page.status_code == 403 and "lacks the scope <code>read</code>" in page.text
    with dashboard.signed_in_client() as admin:
        assert "theirs" in admin.get("/crons").text


def test_a_key_sees_only_the_actions_it_may_take_and_each_asks_first(
    dashboard: Dashboard,
) -> None:
    """A read key sees no button it cannot use (pause, resume, redrive,
    discard, bulk, cancel, cron pause and call); the ops key sees them all,
    and each that changes what runs asks for confirmation (data-confirm):
    resume and a single redrive did not."""
    app = dashboard.app
    assert app.cleanup is not None
    reader = app.keys.create("watcher", ["read", "queue:consume:default"])  # sees the job
    dead_job(dashboard, "dead-1")
    app.crons.create("mine", dashboard.url("/v1/health"), "@daily", owner="ops")
    run = app.cleanup.open_run("expired-sessions")
    app.engine.schedule_set_paused("expired-sessions", True)
    pages = {
        "/": ["/policies/pause"],
        "/dlq": ["/dlq/redrive", "/dlq/discard", "/dlq/bulk"],
        "/jobs/dead-1": ["/dlq/redrive", "/dlq/discard"],
        "/crons": ["/crons/pause", "/crons/call", "/crons/edit"],
        f"/runs/{quote(run.run_id, safe='')}": ["/runs/cancel"],
    }
    with dashboard.client() as client:
        assert post_login(client, reader).status_code == 303
        for path, actions in pages.items():
            page = client.get(path)
            assert page.status_code == 200, path
            assert not [a for a in actions if a in page.text], (path, actions)
    with dashboard.signed_in_client() as ops:
        for path, actions in pages.items():
            page = ops.get(path).text
            assert all(a in page for a in actions), (path, actions)
            forms = re.findall(r'<form method="post" action="([^"]+)"[^>]*>', page)
            asking = re.findall(r'<form method="post" action="([^"]+)"[^>]*data-confirm=', page)
            changing = [f for f in forms if f != "/crons/call" and f != "/logout"]
            assert sorted(changing) == sorted(asking), (path, forms, asking)
        overview = ops.get("/").text
        assert "Resume the schedule of expired-sessions?" in overview


def test_plan_shows_what_a_run_would_do_and_trigger_opens_it(dashboard: Dashboard) -> None:
    """From the overview: Plan… shows the dry run (cutoff, rows, windows and
    how they are chosen) and opens nothing; Trigger a run now (asked first)
    opens the run and goes to its page. A read key sees the plan, no trigger
    button, and its POST is refused; an unknown policy's plan is a 404."""
    app = dashboard.app
    reader = app.keys.create("watcher", ["read"])
    plan_path = "/policies/expired-sessions/plan"
    with dashboard.signed_in_client() as ops:
        assert plan_path in ops.get("/").text
        page = ops.get(plan_path)
        assert page.status_code == 200
        assert "What a run of expired-sessions would do now" in page.text
        assert re.search(r"Rows to delete</dt><dd[^>]*>\d[\d,]* \(the planner", page.text)
        assert "Trigger a run now" in page.text and "data-confirm=" in page.text
        assert app.runs.recent("expired-sessions", 5) == []  # a plan opens nothing
        assert ops.get("/policies/no-such/plan").status_code == 404
        answer = ops.post(
            "/policies/trigger",
            data={"policy": "expired-sessions", "csrf": csrf_of(page.text)},
        )
        assert answer.status_code == 303 and answer.headers["location"].startswith("/runs/")
        [opened] = app.runs.recent("expired-sessions", 5)
        assert quote(opened["id"], safe="") in answer.headers["location"]
    with dashboard.client() as client:
        assert post_login(client, reader).status_code == 303
        page = client.get(plan_path)
        assert page.status_code == 200 and "Trigger a run now" not in page.text
        refused = client.post(
            "/policies/trigger", data={"policy": "expired-sessions", "csrf": csrf_of(page.text)}
        )
        assert refused.status_code == 403
    assert len(app.runs.recent("expired-sessions", 5)) == 1


@pytest.mark.dashboard_config(hold=[{"name": "case-7", "table": "sessions", "where": "id <= 10"}])
def test_a_hold_is_named_on_the_overview_and_its_kept_rows_counted_on_the_plan(
    dashboard: Dashboard,
) -> None:
    """The overview names the holds on each policy's table; the plan page counts
    the expired rows each keeps (ids 1 to 10 of the 450 expired) and the rows
    to delete leave them out."""
    with dashboard.signed_in_client() as ops:
        overview = ops.get("/").text
        assert "held: case-7" in overview
        plan = ops.get("/policies/expired-sessions/plan").text
        assert re.search(r'id="held-case-7">keeps 10 expired rows<', plan), plan
        assert re.search(r"Rows to delete</dt><dd[^>]*>440 \(the planner", plan), plan


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.dashboard_config(policy=[{**POLICY, "approve": True}])
def test_a_run_awaiting_approval_shows_its_preview_and_is_approved_from_its_page(
    page: WebDriver, dashboard: Dashboard
) -> None:
    """A policy with approve = true: the run's page says it awaits approval,
    with the rows its preview counted and a sample of their keys; a key without
    cleanup:approve sees no button; the ops key approves (asked first), audited
    with its name, and the run then deletes the 450 expired rows, not one live."""
    app = dashboard.app
    assert app.cleanup is not None
    run = app.cleanup.open_run("expired-sessions")
    assert app.worker(until_idle=True, poll=0.05, rescue_every=0.2).run() == 0
    path = f"/runs/{quote(run.run_id, safe='')}"
    trigger = app.keys.create("operator", ["read", "cleanup:trigger"])
    with dashboard.client() as client:
        assert post_login(client, trigger).status_code == 303
        shown = client.get(path).text
        assert "Awaiting approval" in shown and "/runs/approve" not in shown
        overview = client.get("/").text
        assert "awaiting approval" in overview and f'href="{path}"' in overview
    sign_in(page, dashboard)
    page.get(dashboard.url(path))
    assert "450 rows are expired" in text(page, "p.approval")
    assert "Sample keys:" in page.page_source
    page.find_element(By.CSS_SELECTOR, f"button[aria-label='Approve run {run.run_id}']").click()
    confirm = WebDriverWait(page, 5).until(ec.alert_is_present())
    assert "450 expired rows are deleted" in confirm.text
    confirm.accept()
    wait_for(page, f"Approved run {run.run_id}")
    assert app.worker(until_idle=True, poll=0.05, rescue_every=0.2).run() == 0
    summary = app.runs.summary(run.run_id)
    assert summary is not None and summary["rows_affected"] == 450
    assert summary["approval"]["approved_by"] == "dashboard:ops"
    with app.engine.transaction() as conn:
        [(left,)] = [tuple(r.values()) for r in conn.execute("select count(*) as n from sessions")]
    assert left == 50
