"""Times and durations as expiry writes and reads them. Pure.

- a time: ISO-8601 in UTC with a ``Z``, to the microsecond when there is one;
- a duration: as people write it, "30d", "12h", "90m", "45s", "250ms", "1h30m".

(How a policy's column stores time is timestamps.py's.)"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta


def format_time(value: datetime) -> str:
    """``2026-11-30T12:00:00Z``, or ``...:00.250000Z`` with microseconds."""
    value = value.astimezone(UTC)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{value.microsecond:06d}" if value.microsecond else "") + "Z"


def parse_time(text: str) -> datetime:
    """An ISO-8601 time; without a zone it is UTC."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def in_utc(value: datetime) -> datetime:
    """An aware time in UTC: PostgreSQL refuses UTC offsets beyond 15:59, which
    ISO-8601 and Python allow, and the drivers read years up to 9999 only."""
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range") from None
    if utc.year > 9998:
        raise ValueError("is out of range: use a year before 9999")
    return utc


def parse_since(text: str, now: datetime) -> datetime:
    """A time to read from: ISO-8601 (``2026-11-01T00:00:00Z``), or a duration
    back from ``now`` (``30d``), which the caller reads off the database's clock."""
    try:
        return in_utc(parse_time(text))
    except ValueError:
        pass
    try:
        return now - timedelta(seconds=parse_duration(text))
    except (ValueError, OverflowError):
        raise ValueError(
            f"{text!r}: write an ISO-8601 time (2026-11-01T00:00:00Z) or how long ago (30d)"
        ) from None


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
