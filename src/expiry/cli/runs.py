"""The commands about runs and what they left: trigger, plan, status, runs,
evidence and the dead-letter queue."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..app import App
from ..cleanup.holds import holds_report
from ..cleanup.preview import PlanPreview
from ..errors import ConfigError
from ..status import Status
from ..times import format_time, parse_duration
from ..times import parse_since as since_of
from .opening import cleanup_of, migrated, parse_cutoff, reading
from .output import (
    emit,
    out,
    print_dead_jobs,
    print_evidence,
    print_history,
    print_holds,
    print_json,
    print_preview,
    print_run,
    print_runs,
    print_status,
    wait_with_progress,
    write_evidence_csv,
)

if TYPE_CHECKING:
    from ..queue.jobs import Queue

logger = logging.getLogger("expiry.cli")


def cmd_trigger(args: argparse.Namespace) -> int:
    cutoff = parse_cutoff(args.cutoff)
    timeout = parse_timeout(args.timeout)
    if timeout is not None and not args.wait:
        raise ConfigError("--timeout bounds --wait: add --wait, or drop --timeout")
    if args.dry_run:
        return dry_run(args, reading(args, need_config=True), cutoff)
    app = migrated(args, need_config=True)
    cleanup = cleanup_of(app)
    opened = cleanup.open_run(
        args.policy, cutoff, opened_by="cli", actor=args.actor, force=args.force
    )
    if args.wait:
        return wait_for_run(args, app, opened.run_id, timeout)
    verb = "opened" if opened.created else "was already open"
    data = {
        "run_id": opened.run_id,
        "policy": opened.policy,
        "cutoff": format_time(opened.cutoff),
        "created": opened.created,
    }
    emit(args, data, lambda: out.print(f"run {opened.run_id} {verb}"))
    return 0


def wait_for_run(args: argparse.Namespace, app: App, run_id: str, timeout: float | None) -> int:
    """`trigger --wait`: the run's summary once it ends; exit 1 unless it finished
    with no dead window, or when --timeout passed first (the run goes on)."""
    summary = wait_with_progress(app.runs, run_id, show=not args.json, timeout=timeout)
    emit(args, summary, lambda: print_run(summary))
    if summary.get("timed_out"):
        logger.error(
            "stopped waiting after %s: %d of %d windows done; the run goes on",
            args.timeout,
            summary["jobs_done"],
            summary["jobs_total"],
            extra={"run": run_id},
        )
        return 1
    return 0 if summary["state"] == "finished" and not summary["jobs_dead"] else 1


def parse_timeout(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"--timeout {text!r}: {exc}") from None


def cmd_holds(args: argparse.Namespace) -> int:
    """The config's legal holds, and per policy on each hold's table the rows
    older than its retain that the hold keeps now. Reads the tables alone."""
    app = reading(args, need_config=True)
    assert app.config is not None
    holds = holds_report(app.table_reader(), app.config)
    emit(args, {"holds": holds}, lambda: print_holds(holds))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """A policy's last minutes from the database: rows cleaned (the ledger),
    and the backlog, retries, dead letters, oldest expired row's age and
    throttle holds the workers and the scheduler sampled."""
    app = reading(args, need_config=True)
    assert app.config is not None and app.history is not None
    app.config.get_policy(args.policy)  # ConfigError naming the known ones
    if not 1 <= args.minutes <= 1440:
        raise ConfigError(f"--minutes {args.minutes}: write 1 to 1440 (a day)")
    report = app.history.minutes(args.policy, args.minutes).report()
    emit(args, report, lambda: print_history(report))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    return dry_run(args, reading(args, need_config=True), parse_cutoff(args.cutoff))


def dry_run(args: argparse.Namespace, app: App, cutoff: datetime | None) -> int:
    """`plan` and `trigger --dry-run`: the preview reads the policy's table
    alone, so it answers before `expiry migrate` too, and says what is left
    to do then."""
    code = show_preview(args, app.table_reader().preview(args.policy, cutoff))
    problem = app.schema_problem()
    if problem is not None:
        logger.warning("%s (a dry run reads none of them; a run needs them)", problem)
    return code


def show_preview(args: argparse.Namespace, preview: PlanPreview) -> int:
    cutoff = format_time(preview.cutoff)
    data = {
        "policy": preview.policy,
        "cutoff": cutoff,
        "candidates": preview.candidates,
        "windows": preview.windows,
        "first_windows": [
            {**s.payload(windows=False), "range": s.describe()} for s in preview.first_windows
        ],
        "strategy": preview.strategy,
        "partitions": preview.partitions,
        "timestamp_storage": preview.storage,
        "warnings": preview.warnings,
        "held": preview.held,
        "dry_run": True,
    }
    emit(args, data, lambda: print_preview(preview, cutoff))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    app = reading(args)
    data: dict[str, Any] = {
        "policies": Status.of(app).policies(),
        "queue": Status.of(app).queue(),
        "workers_alive": Status.of(app).workers_alive(),
    }
    emit(args, data, lambda: print_status(data))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    verb = args.args[0] if args.args[:1] in (["show"], ["cancel"], ["approve"]) else None
    writes = verb in ("cancel", "approve")
    app = migrated(args, need_config=verb == "approve") if writes else reading(args)
    runs = app.runs
    if verb is not None:
        if len(args.args) != 2:
            raise ConfigError(f"usage: expiry runs {verb} RUN_ID")
        if verb == "approve":  # audited with --actor; the planning job wakes
            cleanup_of(app).approve(args.args[1], actor=args.actor)
        found = (
            runs.cancel(args.args[1], actor=args.actor)
            if verb == "cancel"
            else runs.summary(args.args[1])
        )
        if found is None:
            raise ConfigError(f"no run {args.args[1]!r}")
        summary = found
        emit(args, summary, lambda: print_run(summary))
        return 0
    recent = runs.recent(args.args[0] if args.args else None)
    emit(args, recent, lambda: print_runs(recent))
    return 0


def cmd_evidence(args: argparse.Namespace) -> int:
    app = reading(args)
    since = parse_since(args.since, app)
    found = Status.of(app).evidence(args.policy, since, limit=2**62)  # all of it
    if args.json or args.format == "json":
        print(json.dumps(found, indent=2))
    elif args.format == "csv":
        write_evidence_csv(found, sys.stdout)
    else:
        print_evidence(args.policy, found)
    return 0


def parse_since(text: str | None, app: App) -> datetime | None:
    """``--since``: an ISO-8601 time, or a duration back from the database's now."""
    if text is None:
        return None
    try:
        return since_of(text, app.engine.now())
    except ValueError as exc:
        raise ConfigError(f"--since {exc}") from None


def cmd_dlq(args: argparse.Namespace) -> int:
    queue = (reading(args) if args.action in ("list", "show") else migrated(args)).queue
    if args.action == "list":
        return dlq_list(args, queue)
    if args.action == "show":
        return dlq_show(args, queue)
    if args.action == "redrive":
        if not (args.keys or args.all or args.policy):
            raise ConfigError("usage: expiry dlq redrive (KEY... | --all | --policy POLICY)")
        keys = queue.redrive(args.keys, all=args.all, policy=args.policy, actor=args.actor)
    else:
        if not args.keys:
            raise ConfigError("usage: expiry dlq discard KEY...")
        keys = queue.discard(args.keys, actor=args.actor)
    verb = "redriven" if args.action == "redrive" else "discarded"
    # A key named but not acted on: no dead job to redrive, or no job at all to
    # discard (discarding a job twice is fine). Said, exit 2; the others were done.
    missing = [
        k
        for k in args.keys
        if k not in set(keys) and (args.action == "redrive" or queue.get(k) is None)
    ]
    if missing:
        what = "dead job" if args.action == "redrive" else "job"
        raise ConfigError(
            f"no {what} with key {', '.join(map(repr, missing))} ({len(keys)} jobs {verb})"
        )
    emit(args, {verb: keys}, lambda: out.print(f"{len(keys)} jobs {verb}"))
    return 0


def dlq_list(args: argparse.Namespace, queue: Queue) -> int:
    dead = queue.dead(limit=1000)
    data = [
        {
            "key": j.key,
            "handler": j.handler,
            "attempt": j.attempt,
            "error": j.last_error,
            "kind": j.last_error_kind,
            "failed_at": format_time(j.finished_at) if j.finished_at else None,
        }
        for j in dead
    ]
    emit(args, data, lambda: print_dead_jobs(dead))
    return 0


def dlq_show(args: argparse.Namespace, queue: Queue) -> int:
    if len(args.keys) != 1:
        raise ConfigError("usage: expiry dlq show KEY")
    job = queue.get(args.keys[0])
    if job is None:
        raise ConfigError(f"no job with key {args.keys[0]!r}")
    shown = {
        "key": job.key,
        "handler": job.handler,
        "state": job.state.value,
        "payload": job.payload,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "errors": job.errors,
    }
    emit(args, shown, lambda: print_json(shown))
    return 0
