"""The ledger, the audit log and the clock on every engine: book an operation
once, read it back, append and list events, count them, total per policy.

Each test runs once on SQLite and once on PostgreSQL (the ``engine`` fixture).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from _conformance import age, execute, is_utc, set_time

from expiry.engines import Engine
from expiry.errors import AlreadyApplied
from expiry.types import AuditCount, PolicyTotals


def test_now_is_the_database_clock_in_utc(engine: Engine) -> None:
    first = engine.now()
    with engine.transaction() as conn:
        inside = engine.now(conn)
    assert is_utc(first) and is_utc(inside)
    assert first <= inside <= engine.now()


# -- the ledger -------------------------------------------------------------------


def test_ledger_insert_then_get_returns_the_booking(engine: Engine) -> None:
    before = engine.now()
    with engine.transaction() as conn:
        booked = engine.ledger_insert(
            conn,
            "p:1:0",
            policy="p",
            run_id="p:1",
            lo=0,
            hi=100,
            action="delete",
            worker="w-1",
            rows=42,
        )
    assert booked is True

    entry = engine.ledger_get("p:1:0")
    assert entry is not None
    assert (entry.key, entry.policy, entry.run_id, entry.lo, entry.hi) == (
        "p:1:0",
        "p",
        "p:1",
        0,
        100,
    )
    assert (entry.action, entry.worker, entry.rows_affected) == ("delete", "w-1", 42)
    assert is_utc(entry.applied_at) and before <= entry.applied_at <= engine.now()


def test_ledger_insert_of_a_booked_key_is_refused_and_changes_nothing(engine: Engine) -> None:
    with engine.transaction() as conn:
        assert engine.ledger_insert(conn, "once:1", action="once", rows=1) is True
    with engine.transaction() as conn:
        assert engine.ledger_insert(conn, "once:1", action="other", rows=9) is False
    with pytest.raises(AlreadyApplied), engine.transaction() as conn:
        engine.ledger_insert(conn, "once:1", strict=True)

    entry = engine.ledger_get("once:1")
    assert entry is not None and (entry.action, entry.rows_affected) == ("once", 1)
    assert (entry.policy, entry.run_id, entry.lo, entry.hi, entry.worker) == (None,) * 5


def test_ledger_insert_rolled_back_books_nothing(engine: Engine) -> None:
    with pytest.raises(RuntimeError), engine.transaction() as conn:
        assert engine.ledger_insert(conn, "p:1:0", rows=3)
        raise RuntimeError("roll back")
    assert engine.ledger_get("p:1:0") is None


def test_ledger_keep_counts_the_kept_rows_on_the_booking_in_its_transaction(
    engine: Engine,
) -> None:
    with engine.transaction() as conn:
        engine.ledger_insert(conn, "k:1:0", run_id="k:1", action="delete", rows=90)
        engine.ledger_keep(conn, "k:1:0", 10, "10 rows kept: referenced by rows of orders")
        engine.ledger_insert(conn, "k:1:1", run_id="k:1", blocked="id 7: refused", kept=1)
    with pytest.raises(RuntimeError), engine.transaction() as conn:
        engine.ledger_insert(conn, "k:1:2", run_id="k:1", action="delete", rows=5)
        engine.ledger_keep(conn, "k:1:2", 3, "3 rows kept")
        raise RuntimeError("roll back")
    entry = engine.ledger_get("k:1:0")
    assert entry is not None
    assert (entry.rows_affected, entry.kept, entry.blocked) == (
        90,
        10,
        "10 rows kept: referenced by rows of orders",
    )
    assert engine.ledger_get("k:1:2") is None
    totals = engine.run_ledger("k:1")
    assert (totals.windows, totals.rows, totals.blocked) == (2, 90, 11)


def test_ledger_list_is_a_policy_s_runs_bookings_since_oldest_first(engine: Engine) -> None:
    cutoff = datetime(2026, 1, 1, tzinfo=UTC)
    for run_id, policy in (("p:1", "p"), ("p:2", "p"), ("q:1", "q")):
        engine.run_insert(run_id, policy, cutoff, "tests")
    for key, run_id, rows in (("p:1:a", "p:1", 3), ("q:1:a", "q:1", 5), ("p:2:a", "p:2", 7)):
        with engine.transaction() as conn:
            engine.ledger_insert(conn, key, policy=run_id[0], run_id=run_id, rows=rows)
        time.sleep(0.02)  # applied_at orders them
    with engine.transaction() as conn:  # booked outside any run: not a policy's evidence
        engine.ledger_insert(conn, "p:none", policy="p", rows=11)
    found = engine.ledger_list("p")
    assert [(e.key, e.run_id, e.rows_affected) for e in found] == [
        ("p:1:a", "p:1", 3),
        ("p:2:a", "p:2", 7),
    ]
    assert all(is_utc(e.applied_at) for e in found)
    since = found[1].applied_at
    assert [e.key for e in engine.ledger_list("p", since)] == ["p:2:a"]  # at or after
    assert engine.ledger_list("p", since + timedelta(seconds=1)) == []
    assert [e.key for e in engine.ledger_list("p", limit=1)] == ["p:1:a"]  # the oldest
    assert [e.key for e in engine.ledger_list("q")] == ["q:1:a"]
    assert engine.ledger_list("nobody") == []


def test_ledger_minutes_sum_each_policys_windows_and_rows_per_minute_since(
    engine: Engine,
) -> None:
    """The dashboard's history, against an oracle: the same ledger rows read
    one by one (ledger_list) and summed per minute here."""
    now = engine.now().replace(second=30, microsecond=0)
    cutoff = datetime(2026, 1, 1, tzinfo=UTC)
    for run_id, policy in (("p:1", "p"), ("p:2", "p"), ("q:1", "q"), ("q:old", "q")):
        engine.run_insert(run_id, policy, cutoff, "tests")
    booked = [  # key, run, rows, seconds before now
        ("p:1:a", "p:1", 3, 125),
        ("p:1:b", "p:1", 4, 100),  # the same minute as p:1:a
        ("p:2:a", "p:2", 7, 100),  # another run, the same minute: summed
        ("q:1:a", "q:1", 5, 20),
        ("p:1:c", "p:1", 0, 10),  # a window that took nothing still counts as one
        ("q:old:a", "q:old", 9, 7200),  # before since: not drawn
    ]
    for key, run_id, rows, back in booked:
        with engine.transaction() as conn:
            engine.ledger_insert(conn, key, policy=run_id[0], run_id=run_id, rows=rows)
        set_time(engine, "ledger", "applied_at", now - timedelta(seconds=back), "key", key)
    execute(
        engine,
        "update expiry.runs set state = 'finished', finished_at = %s where id = 'q:old'",
        [engine.time_param(now - timedelta(seconds=7000))],
    )
    since = now - timedelta(hours=1)
    got = engine.ledger_minutes(since)

    expected: dict[tuple[str, datetime], list[int]] = {}
    for policy in ("p", "q"):
        for entry in engine.ledger_list(policy, since):
            minute = entry.applied_at.replace(second=0, microsecond=0)
            sums = expected.setdefault((policy, minute), [0, 0])
            sums[0] += 1
            sums[1] += entry.rows_affected
    assert [(m.policy, m.minute, m.windows, m.rows) for m in got] == sorted(
        ((policy, minute, n, rows) for (policy, minute), (n, rows) in expected.items()),
        key=lambda x: (x[1], x[0]),
    )
    assert all(is_utc(m.minute) and m.minute.second == 0 for m in got)
    assert sum(m.windows for m in got) == 5 and sum(m.rows for m in got) == 19
    assert engine.ledger_minutes(now + timedelta(minutes=1)) == []


def test_ledger_prune_deletes_old_finished_runs_evidence_and_then_the_runs(
    engine: Engine,
) -> None:
    cutoff = datetime(2026, 1, 1, tzinfo=UTC)
    for run_id in ("p:old", "p:open", "p:new"):
        engine.run_insert(run_id, "p", cutoff, "tests")
        for n in range(3):
            with engine.transaction() as conn:
                engine.ledger_insert(conn, f"{run_id}:{n}", policy="p", run_id=run_id, rows=n)
    now = engine.time_param(engine.now())
    execute(
        engine,
        "update expiry.runs set state = 'finished', finished_at = %s where id in ('p:old', 'p:new')",
        [now],
    )
    year = 365 * 86400.0
    age(engine, "runs", "finished_at", 2 * year, "id = 'p:old'")
    age(engine, "runs", "opened_at", 3 * year)  # opened long ago, still open: kept
    assert engine.ledger_prune(year, limit=2) == (2, 0)  # a batch at a time
    assert engine.ledger_prune(year, limit=2) == (1, 1)  # its last row, then the run
    assert engine.ledger_prune(year) == (0, 0)
    kept = sorted(e.key for e in engine.ledger_list("p"))
    assert kept == sorted(f"{run_id}:{n}" for run_id in ("p:open", "p:new") for n in range(3))
    assert engine.run_get("p:old") is None
    assert engine.run_get("p:open") is not None and engine.run_get("p:new") is not None


def test_ledger_get_of_an_unknown_key_is_none(engine: Engine) -> None:
    assert engine.ledger_get("nope") is None


def test_policy_totals_sum_the_whole_ledger_per_policy(engine: Engine) -> None:
    assert engine.policy_totals() == []
    with engine.transaction() as conn:
        engine.ledger_insert(conn, "p:1:0", policy="p", run_id="p:1", rows=40)
        engine.ledger_insert(conn, "p:2:0", policy="p", run_id="p:2", rows=2)
        engine.ledger_insert(conn, "q:1:0", policy="q", run_id="q:1", rows=0)
        engine.ledger_insert(conn, "once:1", action="once", rows=7)  # no policy: not counted

    found = sorted(engine.policy_totals(), key=lambda t: t.policy)
    assert found == [PolicyTotals("p", windows=2, rows=42), PolicyTotals("q", windows=1, rows=0)]


# -- the audit log ----------------------------------------------------------------


def test_audit_append_then_list_returns_the_event(engine: Engine) -> None:
    before = engine.now()
    engine.audit_append(
        None,
        "run.opened",
        actor="alice",
        policy="p",
        run_id="p:1",
        job_key="p:1:plan",
        detail={"cutoff": "2030-01-01T00:00:00Z", "n": 3, "nested": {"ok": True}},
    )

    [event] = engine.audit_list()
    assert (event.actor, event.action, event.policy, event.run_id, event.job_key) == (
        "alice",
        "run.opened",
        "p",
        "p:1",
        "p:1:plan",
    )
    assert event.detail == {"cutoff": "2030-01-01T00:00:00Z", "n": 3, "nested": {"ok": True}}
    assert is_utc(event.at) and before <= event.at <= engine.now()


def test_audit_append_without_detail_stores_an_empty_one(engine: Engine) -> None:
    engine.audit_append(None, "key.created", actor="operator")

    [event] = engine.audit_list()
    assert event.detail == {} and event.policy is None and event.run_id is None


def test_audit_append_in_the_callers_transaction_rolls_back_with_it(engine: Engine) -> None:
    with pytest.raises(RuntimeError), engine.transaction() as conn:
        engine.audit_append(conn, "run.opened", actor="alice", policy="p")
        raise RuntimeError("roll back")
    assert engine.audit_list() == []


def test_audit_list_is_newest_first_filtered_by_policy_and_limited(engine: Engine) -> None:
    for i, policy in enumerate(["p", "q", "p", None, "p"]):
        engine.audit_append(None, f"event.{i}", actor="t", policy=policy)

    assert [e.action for e in engine.audit_list()] == [f"event.{i}" for i in (4, 3, 2, 1, 0)]
    assert [e.action for e in engine.audit_list("p")] == ["event.4", "event.2", "event.0"]
    assert [e.action for e in engine.audit_list("p", 2)] == ["event.4", "event.2"]
    assert [e.action for e in engine.audit_list(limit=1)] == ["event.4"]
    assert engine.audit_list("none") == []
    ids = [e.id for e in engine.audit_list()]
    assert ids == sorted(ids, reverse=True)


def test_audit_hold_events_are_the_holds_placed_and_lifted_oldest_first(engine: Engine) -> None:
    assert engine.audit_hold_events() == []
    for action, hold in [
        ("hold.placed", "a"),
        ("run.opened", None),
        ("hold.placed", "b"),
        ("hold.lifted", "a"),
        ("policy.paused", None),
    ]:
        engine.audit_append(None, action, actor="t", detail={"hold": hold} if hold else None)
    events = engine.audit_hold_events()
    assert [(e.action, e.detail["hold"]) for e in events] == [
        ("hold.placed", "a"),
        ("hold.placed", "b"),
        ("hold.lifted", "a"),
    ]
    assert [e.id for e in events] == sorted(e.id for e in events)


def test_audit_counts_count_events_by_action_and_policy(engine: Engine) -> None:
    assert engine.audit_counts() == []
    for action, policy in [
        ("schedule.fired", "p"),
        ("schedule.fired", "p"),
        ("schedule.fired", "q"),
        ("schedule.missed", "p"),
        ("key.created", None),
    ]:
        engine.audit_append(None, action, actor="t", policy=policy)

    found = sorted(engine.audit_counts(), key=lambda c: (c.action, c.policy or ""))
    assert found == [
        AuditCount("key.created", None, 1),
        AuditCount("schedule.fired", "p", 2),
        AuditCount("schedule.fired", "q", 1),
        AuditCount("schedule.missed", "p", 1),
    ]


def test_the_audit_log_is_append_only(engine: Engine) -> None:
    engine.audit_append(None, "run.opened", actor="alice")
    with pytest.raises(Exception, match="append-only"):
        execute(engine, "update expiry.audit set actor = 'mallory'")
    with pytest.raises(Exception, match="append-only"):
        execute(engine, "delete from expiry.audit")
    assert [e.actor for e in engine.audit_list()] == ["alice"]


def test_audit_holds_lock_makes_a_second_transaction_wait_until_the_first_ends(
    engine: Engine,
) -> None:
    """The lock that serializes the auditing of holds: a second transaction
    asking for it waits while the first holds it, and gets it once the first
    commits."""
    got = threading.Event()

    def second() -> None:
        with engine.transaction() as conn:
            engine.audit_holds_lock(conn)
            got.set()

    with engine.transaction() as conn:
        engine.audit_holds_lock(conn)
        waiter = threading.Thread(target=second)
        waiter.start()
        assert not got.wait(0.5)  # waits while the first holds it
    assert got.wait(10)
    waiter.join(10)


def test_audit_approvals_are_the_runs_approval_events_oldest_first(engine: Engine) -> None:
    assert engine.audit_approvals("p:1") == []
    for action, run in [
        ("run.awaiting_approval", "p:1"),
        ("run.opened", "p:1"),
        ("run.awaiting_approval", "p:2"),
        ("run.approved", "p:1"),
        ("run.approval_expired", "p:1"),
        ("run.approved", None),
    ]:
        engine.audit_append(None, action, actor="t", run_id=run, detail={"n": 1})
    events = engine.audit_approvals("p:1")
    assert [(e.action, e.run_id) for e in events] == [
        ("run.awaiting_approval", "p:1"),
        ("run.approved", "p:1"),
        ("run.approval_expired", "p:1"),
    ]
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert events[0].detail == {"n": 1}
