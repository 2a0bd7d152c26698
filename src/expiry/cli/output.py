"""How the CLI prints: with --json, a command's data as JSON on stdout; without,
text and tables on the terminal (rich), drawn from the same data.

Nothing here reads the database: the commands in cli/main.py fetch, these print.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ..times import format_duration
from ..types import Job

if TYPE_CHECKING:
    from ..cleanup.preview import PlanPreview
    from ..cleanup.runs import Runs

OFF_TERMINAL_WIDTH = 10_000
"""Off a terminal (a pipe, a file, a CI log) a table is as wide as its widest
row: wrapped at rich's default of 80 columns, a run id split over four lines.
$COLUMNS still decides where it is set."""


def console(*, stderr: bool = False) -> Console:
    """A console at the terminal's width, or off a terminal at no width at all."""
    made = Console(stderr=stderr)
    if not made.is_terminal and "COLUMNS" not in os.environ:
        made.width = OFF_TERMINAL_WIDTH
    return made


out = console()
err = console(stderr=True)


def emit(args: argparse.Namespace, data: Any, render: Callable[[], None]) -> None:
    """``data`` as JSON with --json, else whatever ``render`` prints."""
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        render()


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A table whose first column (the id or key that `show` takes) is never
    cut with an ellipsis on a narrow terminal: it folds onto more lines."""
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, overflow="fold", min_width=None if i else 12)
    for row in rows:
        table.add_row(*row)
    out.print(table)


def print_json(data: Any) -> None:
    """``data`` as indented, highlighted JSON on the terminal."""
    out.print_json(json.dumps(data, default=str))


# -- runs ---------------------------------------------------------------------------


def print_run(summary: dict[str, Any]) -> None:
    for key, value in summary.items():
        if key not in ("waiting", "approval"):
            out.print(f"{key:>20}: {value}")
    if summary.get("stalled"):
        out.print(f"{'':>20}  STALLED: open since {summary['opened_at']}")
    for wait in summary.get("waiting") or []:
        out.print(f"{'waiting':>20}: {wait['why']} (since {wait['since']})")
    approval = summary.get("approval")
    if approval:
        preview = approval["preview"]
        out.print(
            f"{'approval':>20}: {approval['state']} since {approval['since']}"
            + (f", by {approval['approved_by']}" if approval["approved_by"] else ""),
            highlight=False,
        )
        out.print(
            f"{'preview':>20}: {preview.get('candidates', '?'):,} candidates at cutoff "
            f"{preview.get('cutoff')}; policy hash {preview.get('config_hash')}; "
            f"approve by {preview.get('approve_by')}",
            highlight=False,
        )
        if preview.get("sample"):
            out.print(f"{'sample keys':>20}: {', '.join(preview['sample'])}", highlight=False)
        for hold, kept in (preview.get("held") or {}).items():
            out.print(f"{'held':>20}: {kept:,} rows by hold {hold}", highlight=False)
        if preview.get("partitions"):
            out.print(f"{'partitions':>20}: {', '.join(preview['partitions'])}", highlight=False)


def print_runs(found: list[dict[str, Any]]) -> None:
    columns = ("run", "state", "windows done/total", "rows", "duplicates", "retries", "dead")
    rows = (
        (
            r["id"],
            r["outcome"],
            f"{r['jobs_done']}/{r['jobs_total']}",
            str(r["rows_affected"]),
            str(r["duplicates_skipped"]),
            str(r["retries"]),
            str(r["jobs_dead"]),
        )
        for r in found
    )
    print_table("runs", columns, rows)


def print_evidence(policy: str, found: list[dict[str, Any]]) -> None:
    """A line a run, oldest first, then the total; csv and json carry every operation."""
    if not found:
        out.print(f"policy {policy}: no run of it booked anything in the ledger kept")
        return
    for run in found:
        actions = ", ".join(f"{n:,} {action}d" for action, n in run["rows_by_action"].items())
        out.print(
            f"run {run['run_id']}: table {run['table'] or '?'}, cutoff {run['cutoff']}, "
            f"{actions or '0 rows'} in {len(run['operations'])} operations "
            f"{run['operations'][0]['applied_at']} .. {run['operations'][-1]['applied_at']}; "
            f"{run['outcome']}",
            highlight=False,
        )
    total = sum(r["rows_affected"] for r in found)
    out.print(f"policy {policy}: {total:,} rows in {len(found)} runs", highlight=False)


EVIDENCE_COLUMNS = (
    "run_id",
    "policy",
    "table",
    "cutoff",
    "key",
    "action",
    "range",
    "rows",
    "applied_at",
    "worker",
    "kept",
    "blocked",
)
"""The columns of ``expiry evidence --format csv``: a row an operation."""


def write_evidence_csv(found: list[dict[str, Any]], stream: IO[str]) -> None:
    writer = csv.writer(stream)
    writer.writerow(EVIDENCE_COLUMNS)
    for run in found:
        for op in run["operations"]:
            row = {**run, **op}
            writer.writerow(["" if row[c] is None else row[c] for c in EVIDENCE_COLUMNS])


PROGRESS_EVERY = 5.0
"""Off a terminal, a line of progress this often (seconds)."""

UNCLAIMED_HINT_AFTER = 10.0
"""A wait that saw no window start for this long says so, with the likely cause."""


def wait_with_progress(
    runs: Runs, run_id: str, *, show: bool, timeout: float | None = None
) -> dict[str, Any]:
    """``runs.wait``, with a progress bar of the run's windows on stderr when
    ``show`` and stderr is a terminal (it vanishes when the wait ends), else a
    line every PROGRESS_EVERY seconds; a hint when nothing of the run has been
    done for UNCLAIMED_HINT_AFTER seconds. The run's summary."""
    console = Console(stderr=True)
    started = time.monotonic()
    state = {"last_line": started, "hinted": False}

    def lines(done: int, total: int) -> None:
        now = time.monotonic()
        if not state["hinted"] and done == 0 and now - started >= UNCLAIMED_HINT_AFTER:
            state["hinted"] = True
            err.print(
                f"run {run_id}: nothing done after {UNCLAIMED_HINT_AFTER:.0f} s; is "
                "`expiry worker` running against this database? (the run goes on "
                "once one does)"
            )
        if show and not console.is_terminal and now - state["last_line"] >= PROGRESS_EVERY:
            state["last_line"] = now
            err.print(f"run {run_id}: {done} of {total} windows done")

    with Progress(
        console=console, disable=not (show and console.is_terminal), transient=True
    ) as bar:
        task = bar.add_task(run_id, total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, total=max(total, 1), completed=done)
            lines(done, total)

        return runs.wait(run_id, progress=progress, timeout=timeout)


# -- check, plan and status -----------------------------------------------------------


def print_check(
    warnings: list[str],
    timestamps: dict[str, str],
    notes: dict[str, list[str]],
    policies: int,
    schema: tuple[int, int],
) -> None:
    """The check's findings; its last line says whether all is ready, or that
    the policies fit while expiry's schema (version, needed) is not."""
    current, latest = schema
    last = (
        f"ok: {policies} policies"
        if current == latest
        else f"{policies} policies fit their tables; expiry's schema is at version "
        f"{current}, this expiry needs {latest}"
    )
    out.print(
        "\n".join(
            [f"warning: {w}" for w in warnings]
            + [f"policy {name}: {text}" for name, text in timestamps.items()]
            + [f"policy {name}: {text}" for name, texts in notes.items() for text in texts]
            + [last]
        )
    )


def print_history(report: dict[str, Any]) -> None:
    """A row a minute: rows cleaned, then what was sampled ("-": nobody sampled)."""

    def shown(m: dict[str, Any], field: str) -> str:
        value = m[field]
        if not m["sampled"] or value is None:
            return "-"
        return format_duration(round(value)) if field == "oldest_age_seconds" else f"{value:,}"

    rows = (
        (
            m["minute"][11:16],
            f"{m['rows']:,}",
            *(shown(m, f) for f in ("backlog", "retrying", "dead", "oldest_age_seconds")),
            (m["held"] or "") if m["sampled"] else "not sampled",
        )
        for m in report["minutes"]
    )
    columns = (
        "minute (UTC)",
        "rows cleaned",
        "backlog",
        "retrying",
        "dead",
        "oldest expired",
        "held",
    )
    print_table(f"{report['policy']}: the last {len(report['minutes'])} minutes", columns, rows)
    if report["held_minutes"]:
        held = ", ".join(f"{n} min for {r}" for r, n in report["held_minutes"].items())
        out.print(f"throttle held it: {held}")


def print_holds(holds: list[dict[str, Any]]) -> None:
    """One row a hold: its table, the rows it names, why, what it keeps per policy."""
    rows = (
        (
            h["name"],
            h["table"],
            h["rows"],
            h["reason"] or "-",
            ", ".join(f"{n:,} from {p}" for p, n in h["kept"].items()) or "no policy on the table",
        )
        for h in holds
    )
    print_table("holds", ("hold", "table", "rows held", "reason", "expired rows kept"), rows)


def print_preview(preview: PlanPreview, cutoff: str) -> None:
    jobs = f"{preview.windows} windows"
    if preview.partitions:
        # A run removes the partitions first and plans its windows after them:
        # the windows counted here over the whole table are an upper bound.
        jobs = f"{len(preview.partitions)} whole partitions, then at most {jobs}"
    out.print(
        f"policy {preview.policy}: cutoff {cutoff}, {preview.candidates} candidate "
        f"rows in {jobs} (dry run: nothing changed)"
    )
    out.print(f"  {preview.storage}")
    for warning in preview.warnings:
        out.print(f"  warning: {warning}")
    for hold, rows in preview.held.items():
        out.print(f"  hold {hold}: keeps {rows} expired rows")
    out.print(f"  {preview.strategy}")
    for part in preview.partitions:
        out.print(
            f"  partition {part['partition']}: {part['action']} "
            + (
                f"(about {part['rows_estimated']:,} rows)"
                if part["rows_estimated"] is not None
                else "(rows unknown: never analyzed)"
            )
        )
    for span in preview.first_windows:
        out.print(f"  window {span.describe()}")


def print_status(data: dict[str, Any]) -> None:
    """The policies table, the queue's jobs by state, then one line of queue health."""
    columns = (
        "policy",
        "table",
        "action",
        "retain",
        "schedule",
        "next fire",
        "watermark",
        "last run",
    )
    print_table("policies", columns, (_policy_row(p) for p in data["policies"]))
    for p in data["policies"]:
        for line in _policy_alerts(p):
            out.print(line)
    if "workers_alive" in data:
        out.print(f"workers alive: {data['workers_alive']}")
    q = data["queue"]
    by_state = q["jobs_by_queue_and_state"].items()
    rows = (
        (name, state, str(n)) for name, states in by_state for state, n in sorted(states.items())
    )
    print_table("queue", ("queue", "state", "jobs"), rows)
    out.print(
        f"oldest due: {q['oldest_due_seconds'] or 'none'}; running: {len(q['running'])}; "
        f"retries by kind: {q['retries_by_kind'] or 'none'}; dead-letter depth: {q['dead']}"
    )


def _policy_alerts(p: dict[str, Any]) -> Iterator[str]:
    """What is wrong with a policy, a line each, with what to do about it."""
    if p["broken"]:
        yield f"quarantined: {p['broken']}"
    if p["stalled"]:
        yield (
            f"STALLED: {p['name']}: a run has been open {p['oldest_open_run_seconds']:.0f}s"
            f" (stall_after {p['stall_after']}): `expiry runs show RUN` says why it waits"
        )
    if p.get("awaiting_approval"):
        yield (
            f"AWAITING APPROVAL: {p['name']}: run {p['awaiting_approval']} deletes nothing "
            f"until approved: `expiry runs show {p['awaiting_approval']}`, then "
            f"`expiry runs approve {p['awaiting_approval']}`"
        )
    if p.get("unserved_seconds") is not None:
        yield (
            f"UNSERVED: {p['name']}: jobs due for {p['unserved_seconds']:.0f}s and no live "
            "worker works its queue: start one (`expiry worker`)"
        )
    if p.get("unscheduled"):
        late = p.get("unscheduled_seconds")
        since = (
            f"its fire due {late:.0f}s ago was not taken"
            if late is not None
            else "no scheduler has registered its schedule"
        )
        yield (
            f"UNSCHEDULED: {p['name']}: {since}: no scheduler keeps it, so no run "
            "opens: start one (`expiry scheduler`, or `expiry serve`) with this policy "
            "in its config"
        )
    if line := _throttle_line(p):
        yield line


def _policy_row(p: dict[str, Any]) -> tuple[str, ...]:
    last = p["last_run"]
    return (
        p["name"],
        p["table"],
        p["action"],
        p["retain"] + _kept(p),
        (p["schedule"] or "-") + (" (paused)" if p["paused"] else ""),
        "-" if p["paused"] or not p["next_fire"] else p["next_fire"],
        "QUARANTINED" if p["broken"] else p["watermark"],
        f"{last['state']} {last['jobs_done']}/{last['jobs_total']}" if last else "-",
    )


def _kept(p: dict[str, Any]) -> str:
    """What keep_last keeps, after the retain it is combined with."""
    if not p.get("keep_last"):
        return ""
    return f", keep {p['keep_last']} newest" + (
        f" per {p['group_by']}" if p.get("group_by") else ""
    )


def _throttle_line(p: dict[str, Any]) -> str:
    """A policy's throttle and vacuum pressure, when there is anything to say."""
    parts = []
    t = p.get("throttle") or {}
    if t.get("state") not in (None, "open"):
        why = t.get("detail") or t.get("reason")
        held = t.get("held_seconds")
        parts.append(f"{t['state']} ({why}" + (f", for {held:.0f}s)" if held is not None else ")"))
    if t.get("rate"):
        parts.append(f"rate limit {t['rate']:.2f} windows/s")
    held = t.get("throttled_seconds") or {}
    if held:
        parts.append("held " + ", ".join(f"{r} {s:.0f}s" for r, s in sorted(held.items())))
    v = p.get("vacuum")
    if v and v["dead_tuples"]:
        parts.append(
            f"{v['dead_tuples']} dead tuples ({100 * v['dead_ratio']:.1f}%), "
            f"last vacuum {v['last_vacuum'] or 'never'}"
        )
    return f"{p['name']}: " + "; ".join(parts) if parts else ""


# -- the dead-letter queue ------------------------------------------------------------


def print_dead_jobs(dead: list[Job]) -> None:
    rows = (
        (j.key, j.handler, str(j.attempt), j.last_error_kind or "", (j.last_error or "")[:80])
        for j in dead
    )
    print_table(
        f"dead-letter queue ({len(dead)})", ("key", "handler", "attempts", "kind", "error"), rows
    )
