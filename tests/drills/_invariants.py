"""The one invariant checker every drill ends with: plain SQL against the database.

Before a run, ``record_expected`` keeps a copy of what must survive in side
tables of the target database:

    drill_survivors (tbl, id)   rows not expired at any cutoff the drill can use
                                (deadline in the future) and rows the policy's
                                ``where`` excludes
    drill_baseline (tbl, rows)  the table's row count, so that the rows deleted
                                can be compared with what the ledger says it applied

After the drill, ``check`` (or ``violations``) reads the database and reports:

1. protected rows deleted: a survivor id missing from its table;
2. expired rows left: rows with timestamp < the newest run's cutoff that match
   ``where`` (the retention predicate, as the engine evaluates it);
3. ledger keys != completed window job keys (exactly one ledger row per key);
4. a key range applied twice: (lo, hi] ranges of one run's ledger overlapping;
5. a job neither completed, dead with its reason, nor cancelled;
6. a run not finished once all its jobs are final;
7. rows deleted != the sum of rows_affected in the policy's ledger (baseline).

The checks are written for PostgreSQL and run on MariaDB too (the crash drill
and the duplicate storm): its connection translates expiry's table names, and
the few statements that differ are spelled for each.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pymysql

WINDOW_HANDLER = "expiry.window"
_KEY = re.compile(r"(?<![\w`'.])(?<!primary )(?<!foreign )(?<!duplicate )key(?![\w`'])")


def dialect(url: str) -> str:
    if url.startswith(("mysql://", "mariadb://")):
        return "mysql"
    return "postgres"


class Translating:
    """An autocommit MariaDB connection that takes the drills' PostgreSQL
    spelling of expiry's tables (``expiry.jobs``) and of the column ``key``.
    (This module is self-contained: bench/soak.py loads it by path.)"""

    def __init__(self, url: str) -> None:
        from expiry.engines.mysql.sessions import parse_url

        self.raw = pymysql.connect(
            **parse_url(url), autocommit=True, init_command="set session time_zone = '+00:00'"
        )

    def execute(self, statement: str, params: Any = None) -> Any:
        cur = self.raw.cursor()
        cur.execute(_KEY.sub("`key`", statement.replace("expiry.", "expiry_")), params)
        return cur

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> Translating:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Target:
    """A policy's table as the checker sees it."""

    policy: str = "expired-sessions"
    table: str = "sessions"
    key: str = "id"
    timestamp: str = "expires_at"
    where: str | None = "revoked_at is null"
    action: str = "delete"


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    jobs: dict[str, int] = field(default_factory=dict)
    """state -> count, over every job"""
    ledger_rows: int = 0
    rows_applied: int = 0
    survivors: int = 0

    def __str__(self) -> str:
        head = (
            f"jobs {self.jobs}, ledger rows {self.ledger_rows}, "
            f"rows applied {self.rows_applied}, survivors {self.survivors}"
        )
        if not self.violations:
            return head + ": all invariants hold"
        return head + "\n" + "\n".join(f"  VIOLATION: {v}" for v in self.violations)


def _connect(url: str) -> Any:
    if dialect(url) == "mysql":
        return Translating(url)
    # Explicitly read-write, so that a drill that made the database read-only
    # by default can still be checked (the checker itself only reads).
    return psycopg.connect(url, autocommit=True, options="-c default_transaction_read_only=off")


def _quote(url: str, name: str) -> str:
    """An identifier, schema-qualified or not, quoted as the server reads it."""
    mark = "`" if dialect(url) == "mysql" else '"'
    return ".".join(mark + part.replace(mark, mark * 2) + mark for part in name.split("."))


def _retention(url: str, target: Target) -> str:
    pred = f"{_quote(url, target.timestamp)} < %(cutoff)s"
    if target.where:
        pred = f"{pred} and ({target.where.replace('%', '%%')})"
    return pred


def _table(url: str, target: Target) -> str:
    return _quote(url, target.table)


def record_expected(url: str, targets: Sequence[Target] = (Target(),)) -> dict[str, int]:
    """Copy the ids that must survive any run of the drill, and the row counts.
    Call it after loading the table and before opening the run. Survivors are rows
    whose deadline is still ahead (database clock) and rows ``where`` excludes.
    Returns {table: survivors}."""
    out: dict[str, int] = {}
    mysql = dialect(url) == "mysql"
    text = "varchar(255)" if mysql else "text"
    now = "utc_timestamp(6)" if mysql else "now()"
    with _connect(url) as conn:
        conn.execute(
            "create table if not exists drill_survivors"
            f" (tbl {text} not null, id bigint not null, primary key (tbl, id))"
        )
        conn.execute(
            "create table if not exists drill_baseline"
            f" (tbl {text} primary key, {_quote(url, 'rows')} bigint not null)"
        )
        for target in targets:
            kept = f"not ({_quote(url, target.timestamp)} < {now})"
            if target.where:
                kept = f"{kept} or not coalesce(({target.where}), false)"
            conn.execute("delete from drill_survivors where tbl = %s", (target.table,))
            cur = conn.execute(
                f"insert into drill_survivors (tbl, id) select %s, {_quote(url, target.key)}"
                f" from {_table(url, target)} where {kept.replace('%', '%%')}",
                (target.table,),
            )
            out[target.table] = cur.rowcount
            upsert = (
                "on duplicate key update `rows` = values(`rows`)"
                if mysql
                else "on conflict (tbl) do update set rows = excluded.rows"
            )
            conn.execute(
                f"insert into drill_baseline (tbl, {_quote(url, 'rows')}) select %s, count(*)"
                f" from {_table(url, target)} {upsert}",
                (target.table,),
            )
    return out


def add_survivors(conn: Any, table: str, ids: Sequence[int]) -> None:
    """Protect more ids (a drill that revives rows during the run)."""
    conn.execute(
        "insert into drill_survivors (tbl, id) select %s, unnest(%s::bigint[])"
        " on conflict do nothing",
        (table, list(ids)),
    )


def violations(url: str, targets: Sequence[Target] = (Target(),)) -> Report:
    """Check every invariant; returns a report whose ``violations`` is empty when all hold."""
    report = Report()
    v = report.violations
    with _connect(url) as conn:
        # 5. every job completed, dead with its reason, or cancelled
        for state, n in conn.execute("select state, count(*) from expiry.jobs group by state"):
            report.jobs[state] = n
        for key, state in conn.execute(
            "select key, state from expiry.jobs"
            " where state not in ('completed', 'dead', 'cancelled') order by id limit 5"
        ):
            v.append(f"job {key} is still {state}")
        unfinished = sum(
            n for s, n in report.jobs.items() if s not in ("completed", "dead", "cancelled")
        )
        if unfinished > 5:
            v.append(f"... {unfinished} jobs in all are not final")
        for (key,) in conn.execute(
            "select key from expiry.jobs where state = 'dead'"
            " and coalesce(last_error, '') = '' order by id limit 5"
        ):
            v.append(f"dead job {key} has no reason (last_error is empty)")

        # 3. ledger keys == completed window job keys
        ledger = {
            key for (key,) in conn.execute("select key from expiry.ledger where run_id is not null")
        }
        completed = {
            key
            for (key,) in conn.execute(
                "select key from expiry.jobs where handler = %s and state = 'completed'",
                (WINDOW_HANDLER,),
            )
        }
        report.ledger_rows = len(ledger)
        if extra := sorted(ledger - completed):
            v.append(f"{len(extra)} ledger rows without a completed window job: {extra[:5]}")
        if missing := sorted(completed - ledger):
            v.append(f"{len(missing)} completed window jobs without a ledger row: {missing[:5]}")

        # 4. no key range applied twice: a run's (lo, hi] ranges are disjoint
        for run_id, key, lo, hi, prev_key, prev_hi in conn.execute(
            """
            select run_id, key, lo, hi, prev_key, prev_hi from (
                select run_id, key, lo, hi,
                       lag(key) over w as prev_key, lag(hi) over w as prev_hi
                from expiry.ledger where run_id is not null
                window w as (partition by run_id order by lo, hi)
            ) x
            where lo >= hi or lo < prev_hi
            limit 5
            """
        ):
            v.append(
                f"run {run_id}: ledger {key} ({lo}, {hi}] overlaps {prev_key} (.., {prev_hi}]"
                if prev_hi is not None and lo < prev_hi
                else f"run {run_id}: ledger {key} has an empty range ({lo}, {hi}]"
            )

        # 6. a run whose jobs are all final is finished
        for run_id, state in conn.execute(
            """
            select r.id, r.state from expiry.runs r
            where r.state <> 'finished'
              and not exists (select 1 from expiry.jobs j where j.run_id = r.id
                              and j.state in ('scheduled', 'available', 'retryable', 'running'))
            """
        ):
            v.append(f"run {run_id} is {state} although none of its jobs is pending")

        for target in targets:
            _check_target(url, conn, target, report)
    return report


def _check_target(url: str, conn: Any, target: Target, report: Report) -> None:
    v = report.violations
    table, key = _table(url, target), _quote(url, target.key)
    # 1. no protected row deleted
    report.survivors = int(
        conn.execute(
            "select count(*) from drill_survivors where tbl = %s", (target.table,)
        ).fetchone()[0]
    )
    lost = [
        r[0]
        for r in conn.execute(
            "select s.id from drill_survivors s where s.tbl = %s"
            f" and not exists (select 1 from {table} t where t.{key} = s.id)"
            " order by s.id",
            (target.table,),
        )
    ]
    if lost:
        v.append(f"{target.table}: {len(lost)} protected rows were deleted, e.g. ids {lost[:10]}")

    # 2. no expired row left once the run is done (by the newest run's cutoff)
    row = conn.execute(
        "select max(cutoff) from expiry.runs where policy = %s", (target.policy,)
    ).fetchone()
    cutoff = row[0] if row else None
    if cutoff is None:
        v.append(f"policy {target.policy}: no run was opened")
    else:
        left = [
            r[0]
            for r in conn.execute(
                f"select {key} from {table} where {_retention(url, target)}"
                f" order by {key} limit 10",
                {"cutoff": cutoff},
            )
        ]
        if left:
            v.append(
                f"{target.table}: rows expired before the cutoff {cutoff} are left, e.g. ids {left}"
            )

    # 7. the rows that went are exactly the rows the ledger says it applied
    row = conn.execute(
        f"select {_quote(url, 'rows')} from drill_baseline where tbl = %s", (target.table,)
    ).fetchone()
    applied = int(
        conn.execute(
            "select coalesce(sum(rows_affected), 0) from expiry.ledger where policy = %s",
            (target.policy,),
        ).fetchone()[0]
    )
    report.rows_applied += applied
    if row is not None and target.action == "delete":
        now = int(conn.execute(f"select count(*) from {table}").fetchone()[0])
        if row[0] - now != applied:
            v.append(
                f"{target.table}: {row[0] - now} rows are gone but the ledger of "
                f"{target.policy} says {applied} were deleted"
            )


def check(url: str, targets: Sequence[Target] = (Target(),)) -> Report:
    """Assert every invariant; the failure message lists each violation."""
    report = violations(url, targets)
    print(report)
    assert not report.violations, str(report)
    return report
