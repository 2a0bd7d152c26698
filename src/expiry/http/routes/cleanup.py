"""Cleanup over HTTP: trigger a policy's run (or dry-run it), list the
policies, pause and resume them, read runs and cancel one."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from ...app import App
from ...cleanup.holds import holds_report
from ...cleanup.service import Cleanup
from ...errors import ConfigError
from ...status import Status
from ...times import format_time, parse_since
from .. import models as m
from ..deps import Approver, ExpiryApp, Reader, Trigger
from ..errors import NOT_FOUND, ApiError

router = APIRouter(prefix="/v1", tags=["cleanup"])

# Path and query text reaches SQL parameters: constrain it like the bodies.
RunId = Annotated[str, Path(max_length=300, pattern=m.NO_NUL)]
PolicyFilter = Annotated[str | None, Query(max_length=63, pattern=m.NO_NUL)]


def cleanup_of(app: App) -> Cleanup:
    """The App's cleanup; 404 for a server started without policies."""
    if app.cleanup is None:
        raise ApiError(404, "no_policies", "this server has no config with policies")
    return app.cleanup


def known_policy(app: App, name: str) -> Cleanup:
    """The App's cleanup, once it knows the policy ``name``; else 404."""
    cleanup = cleanup_of(app)
    try:
        cleanup.policy(name)
    except ConfigError as exc:
        raise ApiError(404, "not_found", str(exc)) from None
    return cleanup


@router.post("/cleanup/trigger", response_model=m.Triggered, responses=NOT_FOUND)
def trigger(body: m.TriggerRequest, key: Trigger, app: ExpiryApp) -> m.Triggered:
    cleanup = known_policy(app, body.policy)
    if body.dry_run:
        preview = cleanup.preview(body.policy, body.cutoff)
        return m.Triggered(
            policy=body.policy,
            cutoff=format_time(preview.cutoff),
            dry_run=True,
            candidates=preview.candidates,
            windows=preview.windows,
            first_windows=[
                m.Window(range=s.describe(), **s.payload(windows=False))
                for s in preview.first_windows
            ],
            strategy=preview.strategy,
            partitions=preview.partitions,
            held=preview.held,
        )
    opened = cleanup.open_run(
        body.policy, body.cutoff, opened_by="api", actor=f"api:{key.name}", force=body.force
    )
    return m.Triggered(
        policy=body.policy,
        cutoff=format_time(opened.cutoff),
        dry_run=False,
        run_id=opened.run_id,
        created=opened.created,
    )


@router.get("/holds", response_model=list[m.HoldReport])
def holds(_: Reader, app: ExpiryApp) -> list[dict[str, Any]]:
    """The config's legal holds, each with the expired rows it keeps per policy."""
    cleanup = cleanup_of(app)
    return holds_report(cleanup, cleanup.config)


@router.get("/policies")
def policies(_: Reader, app: ExpiryApp) -> list[dict[str, Any]]:
    return Status.of(app).policies()


@router.get("/policies/{name}/history", response_model=m.PolicyHistory, responses=NOT_FOUND)
def policy_history(
    name: Annotated[str, Path(max_length=63, pattern=m.NO_NUL)],
    _: Reader,
    app: ExpiryApp,
    minutes: Annotated[int, Query(ge=1, le=1440)] = 60,
) -> m.PolicyHistory:
    """The policy's last ``minutes`` minutes, one entry a minute, from the
    database: rows cleaned (the ledger) and the sampled backlog, retries,
    dead letters, oldest expired row's age and throttle holds."""
    known_policy(app, name)
    assert app.history is not None  # known_policy: the App has a config
    return m.PolicyHistory(**app.history.minutes(name, minutes).report())


def set_paused(app: App, policy: str, paused: bool, actor: str) -> m.Paused:
    known_policy(app, policy)
    app.scheduler().set_paused(policy, paused, actor=actor)
    return m.Paused(name=policy, paused=paused)


@router.post("/policies/{name}/pause", response_model=m.Paused, responses=NOT_FOUND)
def policy_pause(name: str, key: Trigger, app: ExpiryApp) -> m.Paused:
    return set_paused(app, name, True, f"api:{key.name}")


@router.post("/policies/{name}/resume", response_model=m.Paused, responses=NOT_FOUND)
def policy_resume(name: str, key: Trigger, app: ExpiryApp) -> m.Paused:
    return set_paused(app, name, False, f"api:{key.name}")


@router.get("/runs")
def runs(
    _: Reader, app: ExpiryApp, policy: PolicyFilter = None, limit: int = 20
) -> list[dict[str, Any]]:
    return Status.of(app).runs(policy, max(1, min(limit, 200)))


@router.post("/runs/cancel", responses=NOT_FOUND)
def run_cancel(body: m.CancelRunRequest, key: Trigger, app: ExpiryApp) -> dict[str, Any]:
    """Cancel a run: planning stops, its waiting jobs are cancelled, running ones
    finish; 404 for no such run, 409 for one that finished already."""
    if Status.of(app).run_summary(body.run_id) is None:
        raise ApiError(404, "not_found", f"no run {body.run_id!r}")
    try:
        return app.runs.cancel(body.run_id, actor=f"api:{key.name}")
    except ConfigError as exc:
        raise ApiError(409, "run_finished", str(exc)) from None


@router.post("/runs/approve", responses=NOT_FOUND)
def run_approve(body: m.ApproveRunRequest, key: Approver, app: ExpiryApp) -> dict[str, Any]:
    """Approve a run awaiting approval (a policy with approve = true): its
    planning goes on at the run's cutoff. 404 for no such run; 409 for one
    that awaits no approval, is finished, or was previewed under another
    version of its policy (it previews again: approve that)."""
    if Status.of(app).run_summary(body.run_id) is None:
        raise ApiError(404, "not_found", f"no run {body.run_id!r}")
    try:
        cleanup_of(app).approve(body.run_id, actor=f"api:{key.name}")
    except ConfigError as exc:
        raise ApiError(409, "not_approvable", str(exc)) from None
    found = Status.of(app).run_summary(body.run_id)
    assert found is not None
    return found


@router.get("/runs/{run_id:path}", responses=NOT_FOUND)
def run(run_id: RunId, _: Reader, app: ExpiryApp) -> dict[str, Any]:
    found = Status.of(app).run_summary(run_id)
    if found is None:
        raise ApiError(404, "not_found", f"no run {run_id!r}")
    return found


@router.get("/evidence/{policy}", responses=NOT_FOUND)
def evidence(
    policy: Annotated[str, Path(max_length=63, pattern=m.NO_NUL)],
    _: Reader,
    app: ExpiryApp,
    since: Annotated[str | None, Query(max_length=64, pattern=m.NO_NUL)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> list[dict[str, Any]]:
    """What the policy's runs deleted or archived, from the ledger booked at or
    after ``since`` (ISO-8601, or how long ago: ``30d``), oldest run first, each
    with its operations, at most ``limit`` operations in all (page on with
    ``since`` = the last one's ``applied_at``): ``expiry evidence`` over HTTP."""
    start = None
    if since is not None:
        try:
            start = parse_since(since, app.engine.now())
        except ValueError as exc:
            raise ApiError(422, "invalid_since", f"since {exc}") from None
    return Status.of(app).evidence(policy, start, limit)
