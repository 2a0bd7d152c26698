"""Every dashboard page, with data on it: served, valid HTML, readable without
JavaScript, and photographed in the browser (artifacts/dashboard/*.png)."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing
from datetime import timedelta
from urllib.parse import quote

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from expiry.queue.jobs import policy_queue
from expiry.status import Status

from .conftest import Dashboard, screenshot, sign_in
from .html_check import check_html


def arrange(dashboard: Dashboard) -> dict[str, str]:
    """A finished run, dead, retrying, due and running jobs, cron targets with
    outcomes, a paused policy: something on every page."""
    app = dashboard.app
    assert app.cleanup is not None
    opened = app.cleanup.open_run("expired-sessions")
    app.queue.enqueue("no.such.handler", {"order": 7}, key="dead-1", max_attempts=1)
    app.queue.enqueue("no.such.handler", {"order": 8}, key="dead-2", max_attempts=1)
    app.crons.create("nightly-report", dashboard.url("/v1/health"), "0 3 * * *")
    app.crons.create("hourly-ping", dashboard.url("/v1/health"), "0 * * * *")
    target = app.engine.cron_get("nightly-report")
    assert target is not None
    fire = app.engine.now().replace(microsecond=0) + timedelta(seconds=1)
    with app.engine.transaction() as conn:
        assert app.crons.fire(target, fire, conn)
    assert app.worker(until_idle=True, poll=0.05, rescue_every=0.2).run() == 0
    app.engine.cron_call_insert(
        "hourly-ping", fire, 1, status=204, duration_ms=12.5, response="", error=None
    )
    app.queue.enqueue("slow.export", {"n": 1}, key="slow-1", queue="exports")
    app.queue.enqueue("slow.export", {"n": 2}, key="slow-2", queue="exports")
    app.queue.enqueue("slow.export", {"n": 3}, key="slow-3", queue="exports")
    [claimed] = app.queue.claim(1, 300, queues=("exports",), owner="test-worker")
    [flaky] = app.queue.claim(1, 300, queues=("exports",), owner="test-worker")
    app.queue.fail(flaky, "lock timeout on exports", transient=True, kind="lock_timeout")
    app.engine.worker_seen(
        "test-worker",
        host="box",
        pid=4242,
        threads=2,
        queues=["exports"],
        resting={"expiry.policy.expired-sessions": 0.4},
        holding=1,
    )

    app.scheduler().set_paused("expired-sessions", True, actor="test")
    return {"run": opened.run_id, "dead": "dead-1", "running": claimed.key}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_every_page_is_valid_html_and_reads_well(page: WebDriver, dashboard: Dashboard) -> None:
    made = arrange(dashboard)
    pages = {
        "overview": "/",
        "runs": "/runs",
        "run-detail": f"/runs/{quote(made['run'], safe='')}",
        "queue": "/queue",
        "jobs-running": "/jobs?state=running",
        "jobs-completed": "/jobs?state=completed&policy=expired-sessions",
        "dead-letters": "/dlq",
        "job-detail": f"/jobs/{made['dead']}",
        "bulk-redrive": "/dlq/bulk?action=redrive",
        "workers": "/workers",
        "cron-targets": "/crons",
        "audit-log": "/audit",
    }
    with dashboard.signed_in_client() as client:
        for path in pages.values():
            answer = client.get(path)
            assert answer.status_code == 200, (path, answer.text[:500])
            assert answer.headers["content-type"].startswith("text/html")
            assert "script-src 'self'" in answer.headers["content-security-policy"]
            check_html(answer.text, path)
        missing = client.get("/jobs/no-such-job")
        assert missing.status_code == 404
        check_html(missing.text, "404 page")
        refused = client.post("/dlq/redrive", data={"key": "dead-1"})
        assert refused.status_code == 403
        check_html(refused.text, "403 page")
        assert "lock_timeout" in client.get("/queue").text
        assert "HTTP 405" in client.get("/crons").text
        workers = client.get("/workers").text
        assert "test-worker" in workers and made["running"] in workers and "4242" in workers
    with dashboard.client() as stranger:
        login = stranger.get("/login")
        check_html(login.text, "/login")
        assert stranger.get("/").headers["location"] == "/login?next=%2F"

    screenshot(page, "login")
    sign_in(page, dashboard)
    for name, path in pages.items():
        page.get(dashboard.url(path))
        assert page.find_element(By.TAG_NAME, "h1").text, path
        screenshot(page, name)
    # the script ran: live pages show their auto-refresh switch
    page.get(dashboard.url("/"))
    assert page.find_element(By.ID, "refresh-toggle").is_displayed()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_stays_out_of_the_api_schema(dashboard: Dashboard) -> None:
    with dashboard.client() as client:
        paths = client.get("/openapi.json").json()["paths"]
        assert not [p for p in paths if not p.startswith(("/v1", "/metrics"))], paths
        script = client.get("/static/dashboard.js")
        assert script.status_code == 200 and "data-confirm" in script.text
        assert client.get("/static/../api.py").status_code == 404


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_quarantined_policy_shows_in_red_and_the_overview_still_serves(
    page: WebDriver, dashboard: Dashboard
) -> None:
    """A policy whose table is missing no longer turns the overview into a 500:
    it is shown quarantined with its reason, beside the working policy."""
    app = dashboard.app
    assert app.cleanup is not None and app.config is not None
    broken = {
        "name": "broken",
        "table": "no_such_table",
        "key": "id",
        "timestamp": "expires_at",
    }
    config = app.config.model_copy(
        update={"policy": [*app.config.policy, type(app.config.policy[0])(**broken)]}
    )
    app.cleanup.reload(config)
    sign_in(page, dashboard)
    page.get(dashboard.url("/"))
    good = page.find_element(By.ID, "policy-expired-sessions").text
    bad = page.find_element(By.ID, "policy-broken").text
    assert "quarantined" not in good
    assert "quarantined" in bad and "no_such_table" in bad
    cell = page.find_element(By.CSS_SELECTOR, "#policy-broken .quarantined .level-alert")
    assert cell.is_displayed()
    screenshot(page, "overview-quarantined")


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_the_workers_page_shows_each_worker_and_what_it_holds(
    page: WebDriver, dashboard: Dashboard
) -> None:
    """A real worker holding a job: the page names its process and threads,
    the job it holds and for how long; once it stops, it leaves the roll."""
    app = dashboard.app
    holding, release = threading.Event(), threading.Event()

    @app.handler("slow.export")
    def slow(job: object, tx: object) -> None:
        holding.set()
        release.wait(30)

    app.queue.enqueue("slow.export", {}, key="export-1", queue="exports")
    worker = app.worker(queues=("exports",), concurrency=2, poll=0.05, name="box:77:cafe")
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert holding.wait(10)
        sign_in(page, dashboard)
        page.get(dashboard.url("/workers"))
        section = page.find_element(By.CSS_SELECTOR, "section.worker").text
        assert "box:77:cafe" in section and "Threads\n4" in section  # 2, and 2 for cron calls
        assert "export-1" in section
        screenshot(page, "workers-holding")
    finally:
        release.set()
        worker.stop()
        thread.join(30)
    page.get(dashboard.url("/workers"))
    assert "No worker has said it is running" in page.page_source


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the roll reads alike on each
def test_due_work_that_no_live_worker_serves_is_said_on_every_surface(
    page: WebDriver, dashboard: Dashboard
) -> None:
    """A run's jobs due and no worker: the overview says in red that nothing is
    cleaning the policy and counts 0 workers alive, `status` data and /metrics
    say it too. A live worker that works other queues only changes the count;
    one that works the policy's queue ends the alarm, the jobs still due."""
    app = dashboard.app
    assert app.cleanup is not None
    app.cleanup.open_run("expired-sessions")

    def said() -> tuple[bool, str]:
        page.get(dashboard.url("/"))
        banner = page.find_elements(By.ID, "unserved")
        alive = page.find_element(By.CSS_SELECTOR, "a[href='/workers'] .big").text
        [row] = Status.of(app).policies()
        assert (row["unserved_seconds"] is not None) == bool(banner)
        return bool(banner), alive

    def metrics_say(*lines: str) -> None:
        """/metrics holds every line within its cache time ([http] metrics_cache)."""
        deadline = time.monotonic() + 15
        with dashboard.client() as client:
            while True:
                text = client.get("/metrics").text
                if all(line in text for line in lines):
                    return
                assert time.monotonic() < deadline, f"/metrics never said {lines}:\n{text}"
                time.sleep(0.5)

    sign_in(page, dashboard)
    assert said() == (True, "0")
    assert "Nothing is cleaning expired-sessions" in page.find_element(By.ID, "unserved").text
    metrics_say("expiry_workers_alive 0.0", 'expiry_policy_unserved{policy="expired-sessions"} 1.0')
    screenshot(page, "overview-unserved")

    roll = {"host": "box", "pid": 7, "threads": 2, "resting": {}, "holding": 0}
    app.engine.worker_seen("box:7:other", queues=["exports"], **roll)
    assert said() == (True, "1")
    metrics_say("expiry_workers_alive 1.0", 'expiry_policy_unserved{policy="expired-sessions"} 1.0')

    app.engine.worker_seen("box:8:cleaner", queues=[policy_queue("expired-sessions")], **roll)
    assert said() == (False, "2")
    metrics_say("expiry_workers_alive 2.0", 'expiry_policy_unserved{policy="expired-sessions"} 0.0')
    assert app.queue.stats().oldest_due_seconds  # still due: served, not done


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the schedules read alike on each
def test_a_schedule_no_scheduler_keeps_is_said_in_red_until_a_scheduler_takes_it(
    page: WebDriver, dashboard: Dashboard
) -> None:
    """The policy is scheduled and no scheduler runs (this server has none):
    the overview says in red that no scheduler keeps its schedule and how to
    start one; once a scheduler registers it and takes its fires, it is gone."""
    app = dashboard.app
    sign_in(page, dashboard)
    page.get(dashboard.url("/"))
    banner = page.find_element(By.ID, "unscheduled").text
    assert "No scheduler keeps the schedule of expired-sessions" in banner
    assert "no scheduler has registered it" in banner and "expiry scheduler" in banner
    screenshot(page, "overview-unscheduled")

    app.engine.schedule_register("expired-sessions", app.engine.now() - timedelta(hours=1))
    page.get(dashboard.url("/"))
    banner = page.find_element(By.ID, "unscheduled").text
    assert "its fire due" in banner and "ago was not taken" in banner

    app.scheduler().tick()
    page.get(dashboard.url("/"))
    assert not page.find_elements(By.ID, "unscheduled")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_workers_page_says_when_none_is_alive_and_lets_gone_ones_age_out(
    page: WebDriver, dashboard: Dashboard
) -> None:
    """Workers not seen lately are listed apart (and, past an hour, only
    counted: crashed workers used to stay listed as if running); with no live
    one the page says in red that nothing claims jobs."""
    app = dashboard.app
    roll = {"host": "box", "threads": 2, "queues": ["default"], "resting": {}, "holding": 0}
    app.engine.worker_seen("box:1:crashed", pid=1, **roll)
    app.engine.worker_seen("box:2:long-gone", pid=2, **roll)
    path = str(app.url).removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as lite, lite:
        lite.execute("update expiry_workers set seen_at = seen_at - 300 where pid = 1")
        lite.execute("update expiry_workers set seen_at = seen_at - 7200 where pid = 2")
    sign_in(page, dashboard)
    page.get(dashboard.url("/workers"))
    assert "No worker is alive" in page.find_element(By.ID, "no-worker").text
    gone = page.find_element(By.ID, "gone").text
    assert "box:1:crashed" in gone and "box:2:long-gone" not in gone
    assert "1 more not seen for over an hour" in page.page_source
    screenshot(page, "workers-none-alive")
    app.engine.worker_seen("box:3:alive", pid=3, **roll)
    page.get(dashboard.url("/workers"))
    assert not page.find_elements(By.ID, "no-worker")
    assert "box:3:alive" in page.find_element(By.CSS_SELECTOR, "section.worker").text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the roll reads alike on each
def test_the_workers_page_says_why_each_resting_queue_rests(dashboard: Dashboard) -> None:
    """A resting queue says why, not only for how long: a throttle's hold with
    the reading past its limit, or the policy's own pacing (nice_ratio)."""
    app = dashboard.app
    queue = policy_queue("expired-sessions")
    roll = {"host": "box", "threads": 2, "queues": [queue], "holding": 0}
    held = {"state": "held", "reason": "active_backends", "detail": "active_backends 6 > 3"}
    app.engine.worker_seen(
        "box:1:held", pid=1, resting={queue: 2.5}, health={"expired-sessions": held}, **roll
    )
    app.engine.worker_seen("box:2:nice", pid=2, resting={queue: 0.4}, **roll)
    with dashboard.signed_in_client() as client:
        page = client.get("/workers").text
    assert "held: active_backends 6 &gt; 3" in page
    assert "nice_ratio 1: rests 1x its last window&#39;s time" in page


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_run_waiting_its_turn_says_so_on_the_overview(
    page: WebDriver, dashboard: Dashboard
) -> None:
    """A later run's planning job, snoozed until the earlier run of its policy
    is done, no longer looks idle: the policy's row says what it waits for."""
    app = dashboard.app
    assert app.cleanup is not None
    now = app.engine.now().replace(microsecond=0)
    first = app.cleanup.open_run("expired-sessions", now - timedelta(minutes=30))
    worker = app.worker()
    [plan] = app.queue.claim(1, 60, owner="test", queues=app.worked_queues())
    worker.process(plan)  # the first run planned: its windows wait for a worker
    second = app.cleanup.open_run("expired-sessions", now)
    jobs = app.queue.claim(100, 60, owner="test", queues=app.worked_queues())
    worker.process(next(j for j in jobs if j.payload["run_id"] == second.run_id))
    for job in jobs:
        if job.payload["run_id"] != second.run_id:
            app.queue.release(job)  # back to waiting, unrun
    sign_in(page, dashboard)
    page.get(dashboard.url("/"))
    row = page.find_element(By.ID, "policy-expired-sessions").text
    assert f"1 job waiting: waiting for run {first.run_id}" in row, row
    screenshot(page, "overview-run-waits-its-turn")


def test_the_overview_draws_rows_per_minute_from_the_ledger_and_the_run_page_its_rate(
    page: WebDriver, dashboard: Dashboard
) -> None:
    """History from the database, not the process: the run's 450 deleted rows
    (the table's expired rows) drawn per minute on the overview, its total
    read from the ledger whichever process serves the page; the run page
    states the run's rate."""
    app = dashboard.app
    assert app.cleanup is not None
    opened = app.cleanup.open_run("expired-sessions")
    assert app.worker(until_idle=True, poll=0.05).run() == 0
    booked = app.engine.ledger_list("expired-sessions")
    assert sum(e.rows_affected for e in booked) == 450
    sign_in(page, dashboard)
    page.get(dashboard.url("/"))
    chart = page.find_element(By.CSS_SELECTOR, "#policy-expired-sessions svg.history")
    label = chart.get_attribute("aria-label") or ""
    assert label.startswith("450 rows in the last 60 minutes"), label
    bars = chart.find_elements(By.TAG_NAME, "rect")
    minutes = {e.applied_at.replace(second=0, microsecond=0) for e in booked}
    assert len(bars) == len(minutes)  # a bar a minute with rows, none for the others
    assert "450 rows, peak" in page.find_element(By.ID, "policy-expired-sessions").text
    screenshot(page, "overview-history")

    page.get(dashboard.url(f"/runs/{quote(opened.run_id, safe='')}"))
    facts = page.find_element(By.CSS_SELECTOR, "dl.facts").text
    assert "rows/s" in facts and "windows/s over its" in facts, facts
    assert "Finishes" not in facts  # a finished run has nothing left
