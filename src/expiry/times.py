"""Times as expiry writes and reads them: ISO-8601 in UTC with a ``Z``, to the
microsecond when there is one. Pure. (How a policy's column stores time is
timestamps.py's; durations are durations.py's.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .durations import parse_duration


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
