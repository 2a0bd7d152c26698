"""The dead-letter page for on-call: dead jobs grouped by their error, with a
redrive or discard per group and per run, a run cancelled by clicking, and
pages that work on a phone (390 px wide) with every button on screen."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from .conftest import ARTIFACTS, Dashboard, sign_in

RUN = "expired-sessions:2026-01-01T00:00:00Z"


def dead(dashboard: Dashboard, key: str, error: str, kind: str, run: str | None = None) -> None:
    """A dead job of ``run`` (when given) that failed with ``error``."""
    app = dashboard.app
    payload = {"policy": "expired-sessions", "run_id": run} if run else {"n": key}
    app.queue.enqueue("no.such.handler", payload, key=key, queue="mail", max_attempts=1)
    [job] = app.queue.claim(1, 60, queues=("mail",), owner="test")
    app.queue.fail(job, error, transient=False, kind=kind)


def arrange(dashboard: Dashboard) -> None:
    """29 dead windows of one run that met a lock (rows and ids differ), 3
    jobs whose handler is missing, 8 more lock failures of no run."""
    for i in range(29):
        dead(
            dashboard, f"w-{i}", f"lock timeout on row {1000 + i} of sessions", "lock_timeout", RUN
        )
    for i in range(3):
        dead(dashboard, f"h-{i}", "KeyError: no handler 'no.such.handler'", "permanent")
    for i in range(8):
        dead(dashboard, f"x-{i}", f"lock timeout on row {i} of sessions", "lock_timeout")


def wait_for(browser: WebDriver, words: str) -> None:
    WebDriverWait(browser, 10).until(lambda b: words in b.page_source)


def bulk(page: WebDriver, link: str, action: str, n: int) -> None:
    """Follow a bulk link, check the count it confirms, confirm, and wait."""
    page.find_element(By.PARTIAL_LINK_TEXT, link).click()
    wait_for(page, f"{action.capitalize()} dead letters")
    assert f"This will {action} {n} dead jobs." in page.find_element(By.ID, "bulk-count").text
    page.find_element(
        By.XPATH, f"//button[normalize-space()='{action.capitalize()} {n} jobs']"
    ).click()
    WebDriverWait(page, 5).until(ec.alert_is_present()).accept()
    done = {"redrive": "Redrove", "discard": "Discarded"}[action]
    wait_for(page, f"{done} {n} jobs.")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_dead_letters_are_grouped_by_error_and_a_group_is_redriven(
    page: WebDriver, dashboard: Dashboard
) -> None:
    arrange(dashboard)
    sign_in(page, dashboard)
    page.get(dashboard.url("/dlq"))
    groups = [g.text for g in page.find_elements(By.CSS_SELECTOR, "li.group")]
    assert len(groups) == 2
    assert groups[0].startswith("37 lock_timeout lock timeout on row")
    assert groups[1].startswith("3 permanent KeyError: no handler")

    bulk(page, "Redrive 37", "redrive", 37)
    assert {dashboard.job_state(f"w-{i}") for i in range(29)} == {"available"}
    assert {dashboard.job_state(f"h-{i}") for i in range(3)} == {"dead"}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_runs_dead_jobs_are_discarded_from_the_run_page(
    page: WebDriver, dashboard: Dashboard
) -> None:
    app = dashboard.app
    assert app.engine.run_insert(RUN, "expired-sessions", app.engine.now(), "test")
    app.engine.run_add_windows(RUN, 29, done=True)
    arrange(dashboard)
    sign_in(page, dashboard)
    page.get(dashboard.url(f"/runs/{quote(RUN, safe='')}"))
    bulk(page, "Discard them", "discard", 29)
    assert {dashboard.job_state(f"w-{i}") for i in range(29)} == {"cancelled"}
    assert {dashboard.job_state(f"x-{i}") for i in range(8)} == {"dead"}


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_cancel_a_run_by_clicking(page: WebDriver, dashboard: Dashboard) -> None:
    app = dashboard.app
    assert app.cleanup is not None
    opened = app.cleanup.open_run("expired-sessions")
    sign_in(page, dashboard)
    page.get(dashboard.url(f"/runs/{quote(opened.run_id, safe='')}"))
    page.find_element(By.CSS_SELECTOR, f"button[aria-label='Cancel run {opened.run_id}']").click()
    WebDriverWait(page, 5).until(ec.alert_is_present()).accept()
    wait_for(page, f"Cancelled run {opened.run_id}")
    assert "Cancelled by dashboard:ops" in page.page_source
    summary = app.runs.summary(opened.run_id)
    assert summary is not None and summary["outcome"] == "cancelled"
    assert dashboard.job_state(f"{opened.run_id}:plan") == "cancelled"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dead_letter_page_fits_a_phone(page: WebDriver, dashboard: Dashboard) -> None:
    """390 px wide: nothing wider than the screen, each job a card with its
    buttons on screen, and a page of 25 jobs a few screens tall, not 17,000 px."""
    arrange(dashboard)
    sign_in(page, dashboard)
    page.set_window_size(390, 844)
    try:
        for path in ("/dlq", "/", "/runs", "/workers", "/jobs?state=dead"):
            page.get(dashboard.url(path))
            width = page.execute_script("return document.documentElement.scrollWidth")
            assert width <= 390, (path, width)
        page.get(dashboard.url("/dlq"))
        inner = page.execute_script("return window.innerWidth")
        for button in page.find_elements(By.CSS_SELECTOR, "table.jobs td.actions button"):
            rect = page.execute_script("return arguments[0].getBoundingClientRect()", button)
            assert 0 <= rect["left"] and rect["right"] <= inner, rect
        height = page.execute_script("return document.documentElement.scrollHeight")
        assert height < 9000, height
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.save_screenshot(str(ARTIFACTS / "dlq-390px-first-screen.png"))
        page.set_window_size(390, min(int(height) + 140, 9000))
        page.save_screenshot(str(ARTIFACTS / "dlq-390px.png"))
    finally:
        page.set_window_size(1400, 1000)


WIDEST = (
    "return [...document.querySelectorAll('body *')]"
    ".filter(e => e.getBoundingClientRect().right > 390 && !e.closest('.scroll'))"
    ".slice(0, 5).map(e => e.tagName + '.' + e.className)"
)
"""What sticks out past the screen (outside the tables that scroll sideways)."""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def phone_screenshot(page: WebDriver, path: str) -> None:
    """The page as a 390 px phone shows it, whole (artifacts/dashboard/390px-*.png)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page_of = "/run" if path.startswith("/runs/") else path.split("?")[0]  # not its id
    slug = re.sub(r"[^a-z0-9]+", "-", page_of.lower()).strip("-") or "overview"
    slug = "policy-history" if "?policy=" in path else slug
    height = page.execute_script("return document.documentElement.scrollHeight")
    page.set_window_size(390, min(int(height) + 140, 9000))
    page.save_screenshot(str(ARTIFACTS / f"390px-{slug}.png"))
    page.set_window_size(390, 844)


def test_every_page_fits_a_phone(page: WebDriver, dashboard: Dashboard) -> None:
    """390 x 844, an on-call phone: no page is wider than the screen (a run,
    a job, the queue, cron targets, the audit log, a policy's plan and its
    history, the sign-in page), so nothing needs a sideways scroll to be read or pressed."""
    app = dashboard.app
    assert app.cleanup is not None
    arrange(dashboard)
    opened = app.cleanup.open_run("expired-sessions")
    app.crons.create(
        "nightly-digest-for-the-whole-team",
        dashboard.url("/v1/health?team=platform-on-call&token=a-long-query-string-value"),
        "0 3 * * *",
        owner="ops",
    )
    sign_in(page, dashboard)
    page.set_window_size(390, 844)
    paths = [
        "/",
        "/queue",
        "/crons",
        "/audit",
        "/runs",
        "/runs?policy=expired-sessions",  # the policy's history charts
        f"/runs/{quote(opened.run_id, safe='')}",
        "/jobs/w-1",
        "/jobs?state=available",
        "/workers",
        "/policies/expired-sessions/plan",
        "/dlq/bulk?action=redrive",
    ]
    wide = {}
    try:
        for path in paths:
            page.get(dashboard.url(path))
            width = page.execute_script("return document.documentElement.scrollWidth")
            if width > 390:
                wide[path] = (width, page.execute_script(WIDEST))
            phone_screenshot(page, path)
        page.delete_all_cookies()
        page.get(dashboard.url("/login"))
        width = page.execute_script("return document.documentElement.scrollWidth")
        if width > 390:
            wide["/login"] = width
    finally:
        page.set_window_size(1400, 1000)
    assert wide == {}, wide


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_cron_target_is_edited_from_the_cron_page(page: WebDriver, dashboard: Dashboard) -> None:
    """Open Edit, change the schedule, confirm: the target is changed and the
    change audited; a schedule the API would refuse is refused with the field
    named, and changes nothing. Its call timeout is set the same way, and a
    blank one goes back to [http] call_timeout."""
    app = dashboard.app
    app.crons.create("digest", dashboard.url("/v1/health"), "0 3 * * *")
    sign_in(page, dashboard)

    def edit(schedule: str, name: str = "schedule") -> None:
        page.get(dashboard.url("/crons"))
        page.find_element(By.XPATH, "//details[@class='edit']/summary").click()
        field = page.find_element(By.CSS_SELECTOR, f"form[action='/crons/edit'] input[name={name}]")
        field.clear()
        field.send_keys(schedule)
        page.find_element(By.CSS_SELECTOR, "form[action='/crons/edit'] button[type=submit]").click()
        WebDriverWait(page, 5).until(ec.alert_is_present()).accept()

    edit("*/5 * * * *")
    wait_for(page, "Changed cron target digest.")
    target = app.crons.get("digest")
    assert target is not None and target["schedule"] == "*/5 * * * *"
    edit("61 * * * *")
    wait_for(page, "Cron target digest not changed: schedule:")
    target = app.crons.get("digest")
    assert target is not None and target["schedule"] == "*/5 * * * *"
    [event] = [e for e in app.engine.audit_list(limit=20) if e.action == "cron.updated"]
    assert event.actor == f"dashboard:{dashboard.key_name}"
    assert event.detail["schedule"] == {"from": "0 3 * * *", "to": "*/5 * * * *"}

    row = page.find_element(By.XPATH, "//th[starts-with(normalize-space(), 'digest')]").text
    assert "times out after 10 s ([http] call_timeout)" in row, row
    edit("45", name="timeout_seconds")
    wait_for(page, "Changed cron target digest.")
    target = app.crons.get("digest")
    assert target is not None and target["timeout_seconds"] == 45.0
    assert "times out after 45 s" in page.find_element(By.TAG_NAME, "main").text
    edit("", name="timeout_seconds")
    wait_for(page, "Changed cron target digest.")
    target = app.crons.get("digest")
    assert target is not None and target["timeout_seconds"] is None
    timeouts = [
        e.detail["timeout_seconds"]
        for e in app.engine.audit_list(limit=20)
        if e.action == "cron.updated" and "timeout_seconds" in e.detail
    ]
    assert timeouts == [{"from": 45.0, "to": None}, {"from": None, "to": 45.0}]
