"""Durations as people write them: "30d", "12h", "90m", "45s", "250ms", "1h30m"."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str | int | float) -> float:
    """Seconds in a duration. A unit is required: a bare number is refused, as
    ``retain = 30`` read as seconds would plan rows 30 s old instead of 30 days.
    Raises ValueError."""
    if isinstance(text, bool):
        raise ValueError('expected a duration like "30d", "12h", "90m" or "0s"')
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError("a duration cannot be negative")
        n = f"{text:g}"
        raise ValueError(
            f'{n} has no unit: write it as a string with one, like "{n}d", "{n}h", '
            f'"{n}m" or "{n}s" (units: ms, s, m, h, d, w)'
        )
    compact = text.strip().replace(" ", "")
    if not compact or _PART.sub("", compact) != "":
        raise ValueError(
            f'{text!r} is not a duration: write a number and a unit, like "30d", "12h", '
            '"90m", "45s" or "250ms" (units: ms, s, m, h, d, w)'
        )
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(compact))


def format_duration(seconds: float) -> str:
    """The shortest exact spelling: 2592000 -> "30d", 5400 -> "1h30m"."""
    if seconds == 0:
        return "0s"
    parts, rest = [], seconds
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        count = int(rest // size)
        if count:
            parts.append(f"{count}{unit}")
            rest -= count * size
    if rest > 1e-9:
        parts.append(f"{round(rest * 1000)}ms")
    return "".join(parts)
