"""An independent oracle for what a cleanup deletes (issue #16, point 3).

Hypothesis builds a target table on each engine: a timestamp column in a random
storage (PostgreSQL timestamptz, timestamp, date or bigint epoch seconds / ms;
SQLite TIMESTAMP, DATETIME, DATE, TEXT, REAL, INTEGER or untyped columns holding
ISO-8601 text in every spelling, epoch seconds, epoch milliseconds or
julianday), instants around the cutoff (equal, a microsecond, millisecond or
second either side, minutes, hours, days, the cutoff's midnight), a random
``where`` over extra columns, sparse keys and small windows, key or time
windows or (PostgreSQL) block windows (the policy's ``windows``, or chosen by
the data), and an integer,
text or (PostgreSQL) UUID key, whose time windows split rows sharing one
instant by the key. It then runs a
real cleanup (App, planner, queue, worker), redelivers some completed windows
after putting their deleted rows back, and drains again. Two grid tests run
every storage in every declared type with fixed edge instants, so that each
combination is covered on every run and each failing one is listed.

The oracle is plain Python over the values inserted: a row is expired when its
instant (as the chosen storage can hold it) is before the cutoff, and it matches
``where`` by SQL's three-valued logic evaluated here, never by asking the
database or expiry. Every example must be safe (nothing deleted that the oracle
keeps). A uniform column (one storage, one spelling) must lose exactly the
oracle's rows. A column mixing storages or ISO spellings may instead be refused
(SchemaError from the check, or a dead job) with nothing deleted.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from expiry.app import App
from expiry.errors import ExpiryError, SchemaError

from ._support import Db, assert_run_clean, drain, make_app

US = 1
MS = 1_000
S = 1_000_000
MINUTE = 60 * S
HOUR = 60 * MINUTE
DAY = 24 * HOUR
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
JULIAN_EPOCH = 2440587.5  # julianday('1970-01-01 00:00:00')

FLOAT_GUARD = MS
"""Julianday floats hold about 40 us near today, and whoever computes the
cutoff's julianday may round it another way: instants this close to the cutoff
are moved out to it, so that the oracle and any correct reading agree."""

_names = itertools.count()


# -- instants around the cutoff ---------------------------------------------------


@dataclass(frozen=True)
class When:
    """An instant relative to the run's cutoff: ``anchor`` (the cutoff, or the
    midnight that starts or ends its UTC day) plus ``delta`` microseconds."""

    anchor: str
    delta: int

    def at(self, cutoff: datetime) -> datetime:
        base = cutoff
        if self.anchor != "cutoff":
            base = datetime.combine(cutoff.date(), time(), UTC)
            if self.anchor == "next_midnight":
                base += timedelta(days=1)
        return base + timedelta(microseconds=self.delta)

    def __repr__(self) -> str:
        return f"{self.anchor}{self.delta:+d}us"


EDGES = [0, -1, 1, -MS, MS, -S, S, -(S - 1), S - 1, -MINUTE, MINUTE, -HOUR, HOUR, -DAY, DAY]
whens = st.one_of(
    st.builds(When, st.just("cutoff"), st.sampled_from(EDGES)),
    st.builds(When, st.just("cutoff"), st.integers(-2 * S, 2 * S)),
    st.builds(When, st.just("cutoff"), st.integers(-30 * DAY, 30 * DAY)),
    st.builds(
        When, st.sampled_from(["midnight", "next_midnight"]), st.sampled_from([0, -1, 1, -S, S])
    ),
)


@dataclass(frozen=True)
class Cutoff:
    """The run's cutoff: a day before the database's now, truncated to the
    second, then given ``micros`` or moved to its midnight; fixed in the past so
    that no future-cutoff guard interferes."""

    shape: str  # "second" | "micros" | "midnight"
    micros: int = 0

    def resolve(self, now: datetime) -> datetime:
        base = (now - timedelta(days=1)).astimezone(UTC).replace(microsecond=0)
        if self.shape == "midnight":
            return datetime.combine(base.date(), time(), UTC)
        return base.replace(microsecond=self.micros if self.shape == "micros" else 0)


cutoffs = st.one_of(
    st.just(Cutoff("second")),
    st.builds(Cutoff, st.just("micros"), st.sampled_from([1, 999, 1000, 500_000, 999_999])),
    st.builds(Cutoff, st.just("micros"), st.integers(1, 999_999)),
    st.just(Cutoff("midnight")),
)


# -- storages: how a column holds an instant ---------------------------------------


@dataclass(frozen=True)
class Storage:
    """One way of writing instants. ``fmt``: SQLite's iso, epoch (integer
    seconds), epoch_real, epoch_ms, julianday; PostgreSQL's column types, with
    epoch / epoch_ms in a bigint. ISO text also has its separator, zone suffix
    and fractional digits ("auto": six when there are microseconds, as
    Python's str(datetime) writes them)."""

    fmt: str
    sep: str = " "
    zone: str = ""
    frac: str = "0"
    mysql: bool = False  # a MySQL column type (its "timestamp" holds whole seconds)

    def __repr__(self) -> str:
        if self.fmt != "iso":
            return self.fmt
        return f"iso({self.sep!r}, frac={self.frac}, zone={self.zone!r})"

    @property
    def resolution(self) -> int:
        """Microseconds the storage can tell apart (0: a float, see FLOAT_GUARD)."""
        if self.fmt == "iso":
            return {"0": S, "3": MS}.get(self.frac, US)
        return {
            "epoch": S,
            "epoch_ms": MS,
            "timestamptz(3)": MS,
            "timestamp(0)": S,
            # MySQL's: a fraction only when declared (MariaDB truncates the rest).
            "datetime": S,
            "timestamp": S if self.mysql else US,
            "datetime(3)": MS,
            "date": DAY,
            "epoch_real": 0,
            "julianday": 0,
        }.get(self.fmt, US)

    @property
    def stated(self) -> str:
        """The policy's timestamp_format for this storage."""
        return {"epoch_real": "epoch"}.get(self.fmt, self.fmt)

    def instant(self, wanted: datetime, cutoff: datetime) -> datetime:
        """The instant this storage really holds for ``wanted``: truncated to its
        resolution, or for floats kept clear of the cutoff."""
        resolution = self.resolution
        micros = (wanted - EPOCH) // timedelta(microseconds=1)
        if resolution:
            return EPOCH + timedelta(microseconds=micros - micros % resolution)
        gap = micros - (cutoff - EPOCH) // timedelta(microseconds=1)
        # Epoch seconds as a float tell microseconds apart near today; only
        # equality with a cutoff that has microseconds depends on rounding.
        guard = FLOAT_GUARD if self.fmt == "julianday" else (US if cutoff.microsecond else 0)
        if abs(gap) < guard:
            gap = -guard if gap < 0 else guard
        return cutoff + timedelta(microseconds=gap)

    def value(self, instant: datetime) -> Any:
        """The Python value inserted for ``instant`` (already at this resolution)."""
        since = instant - EPOCH
        if self.fmt == "iso":
            digits = self.frac if self.frac != "auto" else ("6" if instant.microsecond else "0")
            text = instant.strftime(f"%Y-%m-%d{self.sep}%H:%M:%S")
            if digits != "0":
                text += f".{instant.microsecond:06d}"[: int(digits) + 1]
            return text + self.zone
        if self.fmt == "epoch":
            return since // timedelta(seconds=1)
        if self.fmt == "epoch_ms":
            return since // timedelta(milliseconds=1)
        if self.fmt == "epoch_real":
            return since / timedelta(seconds=1)
        if self.fmt == "julianday":
            return JULIAN_EPOCH + since / timedelta(days=1)
        if self.fmt == "date":
            return instant.date()
        if self.fmt.startswith("datetime") or (
            self.fmt.startswith("timestamp") and not self.fmt.startswith("timestamptz")
        ):
            # Without time zone: UTC by contract (MySQL's TIMESTAMP read in the
            # session's zone, which expiry and these tests set to UTC).
            return instant.astimezone(UTC).replace(tzinfo=None)
        return instant  # timestamptz

    def signature(self, instant: datetime) -> tuple[str, ...]:
        """Values with one signature sort together; two signatures make a mixed
        column. Integer and real epoch seconds are one storage."""
        if self.fmt == "iso":
            digits = self.frac if self.frac != "auto" else ("6" if instant.microsecond else "0")
            return ("iso", self.sep, self.zone, digits)
        return (self.stated,)


ISO = st.builds(
    Storage,
    st.just("iso"),
    st.sampled_from([" ", "T"]),
    st.sampled_from(["", "Z", "+00:00"]),
    st.sampled_from(["0", "6", "3", "auto"]),
)
NUMERIC = st.sampled_from([Storage(f) for f in ("epoch", "epoch_ms", "julianday", "epoch_real")])
SQLITE_TYPES = ["TIMESTAMP", "INTEGER", "REAL", "TEXT", "DATETIME", "DATE", ""]
PG_TYPES = ["timestamptz", "bigint", "timestamp", "date", "timestamptz(3)", "timestamp(0)"]
MYSQL_TYPES = [
    "datetime(6)",
    "bigint",
    "datetime",
    "timestamp(6)",
    "timestamp",
    "date",
    "datetime(3)",
]


# -- where: a small grammar and its three-valued evaluation ------------------------

Where = tuple[Any, ...]
NOTES = [None, "a", "ab", "b", "it's", "50%"]

atoms: st.SearchStrategy[Where] = st.one_of(
    st.tuples(st.just("null"), st.sampled_from(["revoked_at", "note"]), st.booleans()),
    st.tuples(st.just("cmp"), st.sampled_from(["=", "<>", "<", ">="]), st.integers(0, 3)),
    st.tuples(st.just("note"), st.sampled_from(NOTES[1:])),
    st.tuples(st.just("like"), st.sampled_from(["a", "50", "it"])),
    st.tuples(st.just("between"), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("in"), st.lists(st.integers(0, 3), min_size=1, max_size=3)),
    st.tuples(st.just("mod"), st.integers(2, 3), st.integers(0, 1)),
)
wheres: st.SearchStrategy[Where] = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["or", "and"]), inner, inner),
        st.tuples(st.just("not"), inner),
        st.tuples(st.just("paren"), inner),
    ),
    max_leaves=6,
)


where_or_none: st.SearchStrategy[Where | None] = st.one_of(
    st.none(),
    wheres,
    # A bare top-level "or": the where must reach SQL inside parentheses.
    st.tuples(st.just("or"), wheres, wheres),
)


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def render(node: Where) -> tuple[str, int]:
    """SQL for ``node`` and its precedence (1 or, 2 and, 3 not, 4 atom), with
    only the parentheses precedence needs (and any ``paren`` nodes): a top-level
    ``or`` reaches expiry bare, as users write it."""
    kind = node[0]
    if kind in ("or", "and"):
        prec = 1 if kind == "or" else 2
        parts = []
        for child in node[1:]:
            text, child_prec = render(child)
            parts.append(text if child_prec >= prec else f"({text})")
        return f" {kind} ".join(parts), prec
    if kind == "not":
        text, child_prec = render(node[1])
        return ("not " + text if child_prec == 4 else f"not ({text})"), 3
    if kind == "paren":
        return f"({render(node[1])[0]})", 4
    if kind == "null":
        return f"{node[1]} is {'not ' if node[2] else ''}null", 4
    if kind == "cmp":
        return f"user_id {node[1]} {node[2]}", 4
    if kind == "note":
        return f"note = {literal(node[1])}", 4
    if kind == "like":
        return f"note like {literal(node[1] + '%')}", 4
    if kind == "between":
        return f"user_id between {node[1]} and {node[2]}", 4
    if kind == "in":
        return f"user_id in ({', '.join(map(str, node[1]))})", 4
    assert kind == "mod"
    return f"id % {node[1]} = {node[2]}", 4


def holds(node: Where, row: Row) -> bool | None:
    """SQL's three-valued truth of ``node`` on ``row`` (None: unknown)."""
    kind = node[0]
    if kind == "or":
        values = [holds(child, row) for child in node[1:]]
        return True if True in values else (None if None in values else False)
    if kind == "and":
        values = [holds(child, row) for child in node[1:]]
        return False if False in values else (None if None in values else True)
    if kind == "not":
        value = holds(node[1], row)
        return None if value is None else not value
    if kind == "paren":
        return holds(node[1], row)
    if kind == "null":
        null = (row.revoked_at if node[1] == "revoked_at" else row.note) is None
        return (not null) if node[2] else null  # node[2]: "is not null"
    if kind == "cmp":
        compare: dict[str, Callable[[int, int], bool]] = {
            "=": lambda a, b: a == b,
            "<>": lambda a, b: a != b,
            "<": lambda a, b: a < b,
            ">=": lambda a, b: a >= b,
        }
        return compare[node[1]](row.user_id, node[2])
    if kind == "note":
        return None if row.note is None else row.note == node[1]
    if kind == "like":  # lower-case ASCII only: SQLite's case-blind LIKE agrees
        return None if row.note is None else row.note.startswith(node[1])
    if kind == "between":
        return bool(node[1] <= row.user_id <= node[2])
    if kind == "in":
        return row.user_id in node[1]
    assert kind == "mod"
    return bool(row.key % node[1] == node[2])


# -- a case: the table, its rows and the policy ------------------------------------


@dataclass(frozen=True)
class Row:
    key: int
    when: When | None  # None: a NULL timestamp, never expired
    storage: int  # index into the case's storages
    user_id: int
    revoked_at: int | None
    note: str | None

    def __repr__(self) -> str:
        extra = f"u{self.user_id} rev={self.revoked_at} note={self.note!r}"
        return f"Row({self.key}, {self.when!r}, s{self.storage}, {extra})"


@dataclass(frozen=True)
class Case:
    dialect: str
    column: str  # the declared type of the timestamp column
    storages: tuple[Storage, ...]
    rows: tuple[Row, ...]
    where: Where | None
    window: int
    cutoff: Cutoff
    state_format: str  # timestamp_format: "no" (detect), "yes" (the truth), "wrong"
    index: bool
    concurrency: int
    redeliver: tuple[int, ...]  # picks among the completed windows
    windows: str = "auto"  # the policy's windows: "auto", "key", "time" or "blocks" (PostgreSQL)
    key_kind: str = "int"  # the policy's key: "int" (id), "text" or "uuid" (code)
    inclusive: bool = False  # the policy's inclusive: expired means <= cutoff
    where_sql: str | None = field(init=False, default=None)

    @property
    def formats_apply(self) -> bool:
        """timestamp_format is for SQLite columns and PostgreSQL integer columns."""
        return self.dialect == "sqlite" or self.column == "bigint"

    def __post_init__(self) -> None:
        object.__setattr__(self, "where_sql", render(self.where)[0] if self.where else None)

    def __repr__(self) -> str:
        rows = ",\n    ".join(map(repr, self.rows))
        return (
            f"Case(column={self.column!r}, storages={list(self.storages)}, "
            f"where={self.where_sql!r}, window={self.window}, cutoff={self.cutoff}, "
            f"state_format={self.state_format}, index={self.index}, "
            f"concurrency={self.concurrency}, redeliver={list(self.redeliver)}, "
            f"windows={self.windows}, key={self.key_kind},\n"
            f"  rows=[\n    {rows}])"
        )


@st.composite
def keys(draw: st.DrawFn) -> list[int]:
    """Increasing keys with gaps of every size: neighbours, a few apart, far apart."""
    if draw(st.integers(0, 19)) == 19:
        return []  # an empty table: nothing to detect a storage from, nothing to do
    gaps = draw(
        st.lists(
            st.one_of(st.integers(1, 3), st.integers(4, 40), st.sampled_from([1000, 2**33])),
            min_size=1,
            max_size=40,
        )
    )
    start = draw(st.integers(1, 50))
    return list(itertools.accumulate(gaps, initial=start))[1:]


@st.composite
def cases(draw: st.DrawFn, dialect: str) -> Case:
    if dialect == "sqlite":
        column = draw(st.sampled_from(SQLITE_TYPES))
        # TEXT affinity would turn numbers into text: such a column holds ISO text.
        storage = ISO if column == "TEXT" else st.one_of(ISO, NUMERIC)
        storages = tuple(draw(st.lists(storage, min_size=1, max_size=2)))
    else:
        column = draw(st.sampled_from(PG_TYPES if dialect == "postgres" else MYSQL_TYPES))
        if column == "bigint":
            epochs = st.sampled_from([Storage("epoch"), Storage("epoch_ms")])
            storages = tuple(draw(st.lists(epochs, min_size=1, max_size=2)))
        else:
            storages = (Storage(column, mysql=dialect == "mysql"),)
    row_keys = draw(keys())
    rows = tuple(
        Row(
            key,
            None if draw(st.integers(0, 9)) == 9 else draw(whens),
            draw(st.integers(0, len(storages) - 1)),
            draw(st.integers(0, 3)),
            draw(st.one_of(st.none(), st.integers(1, 9))),
            draw(st.sampled_from(NOTES)),
        )
        for key in row_keys
    )
    return Case(
        dialect=dialect,
        column=column,
        storages=storages,
        rows=rows,
        where=draw(where_or_none),
        window=draw(st.integers(1, 30)),
        cutoff=draw(cutoffs),
        state_format=draw(st.sampled_from(["no", "yes", "wrong"])),
        index=draw(st.booleans()),
        concurrency=draw(st.sampled_from([1, 2])),
        redeliver=tuple(draw(st.lists(st.integers(0, 50), max_size=3))),
        windows=draw(
            st.sampled_from(["auto", "key", "time"] + ["blocks"] * (dialect == "postgres"))
        ),
        # Text and UUID keys: time windows, ties between equal instants split by the key.
        key_kind=draw(st.sampled_from(["int", "int", "text"] + ["uuid"] * (dialect != "sqlite"))),
        inclusive=draw(st.booleans()),
    )


# -- the oracle --------------------------------------------------------------------


@dataclass
class Built:
    """A case laid out for a given cutoff: what each row stores, and the oracle."""

    values: dict[int, Any]  # key -> the timestamp value inserted
    instants: dict[int, datetime | None]  # key -> the instant that value holds
    expected: set[int]  # keys the cleanup must delete
    uniform: bool
    family: str | None  # the storage all rows share, for timestamp_format


def build(case: Case, cutoff: datetime) -> Built:
    values: dict[int, Any] = {}
    instants: dict[int, datetime | None] = {}
    expected: set[int] = set()
    signatures: set[tuple[str, ...]] = set()
    families: set[str] = set()
    for row in case.rows:
        values[row.key] = instants[row.key] = None
        if row.when is None:
            continue
        storage = case.storages[row.storage]
        instant = instants[row.key] = storage.instant(row.when.at(cutoff), cutoff)
        values[row.key] = storage.value(instant)
        signatures.add(storage.signature(instant))
        families.add(storage.stated)
        where = True if case.where is None else holds(case.where, row)
        if (instant <= cutoff if case.inclusive else instant < cutoff) and where is True:
            expected.add(row.key)
    family = families.pop() if len(families) == 1 else None
    return Built(values, instants, expected, len(signatures) <= 1, family)


# -- running a case ----------------------------------------------------------------


def code(case: Case, key: int) -> str | None:
    """The row's text or UUID key, in no relation to ``id``'s order; None for int keys."""
    if case.key_kind == "int":
        return None
    text = str(uuid.uuid5(uuid.NAMESPACE_OID, str(key)))
    return text if case.key_kind == "uuid" else text[:13]


def create(db: Db, table: str, case: Case) -> None:
    key_type = "integer" if db.dialect == "sqlite" else "bigint"
    column = "bigint" if case.column == "bigint" else case.column
    # id stays first (the oracle's handle on a row); a text or UUID key is code.
    code_type = {
        "postgres": {"uuid": "uuid", "text": "text"},
        "sqlite": {"text": "text"},
        "mysql": {"uuid": "char(36)", "text": "varchar(64)"},
    }[db.dialect]
    if case.key_kind == "int":
        keys = f"id {key_type} primary key"
    else:
        keys = f"id {key_type} not null, code {code_type[case.key_kind]} primary key"
    db.execute(
        f"create table {table} ({keys}, expires_at {column},"
        f" user_id integer not null, revoked_at {key_type}, note text)"
    )
    if case.index:
        db.execute(f"create index {table}_expires_at on {table} (expires_at)")


def insert(db: Db, table: str, case: Case, values: dict[int, Any]) -> None:
    rows = case.rows
    if not rows:
        return
    statement = db.sql(
        f"insert into {table} (id, expires_at, user_id, revoked_at, note{', code' * (case.key_kind != 'int')})"
        f" values (%s, %s, %s, %s, %s{', %s' * (case.key_kind != 'int')})"
    )
    params = [
        (r.key, values[r.key], r.user_id, r.revoked_at, r.note)
        + ((code(case, r.key),) if case.key_kind != "int" else ())
        for r in rows
    ]
    if db.dialect == "postgres":
        with db.conn.cursor() as cur:
            cur.executemany(statement, params)
    else:
        db.conn.executemany(statement, params)


MISSTATED = {"iso": "epoch", "epoch": "epoch_ms", "epoch_ms": "epoch", "julianday": "epoch"}


def policy_for(case: Case, built: Built, name: str, table: str) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "name": name,
        "table": table,
        "key": "id" if case.key_kind == "int" else "code",
        "timestamp": "expires_at",
        "where": case.where_sql,
        "window": case.window,
        "windows": case.windows if case.key_kind == "int" or case.windows == "blocks" else "auto",
        "nice_ratio": 0,  # no rest between windows: the test has no live traffic
        "max_attempts": 3,
        "inclusive": case.inclusive,
    }
    if case.state_format != "no" and built.uniform and built.family and case.formats_apply:
        # Stated only for a uniform column, as its truth or as another format
        # (misread, it would take live rows); unstated, expiry detects it.
        right = case.state_format == "yes"
        policy["timestamp_format"] = built.family if right else MISSTATED[built.family]
    return policy


def database_now(db: Db) -> datetime:
    if db.dialect == "postgres":
        now: datetime = db.scalar("select now()")
        return now
    if db.dialect == "mysql":
        naive: datetime = db.scalar("select utc_timestamp(6)")
        return naive.replace(tzinfo=UTC)
    return datetime.fromtimestamp(float(db.scalar("select {now}")), UTC)


def run_case(db: Db, case: Case) -> None:
    n = next(_names)
    table, name = f"oracle_{n}", f"oracle-{n}"
    create(db, table, case)
    app: App | None = None
    try:
        cutoff = case.cutoff.resolve(database_now(db))
        built = build(case, cutoff)
        if currently_in_test_context():
            # A note is printed with a failure even where a plugin (schemathesis's)
            # blanks the arguments of Hypothesis's "Failing test case".
            note(f"{case!r}\ncutoff={cutoff.isoformat()} expected={sorted(built.expected)}")
        insert(db, table, case, built.values)
        before = {row[0]: row for row in db.table(table)}
        policy = policy_for(case, built, name, table)
        app = make_app(db.url, policy, pool_size=2)
        # Exact deletion is owed for a uniform column whose format, if stated, is
        # its own; a mixed or misstated column may be refused instead.
        strict = built.uniform and policy.get("timestamp_format") in (None, built.family)
        check_and_clean(db, app, case, built, strict, table, name, cutoff, before)
    finally:
        if app is not None:
            app.close()
        db.execute(f"drop table {table}")


def check_and_clean(
    db: Db,
    app: App,
    case: Case,
    built: Built,
    strict: bool,
    table: str,
    name: str,
    cutoff: datetime,
    before: dict[int, tuple[Any, ...]],
) -> None:
    cleanup = app.cleanup
    assert cleanup is not None
    refused: list[str] = []
    try:
        cleanup.check()
    except SchemaError as exc:
        refused.append(f"check: {exc}")
    run_id: str | None = None
    try:
        run_id = cleanup.open_run(name, cutoff).run_id
    except SchemaError as exc:
        refused.append(f"open_run: {exc}")
    if run_id is not None:
        drain(app, concurrency=case.concurrency)
        refused += [
            f"dead job {j['key']}: {j['error']}"
            for j in db.jobs(run_id=run_id)
            if j["state"] == "dead"
        ]

    left = db.table(table)
    deleted = set(before) - {row[0] for row in left}
    if currently_in_test_context():  # what the examples covered (--hypothesis-show-statistics)
        kind = "uniform" if built.uniform else "mixed"
        event(kind if strict else f"{kind}{', misstated' * built.uniform}, refused={bool(refused)}")
        shares = {0: "none expired", len(before): "all expired"}
        event(shares.get(len(built.expected), "some expired") if before else "empty table")
        event("top-level or" if case.where and case.where[0] == "or" else "other where")
    assert_safe(case, built, cutoff, before, deleted)
    # Survivors are untouched, column for column.
    assert left == [before[k] for k in sorted(set(before) - deleted)]
    if strict:
        # LIVENESS: a uniform column is never refused and loses exactly the oracle's rows.
        assert not refused, f"a uniform column was refused: {refused}"
    elif refused:
        # A mixed or misstated column may be refused, but before anything is deleted.
        assert not deleted, f"refused ({refused}) yet deleted {sorted(deleted)}"
        return
    assert_live(built, cutoff, before, deleted)
    assert run_id is not None
    assert_run_clean(db, run_id)
    redeliver(db, app, case, table, run_id, before, deleted)


def assert_safe(
    case: Case,
    built: Built,
    cutoff: datetime,
    before: dict[int, tuple[Any, ...]],
    deleted: set[int],
) -> None:
    """SAFETY, whatever the column: nothing deleted that the oracle keeps. One
    assertion per reason, so that Hypothesis reports each as its own failure."""
    wrong = sorted(deleted - built.expected)
    instants = built.instants
    live = {k: before[k] for k in wrong if (at := instants[k]) is not None and at >= cutoff}
    assert not live, f"cutoff {cutoff.isoformat()}: deleted rows not expired: {live}"
    null = {k: before[k] for k in wrong if instants[k] is None}
    assert not null, f"deleted rows whose timestamp is NULL: {null}"
    kept = {k: before[k] for k in wrong}
    assert not kept, f"deleted expired rows that where = {case.where_sql!r} protects: {kept}"


def assert_live(
    built: Built, cutoff: datetime, before: dict[int, tuple[Any, ...]], deleted: set[int]
) -> None:
    """LIVENESS: every row the oracle expires is deleted. The one documented
    exception: ISO text on SQLite is compared through julianday(), which rounds
    to the millisecond (the README says so), so a text row expired by less than
    a millisecond may wait for the next run; every other storage is exact."""
    missed = sorted(built.expected - deleted)
    edge = cutoff - timedelta(milliseconds=1)
    instants = built.instants
    far = {k: before[k] for k in missed if (at := instants[k]) is not None and at <= edge}
    assert not far, f"cutoff {cutoff.isoformat()}: expired rows kept: {far}"
    near = {k: before[k] for k in missed if not isinstance(built.values[k], str)}
    assert not near, (
        f"cutoff {cutoff.isoformat()}: rows expired by less than a millisecond kept: {near}"
    )


def redeliver(
    db: Db,
    app: App,
    case: Case,
    table: str,
    run_id: str,
    before: dict[int, tuple[Any, ...]],
    deleted: set[int],
) -> None:
    """Redeliver some completed windows after putting back their deleted rows
    (still expired): the ledger must make each delivery a no-op."""
    windows = [w for w in db.windows(run_id) if w["state"] == "completed"]
    if not windows or not case.redeliver:
        return
    picked = list({windows[i % len(windows)]["key"]: None for i in case.redeliver})
    if all("windows" not in w["payload"] for w in windows):  # key windows: their own rows back
        ranges = [(w["payload"]["lo"], w["payload"]["hi"]) for w in windows if w["key"] in picked]
        back = sorted(k for k in deleted if any(lo < k <= hi for lo, hi in ranges))
    else:  # time or block windows: every deleted row back, whichever window took it
        back = sorted(deleted)
    placeholders = ", ".join(["%s"] * len(before[next(iter(before))]))
    for key in back:
        db.execute(f"insert into {table} values ({placeholders})", list(before[key]))
    table_before, ledger_before = db.table(table), db.ledger(run_id)
    for key in picked:
        db.redeliver(key)
    if currently_in_test_context():
        event("redelivered, rows put back" if back else "redelivered")
    drain(app, concurrency=case.concurrency)
    assert db.table(table) == table_before, f"a redelivery of {picked} changed the table"
    assert db.ledger(run_id) == ledger_before
    states = {w["key"]: w["state"] for w in db.windows(run_id)}
    assert all(states[key] == "completed" for key in picked), states


# -- the tests -----------------------------------------------------------------------

# Measured on the 2-core machine (2026-12-05), every example passing: MariaDB
# 50 s, PostgreSQL 28 s, SQLite 17 s, the grids 28 s; the file 124 s. A
# failure adds its shrinking, within a minute. EXPIRY_ORACLE_SCALE=0.1 runs a
# tenth of the examples (the grids whole): the file in under a minute, for a
# change's own loop; the suite runs them all.
SCALE = float(os.environ.get("EXPIRY_ORACLE_SCALE", "1"))
SQLITE_EXAMPLES = max(5, round(400 * SCALE))
POSTGRES_EXAMPLES = max(5, round(200 * SCALE))
MYSQL_EXAMPLES = max(5, round(150 * SCALE))
ORACLE = settings(
    deadline=None,
    derandomize=True,  # the same examples on every run, in CI too
    database=None,
    # No explain phase: it reruns a failing example hundreds of times (minutes
    # on PostgreSQL), and the shrunk example's note already says what it was.
    phases=[Phase.explicit, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def pg_oracle(pg_url: str) -> Iterator[Db]:
    """One database for all examples, whose sessions default to a zone far from
    UTC: "timestamp without time zone is UTC" must not lean on the server's."""
    db = Db(pg_url)
    name = pg_url.rsplit("/", 1)[1]
    db.execute(f"alter database \"{name}\" set timezone to 'Pacific/Chatham'")
    yield db
    db.close()


@pytest.fixture
def sqlite_oracle(sqlite_url: str) -> Iterator[Db]:
    db = Db(sqlite_url)
    yield db
    db.close()


@pytest.fixture
def mysql_oracle(mysql_url: str) -> Iterator[Db]:
    db = Db(mysql_url)
    yield db
    db.close()


@settings(ORACLE, max_examples=MYSQL_EXAMPLES)
@given(case=cases("mysql"))
def test_mysql_deletes_exactly_what_the_oracle_expires(mysql_oracle: Db, case: Case) -> None:
    run_case(mysql_oracle, case)


@settings(ORACLE, max_examples=SQLITE_EXAMPLES)
@given(case=cases("sqlite"))
def test_sqlite_deletes_exactly_what_the_oracle_expires(sqlite_oracle: Db, case: Case) -> None:
    run_case(sqlite_oracle, case)


@settings(ORACLE, max_examples=POSTGRES_EXAMPLES)
@given(case=cases("postgres"))
def test_postgres_deletes_exactly_what_the_oracle_expires(pg_oracle: Db, case: Case) -> None:
    run_case(pg_oracle, case)


GRID_ISO = [
    Storage("iso", " ", "", "0"),  # SQLite's datetime()
    Storage("iso", "T", "Z", "3"),  # JavaScript's toISOString()
    Storage("iso", " ", "+00:00", "6"),
    Storage("iso", "T", "", "6"),
    Storage("iso", "T", "Z", "0"),
]
GRID_NUMERIC = [Storage(f) for f in ("epoch", "epoch_real", "epoch_ms", "julianday")]
GRID_WHERE: Where = ("or", ("null", "revoked_at", False), ("cmp", "=", 0))
GRID_RUNS = [(Cutoff("second"), "no"), (Cutoff("micros", 1), "no"), (Cutoff("micros", 1), "yes")]
"""A whole-second cutoff, then one a microsecond past it, with the storage
detected and then with timestamp_format stated (where it applies)."""


def grid_case(dialect: str, column: str, storage: Storage, cutoff: Cutoff, stated: str) -> Case:
    """Every edge instant once, in one storage, under a top-level ``or``."""
    whens = [When("cutoff", d) for d in EDGES]
    whens += [When(a, d) for a in ("midnight", "next_midnight") for d in (-1, 0, 1)]
    rows = tuple(
        Row(10 * i + i % 3, when, 0, i % 4, None if i % 3 else 5, NOTES[i % len(NOTES)])
        for i, when in enumerate([*whens, None], start=1)
    )
    return Case(dialect, column, (storage,), rows, GRID_WHERE, 7, cutoff, stated, True, 1, (0, 2))


def run_grid(db: Db, combos: list[tuple[str, Storage]]) -> None:
    """Each combination with each of GRID_RUNS; every failing combination is
    listed, not just the first."""
    failures = []
    for column, storage in combos:
        for cutoff, stated in GRID_RUNS:
            case = grid_case(db.dialect, column, storage, cutoff, stated)
            try:
                run_case(db, case)
            except (AssertionError, ExpiryError) as exc:
                first = str(exc).splitlines()[0][:300]
                failures.append(
                    f"{column or 'untyped'} / {storage!r} / {cutoff} stated={stated}: {first}"
                )
    assert not failures, f"{len(failures)} failing combinations:\n" + "\n".join(failures)


def test_sqlite_every_storage_in_every_declared_type(sqlite_oracle: Db) -> None:
    run_grid(
        sqlite_oracle,
        [
            (column, storage)
            for column in SQLITE_TYPES
            for storage in GRID_ISO + ([] if column == "TEXT" else GRID_NUMERIC)
        ],
    )


def test_postgres_every_column_type(pg_oracle: Db) -> None:
    combos = [(t, Storage(t)) for t in PG_TYPES if t != "bigint"]
    run_grid(pg_oracle, combos + [("bigint", Storage("epoch")), ("bigint", Storage("epoch_ms"))])


def test_mysql_every_column_type(mysql_oracle: Db) -> None:
    combos = [(t, Storage(t, mysql=True)) for t in MYSQL_TYPES if t != "bigint"]
    run_grid(mysql_oracle, combos + [("bigint", Storage("epoch")), ("bigint", Storage("epoch_ms"))])


def test_the_oracle_reads_instants_as_written() -> None:
    """The oracle's own arithmetic, checked by hand on a few values."""
    cutoff = datetime(2026, 3, 4, 10, 0, 0, 500_000, tzinfo=UTC)
    iso = Storage("iso", "T", "Z", "0")
    at = iso.instant(When("cutoff", 0).at(cutoff), cutoff)
    assert at == cutoff.replace(microsecond=0) and iso.value(at) == "2026-03-04T10:00:00Z"
    ms = Storage("epoch_ms")
    assert ms.value(ms.instant(cutoff, cutoff)) == 1772618400500
    jd = Storage("julianday")
    assert jd.instant(cutoff - timedelta(microseconds=1), cutoff) == cutoff - timedelta(
        microseconds=FLOAT_GUARD
    )
    assert jd.value(datetime(1970, 1, 1, tzinfo=UTC)) == JULIAN_EPOCH
    assert Storage("date").value(cutoff) == date(2026, 3, 4)
    row = Row(6, None, 0, 1, None, None)
    where = ("or", ("null", "revoked_at", False), ("cmp", "=", 0))
    assert render(where)[0] == "revoked_at is null or user_id = 0"
    assert holds(("not", ("note", "a")), row) is None  # NULL stays unknown under not
    assert holds(("or", ("note", "a"), ("mod", 3, 0)), row) is True
    assert render(("and", where, ("not", where)))[0] == (
        "(revoked_at is null or user_id = 0) and not (revoked_at is null or user_id = 0)"
    )
