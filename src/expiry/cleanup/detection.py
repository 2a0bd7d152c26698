"""How the policy's timestamp column stores time, read from its declared type
and, for text and numbers, from its values; a reading that could be wrong is
refused with the fix."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from ..errors import SchemaError
from ..times import format_time
from ..timestamps import (
    NUMERIC_RANGES,
    UTC_ZONES,
    Storage,
    naive_type,
    numeric_format,
)
from .sql import (
    DEADLINE_WORDS,
    EXPLAIN_HOLDS,
    EXPLAIN_WHERE,
    SHIFT_MAX_SECONDS,
    SHIFT_MIN_SECONDS,
    STORAGE_ABOVE_ZERO,
    STORAGE_CLASSES,
    STORAGE_ENDS,
    STORAGE_RANGE,
)
from .statements import Statements

log = logging.getLogger("expiry.target")


class Detection(Statements):
    """Reading the timestamp column's storage."""

    def detect(self, conn: Any) -> Storage:
        """Read how the timestamp column stores time, from every row the policy
        covers; raise SchemaError, with the counts and the fix, when a reading
        could be wrong (timestamps.py says why). Naive values are read as
        wall-clock times of the policy's timestamp_zone, else the database's."""
        self._naive = False
        if self.engine.typed_columns:
            return self._zoned(self._detect_typed(conn))
        return self._zoned(self._detect_values(conn))

    def _zoned(self, storage: Storage) -> Storage:
        """``storage`` with the zone of its naive values; a zone the policy states
        for a column that carries its zone, or holds epoch numbers, is refused
        (the database's default does not apply there)."""
        p = self.policy
        zone = p.timestamp_zone or p.database_zone
        if self._naive:
            return storage.zoned(zone) if zone else storage
        if p.timestamp_zone:
            held = (
                f"holds {storage.describe()}, which are UTC by definition"
                if storage.format not in ("native", "iso")
                else f"holds {storage.describe()}, which carries its zone"
                if storage.format == "iso"
                else f"is {self._declared}, which carries its zone"
            )
            raise self._refuse(
                f"{held}, but the policy states timestamp_zone = {p.timestamp_zone!r}",
                "remove timestamp_zone: it is for naive times (timestamp without time zone, "
                "DATETIME, DATE, ISO text without a zone suffix)",
            )
        return storage

    def _refuse(self, problem: str, fix: str) -> SchemaError:
        p = self.policy
        return SchemaError(
            f"policy {p.name!r}: timestamp column {p.timestamp!r} {problem}; nothing is "
            f"deleted while it could be misread. Fix: {fix}"
        )

    def _detect_typed(self, conn: Any) -> Storage:
        """Where the declared type decides (PostgreSQL): a native time type as
        it is; an integer column by the range of its values."""
        p, kind = self.policy, self.engine.column_kind(self._declared)
        if kind == "time":
            if p.timestamp_format:
                raise self._refuse(
                    f"is {self._declared}, a native time type",
                    "remove timestamp_format (it is for integer epoch columns)",
                )
            self._naive = naive_type(self._declared)
            return Storage("native")
        if kind != "integer":
            raise self._refuse(
                f"is {self._declared}",
                "store time as timestamptz, timestamp or date, or as integer epoch "
                'seconds or milliseconds with timestamp_format = "epoch" or "epoch_ms"',
            )
        if p.timestamp_format not in (None, "epoch", "epoch_ms"):
            raise self._refuse(
                f"is {self._declared}",
                'on PostgreSQL write timestamp_format = "epoch" or "epoch_ms"',
            )
        row = conn.execute(self.text(STORAGE_RANGE), {}).fetchone()
        storage = self._numeric(row["lo"], row["hi"], None, conn)
        if storage.format not in ("epoch", "epoch_ms"):  # julianday is SQLite's (a real)
            raise self._refuse(
                f"holds integers from {row['lo']!r} to {row['hi']!r}, which are neither "
                "epoch seconds (1e8..1e11) nor epoch milliseconds (1e11..1e14)",
                "convert the column to timestamptz, or to epoch seconds or milliseconds",
            )
        return storage

    def _numeric(self, lo: Any, hi: Any, counts: str | None, conn: Any = None) -> Storage:
        """The numeric format of values from ``lo`` to ``hi`` (None: no values).
        Under a stated epoch format a 0 is the epoch itself (Storage.zero): the
        format is read off the other values."""
        stated = self.policy.timestamp_format
        zero = stated in ("epoch", "epoch_ms")
        if lo is None:
            return Storage(stated or "epoch", zero=zero)
        if zero and float(lo) == 0 and conn is not None:
            lo = conn.execute(self.text(STORAGE_ABOVE_ZERO), {}).fetchone()["lo"]
            if lo is None:  # every value is 0
                return Storage(str(stated), zero=True)
        low, high = numeric_format(float(lo)), numeric_format(float(hi))
        ranges = "epoch seconds 1e8..1e11, epoch milliseconds 1e11..1e14, julianday 1e6..1e7"
        held = counts or f"numbers from {lo!r} to {hi!r}"
        if low is None or high is None or low != high:
            raise self._refuse(
                f"holds {held}, which are not all of one format ({ranges})",
                "convert the rows to one format" + _one_format(self.policy.timestamp, low, high),
            )
        if stated and stated != low:
            raise self._refuse(
                f"holds {held}, which look like {Storage(low).describe()}, but the policy "
                f'states timestamp_format = "{stated}"',
                f'correct timestamp_format (to "{low}"), or the data',
            )
        return Storage(low, zero=zero)

    def _detect_values(self, conn: Any) -> Storage:
        """Where each value has its own storage class (SQLite): read them all."""
        p = self.policy
        ends = conn.execute(self.text(STORAGE_ENDS), {}).fetchone()
        lo, hi = ends["lo"], ends["hi"]
        if lo is None:  # no rows to read: this run deletes nothing
            self._naive = p.timestamp_format in (None, "iso")
            stated = p.timestamp_format or "iso"
            return Storage(stated, zero=stated in ("epoch", "epoch_ms"))
        if all(isinstance(v, int | float) for v in (lo, hi)):
            return self._numeric(lo, hi, None, conn)
        rows = conn.execute(self.text(STORAGE_CLASSES), {}).fetchall()
        classes: dict[str, int] = {}
        for row in rows:
            classes[row["storage"]] = classes.get(row["storage"], 0) + row["n"]
        counts = ", ".join(f"{n:,} {kind}" for kind, n in sorted(classes.items()))
        if "blob" in classes or ("text" in classes and len(classes) > 1):
            keep = "text" if classes.get("text", 0) >= sum(classes.values()) / 2 else "integer"
            raise self._refuse(
                f"mixes storage classes ({counts} values)",
                f"convert the rows to one storage, or limit the policy to one with "
                f"where = \"typeof({p.timestamp}) = '{keep}'\"",
            )
        return self._spelling(rows)

    def _spelling(self, rows: list[Any]) -> Storage:
        """ISO text: one separator and one zone, so that values sort as times do."""
        p = self.policy
        self._iso_only(rows)
        separators, zones, suffixed = _spellings(rows)
        if len(separators) > 1:
            shown = ", ".join(f"{n:,} with {s!r}" for s, n in sorted(separators.items()))
            raise self._refuse(
                f"spells times two ways ({shown} between date and time), which do not "
                "sort together",
                f"rewrite them to one spelling, for example update {p.table} set "
                f"{p.timestamp} = replace({p.timestamp}, 'T', ' ')",
            )
        if len(zones) > 1:
            shown = ", ".join(f"{n:,} {z or 'UTC'}" for z, n in sorted(zones.items()))
            raise self._refuse(
                f"holds times in several zones ({shown}), which do not sort together",
                "rewrite them in one zone (UTC)",
            )
        naive = sum(r["n"] for r in rows) - suffixed
        zone = p.timestamp_zone or p.database_zone
        if zone and naive and suffixed:
            raise self._refuse(
                f"holds {naive:,} times without a zone suffix and {suffixed:,} with one, "
                f"which do not sort together once the first are read as {zone} times",
                "rewrite them in one zone, or limit the policy to one kind with a where",
            )
        self._naive = not suffixed
        separator = next(iter(separators), " ")
        return Storage("iso", separator, next(iter(zones), ""))

    def _iso_only(self, rows: list[Any]) -> None:
        """Refuse ISO text read under another stated format, or holding values
        that are not ISO-8601 times."""
        p = self.policy
        if p.timestamp_format not in (None, "iso"):
            raise self._refuse(
                f"holds ISO-8601 text, but the policy states timestamp_format = "
                f'"{p.timestamp_format}"',
                'correct timestamp_format (to "iso"), or the data',
            )
        unread = [r for r in rows if r["spelling"] == "?"]
        if unread:
            raise self._refuse(
                f"holds {unread[0]['n']:,} text values that are not ISO-8601 times "
                f"(such as {unread[0]['lo']!r})",
                "rewrite them as YYYY-MM-DD HH:MM:SS, or exclude them with a where",
            )

    def read_values(self, conn: Any, storage: Storage) -> list[str]:
        """Set ``reading``: how the column is read, and its oldest and newest
        values (stored, and as read) beside the database clock; returns a
        warning when the newest looks shifted by a zone (_shifted)."""
        p = self.policy
        ends = conn.execute(self.text(STORAGE_ENDS), {}).fetchone()
        now = self.engine.now(conn)
        self.reading = f"{p.timestamp}: {self.how(storage)}; "
        if ends is None or ends["lo"] is None:
            self.reading += f"no values yet (now {format_time(now)})"
            return []
        oldest, newest = storage.read(ends["lo"]), storage.read(ends["hi"])
        self.reading += (
            f"oldest {_shown(ends['lo'], oldest)}, newest {_shown(ends['hi'], newest)}, "
            f"now {format_time(now)}"
        )
        shifted = self._shifted(storage, ends["hi"], newest, now)
        return [] if shifted is None else [shifted]

    def how(self, storage: Storage) -> str:
        """How the column's values are read, in words (after a check or detect)."""
        p = self.policy
        if storage.format == "native":
            kind = self._declared
        elif storage.format == "iso" and self._naive:
            sep = "'T'" if storage.separator == "T" else "a space"
            kind = f"ISO-8601 text ({sep} between date and time)"
        else:
            kind = storage.describe()
        if self._naive and storage.zone:
            return f"naive {kind}, read as {storage.zone} wall-clock time"
        if self._naive:
            return f"naive {kind}, read as UTC (set timestamp_zone if your app writes local time)"
        ignored = (
            f" ([database] timestamp_zone {p.database_zone} does not apply)"
            if p.database_zone
            else ""
        )
        if storage.format in ("native", "iso"):
            return f"{kind}, which carries its zone{ignored}"
        return f"{kind}, UTC by definition{ignored}"

    def _shifted(
        self, storage: Storage, stored: Any, newest: datetime | None, now: datetime
    ) -> str | None:
        """A warning when a creation or activity time (a column not named like a
        deadline, DEADLINE_WORDS) has its newest value between a quarter of an
        hour and 14h15m ahead of the database clock: written, it seems, as the
        wall-clock time of a zone east of the one it is read in."""
        p = self.policy
        if newest is None or any(word in p.timestamp.lower() for word in DEADLINE_WORDS):
            return None
        ahead = (newest - now).total_seconds()
        if not SHIFT_MIN_SECONDS <= ahead <= SHIFT_MAX_SECONDS:
            return None
        quarters = round(ahead / 900)
        about = f"{quarters // 4}h{quarters % 4 * 15:02d}m"
        read = f"{storage.zone} wall-clock time" if storage.zone else "UTC"
        return (
            f"policy {p.name!r}: timestamp column {p.timestamp!r}, read as {read}, holds a "
            f"value about {about} ahead of the database clock (newest {_shown(stored, newest)}, "
            f"now {format_time(now)}): a creation or activity time lies in the past, so the "
            f"app seems to write the wall-clock time of another zone, and rows are deleted "
            f"about {about} late (fix: timestamp_zone = the zone the app writes in)"
        )

    def _explain_holds(self, conn: Any) -> None:
        """Each hold on the table is a valid predicate on it, its keys table and
        column exist: a hold that cannot be read refuses the policy (its rows
        would otherwise go unheld, or every window fail)."""
        for hold in self.policy.holds:
            try:
                self.engine.explain(conn, self.statement(EXPLAIN_HOLDS, holds=(hold,)))
            except Exception as exc:
                first = str(exc).splitlines()[0]
                what = (
                    f"where = {hold.where!r}"
                    if hold.where is not None
                    else f"keys_table {hold.keys_table!r}, keys_column {hold.keys_column!r}"
                )
                raise SchemaError(
                    f"policy {self.policy.name!r}: hold {hold.name!r}: {what} cannot be read "
                    f"on {self.policy.table!r}: {first} (fix the hold: every policy on the "
                    "table waits for it)"
                ) from exc

    def _explain_where(self, conn: Any) -> None:
        try:
            self.engine.explain(conn, self.statement(EXPLAIN_WHERE))
        except Exception as exc:
            first = str(exc).splitlines()[0]
            raise SchemaError(
                f"policy {self.policy.name!r}: where = {self.policy.where!r} "
                f"is not a valid predicate on {self.policy.table!r}: {first}"
            ) from exc


def _spellings(rows: list[Any]) -> tuple[dict[str, int], dict[str, int], int]:
    """Rows per separator and per zone (every UTC spelling as one) of ISO text,
    and the rows with a zone suffix ("Z" or an offset)."""
    separators: dict[str, int] = {}
    zones: dict[str, int] = {}
    suffixed = 0
    for row in rows:
        if row["spelling"] == "date":
            continue  # a date alone sorts before its day's times in either spelling
        separator, zone = row["spelling"].split("|")
        suffixed += row["n"] if zone else 0
        zone = "" if zone in UTC_ZONES else zone
        separators[separator] = separators.get(separator, 0) + row["n"]
        zones[zone] = zones.get(zone, 0) + row["n"]
    return separators, zones, suffixed


def _shown(stored: Any, read: datetime | None) -> str:
    """A stored value, and the instant it was read as."""
    value = stored.isoformat(sep=" ") if isinstance(stored, datetime) else str(stored)
    return f"{value} (= {format_time(read)})" if read is not None else f"{value} (unreadable)"


def _one_format(column: str, low: str | None, high: str | None) -> str:
    """The where that limits a policy to the values of one numeric format (the
    higher values' where they have one), as a refusal's fix: exactly that
    format's range, so that the check reads one format under it."""
    keep = high or low
    if keep is None:
        return ""
    start, end = NUMERIC_RANGES[keep]
    return (
        f", or limit the policy to the {Storage(keep).describe()} with where = "
        f'"{column} >= {int(start)} and {column} < {int(end)}"'
    )
