"""Cron expressions, by cronsim (Debian cron's semantics, DST included). Pure.

Standard 5-field cron plus the aliases @hourly, @daily (@midnight), @weekly,
@monthly and @yearly (@annually), which are expanded here.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

LATE_GRACE = timedelta(seconds=60)
"""A fire this late or less is on time, not missed."""

MAX_SCAN = 100_000
"""Fire times examined per policy per pass; a longer gap is reported as at least this."""


class Rule(Protocol):
    """What the schedule rules read of a policy (config.Policy has it)."""

    @property
    def schedule(self) -> str | None: ...
    @property
    def timezone(self) -> str: ...
    @property
    def catch_up(self) -> str: ...
    @property
    def max_catch_up(self) -> int: ...


ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_NONSTANDARD = ("L", "W", "#", "?")


def expand(expr: str) -> str:
    """The 5-field form of an expression (aliases expanded)."""
    return ALIASES.get(expr.strip().lower(), expr.strip())


def check_expression(expr: str) -> str:
    """Refuse what standard 5-field cron cannot say, with the reason."""
    text = expand(expr)
    if text.startswith("@"):
        raise ValueError(f"{expr!r} is not a known alias; use one of {', '.join(ALIASES)}")
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(
            f"{expr!r} has {len(fields)} fields; write standard 5-field cron "
            "(minute hour day-of-month month day-of-week) or @hourly/@daily/@weekly/@monthly"
        )
    if any(mark in text.upper() for mark in _NONSTANDARD):
        raise ValueError(
            f"{expr!r} uses a nonstandard extension (L, W, # or ?); use standard 5-field cron"
        )
    try:
        CronSim(text, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise ValueError(
            f"{expr!r} is not a valid cron expression: {exc}; write standard 5-field cron "
            "(minute 0-59, hour 0-23, day-of-month 1-31, month 1-12, day-of-week 0-6)"
        ) from None
    return expr


def explain(expr: str) -> str:
    """The expression in words, e.g. "At minute 15 past every hour"."""
    return str(CronSim(expand(expr), datetime(2000, 1, 1)).explain())


def fires_between(policy: Rule, after: datetime, until: datetime) -> tuple[list[datetime], int]:
    """Fire times in (after, until], oldest first, in UTC: (the newest MAX_SCAN, how many
    in all). In UTC because arithmetic and equality on same-zone local times ignore
    ``fold``: the two 01:30s of a fall-back night would be one time (one run id), and a
    cutoff ``fire - retain`` would be wall-clock arithmetic across a DST change."""
    assert policy.schedule is not None
    zone = ZoneInfo(policy.timezone)
    found: list[datetime] = []
    count = 0
    for local in CronSim(expand(policy.schedule), after.astimezone(zone)):
        fire = local.astimezone(UTC)
        if fire > until:
            break
        count += 1
        found.append(fire)
        if len(found) > MAX_SCAN:
            found.pop(0)
        if count >= 10 * MAX_SCAN:
            break
    return found, count


def cron_fires(schedule: str, timezone: str, after: datetime, until: datetime) -> list[datetime]:
    """An HTTP cron target's fire times in (after, until], at most MAX_SCAN."""
    found: list[datetime] = []
    for fire in CronSim(expand(schedule), after.astimezone(ZoneInfo(timezone))):
        if fire > until or len(found) >= MAX_SCAN:
            break
        found.append(fire)
    return found


def cron_next(schedule: str, timezone: str, after: datetime) -> datetime:
    """An HTTP cron target's first fire time after ``after``, in UTC."""
    return next(CronSim(expand(schedule), after.astimezone(ZoneInfo(timezone)))).astimezone(UTC)


def next_fire(policy: Rule, after: datetime) -> datetime:
    """The first fire time after ``after``, in UTC."""
    assert policy.schedule is not None
    zone = ZoneInfo(policy.timezone)
    return next(CronSim(expand(policy.schedule), after.astimezone(zone))).astimezone(UTC)


@lru_cache(maxsize=256)
def period(schedule: str, timezone: str) -> float:
    """The schedule's usual gap between fires, in seconds: the median of its
    first 25 gaps from a fixed Monday (the same every call). The median, not
    the longest: a weekday schedule's period is a day, not its weekend."""
    zone = ZoneInfo(timezone)
    fires = CronSim(expand(schedule), datetime(2026, 1, 5, tzinfo=zone))
    times = [next(fires).astimezone(UTC) for _ in range(26)]
    gaps = sorted((b - a).total_seconds() for a, b in zip(times, times[1:], strict=False))
    return gaps[len(gaps) // 2]


def choose(
    policy: Rule, fires: list[datetime], now: datetime
) -> tuple[list[datetime], list[datetime]]:
    """Split due fire times into (to run, missed) by the policy's catch_up."""
    if not fires:
        return [], []
    if policy.catch_up == "latest":
        return [fires[-1]], fires[:-1]
    if policy.catch_up == "all":
        return fires[-policy.max_catch_up :], fires[: -policy.max_catch_up]
    on_time = [f for f in fires if now - f <= LATE_GRACE]
    return on_time[-1:], [f for f in fires if f not in on_time[-1:]]
