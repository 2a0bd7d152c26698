"""What the dashboard's pages show, shaped for templates: relative times, the
watermark's level and trend, bar widths, pages of filtered lists.

Nothing here renders HTML or touches a request. Lists that the engine cannot
filter by policy or run (``job_list``, ``audit_list``) are read up to
``SCAN_LIMIT`` rows, newest first, and filtered here; a page says when that
bound was reached.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..config import Policy
from ..keys import Principal
from ..times import parse_time
from ..types import AuditEvent, Job, JobState, LedgerMinute

if TYPE_CHECKING:
    from ..app import App

SCAN_LIMIT = 5000
"""The most rows one page reads to filter and count (jobs, audit events)."""
PAGE_SIZE = 25


# -- time -------------------------------------------------------------------------


def as_time(value: Any) -> datetime | None:
    """A datetime from what the engines and status views hand out: a datetime,
    an ISO-8601 string, or epoch seconds (SQLite)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), UTC)
    return parse_time(str(value))


def short_duration(seconds: float) -> str:
    """The two largest units: 59 -> "59 s", 200 -> "3 min 20 s", 90000 -> "1 d 1 h"."""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    units = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    rest = int(seconds)
    for i, (name, size) in enumerate(units):
        if rest >= size:
            count, rest = divmod(rest, size)
            text = f"{count} {name}"
            if i + 1 < len(units) and rest >= units[i + 1][1]:
                text += f" {rest // units[i + 1][1]} {units[i + 1][0]}"
            return text
    return "0 s"


def relative(then: datetime, now: datetime) -> str:
    """ "3 min ago", "in 2 h", "just now"."""
    seconds = (now - then).total_seconds()
    if abs(seconds) < 5:
        return "just now"
    words = short_duration(seconds).split(" ")
    text = " ".join(words[:2])  # one unit is enough at a glance
    return f"in {text}" if seconds < 0 else f"{text} ago"


@dataclass(frozen=True)
class Stamp:
    iso: str
    exact: str
    relative: str


def stamp(value: Any, now: datetime) -> Stamp | None:
    when = as_time(value)
    if when is None:
        return None
    when = when.astimezone(UTC)
    return Stamp(
        iso=when.isoformat().replace("+00:00", "Z"),
        exact=when.strftime("%Y-%m-%d %H:%M:%S UTC"),
        relative=relative(when, now),
    )


# -- the watermark ------------------------------------------------------------------


def level(policy: Policy | None, seconds: float) -> str:
    """ "alert" past watermark_alert, "warn" past watermark_warn, else "ok"."""
    if policy is not None:
        if policy.watermark_alert is not None and seconds > policy.watermark_alert:
            return "alert"
        if policy.watermark_warn is not None and seconds > policy.watermark_warn:
            return "warn"
    return "ok"


def trend(series: Sequence[tuple[datetime, float]]) -> str:
    """ "rising", "falling" or "steady" over the samples kept; "new" with one."""
    if len(series) < 2:
        return "new"
    first, last = series[0][1], series[-1][1]
    if abs(last - first) <= max(1.0, 0.05 * max(first, last)):
        return "steady"
    return "rising" if last > first else "falling"


def sparkline(series: Sequence[tuple[datetime, float]], width: int = 120, height: int = 24) -> str:
    """SVG polyline points for the samples, oldest left, zero at the bottom."""
    if not series:
        return ""
    values = [v for _, v in series]
    top = max(values) or 1.0
    step = width / max(1, len(values) - 1)
    points = []
    for i, value in enumerate(values):
        x = 0.0 if len(values) == 1 else i * step
        y = height - 1 - (height - 2) * value / top
        points.append(f"{x:.1f},{y:.1f}")
    if len(points) == 1:
        points.append(f"{width:.1f},{points[0].split(',')[1]}")
    return " ".join(points)


@dataclass(frozen=True)
class MinuteLine:
    """One sampled field a minute as an SVG line in a ``width`` x ``height``
    box, broken where no sample was taken; its latest and highest values."""

    segments: list[str]
    latest: float | None
    peak: float | None
    sampled: int


def minute_line(values: Sequence[float | None], width: int = 240, height: int = 40) -> MinuteLine:
    """A line of ``values`` (oldest left, zero at the bottom, None a gap)."""
    known = [v for v in values if v is not None]
    top = max(known, default=0.0) or 1.0
    step = width / max(1, len(values) - 1)
    segments: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            if segments[-1]:
                segments.append([])
            continue
        segments[-1].append(f"{i * step:.1f},{height - 1 - (height - 2) * value / top:.1f}")
    lines = [" ".join(s if len(s) > 1 else [*s, s[0]]) for s in segments if s]
    latest = next((v for v in reversed(values) if v is not None), None)
    return MinuteLine(lines, latest, max(known) if known else None, len(known))


@dataclass(frozen=True)
class MinuteBars:
    """One policy's rows per minute over the last hour, as SVG bars: each
    (x, y, height) in a ``width`` x ``height`` box, a minute a bar, oldest
    left; its total and its busiest minute, said in words too."""

    bars: list[tuple[float, float, float]]
    total: int
    peak: int
    minutes: int
    bar_width: float


def minute_bars(
    minutes: Sequence[LedgerMinute],
    now: datetime,
    count: int = 60,
    width: int = 120,
    height: int = 24,
) -> MinuteBars:
    """Rows applied per minute for the ``count`` minutes up to ``now`` (from
    the ledger: ``engine.ledger_minutes``); a minute with none has no bar."""
    last = now.replace(second=0, microsecond=0)
    slot = width / count
    rows = {m.minute: m.rows for m in minutes}
    values = [rows.get(last - timedelta(minutes=count - 1 - i), 0) for i in range(count)]
    top = max(values) or 1
    bars = [
        (i * slot, height - h, h)
        for i, value in enumerate(values)
        if value and (h := max(1.0, (height - 1) * value / top))
    ]
    return MinuteBars(bars, sum(values), max(values), count, max(1.0, slot - 0.5))


def run_pace(run: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A run's rate since it opened (to its finish, or now), and while it runs
    the windows left and when, at that rate, they would be done. None for
    what cannot be said yet (no window applied, or a planner still walking)."""
    opened = parse_time(run["opened_at"])
    end = parse_time(run["finished_at"]) if run["finished_at"] else now
    seconds = max((end - opened).total_seconds(), 0.001)
    windows_per_second = run["windows_applied"] / seconds
    running = run["state"] == "running" and not run["cancelled_at"]
    left = max(0, run["windows_planned"] - run["windows_applied"]) if running else None
    eta = left / windows_per_second if left is not None and windows_per_second else None
    return {
        "seconds": seconds,
        "rows_per_second": run["rows_affected"] / seconds,
        "windows_per_second": windows_per_second,
        "windows_left": left,
        "eta_seconds": eta,
    }


# -- charts and pages ------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    text: str
    fraction: float


def bars(items: Sequence[tuple[str, float, str]]) -> list[Bar]:
    """Bars scaled to the largest value: (label, value, text shown)."""
    top = max((v for _, v, _ in items), default=0) or 1
    return [Bar(label, value, text, value / top) for label, value, text in items]


def stacked(by_queue: dict[str, dict[str, int]], states: Sequence[str]) -> list[dict[str, Any]]:
    """One row per queue: its counts, total and bar segments (x, width as
    fractions of the largest queue), in the order of ``states``."""
    top = max((sum(c.values()) for c in by_queue.values()), default=0) or 1
    rows = []
    for name, counts in sorted(by_queue.items()):
        offset, segments = 0.0, []
        for state in states:
            if n := counts.get(state, 0):
                segments.append({"state": state, "n": n, "x": offset, "w": n / top})
                offset += n / top
        rows.append(
            {"queue": name, "counts": counts, "total": sum(counts.values()), "segments": segments}
        )
    return rows


AGE_BUCKETS = ((60, "under 1 min"), (600, "1–10 min"), (3600, "10–60 min"), (86400, "1–24 h"))


def age_histogram(ages: Sequence[float]) -> list[Bar]:
    counts = [0] * (len(AGE_BUCKETS) + 1)
    for age in ages:
        index = next((i for i, (limit, _) in enumerate(AGE_BUCKETS) if age < limit), -1)
        counts[index] += 1
    labels = [label for _, label in AGE_BUCKETS] + ["over 1 day"]
    return bars([(label, n, str(n)) for label, n in zip(labels, counts, strict=True)])


@dataclass(frozen=True)
class Page:
    items: list[Any]
    number: int
    size: int
    has_next: bool
    total: int | None = None
    truncated: bool = False

    @property
    def first(self) -> int:
        return (self.number - 1) * self.size + 1 if self.items else 0

    @property
    def last(self) -> int:
        return (self.number - 1) * self.size + len(self.items)


def page_of(items: Sequence[Any], number: int, size: int = PAGE_SIZE, **kw: Any) -> Page:
    start = (number - 1) * size
    return Page(list(items[start : start + size]), number, size, len(items) > start + size, **kw)


# -- jobs and audit events ------------------------------------------------------------


def job_policy(job: Job) -> str | None:
    value = job.payload.get("policy")
    return value if isinstance(value, str) else None


_VARYING = re.compile(r"[0-9a-fA-F]{8,}|\d+")
"""What differs between failures of one cause: numbers, ids, hashes."""


def error_group(job: Job) -> str:
    """The cause a dead job shares with others: its error kind and the first
    line of its error, numbers and ids masked ("lock timeout on row #")."""
    first = (job.last_error or "").strip().splitlines()[:1]
    text = _VARYING.sub("#", first[0])[:160] if first else "no error recorded"
    return f"{job.last_error_kind or 'error'}: {text}"


def dead_groups(jobs: Sequence[Job]) -> list[dict[str, Any]]:
    """Dead jobs grouped by error_group, the largest group first: its cause,
    how many, which policies and runs, its newest failure and a sample error."""
    groups: dict[str, dict[str, Any]] = {}
    for job in jobs:
        name = error_group(job)
        group = groups.setdefault(
            name,
            {
                "error": name,
                "kind": job.last_error_kind or "error",
                "sample": (job.last_error or "").strip().splitlines()[0][:300]
                if job.last_error
                else "",
                "count": 0,
                "policies": set(),
                "runs": set(),
                "newest": job.finished_at,
            },
        )
        group["count"] += 1
        if policy := job_policy(job):
            group["policies"].add(policy)
        if isinstance(run := job.payload.get("run_id"), str):
            group["runs"].add(run)
        if job.finished_at and (group["newest"] is None or job.finished_at > group["newest"]):
            group["newest"] = job.finished_at
    out = sorted(groups.values(), key=lambda g: (-g["count"], g["error"]))
    for group in out:
        group["policies"], group["runs"] = sorted(group["policies"]), sorted(group["runs"])
    return out


def find_jobs(
    app: App,
    state: JobState,
    who: Principal,
    *,
    queue: str | None = None,
    policy: str | None = None,
    run_id: str | None = None,
    error: str | None = None,
) -> tuple[list[Job], bool]:
    """Jobs in ``state`` matching the filters (``error``: an error_group) on the
    queues ``who`` may see, newest first; True if the scan was cut."""
    found = app.engine.job_list(state, queue, SCAN_LIMIT)
    keep = [
        j
        for j in found
        if who.can_see_queue(j.queue)
        and (policy is None or job_policy(j) == policy)
        and (run_id is None or j.payload.get("run_id") == run_id)
        and (error is None or error_group(j) == error)
    ]
    return keep, len(found) >= SCAN_LIMIT


def attempts(job: Job) -> list[dict[str, Any]]:
    """Each failed attempt: its number, when it failed, how long after the
    previous failure (or the job's creation), its error kind, error and worker."""
    out = []
    previous = as_time(job.created_at)
    for entry in job.errors:
        at = as_time(entry.get("at"))
        out.append(
            {
                "attempt": entry.get("attempt"),
                "at": at,
                "after": short_duration((at - previous).total_seconds())
                if at and previous
                else None,
                "kind": entry.get("kind"),
                "error": entry.get("error"),
                "worker": entry.get("worker"),
            }
        )
        previous = at or previous
    return out


def audit_events(
    app: App,
    who: Principal,
    *,
    policy: str | None = None,
    action: str | None = None,
    job_key: str | None = None,
    run_id: str | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """Audit events matching the filters that ``who`` may see (``visible_event``),
    newest first; True if the scan was cut."""
    events = app.engine.audit_list(policy, SCAN_LIMIT)
    owners = {t["name"]: t["owner"] for t in app.crons.targets()} if not who.admin else {}
    queues: dict[str, str | None] = {}

    def queue_of(key: str) -> str | None:
        if key not in queues:
            job = app.queue.get(key)
            queues[key] = job.queue if job else None
        return queues[key]

    out = []
    for event in events:
        if action and event.action != action:
            continue
        if job_key and event.job_key != job_key:
            continue
        if run_id and event.run_id != run_id:
            continue
        if not visible_event(event, who, owners, queue_of):
            continue
        out.append({**asdict(event), "detail": event.detail or {}})
    return out, len(events) >= SCAN_LIMIT


def visible_event(
    event: AuditEvent,
    who: Principal,
    owners: dict[str, str],
    queue_of: Callable[[str], str | None],
) -> bool:
    """May ``who`` see ``event``, as the API would show its subject: an admin key
    every event; otherwise a cron target's events only for the target's owner
    (``owners``: name to owner; they carry its URL and any token in it), a key's
    or a sign-in's events only for that key, a job's events only where its
    queue is visible (``queue_of``), and the cleanup's own events (runs,
    windows, schedules, policies) to every reader."""
    if who.admin:
        return True
    detail = event.detail or {}
    if event.action.startswith("cron."):
        return owners.get(str(detail.get("name"))) == who.name
    if event.action.startswith(("key.", "dashboard.")):
        return detail.get("name") == who.name or event.actor == f"dashboard:{who.name}"
    if event.job_key and event.run_id is None:
        queue = queue_of(event.job_key)
        return queue is not None and who.can_see_queue(queue)
    return True


def plural(n: int, word: str = "job") -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def compact_json(value: Any) -> str:
    """JSON on one line as a person reads it (">" and "é" as themselves, not
    \u003e: the template escapes it for HTML)."""
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
