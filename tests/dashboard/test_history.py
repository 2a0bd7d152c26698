"""The policies' history from the database, not the process: once a minute
each policy's backlog, retries, dead letters, oldest expired row's age and
throttle hold are sampled into expiry's own table (health/history.py), by
whichever worker or scheduler comes first; the runs page of a policy draws
them, the overview's trend reads them, and a restarted server still has them.
Each sample is checked against the jobs and the table read with plain SQL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from dialects import dialect
from expiry.app import App
from expiry.health.history import History
from expiry.queue.jobs import policy_queue
from expiry.types import Sample

from .conftest import Dashboard, screenshot, sign_in

POLICY = "expired-sessions"


def execute(app: App, statement: str, params: list[Any]) -> list[dict[str, Any]]:
    """A statement written for PostgreSQL, run in the engine's dialect."""
    with app.engine.transaction() as conn:
        cur = conn.execute(dialect(app.engine).translate(statement), tuple(params))
        return list(cur.fetchall())


def states_by_sql(app: App) -> dict[str, int]:
    """The policy queue's jobs by state, counted with plain SQL."""
    rows = execute(
        app,
        "select state, count(*) as n from expiry.jobs where queue = %s group by state",
        [policy_queue(POLICY)],
    )
    return {str(r["state"]): int(r["n"]) for r in rows}


def oldest_age_by_sql(app: App) -> float:
    """Seconds since the table's oldest row expired, read with plain SQL and
    the database's clock (the sessions table's timestamps, per engine)."""
    engine = app.engine
    if engine.dialect == "postgres":
        sql = "select extract(epoch from now() - min(expires_at)) as age from sessions"
    elif engine.dialect == "mysql":
        sql = "select timestampdiff(microsecond, min(expires_at), utc_timestamp(6)) / 1e6 as age from sessions"
    else:
        sql = (
            "select (julianday('now') - 2440587.5) * 86400.0 - min(expires_at) as age from sessions"
        )
    with engine.transaction() as conn:
        return float(conn.execute(sql).fetchone()["age"])


def jobs_in_every_state(app: App) -> None:
    """A planned run's windows: two failed once (retrying), one dead, the rest waiting."""
    assert app.cleanup is not None
    app.cleanup.open_run(POLICY)
    worker = app.worker()
    [plan] = app.queue.claim(1, 60, owner="test", queues=app.worked_queues())
    worker.process(plan)
    windows = app.queue.claim(3, 60, owner="test", queues=app.worked_queues())
    assert len(windows) == 3
    for job in windows[:2]:
        assert app.engine.job_fail(job, "boom", "transient", 600.0) is not None
    assert app.engine.job_fail(windows[2], "bad", "permanent", None) is not None


def test_a_sample_holds_the_backlog_retries_dead_and_oldest_age_that_sql_reads(
    dashboard: Dashboard,
) -> None:
    app = dashboard.app
    while app.engine.now().second > 50:  # the whole test in one minute
        time.sleep(1)
    jobs_in_every_state(app)
    history = app.history
    assert history is not None
    assert history.sample() == 1
    by_sql, age = states_by_sql(app), oldest_age_by_sql(app)
    minute = app.engine.now().replace(second=0, microsecond=0)
    [kept] = app.engine.sample_list(minute - timedelta(minutes=1), policy=POLICY)
    assert kept.backlog == sum(
        n for s, n in by_sql.items() if s in ("available", "scheduled", "retryable", "running")
    )
    assert kept.backlog == 2 + 2  # two windows never claimed, two retrying
    assert kept.retrying == by_sql["retryable"] == 2
    assert kept.dead == by_sql["dead"] == 1
    assert kept.oldest_age is not None and abs(kept.oldest_age - age) < 5, (kept, age)
    assert kept.held is None
    # Once a minute: this process again, then another process (another History
    # on the same database), in the same minute, add nothing.
    time.sleep(1.1)
    assert app.engine.now().replace(second=0, microsecond=0) == kept.minute
    assert history.sample() == 0
    other = History(app.engine, history.cleanup, 3600)
    assert other.sample() == 0
    assert len(app.engine.sample_list(kept.minute, policy=POLICY)) == 1


def test_a_held_throttle_is_sampled_with_its_reading(dashboard: Dashboard) -> None:
    """A live worker reporting the policy held: the sample keeps what held it,
    and the history counts that minute for its reason."""
    app = dashboard.app
    health = {
        POLICY: {
            "state": "held",
            "reason": "active_backends",
            "detail": "active_backends 6 > 3",
            "held_seconds": 12.0,
            "throttled_seconds": {"active_backends": 12.0},
            "rate": None,
        }
    }
    app.engine.worker_seen(
        "w-held",
        host="h",
        pid=1,
        threads=1,
        queues=app.worked_queues(),
        resting={},
        holding=0,
        health=health,
    )
    history = app.history
    assert history is not None and history.sample() == 1
    [kept] = app.engine.sample_list(app.engine.now() - timedelta(minutes=1), policy=POLICY)
    assert kept.held == "active_backends 6 > 3"
    assert history.minutes(POLICY, 60).held_minutes == {"active_backends": 1}


def test_the_policy_page_draws_the_samples_and_the_overview_trend_reads_them(
    page: WebDriver, dashboard: Dashboard
) -> None:
    """Samples of earlier minutes (as workers took them) drawn on the policy's
    runs page, the figures in words matching them; the overview's trend reads
    them too (no process keeps them in memory), so a server that just started
    shows a trend, not "first sample". Showing the overview (signing in does)
    samples the current minute itself."""
    app = dashboard.app
    while app.engine.now().second > 50:  # the whole test in one minute
        time.sleep(1)
    now = app.engine.now().replace(second=0, microsecond=0)
    backlog = [40, 35, 30, 12, 5]
    ages = [9000.0, 8000.0, 7600.0, 7500.0, 7400.0]
    app.engine.sample_insert(
        [
            Sample(POLICY, now - timedelta(minutes=5 - i), b, i % 2, 1, a)
            for i, (b, a) in enumerate(zip(backlog, ages, strict=True))
        ]
    )
    sign_in(page, dashboard)
    page.get(dashboard.url(f"/runs?policy={POLICY}"))
    section = page.find_element(By.ID, "history")
    chart = section.find_element(By.CSS_SELECTOR, "#history-backlog svg")
    label = chart.get_attribute("aria-label") or ""
    # Five minutes inserted, and this minute's sample, which the overview shown
    # at sign-in took: nothing waits now.
    [current] = app.engine.sample_list(now, policy=POLICY)
    assert (current.backlog, current.dead) == (0, 0)
    assert label == "Backlog (jobs not final): 6 samples, now 0, at most 40", label
    words = section.find_element(By.CSS_SELECTOR, "#history-backlog .small")
    assert words.get_attribute("data-latest") == "0" and words.get_attribute("data-peak") == "40"
    assert len(chart.find_elements(By.TAG_NAME, "polyline")) == 1  # six minutes in a row
    dead = section.find_element(By.CSS_SELECTOR, "#history-dead .small").text
    assert dead == "now 0, at most 1", dead
    age = section.find_element(By.CSS_SELECTOR, "#history-oldest_age .small")
    assert current.oldest_age is not None
    assert float(age.get_attribute("data-latest") or 0) == current.oldest_age
    assert age.text.endswith(", at most 2 h 30 min"), age.text
    screenshot(page, "policy-history")

    # The overview's trend: the six samples and the reading now, not one sample.
    page.get(dashboard.url("/"))
    row = page.find_element(By.ID, "policy-expired-sessions")
    spark = row.find_element(By.CSS_SELECTOR, "svg.spark")
    assert "over 7 samples" in (spark.get_attribute("aria-label") or "")
    assert "first sample" not in row.text


def test_a_gap_in_the_samples_breaks_the_line(dashboard: Dashboard) -> None:
    """No worker or scheduler ran for some minutes: the line stops there
    rather than joining the minutes around the gap."""
    app = dashboard.app
    now = app.engine.now().replace(second=0, microsecond=0)
    app.engine.sample_insert(
        [Sample(POLICY, now - timedelta(minutes=m), 3, 0, 0, 10.0) for m in (9, 8, 2, 1)]
    )
    with dashboard.signed_in_client() as client:
        page = client.get(f"/runs?policy={POLICY}").text
    backlog = page[page.index('id="history-backlog"') :]
    backlog = backlog[: backlog.index("</figure>")]
    assert backlog.count("<polyline") == 2, backlog


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_an_idle_worker_process_samples_each_policy_within_seconds(
    dashboard: Dashboard, tmp_path: Path
) -> None:
    """As deployed: `expiry worker` with nothing to do samples the policy
    from its rescuer's sweep (every few seconds), once for the minute."""
    app = dashboard.app
    config = tmp_path / "expiry.toml"
    config.write_text(
        f'[database]\nurl = "{app.url}"\n\n[[policy]]\nname = "{POLICY}"\n'
        'table = "sessions"\nkey = "id"\ntimestamp = "expires_at"\n'
    )
    env = {**os.environ, "EXPIRY_CONFIG": str(config)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "expiry", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        samples: list[Any] = []
        while not samples and time.monotonic() < deadline:
            time.sleep(0.5)
            samples = app.engine.sample_list(app.engine.now() - timedelta(minutes=2))
        assert samples, "no sample in 30 s"
        assert samples[0].policy == POLICY and samples[0].backlog == 0
        assert samples[0].oldest_age is not None and samples[0].oldest_age > 7000
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]


@pytest.mark.parametrize("db_url", ["sqlite", "mysql"], indirect=True)
def test_expiry_history_prints_what_the_api_returns(dashboard: Dashboard, tmp_path: Path) -> None:
    """`expiry history POLICY` reads the same minutes as GET
    /v1/policies/{name}/history: its --json equals the API's answer, its table
    shows the sampled figures and says which minutes nobody sampled; an
    unknown policy exits 2 naming the known one."""
    app = dashboard.app
    while app.engine.now().second > 50:  # the whole test in one minute
        time.sleep(1)
    now = app.engine.now().replace(second=0, microsecond=0)
    app.engine.sample_insert(
        [
            Sample(POLICY, now - timedelta(minutes=3), 1234, 7, 2, 5400.0, "active_backends 6 > 3"),
            Sample(POLICY, now - timedelta(minutes=1), 12, 0, 2, 60.0),
        ]
    )
    config = tmp_path / "expiry.toml"
    config.write_text(
        f'[database]\nurl = "{app.url}"\n\n[[policy]]\nname = "{POLICY}"\n'
        'table = "sessions"\nkey = "id"\ntimestamp = "expires_at"\n'
    )
    env = {**os.environ, "EXPIRY_CONFIG": str(config), "COLUMNS": "160"}

    def expiry(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "expiry", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    shown = expiry("history", POLICY, "--minutes", "5", "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    with dashboard.client() as client:
        api = client.get(
            f"/v1/policies/{POLICY}/history?minutes=5",
            headers={"Authorization": f"Bearer {dashboard.key}"},
        )
    assert api.status_code == 200, api.text
    assert report == api.json()
    sampled = [m for m in report["minutes"] if m["sampled"]]
    assert [(m["backlog"], m["retrying"], m["dead"]) for m in sampled] == [(1234, 7, 2), (12, 0, 2)]
    assert report["held_minutes"] == {"active_backends": 1}

    table = expiry("history", POLICY, "--minutes", "5")
    assert table.returncode == 0, table.stderr
    assert "1,234" in table.stdout and "1h30m" in table.stdout, table.stdout
    assert table.stdout.count("not sampled") == 3, table.stdout
    assert "throttle held it: 1 min for active_backends" in table.stdout

    unknown = expiry("history", "expired-session")
    assert unknown.returncode == 2 and "did you mean 'expired-sessions'" in unknown.stderr
