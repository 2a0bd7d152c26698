"""Legal holds: [[hold]] entries name rows of a table (a predicate, or their
keys listed in another table) that no policy on the table deletes, in any
window, on every engine, nor any partition drop; checked against an oracle."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from expiry.app import App
from expiry.config import parse_config
from expiry.errors import ConfigError, SchemaError

from ._support import Db, cli_env, config_data, expiry_cmd, run_worker, write_config

Apps = Callable[..., App]
POLICY = "expired-sessions"
HOUR = 3600.0
BY_USER = {"name": "user-3-case", "table": "sessions", "where": "user_id = 3", "reason": "case 3"}
BY_KEYS = {
    "name": "listed",
    "table": "sessions",
    "keys_table": "legal_keys",
    "keys_column": "session_id",
}


def offset(i: int) -> float:
    """Two rows in three expired (hours before now), the third live."""
    return -(1 + i % 5) * HOUR if i % 3 else (1 + i % 5) * HOUR


def seed(db: Db, n: int = 600) -> dict[int, tuple[int, bool]]:
    """Rows 1..n, user_id = id mod 7; the ids in legal_keys are the multiples of
    13. Each id's (user, expired)."""
    db.create_sessions()
    db.insert_sessions([(i, offset(i), False) for i in range(1, n + 1)])
    db.execute("update sessions set user_id = id % 7")
    db.execute("create table legal_keys (session_id bigint primary key)")
    for i in range(13, n + 1, 13):
        db.execute("insert into legal_keys (session_id) values (%s)", [i])
    return {i: (i % 7, offset(i) < 0) for i in range(1, n + 1)}


def held_by_user(i: int) -> bool:
    return i % 7 == 3


def listed(i: int) -> bool:
    return i % 13 == 0


def with_holds(url: str, *holds: dict[str, Any], **policy: Any) -> dict[str, Any]:
    data = config_data(url, {"where": None, "window": 40, **policy})
    data["hold"] = list(holds)
    return data


def config_file(tmp_path: Path, url: str, *holds: dict[str, Any]) -> Path:
    """An expiry.toml with the policy and ``holds`` as [[hold]] tables."""
    cfg = write_config(tmp_path / "expiry.toml", url, {"where": None})
    with cfg.open("a") as f:
        for hold in holds:
            f.write("\n[[hold]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in hold.items()))
    return cfg


def expiry(cfg: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        expiry_cmd(command, "--config", str(cfg), *args),
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
    )


def test_no_window_deletes_a_held_row_and_every_other_expired_row_goes(db: Db) -> None:
    rows = seed(db)
    app = App(config=parse_config(with_holds(db.url, BY_USER, BY_KEYS)))
    try:
        assert app.cleanup is not None
        preview = app.cleanup.preview(POLICY)
        expired = {i for i, (_, old) in rows.items() if old}
        assert preview.held == {
            "user-3-case": len({i for i in expired if held_by_user(i)}),
            "listed": len({i for i in expired if listed(i)}),
        }
        kept = {i for i in expired if held_by_user(i) or listed(i)}
        assert preview.candidates == len(expired - kept)

        app.cleanup.open_run(POLICY)
        run_worker(app, concurrency=2)
        assert db.ids() == (set(rows) - expired) | kept
        assert sum(r["rows"] for r in db.ledger()) == len(expired - kept)
    finally:
        app.close()


def test_every_policy_on_the_table_honours_the_hold_and_lifting_it_frees_the_rows(
    db: Db,
) -> None:
    rows = seed(db)
    second = {"name": "old-sessions", "table": "sessions", "key": "id", "timestamp": "expires_at"}
    data = with_holds(db.url, BY_USER)
    data["policy"].append({**second, "retain": "2h", "window": 25})
    app = App(config=parse_config(data))
    try:
        assert app.cleanup is not None
        app.cleanup.open_run("old-sessions")  # two hours: the rows expired 3 to 5 h ago
        run_worker(app)
        app.cleanup.open_run(POLICY)
        run_worker(app)
    finally:
        app.close()
    expired = {i for i, (_, old) in rows.items() if old}
    assert db.ids() == (set(rows) - expired) | {i for i in expired if held_by_user(i)}

    time.sleep(1.1)  # a run's cutoff is to the second: the next run's must differ
    lifted = App(config=parse_config(with_holds(db.url)))  # the hold is out of the config
    try:
        assert lifted.cleanup is not None
        lifted.cleanup.open_run(POLICY)
        run_worker(lifted)
    finally:
        lifted.close()
    assert db.ids() == set(rows) - expired


@pytest.mark.parametrize(
    "hold, words",
    [
        ({**BY_USER, "keys_table": "legal_keys", "keys_column": "id"}, "names its rows one way"),
        ({"name": "x", "table": "sessions"}, "names its rows one way"),
        ({"name": "x", "table": "sessions", "keys_table": "legal_keys"}, "go together"),
        ({**BY_USER, "table": "public.sessions"}, "write it the same way in both"),
        ({**BY_USER, "where": "1 = 1; drop table sessions"}, "one SQL predicate"),
    ],
)
def test_a_hold_that_could_be_misread_is_refused_with_the_fix(
    hold: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(with_holds("sqlite:///unused.db", hold))
    assert words in str(refused.value)


def test_a_hold_that_cannot_be_read_quarantines_the_policy_naming_the_hold(db: Db) -> None:
    seed(db)
    missing = {**BY_KEYS, "keys_table": "no_such_keys"}
    app = App(config=parse_config(with_holds(db.url, missing)))
    try:
        assert app.cleanup is not None
        with pytest.raises(SchemaError) as refused:
            app.cleanup.check()
        assert "hold 'listed'" in str(refused.value) and "no_such_keys" in str(refused.value)
    finally:
        app.close()


def test_expiry_holds_lists_each_hold_and_the_rows_it_keeps(db: Db, tmp_path: Path) -> None:
    rows = seed(db)
    done = expiry(config_file(tmp_path, db.url, BY_USER, BY_KEYS), "holds", "--json")
    assert done.returncode == 0, done.stderr
    shown = {h["name"]: h for h in json.loads(done.stdout)["holds"]}
    expired = {i for i, (_, old) in rows.items() if old}
    assert shown["user-3-case"]["kept"] == {POLICY: len({i for i in expired if held_by_user(i)})}
    assert shown["listed"]["kept"] == {POLICY: len({i for i in expired if listed(i)})}
    assert shown["user-3-case"]["reason"] == "case 3"
    assert shown["listed"]["rows"] == "keys in legal_keys.session_id"


@pytest.mark.parametrize("partitions", ["auto", "drop"])
def test_a_partition_holding_a_held_row_is_cleaned_by_windows_and_the_others_dropped(
    pg_db: Db, partitions: str
) -> None:
    """Two whole expired partitions: the one without a held row is dropped; the
    one holding row 7 stays attached, and windows take the rest of its rows."""
    db = pg_db
    db.execute(
        "create table events (id bigint, created_at timestamptz not null, note text,"
        " primary key (id, created_at)) partition by range (created_at)"
    )
    db.execute("create index on events (created_at)")
    for name, lo, hi in (
        ("events_2019", "2019-01-01", "2020-01-01"),
        ("events_2020", "2020-01-01", "2021-01-01"),
        ("events_now", "2021-01-01", "2100-01-01"),
    ):
        db.execute(f"create table {name} partition of events for values from ('{lo}') to ('{hi}')")
    db.execute(
        "insert into events select i, case when i <= 50 then timestamptz '2019-06-01' + i * interval"
        " '1 hour' when i <= 100 then timestamptz '2020-06-01' + i * interval '1 hour'"
        " else now() + i * interval '1 minute' end, 'e' from generate_series(1, 150) i"
    )
    policy = {"name": "old-events", "table": "events", "key": "id", "timestamp": "created_at"}
    hold = {"name": "case-77", "table": "events", "where": "id = 77"}
    data = {
        "database": {"url": db.url},
        "policy": [{**policy, "window": 30, "partitions": partitions}],
        "hold": [hold],
    }
    app = App(config=parse_config(data))
    try:
        assert app.cleanup is not None
        planned = app.cleanup.preview("old-events")
        assert [p["partition"] for p in planned.partitions] == ["public.events_2019"]
        assert planned.held == {"case-77": 1}
        app.cleanup.open_run("old-events")
        run_worker(app)
    finally:
        app.close()
    assert db.ids("events") == {77} | set(range(101, 151))
    attached = db.rows(
        "select c.relname from pg_inherits i join pg_class c on c.oid = i.inhrelid"
        " where i.inhparent = 'events'::regclass order by 1"
    )
    assert [r[0] for r in attached] == ["events_2020", "events_now"]
    assert db.scalar("select to_regclass('events_2019')") is None  # dropped whole


def test_processes_starting_together_audit_each_hold_once(db: Db) -> None:
    """Six processes (each an App with its own connections) read the same new
    config at once: the log says each hold was placed once, not six times."""
    seed(db)
    config = parse_config(with_holds(db.url, BY_USER, BY_KEYS))
    apps = [App(config=config) for _ in range(6)]
    for app in apps:
        app.engine.now()  # connected before the start line
    start = threading.Barrier(len(apps))
    said: list[list[str]] = []

    def record(app: App) -> None:
        assert app.cleanup is not None
        start.wait()
        said.append(app.cleanup.record_holds())

    threads = [threading.Thread(target=record, args=(app,)) for app in apps]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        events = apps[0].engine.audit_hold_events()
    finally:
        for app in apps:
            app.close()
    assert sorted((e.action, e.detail["hold"]) for e in events) == [
        ("hold.placed", "listed"),
        ("hold.placed", "user-3-case"),
    ]
    assert sorted(len(s) for s in said) == [0, 0, 0, 0, 0, 2], said


def test_placing_changing_and_lifting_a_hold_is_audited_once_each(db: Db) -> None:
    seed(db)

    def recorded(*holds: dict[str, Any]) -> list[str]:
        app = App(config=parse_config(with_holds(db.url, *holds)))
        try:
            assert app.cleanup is not None
            return app.cleanup.record_holds()
        finally:
            app.close()

    assert recorded(BY_USER, BY_KEYS) == [
        "hold user-3-case placed on sessions",
        "hold listed placed on sessions",
    ]
    assert recorded(BY_USER, BY_KEYS) == []  # a restart, the same config: nothing new
    assert recorded({**BY_USER, "where": "user_id in (3, 4)"}) == [
        "hold user-3-case placed on sessions",  # changed: in force as it is now
        "hold listed lifted from sessions",
    ]
    reader = App(db.url)
    try:
        events = reader.engine.audit_hold_events()
    finally:
        reader.close()
    assert [(e.action, e.detail["hold"]) for e in events] == [
        ("hold.placed", "user-3-case"),
        ("hold.placed", "listed"),
        ("hold.placed", "user-3-case"),
        ("hold.lifted", "listed"),
    ]
    assert events[2].detail["where"] == "user_id in (3, 4)"
    assert events[0].detail["reason"] == "case 3"


def test_a_worker_audits_the_holds_of_its_config_as_it_starts(db: Db, tmp_path: Path) -> None:
    seed(db)
    done = expiry(config_file(tmp_path, db.url, BY_USER), "worker", "--until-idle")
    assert done.returncode == 0, done.stderr
    assert "hold user-3-case placed on sessions" in done.stderr
    assert db.audit("hold.placed") == 1
