"""Cron expressions, by cronsim (Debian cron's semantics, DST included). Pure."""

from __future__ import annotations

from datetime import datetime

from cronsim import CronSim, CronSimError

_NONSTANDARD = ("L", "W", "#", "?")


def check_expression(expr: str) -> str:
    """Refuse what standard 5-field cron (plus @hourly..@yearly) cannot say."""
    fields = expr.split()
    if not expr.startswith("@") and len(fields) != 5:
        raise ValueError(
            f"{expr!r} has {len(fields)} fields; write standard 5-field cron "
            "(minute hour day-of-month month day-of-week) or @hourly/@daily/@weekly/@monthly"
        )
    if any(mark in expr.upper() for mark in _NONSTANDARD) and not expr.startswith("@"):
        raise ValueError(f"{expr!r} uses a nonstandard extension (L, W, # or ?); use standard 5-field cron")
    try:
        CronSim(expr, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise ValueError(f"{expr!r} is not a valid cron expression: {exc}") from None
    return expr
