"""The dashboard's reading pages: overview, runs, the queue's charts, jobs and
the dead-letter queue, one job, workers, cron targets, the audit log. Each reads with
bounded queries and renders without JavaScript; without a session it sends the
browser to sign in."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ...app import App
from ...errors import ExpiryError
from ...keys import Principal
from ...status import STALE_AFTER_SECONDS, Status
from ...types import JobState, LedgerMinute
from .. import views as v
from ..deps import DashboardPages, ExpiryApp, Reading
from ..render import page_number

HISTORY_MINUTES = 60
"""The minutes a policy's history on the runs page draws."""

log = logging.getLogger("expiry.http")
router = APIRouter(include_in_schema=False)


def policy_names(app: App) -> list[str]:
    return [p.name for p in (app.cleanup.policies if app.cleanup else [])]


@router.get("/")
def overview(request: Request, app: ExpiryApp, pages: DashboardPages, session: Reading) -> Response:
    policies, error = _policies(app)
    totals: dict[str, int] = {}
    for states in app.queue.stats().by_state.values():
        for state, n in states.items():
            totals[state] = totals.get(state, 0) + n
    return pages.render(
        request,
        "overview.html",
        session,
        policies=policies,
        error=error,
        totals=totals,
        has_config=app.cleanup is not None,
        crons=len(app.crons.targets()),
        workers_alive=Status.of(app).workers_alive(),
        stale_after=STALE_AFTER_SECONDS,
    )


@router.get("/runs")
def runs(
    request: Request,
    app: ExpiryApp,
    pages: DashboardPages,
    session: Reading,
    policy: str = "",
    page: str = "1",
) -> Response:
    number = page_number(page)
    limit = min(number * v.PAGE_SIZE + 1, v.SCAN_LIMIT)
    found = app.engine.run_list(policy or None, limit)
    listed = v.page_of(found, number)
    summaries = [s for r in listed.items if (s := Status.of(app).run_summary(r.id))]
    return pages.render(
        request,
        "runs.html",
        session,
        runs=summaries,
        page=listed,
        policy=policy,
        policy_names=policy_names(app),
        history=_history(app, policy) if policy in policy_names(app) else None,
    )


@router.get("/policies/{name}/plan")
def plan(
    request: Request, name: str, app: ExpiryApp, pages: DashboardPages, session: Reading
) -> Response:
    """What a run of the policy would do now, as `expiry plan` says it (a dry
    run: it reads, in a read-only transaction, and changes nothing)."""
    if app.cleanup is None or name not in {p.name for p in app.cleanup.policies}:
        return pages.render(request, "missing.html", session, status=404, what=f"policy {name}")
    try:
        preview = app.cleanup.preview(name)
    except ExpiryError as exc:
        return pages.render(request, "plan.html", session, name=name, error=str(exc))
    return pages.render(request, "plan.html", session, name=name, preview=preview)


@router.get("/runs/{run_id:path}")
def run(
    request: Request, run_id: str, app: ExpiryApp, pages: DashboardPages, session: Reading
) -> Response:
    summary = Status.of(app).run_summary(run_id)
    if summary is None:
        return pages.render(request, "missing.html", session, status=404, what=f"run {run_id}")
    dead, _ = v.find_jobs(app, JobState.DEAD, session.principal, run_id=run_id)
    events, _ = v.audit_events(app, session.principal, policy=summary["policy"], run_id=run_id)
    by_state = v.bars([(s, n, str(n)) for s, n in sorted(summary["jobs_by_state"].items())])
    return pages.render(
        request,
        "run.html",
        session,
        run=summary,
        pace=v.run_pace(summary, app.engine.now()),
        by_state=by_state,
        dead=dead[:50],
        events=events[:50],
    )


@router.get("/queue")
def queue(request: Request, app: ExpiryApp, pages: DashboardPages, session: Reading) -> Response:
    return pages.render(request, "queue.html", session, **_queue_charts(app, session.principal))


@router.get("/crons")
def crons(request: Request, app: ExpiryApp, pages: DashboardPages, session: Reading) -> Response:
    mine = "admin" in session.scopes
    targets = [t for t in app.crons.targets() if mine or t["owner"] == session.key_name]
    now = app.engine.now()
    for target in targets:
        target["calls"] = app.crons.calls(target["name"], limit=5)
        target.update(app.crons.timing(target, now))
    return pages.render(
        request, "crons.html", session, targets=targets, call_timeout=app.crons.call_timeout
    )


@router.get("/workers")
def workers(request: Request, app: ExpiryApp, pages: DashboardPages, session: Reading) -> Response:
    return pages.render(request, "workers.html", session, **Status.of(app).workers())


@router.get("/audit")
def audit(
    request: Request,
    app: ExpiryApp,
    pages: DashboardPages,
    session: Reading,
    policy: str = "",
    action: str = "",
    page: str = "1",
) -> Response:
    every, truncated = v.audit_events(app, session.principal, policy=policy or None)
    actions = sorted({e["action"] for e in every})
    chosen = [e for e in every if not action or e["action"] == action]
    listed = v.page_of(chosen, page_number(page), total=len(chosen), truncated=truncated)
    return pages.render(
        request,
        "audit.html",
        session,
        page=listed,
        policy=policy,
        action=action,
        actions=actions,
        policy_names=policy_names(app),
    )


@router.get("/jobs")
def jobs(
    request: Request,
    app: ExpiryApp,
    pages: DashboardPages,
    session: Reading,
    state: str = "available",
    queue: str = "",
    policy: str = "",
    run: str = "",
    page: str = "1",
) -> Response:
    chosen = JobState(state) if state in JobState._value2member_map_ else JobState.AVAILABLE
    filters = {"queue": queue, "policy": policy, "run": run, "page": page}
    return pages.render(
        request, "jobs.html", session, **_jobs(app, session.principal, chosen, False, filters)
    )


@router.get("/dlq")
def dlq(
    request: Request,
    app: ExpiryApp,
    pages: DashboardPages,
    session: Reading,
    queue: str = "",
    policy: str = "",
    run: str = "",
    error: str = "",
    page: str = "1",
) -> Response:
    filters = {"queue": queue, "policy": policy, "run": run, "error": error, "page": page}
    return pages.render(
        request, "jobs.html", session, **_jobs(app, session.principal, JobState.DEAD, True, filters)
    )


@router.get("/jobs/{key:path}")
def job(
    request: Request, key: str, app: ExpiryApp, pages: DashboardPages, session: Reading
) -> Response:
    found = app.queue.get(key)
    if found is None or not session.principal.can_see_queue(found.queue):
        # a job on a queue the key may not see is answered as one that is not there
        return pages.render(request, "missing.html", session, status=404, what=f"job {key}")
    events, truncated = v.audit_events(app, session.principal, job_key=key)
    return pages.render(
        request,
        "job.html",
        session,
        job=found,
        policy=v.job_policy(found),
        ledger=app.engine.ledger_get(key),
        attempts=v.attempts(found),
        events=events,
        events_truncated=truncated,
        waiting=found.state.value in ("scheduled", "available", "retryable"),
    )


# -- what the pages show ----------------------------------------------------------------


def _policies(app: App) -> tuple[list[dict[str, Any]], str | None]:
    """The status view of every policy, with its watermark's level and its
    trend over the last hour's samples (the database's: a restart keeps them).
    Showing it samples the policies too, once a minute as the workers do."""
    if app.history is not None and not app.read_only:
        try:  # a page view samples too (serve --no-workers, every worker down)
            app.history.sample()
        except Exception as exc:
            log.warning("could not sample the policies' history: %s", exc)
    try:
        policies = Status.of(app).policies()
    except ExpiryError as exc:
        return [], str(exc)
    now = app.engine.now()
    config = {p.name: p for p in (app.cleanup.policies if app.cleanup else [])}
    hour = now - timedelta(hours=1)
    minutes = app.engine.ledger_minutes(hour)
    samples = app.engine.sample_list(hour)
    for row in policies:
        row["history"] = v.minute_bars([m for m in minutes if m.policy == row["name"]], now)
        if row["broken"]:
            row.update(level="alert", warn=None, alert=None, trend="", spark="", samples=0)
            continue
        series = [
            (s.minute, s.oldest_age)
            for s in samples
            if s.policy == row["name"] and s.oldest_age is not None
        ]
        series.append((now, row["watermark_seconds"]))
        policy = config.get(row["name"])
        row.update(
            level=v.level(policy, row["watermark_seconds"]),
            warn=policy.watermark_warn if policy else None,
            alert=policy.watermark_alert if policy else None,
            trend=v.trend(series),
            spark=v.sparkline(series),
            samples=len(series),
        )
    return policies, None


def _history(app: App, policy: str) -> dict[str, Any] | None:
    """The policy's last hour a minute at a time, as the runs page draws it."""
    if app.history is None:
        return None
    minutes = app.history.minutes(policy, HISTORY_MINUTES)
    now = minutes.minutes[-1] + timedelta(seconds=59)
    rows = [
        LedgerMinute(policy, m, 0, n) for m, n in zip(minutes.minutes, minutes.rows, strict=True)
    ]
    return {
        "minutes": len(minutes.minutes),
        "sampled": minutes.sampled,
        "rows": v.minute_bars(rows, now, count=HISTORY_MINUTES, width=240, height=40),
        "lines": {
            field: v.minute_line(minutes.series(field))
            for field in ("backlog", "retrying", "dead", "oldest_age")
        },
        "held": minutes.held_minutes,
    }


def _queue_charts(app: App, who: Principal) -> dict[str, Any]:
    """The queue page's charts; the running jobs' keys only on queues ``who`` may see."""
    view = Status.of(app).queue()
    view["running"] = [r for r in view["running"] if who.can_see_queue(r["queue"])]
    now = app.engine.now()
    states = [s.value for s in JobState]
    due_ages: list[float] = []
    for state in (JobState.AVAILABLE, JobState.RETRYABLE, JobState.SCHEDULED):
        for job in app.engine.job_list(state, None, v.SCAN_LIMIT):
            age = (now - job.run_at).total_seconds()
            if age >= 0:
                due_ages.append(age)
    oldest = v.bars(
        [(q, age, v.short_duration(age)) for q, age in sorted(view["oldest_due_seconds"].items())]
    )
    running = sorted(view["running"], key=lambda r: -r["held_seconds"])[:20]
    return {
        "states": states,
        "by_queue": v.stacked(view["jobs_by_queue_and_state"], states),
        "oldest": oldest,
        "due_ages": v.age_histogram(due_ages),
        "due_count": len(due_ages),
        "running": v.bars(
            [(r["job"], r["held_seconds"], v.short_duration(r["held_seconds"])) for r in running]
        ),
        "running_total": len(view["running"]),
        "retries": v.bars(
            [
                (k, n, str(n))
                for k, n in sorted(view["retries_by_kind"].items(), key=lambda i: -i[1])
            ]
        ),
        "dead": view["dead"],
    }


def _jobs(
    app: App, who: Principal, state: JobState, dlq: bool, filters: dict[str, str]
) -> dict[str, Any]:
    """A page of the jobs ``who`` may see in ``state`` matching the filters
    (``dlq``: shown as the dead-letter queue, its jobs grouped by error above)."""
    jobs, truncated = v.find_jobs(
        app,
        state,
        who,
        queue=filters["queue"] or None,
        policy=filters["policy"] or None,
        run_id=filters.get("run") or None,
    )
    groups = v.dead_groups(jobs) if dlq else []
    if filters.get("error"):
        jobs = [j for j in jobs if v.error_group(j) == filters["error"]]
    listed = v.page_of(jobs, page_number(filters["page"]), total=len(jobs), truncated=truncated)
    return {
        "dlq": dlq,
        "groups": groups,
        "state": state.value,
        "page": listed,
        "filters": filters,
        "queues": sorted(q for q in app.queue.stats().by_state if who.can_see_queue(q)),
        "policy_names": policy_names(app),
        "job_policy": v.job_policy,
    }
