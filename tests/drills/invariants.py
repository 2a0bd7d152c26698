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

Everything is PostgreSQL: the drills run real processes against the real server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

WINDOW_HANDLER = "expiry.window"


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


def _connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    # Explicitly read-write, so that a drill that made the database read-only
    # by default can still be checked (the checker itself only reads).
    return psycopg.connect(url, autocommit=True, options="-c default_transaction_read_only=off")


def _retention(target: Target) -> sql.Composable:
    pred = sql.SQL("{ts} < %(cutoff)s").format(ts=sql.Identifier(target.timestamp))
    if target.where:
        pred = sql.SQL("{} and ({})").format(pred, sql.SQL(target.where))  # type: ignore[arg-type]
    return pred


def _table(target: Target) -> sql.Identifier:
    return sql.Identifier(*target.table.split("."))


def record_expected(url: str, targets: Sequence[Target] = (Target(),)) -> dict[str, int]:
    """Copy the ids that must survive any run of the drill, and the row counts.
    Call it after loading the table and before opening the run. Survivors are rows
    whose deadline is still ahead (database clock) and rows ``where`` excludes.
    Returns {table: survivors}."""
    out: dict[str, int] = {}
    with _connect(url) as conn:
        conn.execute(
            "create table if not exists drill_survivors"
            " (tbl text not null, id bigint not null, primary key (tbl, id))"
        )
        conn.execute(
            "create table if not exists drill_baseline (tbl text primary key, rows bigint not null)"
        )
        for target in targets:
            kept = sql.SQL("not ({ts} < now())").format(ts=sql.Identifier(target.timestamp))
            if target.where:
                kept = sql.SQL("{} or not coalesce(({}), false)").format(
                    kept, sql.SQL(target.where)
                )
            conn.execute("delete from drill_survivors where tbl = %s", (target.table,))
            cur = conn.execute(
                sql.SQL(
                    "insert into drill_survivors (tbl, id) select %s, {key} from {table} where {kept}"
                ).format(key=sql.Identifier(target.key), table=_table(target), kept=kept),
                (target.table,),
            )
            out[target.table] = cur.rowcount
            conn.execute(
                sql.SQL(
                    "insert into drill_baseline (tbl, rows) select %s, count(*) from {table}"
                    " on conflict (tbl) do update set rows = excluded.rows"
                ).format(table=_table(target)),
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
            _check_target(conn, target, report)
    return report


def _check_target(conn: Any, target: Target, report: Report) -> None:
    v = report.violations
    table, key = _table(target), sql.Identifier(target.key)
    # 1. no protected row deleted
    report.survivors = int(
        conn.execute(
            "select count(*) from drill_survivors where tbl = %s", (target.table,)
        ).fetchone()[0]
    )
    lost = [
        r[0]
        for r in conn.execute(
            sql.SQL(
                "select s.id from drill_survivors s where s.tbl = %s"
                " and not exists (select 1 from {table} t where t.{key} = s.id)"
                " order by s.id"
            ).format(table=table, key=key),
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
                sql.SQL("select {key} from {table} where {pred} order by {key} limit 10").format(
                    key=key, table=table, pred=_retention(target)
                ),
                {"cutoff": cutoff},
            )
        ]
        if left:
            v.append(
                f"{target.table}: rows expired before the cutoff {cutoff} are left, e.g. ids {left}"
            )

    # 7. the rows that went are exactly the rows the ledger says it applied
    row = conn.execute("select rows from drill_baseline where tbl = %s", (target.table,)).fetchone()
    applied = int(
        conn.execute(
            "select coalesce(sum(rows_affected), 0) from expiry.ledger where policy = %s",
            (target.policy,),
        ).fetchone()[0]
    )
    report.rows_applied += applied
    if row is not None and target.action == "delete":
        now = int(conn.execute(sql.SQL("select count(*) from {}").format(table)).fetchone()[0])
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
