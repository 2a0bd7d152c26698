"""How a policy's timestamp column stores time, and how a cutoff is compared
with it in the column's own domain.

Apps store an expiry time in many ways: a typed ``timestamptz``/``timestamp``/
``date`` column (PostgreSQL), ISO-8601 text, epoch seconds, epoch milliseconds
(``Date.now()``) or a julianday (SQLite). A cutoff compared in the wrong domain
deletes live rows (in SQLite an integer sorts below every text, so an epoch
column compared with an ISO cutoff matches every row), so the storage is read
from the data, never from one row, and a reading that could be wrong is
refused with the counts and the fix (``target.py`` runs the statements).

Each storage gives the retention predicate two parts:

- the **index bound**: ``ts < :cutoff``, the cutoff bound in the column's own
  storage, so the timestamp index is used; for ISO text it is the cutoff
  rounded up to the next whole second in the column's spelling, a superset of
  the expired rows whatever their fractional digits or zone suffix;
- the **guard**: a residual condition per row that only a value of this
  storage, read in this storage, earlier than the cutoff can meet (ISO text:
  ``julianday(ts) < julianday(:exact)``, the same monotonic parse on both
  sides; numbers: the storage class and the format's range). A row written in
  another storage after the check (a racing insert, an app that changed its
  format) is therefore never deleted, only left for the next check to refuse.

Numbers are told apart by their range, which does not overlap:
julianday [1e6, 1e7) (years -1975..22666), epoch seconds [1e8, 1e11)
(1973..5138), epoch milliseconds [1e11, 1e14). A value outside every range
(0 as a "never" sentinel, 1970s test data, microseconds) is refused with a
``where`` that excludes it as the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone

FORMATS = ("iso", "epoch", "epoch_ms", "julianday")
"""What ``timestamp_format`` may state."""

NUMERIC_RANGES: dict[str, tuple[float, float]] = {
    "julianday": (1e6, 1e7),
    "epoch": (1e8, 1e11),
    "epoch_ms": (1e11, 1e14),
}
"""Half-open ranges [low, high) of plausible values per numeric format."""

UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
UNIX_EPOCH_JULIANDAY = 2440587.5

UTC_ZONES = ("", "Z", "+00:00", "-00:00")
"""ISO zone suffixes that all mean UTC (no suffix is read as UTC)."""


def numeric_format(value: float) -> str | None:
    """The numeric format whose range holds ``value``, or None."""
    for name, (low, high) in NUMERIC_RANGES.items():
        if low <= value < high:
            return name
    return None


def _micros(value: datetime) -> int:
    """Microseconds since the Unix epoch, exactly (no float on the way)."""
    return (value.astimezone(UTC) - UNIX_EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class Storage:
    """One column's storage of time.

    ``format`` is ``native`` (a PostgreSQL timestamptz, timestamp or date
    column), ``iso`` (text), ``epoch``, ``epoch_ms`` or ``julianday``.
    ``separator`` and ``offset`` give the ISO spelling the column uses ("T" or
    " "; "" for UTC or a fixed "+02:00"). ``integer`` says a PostgreSQL column
    is of an integer type, so its bound is an integer.
    """

    format: str
    separator: str = " "
    offset: str = ""

    @property
    def token(self) -> str:
        """A run carries its storage in its jobs' payloads: every window of the run
        compares in the domain its planner read."""
        if self.format == "iso":
            sep = "T" if self.separator == "T" else "space"
            return f"iso:{sep}:{self.offset or 'utc'}"
        return self.format

    @classmethod
    def from_token(cls, token: str) -> Storage:
        if token.startswith("iso:"):
            _, sep, offset = token.split(":", 2)
            return cls("iso", "T" if sep == "T" else " ", "" if offset == "utc" else offset)
        if token not in ("native", *FORMATS):
            raise ValueError(f"unknown timestamp storage {token!r}")
        return cls(token)

    def describe(self) -> str:
        if self.format == "native":
            return "a native time type"
        if self.format == "iso":
            sep = "'T'" if self.separator == "T" else "a space"
            zone = f"offset {self.offset}" if self.offset else "UTC"
            return f"ISO-8601 text ({sep} between date and time, {zone})"
        return {
            "epoch": "epoch seconds",
            "epoch_ms": "epoch milliseconds",
            "julianday": "julianday numbers",
        }[self.format]

    # -- the cutoff in the column's storage (SQLite binds these; PostgreSQL
    # converts its timestamptz parameter in SQL, see target.py) --------------------

    def bound(self, cutoff: datetime) -> object:
        """The index bound: every value of this storage earlier than ``cutoff``
        compares below it (ISO: rounded up to the second, see the module doc)."""
        micros = _micros(cutoff)
        if self.format == "epoch":
            return micros // 1_000_000 if micros % 1_000_000 == 0 else micros / 1e6
        if self.format == "epoch_ms":
            return micros // 1000 if micros % 1000 == 0 else micros / 1e3
        if self.format == "julianday":
            return UNIX_EPOCH_JULIANDAY + micros / 86_400e6
        if self.format == "iso":
            whole = UNIX_EPOCH + timedelta(seconds=math.ceil(micros / 1e6))
            return self._spell(whole, fraction=False)
        return cutoff

    def exact(self, cutoff: datetime) -> str:
        """The cutoff as exact ISO text, for the guard's julianday()."""
        return self._spell(cutoff, fraction=True)

    def _spell(self, value: datetime, *, fraction: bool) -> str:
        zone = _zone(self.offset)
        local = value.astimezone(zone)
        text = local.strftime(f"%Y-%m-%d{self.separator}%H:%M:%S")
        if fraction and local.microsecond:
            text += f".{local.microsecond:06d}"
        return text + self.offset

    # -- reading a stored value back -------------------------------------------------

    def read(self, value: object) -> datetime | None:
        """A stored value of this storage as a UTC datetime (the watermark's oldest row)."""
        if value is None:
            return None
        if self.format in NUMERIC_RANGES:
            return from_number(float(value), self.format)  # type: ignore[arg-type]
        return instant(value)


def _zone(offset: str) -> timezone:
    if not offset:
        return UTC
    sign = -1 if offset[0] == "-" else 1
    hours, minutes = offset[1:].split(":")
    return timezone(sign * timedelta(hours=int(hours), minutes=int(minutes)))


def from_number(value: float, fmt: str) -> datetime:
    if fmt == "julianday":
        return UNIX_EPOCH + timedelta(days=value - UNIX_EPOCH_JULIANDAY)
    if fmt == "epoch_ms":
        return UNIX_EPOCH + timedelta(milliseconds=value)
    return UNIX_EPOCH + timedelta(seconds=value)


def instant(value: object) -> datetime | None:
    """The instant a stored value denotes, read by Python alone: the run's
    sample check compares with this, independently of the SQL predicate.
    Numbers by their range (None outside every range), text as ISO-8601 (no
    zone: UTC; a date alone: its midnight), driver datetimes and dates as they
    are (naive: UTC). None when the value cannot be read."""
    if isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, int | float):
        fmt = numeric_format(float(value))
        return from_number(float(value), fmt) if fmt else None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None
