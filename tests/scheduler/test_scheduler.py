"""The scheduler against real databases: cron fires claimed by compare-and-set on
expiry.schedules.last_fire_at, catch-up after downtime, pause/resume, daylight
saving, bad expressions, and the `expiry scheduler` process with its signals.

Every test drives Scheduler.tick() with a fake clock (app.scheduler(clock=...))
and checks the outcome in the database: runs, schedules and the audit log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from expiry.app import App
from expiry.config import parse_config
from expiry.cron.scheduler import Fire, Scheduler
from expiry.errors import ConfigError
from expiry.health.metrics import render
from expiry.status import Status
from expiry.times import format_time

HERE = Path(__file__).parent
POLICY = "sweep"
NEW_YORK = ZoneInfo("America/New_York")
T0 = datetime(2030, 1, 1, 0, 30, tzinfo=UTC)
"""Half past midnight: the hourly schedules below are due at 01:00, 02:00, 03:00."""


# -- helpers ------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """EXPIRY_DATABASE_URL would replace the test database in parse_config."""
    monkeypatch.delenv("EXPIRY_DATABASE_URL", raising=False)
    monkeypatch.delenv("EXPIRY_CONFIG", raising=False)


def policy(name: str = POLICY, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "table": "sessions",
        "key": "id",
        "timestamp": "expires_at",
        "schedule": "0 * * * *",
        **fields,
    }


def config(url: str, *policies: dict[str, Any]) -> dict[str, Any]:
    return {"database": {"url": url}, "policy": list(policies or [policy()])}


def create_target(url: str) -> None:
    """The policies' table, empty: runs open and plan nothing."""
    app = App(url)
    with app.engine.transaction() as conn:
        if app.engine.dialect == "postgres":
            conn.execute(
                "create table if not exists sessions "
                "(id bigint primary key, expires_at timestamptz not null)"
            )
        elif app.engine.dialect == "mysql":
            conn.execute(
                "create table if not exists sessions "
                "(id bigint primary key, expires_at datetime(6) not null)"
            )
        else:
            conn.execute(
                "create table if not exists sessions "
                "(id integer primary key, expires_at real not null)"
            )
        conn.execute("create index if not exists sessions_expires_at on sessions (expires_at)")
    app.close()


@pytest.fixture
def make_app(db_url: str) -> Iterator[Callable[..., App]]:
    """Build Apps on the test database (each with its own engine), closed afterwards."""
    create_target(db_url)
    apps: list[App] = []

    def build(*policies: dict[str, Any]) -> App:
        app = App(config=parse_config(config(db_url, *policies)))
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


class Clock:
    """The fake clock handed to app.scheduler(clock=...)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def table(app: App, name: str) -> str:
    return f"expiry.{name}" if app.engine.dialect == "postgres" else f"expiry_{name}"


def select(app: App, sql: str) -> list[tuple[Any, ...]]:
    with app.engine.transaction() as conn:
        rows = conn.execute(sql).fetchall()
    return [tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in rows]


def run_ids(app: App, name: str = POLICY) -> list[str]:
    return [
        r[0]
        for r in select(
            app, f"select id from {table(app, 'runs')} where policy = '{name}' order by cutoff"
        )
    ]


def audit(app: App, action: str, name: str = POLICY) -> list[dict[str, Any]]:
    """The audit events of one action for one policy, oldest first."""
    rows = select(
        app,
        f"select actor, run_id, detail from {table(app, 'audit')} "
        f"where action = '{action}' and policy = '{name}' order by id",
    )
    events = []
    for actor, run_id, detail in rows:
        if isinstance(detail, str):
            detail = json.loads(detail)
        events.append({"actor": actor, "run_id": run_id, "detail": detail or {}})
    return events


def fire_times(events: list[dict[str, Any]]) -> list[str]:
    return [e["detail"]["fire_time"] for e in events]


def rid(when: datetime, name: str = POLICY) -> str:
    return f"{name}:{format_time(when)}"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def minutes_between(after: datetime, until: datetime) -> list[datetime]:
    """The fire times of "* * * * *" in (after, until]."""
    first = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return [
        first + timedelta(minutes=m) for m in range(int((until - first) / timedelta(minutes=1)) + 1)
    ]


# -- registering and firing -------------------------------------------------------


def test_first_tick_registers_the_schedule_without_firing_past_times(
    make_app: Callable[..., App],
) -> None:
    app = make_app(policy(schedule="* * * * *"))
    clock = Clock(utc(2030, 1, 1, 0, 5, 30))
    scheduler = app.scheduler(clock=clock)

    assert scheduler.tick() == []

    [schedule] = app.engine.schedule_list()
    assert schedule.policy == POLICY
    assert schedule.last_fire_at == clock.now
    assert run_ids(app) == []
    assert audit(app, "schedule.fired") == audit(app, "schedule.missed") == []
    # Nothing is due before the next minute either.
    clock.now = utc(2030, 1, 1, 0, 5, 59)
    assert scheduler.tick() == []
    assert run_ids(app) == []


def test_a_fire_per_due_time_with_cutoff_fire_minus_retain(make_app: Callable[..., App]) -> None:
    app = make_app(policy(schedule="*/5 * * * *", retain="1h"))
    clock = Clock(utc(2030, 1, 1, 0, 0, 30))
    scheduler = app.scheduler(clock=clock)
    scheduler.tick()

    fired: list[Fire] = []
    while clock.now < utc(2030, 1, 1, 0, 30, 30):
        clock.now += timedelta(seconds=60)
        fired += scheduler.tick()
        assert scheduler.tick() == []  # a second tick at the same time finds nothing due

    due = [utc(2030, 1, 1, 0, minute) for minute in (5, 10, 15, 20, 25, 30)]
    cutoffs = [when - timedelta(hours=1) for when in due]
    assert [f.fire_time for f in fired] == due
    assert [f.run_id for f in fired] == [rid(c) for c in cutoffs]
    assert run_ids(app) == [rid(c) for c in cutoffs]
    events = audit(app, "schedule.fired")
    assert fire_times(events) == [format_time(d) for d in due]
    assert [e["run_id"] for e in events] == [rid(c) for c in cutoffs]
    assert audit(app, "schedule.missed") == []
    opened_by = select(app, f"select distinct opened_by from {table(app, 'runs')}")
    assert opened_by == [("scheduler",)]


def test_two_schedulers_taking_turns_open_one_run_per_fire(make_app: Callable[..., App]) -> None:
    """Two schedulers (each its own App and engine) on the same schedule take
    turns over one clock sequence: at each step one ticks half-way, the other at
    the new time, then each again at the other's time (one of them late, with a
    stale clock). Each fire is claimed once, by one of them."""
    start = utc(2030, 1, 1, 0, 0, 30)
    clocks = [Clock(start), Clock(start)]
    apps = [make_app(policy(schedule="* * * * *", catch_up="all")) for _ in range(2)]
    schedulers = [apps[i].scheduler(clock=clocks[i]) for i in range(2)]
    for scheduler in schedulers:
        scheduler.tick()

    claimed: list[list[Fire]] = [[], []]
    now = start
    for n, step in enumerate((20, 50, 90, 30, 150, 10, 40, 200, 60, 70, 130, 300)):
        half, now = now + timedelta(seconds=step / 2), now + timedelta(seconds=step)
        x, y = (0, 1) if n % 2 else (1, 0)
        for who, when in ((x, half), (y, now), (x, now), (y, half)):
            clocks[who].now = when
            claimed[who] += schedulers[who].tick()

    due = minutes_between(start, now)
    both = sorted(claimed[0] + claimed[1], key=lambda f: f.fire_time)
    assert [f.fire_time for f in both] == due
    assert claimed[0] and claimed[1]
    app = apps[0]
    assert run_ids(app) == [rid(d) for d in due]
    assert sorted(fire_times(audit(app, "schedule.fired"))) == [format_time(d) for d in due]
    assert audit(app, "schedule.missed") == []


def test_racing_scheduler_processes_on_postgres_open_one_run_per_fire(
    pg_url: str, tmp_path: Path
) -> None:
    """Three OS processes, each with its own App and engine, tick as fast as they
    can over one fake clock that moves on in uneven jumps (several minutes at
    once, or less than one). On the same schedules they open exactly one run per
    fire time (catch_up = "all"), and with catch_up = "latest" every fire time
    is either run or recorded missed, once, never both."""
    create_target(pg_url)
    doc = config(
        pg_url,
        policy("every-fire", schedule="* * * * *", catch_up="all", max_catch_up=1000),
        policy("latest-fire", schedule="* * * * *", catch_up="latest"),
    )
    clock_file = tmp_path / "clock"

    def set_clock(text: str) -> None:
        (tmp_path / "clock.new").write_text(text)
        os.replace(tmp_path / "clock.new", clock_file)

    start = utc(2030, 1, 1, 0, 0, 30)
    set_clock(format_time(start))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "_ticker.py"),
                json.dumps(doc),
                str(clock_file),
                str(tmp_path / f"ready-{i}"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready-{i}").exists() for i in range(3)):
            assert time.monotonic() < deadline, "the ticker processes did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        now = start
        steps = [45, 150, 20, 61, 240, 15, 90, 59, 130, 30, 300, 75]
        # Three rounds, and more (up to twelve) until two processes have won a
        # fire: the race this test is about must have happened.
        for round_ in range(12):
            for step in steps:
                now += timedelta(seconds=step)
                set_clock(format_time(now))
                time.sleep(0.04)
            winners = sum((tmp_path / f"ready-{i}.fired").exists() for i in range(3))
            if round_ >= 2 and winners >= 2:
                break
        # A scheduler that loses a compare-and-set claims nothing and tries again on
        # its next tick: keep the last time until both schedules have caught up.
        last_due = now.replace(second=0)
        caught_up_by = time.monotonic() + 30
        with psycopg.connect(pg_url, autocommit=True) as conn:
            while True:
                row = conn.execute("select min(last_fire_at) from expiry.schedules").fetchone()
                if row is not None and row[0] is not None and row[0] >= last_due:
                    break
                assert time.monotonic() < caught_up_by, "the schedules never caught up"
                time.sleep(0.05)
    finally:
        set_clock("stop")
        outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outputs]

    due = [format_time(m) for m in minutes_between(start, now)]
    claimed = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
    assert sum(1 for out, _ in outputs if out.strip()) >= 2, "only one process ever fired"

    with psycopg.connect(pg_url) as conn:

        def count(sql: str, *params: Any) -> int:
            row = conn.execute(sql, params).fetchone()
            assert row is not None
            return int(row[0])

        # catch_up = "all": one run per fire time, one schedule.fired event each.
        assert count("select count(*) from expiry.runs where policy = 'every-fire'") == len(due)
        assert count(
            "select count(distinct cutoff) from expiry.runs where policy = 'every-fire'"
        ) == len(due)
        assert count(
            "select count(*) from expiry.audit where policy = 'every-fire' and action = 'schedule.fired'"
        ) == len(due)
        assert count(
            "select count(distinct detail->>'fire_time') from expiry.audit "
            "where policy = 'every-fire' and action = 'schedule.fired'"
        ) == len(due)
        assert (
            count(
                "select count(*) from expiry.audit where action = 'schedule.missed' "
                "and policy = 'every-fire'"
            )
            == 0
        )
        # catch_up = "latest": each fire time run or missed, exactly once.
        rows = conn.execute(
            "select action, detail->>'fire_time' from expiry.audit "
            "where policy = 'latest-fire' and action in ('schedule.fired', 'schedule.missed')"
        ).fetchall()
        assert sorted(t for _, t in rows) == due
        fired_latest = [t for a, t in rows if a == "schedule.fired"]
        assert count("select count(*) from expiry.runs where policy = 'latest-fire'") == len(
            fired_latest
        )
    # What the processes say they claimed is what the database holds.
    every = sorted(c["fire_time"] for c in claimed if c["policy"] == "every-fire")
    assert every == due
    latest = sorted(c["fire_time"] for c in claimed if c["policy"] == "latest-fire")
    assert latest == due


# -- catch-up after downtime ----------------------------------------------------------


@pytest.mark.parametrize(
    ("catch_up", "max_catch_up", "resumed_at", "runs", "missed"),
    [
        # latest: one run for the newest fire; its cutoff covers the other two.
        ("latest", 10, utc(2030, 1, 1, 3, 30), [3], [1, 2]),
        # all: a run for every missed fire ...
        ("all", 10, utc(2030, 1, 1, 3, 30), [1, 2, 3], []),
        # ... but only the newest max_catch_up of them.
        ("all", 2, utc(2030, 1, 1, 3, 30), [2, 3], [1]),
        # none: a fire more than 60 s late does not run.
        ("none", 10, utc(2030, 1, 1, 3, 30), [], [1, 2, 3]),
        # none: the newest fire, at most 60 s late, is still on time.
        ("none", 10, utc(2030, 1, 1, 3, 1), [3], [1, 2]),
    ],
    ids=["latest", "all", "all-max-2", "none-late", "none-on-time"],
)
def test_a_scheduler_stopped_across_three_fires_catches_up_by_policy(
    make_app: Callable[..., App],
    catch_up: str,
    max_catch_up: int,
    resumed_at: datetime,
    runs: list[int],
    missed: list[int],
) -> None:
    """Hourly schedule; the scheduler registers at 00:30, is down, and comes back
    after the fires of 01:00, 02:00 and 03:00. Every fire not run is audited as
    'schedule.missed' with its fire time."""
    app = make_app(policy(catch_up=catch_up, max_catch_up=max_catch_up))
    clock = Clock(T0)
    app.scheduler(clock=clock).tick()

    clock.now = resumed_at
    restarted = app.scheduler(clock=clock)  # a new process, the same database
    fired = restarted.tick()

    hour = {h: utc(2030, 1, 1, h) for h in (1, 2, 3)}
    assert [f.fire_time for f in fired if f.run_id] == [hour[h] for h in runs]
    assert run_ids(app) == [rid(hour[h]) for h in runs]
    assert fire_times(audit(app, "schedule.fired")) == [format_time(hour[h]) for h in runs]
    events = audit(app, "schedule.missed")
    assert fire_times(events) == [format_time(hour[h]) for h in missed]
    assert all(e["detail"]["catch_up"] == catch_up and e["actor"] == "scheduler" for e in events)
    # Claimed once: nothing more is due at the same time.
    assert restarted.tick() == []
    [schedule] = app.engine.schedule_list()
    assert schedule.last_fire_at == hour[3]


# -- pause and resume -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("catch_up", "runs", "missed"), [("latest", [3], [1, 2]), ("all", [1, 2, 3], [])]
)
def test_pause_stops_fires_and_resume_applies_catch_up(
    make_app: Callable[..., App], catch_up: str, runs: list[int], missed: list[int]
) -> None:
    """Paused from another App (as `expiry pause` in another process would), the
    schedule fires nothing; resumed, the fires of the pause follow catch_up."""
    app = make_app(policy(catch_up=catch_up))
    operator = make_app(policy(catch_up=catch_up))
    clock = Clock(T0)
    scheduler = app.scheduler(clock=clock)
    scheduler.tick()

    operator.scheduler().set_paused(POLICY, True, actor="alice")

    assert [e["actor"] for e in audit(app, "policy.paused")] == ["alice"]
    assert scheduler.states()[POLICY].paused
    assert Status.of(app).policies()[0]["paused"] is True
    for hour in (1, 2, 3):
        clock.now = utc(2030, 1, 1, hour, 0, 10)
        assert scheduler.tick() == []
    assert run_ids(app) == []
    assert audit(app, "schedule.fired") == audit(app, "schedule.missed") == []

    operator.scheduler().set_paused(POLICY, False, actor="bob")

    assert [e["actor"] for e in audit(app, "policy.resumed")] == ["bob"]
    assert Status.of(app).policies()[0]["paused"] is False
    clock.now = utc(2030, 1, 1, 3, 30)
    scheduler.tick()
    hour_of = {h: utc(2030, 1, 1, h) for h in (1, 2, 3)}
    assert run_ids(app) == [rid(hour_of[h]) for h in runs]
    assert fire_times(audit(app, "schedule.missed")) == [format_time(hour_of[h]) for h in missed]
    # And it keeps firing on schedule afterwards.
    clock.now = utc(2030, 1, 1, 4, 0, 5)
    assert [f.run_id for f in scheduler.tick()] == [rid(utc(2030, 1, 1, 4))]


def test_pausing_an_unknown_policy_is_refused_with_a_suggestion(
    make_app: Callable[..., App],
) -> None:
    app = make_app()
    with pytest.raises(ConfigError, match="did you mean 'sweep'"):
        app.scheduler().set_paused("swep", True, actor="alice")
    assert audit(app, "policy.paused", "swep") == []


# -- daylight saving time ----------------------------------------------------------------


def tick_through(
    scheduler: Scheduler, clock: Clock, until: datetime, step: timedelta
) -> list[Fire]:
    fired: list[Fire] = []
    while clock.now < until:
        clock.now = min(until, clock.now + step)
        fired += scheduler.tick()
    return fired


def local(when: datetime) -> str:
    return when.astimezone(NEW_YORK).strftime("%Y-%m-%d %H:%M %Z")


def test_dst_spring_forward_a_time_in_the_gap_fires_once_right_after_it(
    make_app: Callable[..., App],
) -> None:
    """On 2030-03-10 New York skips from 02:00 EST to 03:00 EDT, so 02:30 does not
    exist. A fixed-time schedule ("30 2 * * *": no '*' in minute or hour) fires
    exactly once that day, right after the gap: at 03:00 EDT (07:00 UTC), as
    Debian cron (cronsim) does. The next day it is back at 02:30."""
    assert utc(2030, 3, 10, 5).astimezone(NEW_YORK).utcoffset() == timedelta(hours=-5)
    assert utc(2030, 3, 10, 9).astimezone(NEW_YORK).utcoffset() == timedelta(hours=-4)
    app = make_app(policy(schedule="30 2 * * *", timezone="America/New_York"))
    clock = Clock(datetime(2030, 3, 9, 12, 0, tzinfo=NEW_YORK).astimezone(UTC))
    scheduler = app.scheduler(clock=clock)
    scheduler.tick()

    end = datetime(2030, 3, 11, 12, 0, tzinfo=NEW_YORK).astimezone(UTC)
    fired = tick_through(scheduler, clock, end, timedelta(minutes=10))

    assert [local(f.fire_time) for f in fired] == ["2030-03-10 03:00 EDT", "2030-03-11 02:30 EDT"]
    assert run_ids(app) == [rid(utc(2030, 3, 10, 7)), rid(utc(2030, 3, 11, 6, 30))]
    assert audit(app, "schedule.missed") == []


def test_dst_fall_back_a_repeated_time_fires_once_at_its_first_occurrence(
    make_app: Callable[..., App],
) -> None:
    """On 2030-11-03 New York goes from 02:00 EDT back to 01:00 EST, so 01:30
    happens twice. A fixed-time schedule ("30 1 * * *") fires exactly once that
    day, at the first 01:30 (EDT, 05:30 UTC), not again at 01:30 EST."""
    assert utc(2030, 11, 3, 4).astimezone(NEW_YORK).utcoffset() == timedelta(hours=-4)
    assert utc(2030, 11, 3, 8).astimezone(NEW_YORK).utcoffset() == timedelta(hours=-5)
    app = make_app(policy(schedule="30 1 * * *", timezone="America/New_York"))
    clock = Clock(datetime(2030, 11, 2, 12, 0, tzinfo=NEW_YORK).astimezone(UTC))
    scheduler = app.scheduler(clock=clock)
    scheduler.tick()

    end = datetime(2030, 11, 4, 12, 0, tzinfo=NEW_YORK).astimezone(UTC)
    fired = tick_through(scheduler, clock, end, timedelta(minutes=10))

    assert [local(f.fire_time) for f in fired] == ["2030-11-03 01:30 EDT", "2030-11-04 01:30 EST"]
    assert run_ids(app) == [rid(utc(2030, 11, 3, 5, 30)), rid(utc(2030, 11, 4, 6, 30))]
    assert audit(app, "schedule.missed") == []


def test_dst_a_schedule_with_a_wildcard_hour_skips_the_gap_and_repeats_the_fold(
    make_app: Callable[..., App],
) -> None:
    """With '*' in the minute or hour field Debian cron (cronsim) does no DST
    fix-up: every existing wall-clock match fires. "30 * * * *" in New York has
    no 02:30 on 2030-03-10 (the gap is skipped, not replaced), and fires at both
    01:30 EDT and 01:30 EST on 2030-11-03."""
    spring = make_app(
        policy("spring", schedule="30 * * * *", timezone="America/New_York", catch_up="all")
    )
    clock = Clock(datetime(2030, 3, 10, 0, 0, tzinfo=NEW_YORK).astimezone(UTC))
    scheduler = spring.scheduler(clock=clock)
    scheduler.tick()
    end = datetime(2030, 3, 10, 5, 0, tzinfo=NEW_YORK).astimezone(UTC)
    fired = tick_through(scheduler, clock, end, timedelta(minutes=10))
    assert [local(f.fire_time) for f in fired] == [
        "2030-03-10 00:30 EST",
        "2030-03-10 01:30 EST",
        "2030-03-10 03:30 EDT",
        "2030-03-10 04:30 EDT",
    ]

    fall = make_app(policy("fall", schedule="30 * * * *", timezone="America/New_York"))
    clock = Clock(datetime(2030, 11, 3, 0, 0, tzinfo=NEW_YORK).astimezone(UTC))
    scheduler = fall.scheduler(clock=clock)
    scheduler.tick()
    fired = tick_through(scheduler, clock, utc(2030, 11, 3, 8), timedelta(minutes=10))
    assert [local(f.fire_time) for f in fired] == [
        "2030-11-03 00:30 EDT",
        "2030-11-03 01:30 EDT",
        "2030-11-03 01:30 EST",
        "2030-11-03 02:30 EST",
    ]
    assert len(run_ids(fall, "fall")) == 4


# -- bad expressions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("61 * * * *", "Bad minute"),
        ("* * *", "has 3 fields"),
        ("0 0 L * *", "nonstandard extension"),
        ("0 0 31 2 *", "Bad day-of-month"),
        ("@fortnightly", "not a known alias"),
    ],
)
def test_an_invalid_cron_expression_is_refused_at_config_load(expression: str, reason: str) -> None:
    """No database needed: the config is refused before anything opens."""
    with pytest.raises(ConfigError) as refused:
        parse_config(config("sqlite:///unused.db", policy(schedule=expression)))
    message = str(refused.value)
    assert repr(expression) in message
    assert reason in message
    assert f"policy {POLICY!r}" in message and "'schedule'" in message
    assert "\n" not in message


# -- the `expiry scheduler` process ------------------------------------------------------


def scheduler_config(url: str, *names: str) -> str:
    text = f'[database]\nurl = "{url}"\n'
    for name in names:
        text += (
            f'\n[[policy]]\nname = "{name}"\ntable = "sessions"\nkey = "id"\n'
            'timestamp = "expires_at"\nschedule = "* * * * *"\n'
        )
    return text


def test_the_scheduler_command_registers_reloads_on_sighup_and_stops_on_sigterm(
    pg_url: str, tmp_path: Path
) -> None:
    """`expiry scheduler` registers its schedule row, picks up a policy added to
    the config file on SIGHUP within ~3 s, and exits 0 on SIGTERM."""
    create_target(pg_url)
    config_file = tmp_path / "expiry.toml"
    config_file.write_text(scheduler_config(pg_url, "first"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "expiry", "--config", str(config_file), "scheduler"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )

    def registered() -> set[str]:
        with psycopg.connect(pg_url) as conn:
            return {r[0] for r in conn.execute("select policy from expiry.schedules")}

    def wait_for(policy_name: str, seconds: float) -> float:
        started = time.monotonic()
        while policy_name not in registered():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - started < seconds, f"{policy_name} not registered"
            time.sleep(0.05)
        return time.monotonic() - started

    try:
        wait_for("first", 20)
        config_file.write_text(scheduler_config(pg_url, "first", "second"))
        proc.send_signal(signal.SIGHUP)
        assert wait_for("second", 3.0) < 3.0
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "scheduler started: 1 scheduled policies" in err
    assert "config reloaded: 2 scheduled policies" in err
    assert "scheduler stopped" in err
    assert "Traceback" not in err
    assert registered() == {"first", "second"}


def test_the_scheduler_wakes_for_cron_targets_not_only_policies(
    make_app: Callable[..., App],
) -> None:
    """With only a daily policy, an every-minute cron target sets the sleep: the
    scheduler wakes within its minute, and creating or pausing a target changes
    the version its sleep watches (it used to sleep until the daily fire)."""
    app = make_app(policy(schedule="@daily"))
    clock = Clock(utc(2030, 1, 1, 0, 5, 30))
    scheduler = app.scheduler(clock=clock)
    scheduler.tick()
    daily = scheduler.seconds_to_next_fire(clock.now)
    assert daily is not None and daily > 3600

    before = app.engine.schedule_version()
    app.crons.allowed_hosts = ["127.0.0.1:*"]
    app.crons.create("minutely", "http://127.0.0.1:9/", "* * * * *")
    assert app.engine.schedule_version() != before  # a sleeping scheduler wakes
    target = app.engine.cron_get("minutely")
    assert target is not None and target.last_fire_at is not None
    soon = scheduler.seconds_to_next_fire(target.last_fire_at)
    assert soon is not None and soon <= 60

    paused = app.engine.schedule_version()
    time.sleep(0.01)  # the version is the latest change's time: a later moment
    app.crons.set_paused("minutely", True)
    assert app.engine.schedule_version() != paused
    later = scheduler.seconds_to_next_fire(target.last_fire_at)
    # A paused target does not wake it: the daily policy's next fire does.
    midnight = (target.last_fire_at + timedelta(days=1)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    assert later == (midnight - target.last_fire_at).total_seconds()


# -- cron targets: one call at a time, shared fairly across owners --------------------


def cron_calls(app: App) -> list[Any]:
    """The calls of cron targets not finished yet, in the order a worker claims them."""
    from expiry.queue.jobs import CRON_QUEUE
    from expiry.types import JobState

    waiting = app.engine.job_list(JobState.AVAILABLE, CRON_QUEUE, 1000)
    return sorted(waiting, key=lambda j: (j.priority, j.run_at, j.id))


def test_a_cron_target_whose_call_has_not_finished_is_not_called_again(
    make_app: Callable[..., App],
) -> None:
    """A per-minute target whose call waits (or retries, or runs) is not called
    at the next minutes: those fires are audited as missed with the reason, so a
    slow or failing target holds one call, not a backlog (it held one a minute);
    once the call finishes, the next fire calls it again."""
    app = make_app(policy(schedule="@daily"))
    app.crons.allowed_hosts = ["127.0.0.1:*"]
    app.crons.create("minutely", "http://127.0.0.1:9/", "* * * * *")
    target = app.engine.cron_get("minutely")
    assert target is not None and target.last_fire_at is not None
    start = target.last_fire_at
    assert [called for _, _, called in app.crons.fire_due(start + timedelta(minutes=1))] == [True]
    assert app.crons.fire_due(start + timedelta(minutes=3)) == [
        ("minutely", minutes_between(start, start + timedelta(minutes=3))[-1], False)
    ]
    assert len(cron_calls(app)) == 1
    missed = select(
        app,
        f"select detail from {table(app, 'audit')} where action = 'cron.missed' order by id",
    )
    reasons = [(json.loads(d) if isinstance(d, str) else d)["reason"] for (d,) in missed]
    assert reasons == ["the previous call has not finished"] * 2
    [call] = app.queue.claim(1, 30, queues=(cron_calls(app)[0].queue,), owner="test")
    assert app.crons.fire_due(start + timedelta(minutes=4))[0][2] is False  # running
    app.queue.complete(call)
    assert app.crons.fire_due(start + timedelta(minutes=5))[0][2] is True
    assert len(cron_calls(app)) == 1


def test_cron_calls_are_shared_fairly_across_the_keys_that_own_targets(
    make_app: Callable[..., App],
) -> None:
    """Five targets of one key and one of another fire together: the other key's
    call is claimed among the first two (each owner's n-th unfinished call has
    priority n), not after the first key's five."""
    app = make_app(policy(schedule="@daily"))
    app.crons.allowed_hosts = ["127.0.0.1:*"]
    for n in range(5):
        app.crons.create(f"flood-{n}", "http://127.0.0.1:9/", "* * * * *", owner="flooder")
    app.crons.create("victim", "http://127.0.0.1:9/", "* * * * *", owner="other")
    latest = max(t.last_fire_at for t in app.crons.stored() if t.last_fire_at)
    fired = app.crons.fire_due(latest + timedelta(minutes=1))
    assert sorted(name for name, _, called in fired if called) == [
        "flood-0", "flood-1", "flood-2", "flood-3", "flood-4", "victim"
    ]  # fmt: skip
    first_two = [c.payload["name"] for c in cron_calls(app)[:2]]
    assert "victim" in first_two, first_two
    claimed = app.queue.claim(2, 30, queues=(cron_calls(app)[0].queue,), owner="test")
    assert "victim" in [j.payload["name"] for j in claimed]


# -- a schedule that no scheduler keeps ------------------------------------------


def test_a_schedule_no_scheduler_keeps_is_said_until_one_takes_its_fires(
    make_app: Callable[..., App],
) -> None:
    """No scheduler runs: a scheduled policy opens no run and nothing else says
    so (the watermark grows only once rows expire). Status and /metrics say it
    is unscheduled: never registered, then a fire due minutes ago not taken.
    A scheduler's tick takes the fire and ends it; a paused schedule, and a
    policy without a schedule, are never said to be unscheduled."""
    app = make_app(policy(schedule="* * * * *"), policy("manual", schedule=None))

    def said() -> dict[str, Any]:
        rows = {p["name"]: p for p in Status.of(app).policies()}
        assert rows["manual"]["unscheduled"] is False
        text = render(app)[0].decode()
        gauge = f'expiry_policy_unscheduled{{policy="{POLICY}"}} '
        assert (gauge + "1.0" in text) == rows[POLICY]["unscheduled"], text
        assert 'expiry_policy_unscheduled{policy="manual"}' not in text
        return rows[POLICY]

    row = said()
    assert row["unscheduled"] is True and row["unscheduled_seconds"] is None  # never registered

    now = app.engine.now()
    app.engine.schedule_register(POLICY, now - timedelta(minutes=10))
    row = said()
    assert row["unscheduled"] is True
    assert 8 * 60 < row["unscheduled_seconds"] < 10 * 60  # the fire after the registration

    app.engine.schedule_set_paused(POLICY, True)
    assert said()["unscheduled"] is False  # paused: nothing is due
    app.engine.schedule_set_paused(POLICY, False)

    app.scheduler().tick()  # a scheduler, on the database's clock, takes the fires
    row = said()
    assert row["unscheduled"] is False and row["unscheduled_seconds"] is None
    assert run_ids(app)  # and the run it was missing opened
