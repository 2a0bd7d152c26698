"""Cron expressions, by cronsim (Debian cron's semantics, DST included). Pure.

Standard 5-field cron plus the aliases @hourly, @daily (@midnight), @weekly,
@monthly and @yearly (@annually), which are expanded here.
"""

from __future__ import annotations

from datetime import datetime

from cronsim import CronSim, CronSimError

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
