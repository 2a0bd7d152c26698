"""The workers' roll on every engine: a worker's roll call stored and
refreshed, its departure, and the list the workers page reads.

Each test runs once on SQLite and once on PostgreSQL (the ``engine`` fixture).
"""

from __future__ import annotations

from _conformance import age, is_utc

from expiry.engines import Engine


def seen(engine: Engine, name: str, **changes: object) -> None:
    fields: dict[str, object] = {
        "host": "box",
        "pid": 41,
        "threads": 2,
        "queues": ["default", "expiry.policy.p"],
        "resting": {},
        "holding": 0,
        **changes,
    }
    engine.worker_seen(name, **fields)  # type: ignore[arg-type]


def test_worker_seen_stores_a_worker_and_refreshes_it(engine: Engine) -> None:
    before = engine.now()
    seen(engine, "box:41:aa")
    [first] = engine.worker_list()
    assert (first.name, first.host, first.pid, first.threads) == ("box:41:aa", "box", 41, 2)
    assert first.queues == ["default", "expiry.policy.p"] and first.resting == {}
    assert is_utc(first.started_at) and before <= first.started_at <= engine.now()
    assert 0 <= first.seen_seconds_ago < 5

    age(engine, "workers", "seen_at", 30)
    seen(engine, "box:41:aa", resting={"expiry.policy.p": 0.25}, holding=3)
    [again] = engine.worker_list()
    assert again.started_at == first.started_at  # the same worker, seen again
    assert again.resting == {"expiry.policy.p": 0.25} and again.holding == 3
    assert again.seen_seconds_ago < 5


def test_worker_gone_leaves_the_others(engine: Engine) -> None:
    seen(engine, "box:41:aa")
    seen(engine, "box:42:bb", pid=42)
    engine.worker_gone("box:41:aa")
    assert [w.name for w in engine.worker_list()] == ["box:42:bb"]


def test_worker_list_shows_how_long_ago_each_was_seen(engine: Engine) -> None:
    seen(engine, "box:41:aa")
    age(engine, "workers", "seen_at", 120)
    [quiet] = engine.worker_list()
    assert 119 <= quiet.seen_seconds_ago < 125


def test_worker_seen_forgets_workers_not_seen_for_a_day(engine: Engine) -> None:
    seen(engine, "box:41:aa")
    age(engine, "workers", "seen_at", 86_400 + 60)
    seen(engine, "box:42:bb", pid=42)
    assert [w.name for w in engine.worker_list()] == ["box:42:bb"]
