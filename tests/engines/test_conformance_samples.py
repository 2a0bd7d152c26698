"""The policies' per-minute history on every engine: keep a sample, keep only
the first of a minute, list from a minute on (one policy or all), prune the
old ones.

Each test runs on SQLite, PostgreSQL and MariaDB (the ``engine`` fixture).
"""

from __future__ import annotations

from datetime import timedelta

from _conformance import is_utc

from expiry.engines import Engine
from expiry.types import Sample


def sample(policy: str, minute, backlog: int = 0, **fields) -> Sample:  # type: ignore[no-untyped-def]
    values = {"retrying": 0, "dead": 0, "oldest_age": 0.0, "held": None} | fields
    return Sample(policy=policy, minute=minute, backlog=backlog, **values)


def test_sample_insert_keeps_each_field_and_lists_them_back_oldest_first(engine: Engine) -> None:
    minute = engine.now().replace(second=0, microsecond=0)
    earlier = minute - timedelta(minutes=1)
    kept = [
        sample(
            "p", minute, 12, retrying=3, dead=2, oldest_age=4567.25, held="active_backends 6 > 3"
        ),
        sample("p", earlier, 20, retrying=0, dead=1, oldest_age=None),
        sample("q", minute, 0),
    ]
    assert engine.sample_insert(kept) == 3
    got = engine.sample_list(earlier)
    assert [(s.policy, s.minute) for s in got] == [("p", earlier), ("p", minute), ("q", minute)]
    assert got[1] == kept[0] and got[0] == kept[1] and got[2] == kept[2]
    assert all(is_utc(s.minute) for s in got)
    assert engine.sample_list(earlier, policy="q") == [kept[2]]
    assert engine.sample_list(minute, policy="p") == [kept[0]]
    assert engine.sample_list(minute + timedelta(minutes=1)) == []


def test_sample_insert_keeps_the_first_sample_of_a_minute(engine: Engine) -> None:
    """Several processes sample; the first of a minute stays, the others are
    dropped without an error, and only the new ones are counted."""
    minute = engine.now().replace(second=0, microsecond=0)
    assert engine.sample_insert([sample("p", minute, 5)]) == 1
    with engine.transaction() as conn:
        again = engine.sample_insert([sample("p", minute, 99), sample("q", minute, 7)], conn=conn)
    assert again == 1
    assert [(s.policy, s.backlog) for s in engine.sample_list(minute)] == [("p", 5), ("q", 7)]


def test_sample_prune_deletes_only_the_samples_older_than_the_age(engine: Engine) -> None:
    minute = engine.now().replace(second=0, microsecond=0)
    old = minute - timedelta(hours=3)
    engine.sample_insert(
        [sample("p", old), sample("p", minute - timedelta(minutes=5)), sample("q", minute)]
    )
    assert engine.sample_prune(2 * 3600) == 1
    assert [(s.policy, s.minute) for s in engine.sample_list(old)] == [
        ("p", minute - timedelta(minutes=5)),
        ("q", minute),
    ]
    assert engine.sample_prune(2 * 3600) == 0
