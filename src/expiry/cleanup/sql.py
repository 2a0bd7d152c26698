"""The SQL templates of the statements on a policy's table: each written once,
for every engine, with ``{placeholders}`` that Target.text fills with quoted
identifiers and the engine's parameter style (statements.py).

The retention predicate ``{ts} < cutoff AND (where)`` is evaluated by the
database when the statement runs, so a row revived after planning survives.
Dry-run, planning, the watermark and the delete all use the same predicate.

A window is applied and booked in the ledger together, by one engine
operation (Engine.window_apply): its delete (or move) is guarded by the
ledger, then the ledger row is inserted with the count of rows it affected.
"""

from __future__ import annotations

import logging

from .windows import (
    BLOCKS,
    KEY,
    TIME,
)

log = logging.getLogger("expiry.target")

# -- the statements ----------------------------------------------------------------

# The retention predicate: the index bound and the storage's guard (see
# timestamps.py), then the user's where in parentheses. {bound} and {guard}
# are the engine's for the column's storage (Engine.time_predicate).
PREDICATE = "{ts} < {bound}{guard}"

BOUNDS = """
select (select {key} from {table} where {pred} order by {key} limit 1) as lo,
       (select {key} from {table} where {pred} order by {key} desc limit 1) as hi
"""

# The same in one read of the candidates (Engine.bounds_by_aggregate), which
# counts them on the way (the strategy's density, without a read of its own).
BOUNDS_AGGREGATE = """
select min({key}) as lo, max({key}) as hi, count(*) as n from {table} where {pred}
"""

# The windows of one planning page: a loose index scan that jumps from each
# window to the next key that is still a candidate, so empty stretches of the
# key space cost one index probe, not one job.
PLAN_PAGE = """
with recursive w(lo, n) as (
    select cast((select {key} from {table}
                 where {key} > {p_after} and {key} <= {p_max} and {pred}
                 order by {key} limit 1) - 1 as {integer}), 1
    union all
    select cast((select {key} from {table}
                 where {key} > w.lo + {p_window} and {key} <= {p_max} and {pred}
                 order by {key} limit 1) - 1 as {integer}), w.n + 1
    from w where w.lo is not null and w.n < {p_page}
)
select lo from w where lo is not null order by lo
"""

# The same scan one step at a time, where a recursive statement would cost more
# (Engine.recursive_scans): the first candidate key after a window's start.
NEXT_KEY = """
select {key} as k from {table}
where {key} > {p_after} and {key} <= {p_max} and {pred}
order by {key} limit 1
"""

# A window's range ({span} below): two integer keys, or two positions in the
# timestamp's order, (timestamp, tie), compared as row values. The plain
# timestamp bounds beside them let any index on the timestamp serve the scan.
SPANS = {
    "key": "{key} > {p_lo} and {key} <= {p_hi}",
    "time": "{ts} >= {p_lo_ts} and ({ts}, {tie}) > ({p_lo_ts}, {p_lo_tie})"
    " and {ts} <= {p_hi_ts} and ({ts}, {tie}) <= ({p_hi_ts}, {p_hi_tie})",
    # a run's first time window, and the planner's first page: no lower bound
    "time-first": "{ts} <= {p_hi_ts} and ({ts}, {tie}) <= ({p_hi_ts}, {p_hi_tie})",
    "time-after": "{ts} >= {p_lo_ts} and ({ts}, {tie}) > ({p_lo_ts}, {p_lo_tie})",
    "all": "1 = 1",
}

WINDOW = "{span} and {pred}"

# The ledger guard: a window whose job key is booked deletes nothing. Read in
# the statement's snapshot, it sees every ledger row committed before the
# statement began, so a redelivery after commit is a no-op even when rows of the
# window expired since. On PostgreSQL deliveries of one window first take turns
# on a transaction lock of its key (inside expiry.window_apply, before the
# delete takes its snapshot), so the guard sees the earlier one's commit. Should
# one still pass the guard while another is uncommitted (SQLite serializes
# writers; this is belt and braces), its ledger insert waits for the other's
# commit and finds the key taken, and AlreadyApplied rolls back whatever its
# delete took.
UNBOOKED = WINDOW + " and not exists (select 1 from {ledger} where {ledger_key} = {p_key})"

# The count comes back as the statement's row count, never by a RETURNING: that
# would project and keep every row taken, which costs more than the delete.
DELETE = "delete from {table} where " + UNBOOKED

# PostgreSQL moves rows in one statement; SQLite (no DELETE in a CTE) copies then
# deletes inside its single-writer transaction, and checks the two counts agree.
ARCHIVE_MOVE = (
    """
with moved as (delete from {table} where """
    + UNBOOKED
    + """ returning {columns})
insert into {archive} ({columns}) select {columns} from moved
"""
)
ARCHIVE_COPY = "insert into {archive} ({columns}) select {columns} from {table} where " + UNBOOKED

COUNT = "select count(*) as n from {table} where {pred}"

# Time windows: one planning page reads the next ``page`` candidates in the
# (timestamp, tie) order after the page's start and returns every window-th
# position (and the last), each the upper bound of a window. Its cost follows
# the candidates, never the key range.
TIME_PAGE = """
select t, k from (
    select t, k, row_number() over (order by t, k) as n, count(*) over () as total
    from (select {ts} as t, {tie} as k from {table} where {span} and {pred}
          order by {ts}, {tie} limit {p_page}) as c
) as r
where n - n {div} {p_window} * {p_window} = 0 or n = total  -- every window-th, and the last
order by t, k
"""

# The candidate at a given place of a window, in the window's order: where a
# paced window stops, or where a window blocked by a foreign key is halved.
NTH_KEY = (
    "select {key} as k from {table} where {span} and {pred} order by {key} limit 1 offset {p_skip}"
)
NTH_TIME = (
    "select {ts} as t, {tie} as k from {table} where {span} and {pred}"
    " order by {ts}, {tie} limit 1 offset {p_skip}"
)
NTH_BLOCK = (
    "select {block_of_row} as k from {table} where {span} and {pred}"
    " order by ctid limit 1 offset {p_skip}"
)
COUNT_SPAN = "select count(*) as n from {table} where {span} and {pred}"

# Which candidates of a window another transaction holds: after a window waited
# out its lock_timeout, its candidates in the window's order (ORDERED) beside
# those this transaction can lock at once (FREE: the free ones, locked on the
# way for the delete that follows; a held one is skipped, never waited for).
# Around the held rows the window is cut at once, where halving it would wait
# out one lock_timeout a halving (cleanup/window.py's _around_held).
_POSITIONS = {
    KEY: ("{key} as k", "{key}"),
    BLOCKS: ("{block_of_row} as k", "ctid"),
    TIME: ("{ts} as t, {tie} as k", "{ts}, {tie}"),
}
ORDERED = {
    strategy: f"select {columns} from {{table}} where {{span}} and {{pred}} order by {order}"
    for strategy, (columns, order) in _POSITIONS.items()
}
FREE = {
    strategy: f"select {columns} from {{table}} where {{span}} and {{pred}} for update skip locked"
    for strategy, (columns, _) in _POSITIONS.items()
}

# The candidates, as the planner estimates them (never run).
CANDIDATES = "select 1 from {table} where {pred}"

# How densely the expired rows fill their key range: candidates, counted up to
# a cap (the share of the range that key windows need to be worth it).
DENSITY = "select count(*) as n from (select 1 from {table} where {pred} limit {p_page}) as c"

# A partition's range ends no later than the cutoff: every row it can hold is
# expired. Compared by the database, in the column's type, with the predicate's
# bound (a naive column's wall-clock bound in its zone).
PARTITION_EXPIRED = "select {p_upper} <= {bound} as expired"
OLDEST = "select min({ts}) as oldest from {table} where {pred}"

EXPLAIN_WHERE = "select 1 from {table} where {where}"

# Whether an expired partition holds a row some hold keeps (it is cleaned by
# windows then, not removed whole).
PARTITION_HELD = (
    "select count(*) as n from (select 1 from {table}"
    " where {partition_rows} and not (1 = 1{unheld}) limit 1) as h"
)

# A hold's clause alone, planned by the check.
EXPLAIN_HOLDS = "select 1 from {table} where 1 = 1{unheld}"

# How the column stores time, read from every row the policy covers (never one
# row): per storage class and ISO spelling, the count and the range. For
# engines whose values carry their own storage class (SQLite); a full scan of
# the timestamp index, once per run and per check of an ISO text column.
STORAGE_CLASSES = """
select typeof({ts}) as storage,
       case when typeof({ts}) <> 'text' then ''
            when julianday({ts}) is null then '?'
            when length({ts}) = 10 then 'date'
            else substr({ts}, 11, 1) || '|' || case
                when {ts} like '%Z' then 'Z'
                when substr({ts}, -6, 1) in ('+', '-') and substr({ts}, -3, 1) = ':'
                    then substr({ts}, -6)
                else '' end
       end as spelling,
       count(*) as n, min({ts}) as lo, max({ts}) as hi
from {table} where {ts} is not null and ({where})
group by 1, 2
"""
# The two ends of the column in the index's order. SQLite sorts every number
# before every text and every text before every blob, so two numbers at the
# ends mean numbers only, read in two index probes; otherwise the scan above.
STORAGE_ENDS = """
select (select {ts} from {table} where {ts} is not null and ({where})
        order by {ts} limit 1) as lo,
       (select {ts} from {table} where {ts} is not null and ({where})
        order by {ts} desc limit 1) as hi
"""
# Integer columns of a typed engine (PostgreSQL): the range tells the unit.
STORAGE_RANGE = (
    "select min({ts}) as lo, max({ts}) as hi from {table} where {ts} is not null and ({where})"
)

STORAGE_ABOVE_ZERO = "select min({ts}) as lo from {table} where {ts} > 0 and ({where})"

# The run's sample check: candidates read by the very predicate the windows
# use, from both ends of the timestamp order and from the first keys.
SAMPLE = """
select * from (select {key} as k, {ts} as v from {table} where {pred}
               order by {ts} limit {p_page}) as oldest
union all
select * from (select {key} as k, {ts} as v from {table} where {pred}
               order by {ts} desc limit {p_page}) as newest
union all
select * from (select {key} as k, {ts} as v from {table} where {pred_by_key}
               order by {key} limit {p_page}) as first_keys
"""
# {pred_by_key}: the predicate with the timestamp kept off its index
# (Engine.unindexed), so that SQLite walks the key to its first candidates
# rather than sorting every candidate by key (120 ms at 1.6 M candidates).

SAMPLE_SIZE = 20
"""Candidates read from each end by the sample check (three reads of this many)."""

DEADLINE_WORDS = ("expir", "until", "deadline", "due", "valid", "end", "ttl", "next", "sched")
"""A timestamp column whose name holds one of these is a deadline, which may
lie in the future; any other is taken for a creation or activity time, which
may not (Target._shifted)."""

SHIFT_MIN_SECONDS = 15 * 60
SHIFT_MAX_SECONDS = 14 * 3600 + 15 * 60
"""A creation or activity time this far ahead of the database clock looks
written in another zone (no zone is more than 14 hours from UTC); less is
taken for clock skew."""
