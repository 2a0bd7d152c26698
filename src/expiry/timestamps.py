"""How a policy's timestamp column stores time, and how a cutoff is compared
with it in the column's own domain.

Apps store an expiry time in many ways: a typed ``timestamptz``/``timestamp``/
``date`` column (PostgreSQL), ISO-8601 text, epoch seconds, epoch milliseconds
(``Date.now()``) or a julianday (SQLite). A cutoff compared in the wrong domain
deletes live rows (in SQLite an integer sorts below every text, so an epoch
column compared with an ISO cutoff matches every row), so the storage is read
from the data, never from one row, and a reading that could be wrong is
refused with the counts and the fix (``cleanup/target.py`` runs the statements).

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

Naive values (a PostgreSQL ``timestamp without time zone`` or ``date``, a
MySQL ``DATETIME`` or ``DATE``, ISO text without a zone suffix) are wall-clock
times: UTC unless the policy names the zone the app writes them in
(``timestamp_zone``). In a zone, the cutoff is compared as the naive
wall-clock bound ``wall_bound`` computes, and a naive value that could be two
instants (the repeated hour when clocks go back) or none (the skipped hour
when they go forward) counts as the later reading (``latest_instant``): it is
expired only once every instant it could mean has passed. So

    value < wall_bound(cutoff)  <=>  value < the earliest wall-clock time whose
                                     latest reading is not before the cutoff

which is the cutoff's own wall-clock time except in the hour after a change:
while the cutoff is in the first pass of a repeated hour, the bound is the
start of that hour (its values wait for the second pass); in the hour after
clocks went forward, it is the cutoff's wall-clock time read at the offset
before the change (a skipped-hour value is read at that offset). Epoch
numbers are UTC by definition and zoned columns (``timestamptz``, MySQL
``TIMESTAMP``, ISO text with ``Z`` or an offset) carry their zone: no
wall-clock zone applies to them (cleanup/target.py refuses one a policy states).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo

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
"""ISO zone suffixes that all mean UTC (no suffix is read as UTC, or in the
policy's timestamp_zone)."""

LOOKBACK = [timedelta(minutes=30 * step) for step in range(97)]
"""Where wall_bound looks for the offsets in force before a cutoff: every half
hour of the two days before it (the longest skipped stretch on record is a
day, Pacific/Apia in 2011)."""


def numeric_format(value: float) -> str | None:
    """The numeric format whose range holds ``value``, or None."""
    for name, (low, high) in NUMERIC_RANGES.items():
        if low <= value < high:
            return name
    return None


def naive_type(declared: str) -> bool:
    """Whether a typed column's declared type holds naive wall-clock values:
    PostgreSQL ``timestamp without time zone`` and ``date``, MySQL ``DATETIME``
    and ``DATE`` (``timestamptz`` and MySQL ``TIMESTAMP`` carry their zone)."""
    declared = declared.lower()
    return "without time zone" in declared or declared.startswith("date")


@lru_cache(maxsize=64)
def zone_of(name: str) -> ZoneInfo:
    """The IANA zone ``name`` (ValueError when there is none)."""
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise ValueError(f"{name!r} is not an IANA time zone") from exc


def latest_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The later of the instants a naive wall-clock time can denote in ``zone``
    (its two readings, fold 0 and fold 1), in UTC: in a repeated hour, its
    second pass; in a skipped hour, the reading at the offset before the change.
    (Compared in UTC: two datetimes of one tzinfo compare by their fields alone.)"""
    readings = [wall.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)]
    return max(readings)


def _repeated(wall: datetime, zone: ZoneInfo) -> bool:
    """``wall`` falls in a repeated stretch (clocks went back): its first
    reading has the larger offset."""
    first, second = (wall.replace(tzinfo=zone, fold=fold).utcoffset() for fold in (0, 1))
    assert first is not None and second is not None
    return first > second


def _repeat_start(wall: datetime, zone: ZoneInfo) -> datetime:
    """The first wall-clock second of the repeated stretch that holds ``wall``
    (the stretch is whole seconds, at most as long as the offsets' change)."""
    first, second = (wall.replace(tzinfo=zone, fold=fold).utcoffset() for fold in (0, 1))
    assert first is not None and second is not None
    base, lo, hi = wall.replace(microsecond=0), 0, int((first - second).total_seconds())
    while lo < hi:  # the largest s with base - s still repeated
        mid = (lo + hi + 1) // 2
        if _repeated(base - timedelta(seconds=mid), zone):
            lo = mid
        else:
            hi = mid - 1
    return base - timedelta(seconds=lo)


@lru_cache(maxsize=1024)
def wall_bound(cutoff: datetime, zone_name: str) -> datetime:
    """The naive wall-clock bound of ``cutoff`` in the zone: the earliest
    wall-clock time whose latest reading (latest_instant) is not before the
    cutoff, so that ``value < bound`` holds exactly for the values every
    reading of which, and every value below which, is expired (module doc).

    The latest reading rises with the wall clock by steps: it is continuous
    except where it jumps up (the start of a repeated stretch) or down (the end
    of a skipped one). So the bound is one of: the cutoff's own wall-clock
    time, the cutoff read at an offset in force before it (a skipped value's
    reading), or the start of the repeated stretch the cutoff is in the first
    pass of; the earliest of those whose latest reading is not before it."""
    zone, cutoff = zone_of(zone_name), cutoff.astimezone(UTC)
    local = cutoff.astimezone(zone)
    wall = local.replace(tzinfo=None, fold=0)
    candidates = {wall}
    for back in LOOKBACK:
        try:
            offset = (cutoff - back).astimezone(zone).utcoffset()
            assert offset is not None
            candidates.add((cutoff + offset).replace(tzinfo=None))
        except OverflowError:  # a cutoff within days of year 1 or 9999
            continue
    if local.fold == 0 and _repeated(wall, zone):
        candidates.add(_repeat_start(wall, zone))
    return min(v for v in candidates if latest_instant(v, zone) >= cutoff)


def _micros(value: datetime) -> int:
    """Microseconds since the Unix epoch, exactly (no float on the way)."""
    return (value.astimezone(UTC) - UNIX_EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class Storage:
    """One column's storage of time.

    ``format`` is ``native`` (a PostgreSQL or MySQL time type), ``iso``
    (text), ``epoch``, ``epoch_ms`` or ``julianday``. ``separator`` and
    ``offset`` give the ISO spelling the column uses ("T" or " "; "" for UTC or
    a fixed "+02:00"). ``zone`` is the IANA zone whose wall-clock times a naive
    column holds ("": none applies, naive values are UTC).
    """

    format: str
    separator: str = " "
    offset: str = ""
    zone: str = ""
    zero: bool = False
    """Epoch seconds or milliseconds the policy states (timestamp_format): the
    value 0, which apps write for "never" (Nextcloud's last_activity), is the
    epoch itself, 1970-01-01, and so expired."""

    @property
    def token(self) -> str:
        """A run carries its storage in its jobs' payloads: every window of the run
        compares in the domain its planner read (the zone included, after the
        format: ``native@America/Chicago``; ``epoch+zero`` for a stated epoch)."""
        zone = f"@{self.zone}" if self.zone else ""
        if self.format == "iso":
            sep = "T" if self.separator == "T" else "space"
            return f"iso:{sep}:{self.offset or 'utc'}{zone}"
        return self.format + ("+zero" if self.zero else "") + zone

    def plausible(self) -> str:
        """The SQL filter (on ``{ts}``) that keeps a numeric column's comparison to
        values of this format: at least its range's low end (a julianday in an
        epoch column is never read as 1970), or 0 where ``zero``."""
        low = f"{{ts}} >= {NUMERIC_RANGES[self.format][0]:.0f}"
        return f"({low} or {{ts}} = 0)" if self.zero else low

    @classmethod
    def from_token(cls, token: str) -> Storage:
        token, _, zone = token.partition("@")
        if zone:
            zone_of(zone)
        if token.startswith("iso:"):
            _, sep, offset = token.split(":", 2)
            offset = "" if offset == "utc" else offset
            return cls("iso", "T" if sep == "T" else " ", offset, zone)
        zero = token.endswith("+zero")
        token = token.removesuffix("+zero")
        if token not in ("native", *FORMATS) or (zero and token not in ("epoch", "epoch_ms")):
            raise ValueError(f"unknown timestamp storage {token!r}")
        return cls(token, zone=zone, zero=zero)

    def zoned(self, zone: str) -> Storage:
        """This storage with naive values read as wall-clock times of ``zone``."""
        return replace(self, zone=zone)

    def describe(self) -> str:
        read = f" read as {self.zone} wall-clock time" if self.zone else ""
        if self.format == "native":
            return "naive times" + read if self.zone else "a native time type"
        if self.format == "iso":
            sep = "'T'" if self.separator == "T" else "a space"
            if self.zone:
                return f"ISO-8601 text ({sep} between date and time){read}"
            zone = f"offset {self.offset}" if self.offset else "UTC"
            return f"ISO-8601 text ({sep} between date and time, {zone})"
        return {
            "epoch": "epoch seconds",
            "epoch_ms": "epoch milliseconds",
            "julianday": "julianday numbers",
        }[self.format] + (" (0 is the epoch itself: expired)" if self.zero else "")

    # -- the cutoff in the column's storage (SQLite binds these; PostgreSQL
    # converts its timestamptz parameter in SQL, see cleanup/target.py) --------------------

    def compared(self, cutoff: datetime) -> datetime:
        """The time the column is compared with, aware: the cutoff itself, or
        for wall-clock times of a zone their bound (wall_bound) labelled UTC,
        as the engines' sessions (in UTC) read a naive value."""
        if not self.zone:
            return cutoff
        return wall_bound(cutoff, self.zone).replace(tzinfo=UTC)

    def bound(self, cutoff: datetime) -> object:
        """The index bound: every value of this storage earlier than ``cutoff``
        compares below it (ISO: rounded up to the second, see the module doc)."""
        cutoff = self.compared(cutoff)
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
        return self._spell(self.compared(cutoff), fraction=True)

    def _spell(self, value: datetime, *, fraction: bool) -> str:
        zone = _zone(self.offset)
        local = value.astimezone(zone)
        text = local.strftime(f"%Y-%m-%d{self.separator}%H:%M:%S")
        if fraction and local.microsecond:
            text += f".{local.microsecond:06d}"
        return text + self.offset

    # -- reading a stored value back -------------------------------------------------

    def read(self, value: object) -> datetime | None:
        """A stored value of this storage as a UTC datetime (the watermark's oldest
        row): a naive one in the zone, by its latest reading."""
        if value is None:
            return None
        if self.format in NUMERIC_RANGES:
            return from_number(float(value), self.format)  # type: ignore[arg-type]
        return instant(value, self.zone)


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


def instant(value: object, zone: str = "") -> datetime | None:
    """The instant a stored value denotes, read by Python alone: the run's
    sample check compares with this, independently of the SQL predicate.
    Numbers by their range (None outside every range), text as ISO-8601 (a
    date alone: its midnight), driver datetimes and dates as they are; a naive
    value (no zone: a date, a naive datetime, text without a suffix) as UTC,
    or with ``zone`` as a wall-clock time there, by its latest reading. None
    when the value cannot be read."""
    if isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else _naive(value, zone)
    if isinstance(value, date):
        return _naive(datetime(value.year, value.month, value.day), zone)
    if isinstance(value, int | float):
        fmt = numeric_format(float(value))
        return from_number(float(value), fmt) if fmt else None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else _naive(parsed, zone)
    return None


def _naive(wall: datetime, zone: str) -> datetime:
    """A naive wall-clock time as an instant: UTC, or its latest reading in ``zone``."""
    return latest_instant(wall, zone_of(zone)) if zone else wall.replace(tzinfo=UTC)
