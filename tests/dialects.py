"""One profile per database for the tests: what a test that reaches under the
engine (to age a stored time, to read what a table holds, to build an
application's table) writes differently on each.

The tests write such SQL once, for PostgreSQL: expiry's tables as
``expiry.jobs``, placeholders as ``%s``, ``{now}`` for the database's clock.
``Dialect.translate`` moves it into the others: SQLite (``expiry_jobs``, ``?``,
times as epoch seconds) and MySQL/MariaDB (``expiry_jobs``, the column ``key``
quoted: a reserved word there). A quoted ``'expiry.policy.x'`` (a queue's name)
is left as it is.

    from dialects import dialect
    d = dialect(engine)            # or dialect("sqlite"), dialect(url)
    d.translate("update expiry.jobs set run_at = {now} - %s where key = %s")
    d.time_type                    # a column type that holds a time
    d.seconds("30")                # an SQL interval of 30 seconds, to add or subtract
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from expiry.engines.kinds import kind_of

_TABLE = re.compile(r"(?<![\w'.])expiry\.(?=\w)")
_KEY = re.compile(r"(?<![\w`'.])(?<!primary )(?<!foreign )key(?![\w`'])")


@dataclass(frozen=True)
class Dialect:
    name: str
    now: str
    """The database's clock, as the engine stores a time."""
    time_type: str
    """A column type that holds a time, as the tests declare it."""
    interval: str
    """An interval of ``{}`` seconds (an SQL expression), to add to a stored time."""
    placeholder: str = "%s"
    quote_key: bool = False
    schema: bool = False
    """expiry's tables live in a schema ``expiry`` (else they are ``expiry_*``)."""

    def translate(self, statement: str) -> str:
        """``statement``, written for PostgreSQL, in this dialect."""
        text = statement.replace("{now}", self.now)
        if not self.schema:
            text = _TABLE.sub("expiry_", text)
        if self.placeholder != "%s":
            text = text.replace("%s", self.placeholder)
        if self.quote_key:
            text = _KEY.sub("`key`", text)
        return text

    def seconds(self, expression: str | float) -> str:
        """An SQL interval of ``expression`` seconds."""
        return self.interval.format(expression)

    def table(self, name: str) -> str:
        """expiry's own table ``name`` (``runs``) as this database names it."""
        return f"expiry.{name}" if self.schema else f"expiry_{name}"


POSTGRES = Dialect("postgres", "now()", "timestamptz", "make_interval(secs => {})", schema=True)
SQLITE = Dialect(
    "sqlite", "((julianday('now') - 2440587.5) * 86400.0)", "real", "({})", placeholder="?"
)
MYSQL = Dialect(
    "mysql",
    "utc_timestamp(6)",
    "datetime(6)",
    "interval round(({}) * 1000000) microsecond",
    quote_key=True,
)
DIALECTS = {d.name: d for d in (SQLITE, POSTGRES, MYSQL)}
"""Every database the suite runs on: ``db_url``, ``engine`` and ``app`` run a
test once on each (tests/conftest.py)."""


def dialect_of(url: str) -> str:
    """The dialect's name of a database URL."""
    kind = kind_of(url)
    assert kind is not None, f"not a database URL: {url}"
    return kind.dialect


def dialect(of: Any) -> Dialect:
    """The profile of an engine, a dialect's name or a database URL."""
    name = of if isinstance(of, str) else of.dialect
    return DIALECTS[name] if name in DIALECTS else DIALECTS[dialect_of(name)]
