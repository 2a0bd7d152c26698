"""keep_last: a row goes only when it is expired and beyond the N newest rows
(by timestamp, then key) of its group_by value, or of the table; checked on
every engine against an oracle that ranks the rows in Python."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from expiry.app import App
from expiry.config import parse_config
from expiry.errors import ConfigError, SchemaError

from ._support import (
    Db,
    claim_plan,
    cli_env,
    config_data,
    drain,
    expiry_cmd,
    run_worker,
    write_config,
)

Apps = Callable[..., App]
POLICY = "expired-sessions"
HOUR = 3600.0


def offset(i: int) -> float:
    """Whole hours, many rows sharing each: the key decides between rows of one
    timestamp. Users 0 to 2 (id mod 9) have only expired rows, -11 h to -1 h;
    the others' rows range from -6 h to +5 h. No row is within an hour of the
    cutoff."""
    hours = (i * 37) % 11
    if i % 9 < 3:
        return -(hours + 1) * HOUR
    return (hours - 6 if hours < 6 else hours - 5) * HOUR


def seed(db: Db, n: int, groups: int) -> dict[int, tuple[int, Any, bool]]:
    """Rows 1..n, user_id = id mod groups; each id's (group, stored timestamp,
    expired), read back as the database stores it."""
    db.create_sessions()
    db.execute("create index sessions_user_newest on sessions (user_id, expires_at)")
    db.insert_sessions([(i, offset(i), False) for i in range(1, n + 1)])
    db.execute(f"update sessions set user_id = id % {groups}")
    stored = {
        int(r[0]): (int(r[1]), r[2])
        for r in db.rows("select id, user_id, expires_at from sessions")
    }
    return {i: (g, ts, offset(i) < 0) for i, (g, ts) in stored.items()}


def oracle(rows: dict[int, tuple[int, Any, bool]], keep: int, grouped: bool) -> set[int]:
    """The ids a cleanup must leave: the N newest of each group (of the
    table) by (timestamp, id), and every row that is not expired."""
    by_group: dict[int, list[int]] = {}
    for i, (g, _, _) in rows.items():
        by_group.setdefault(g if grouped else 0, []).append(i)
    newest = {
        i
        for ids in by_group.values()
        for i in sorted(ids, key=lambda i: (rows[i][1], i), reverse=True)[:keep]
    }
    return {i for i, (_, _, expired) in rows.items() if not expired or i in newest}


def policy(**fields: Any) -> dict[str, Any]:
    return {"where": None, "window": 50, **fields}


@pytest.mark.parametrize(
    "grouped, windows",
    [(True, "auto"), (False, "auto"), (True, "time")],
    ids=["per-user", "whole-table", "per-user-time-windows"],
)
def test_keep_last_leaves_exactly_the_newest_rows_and_the_live_ones(
    db: Db, apps: Apps, grouped: bool, windows: str
) -> None:
    rows = seed(db, 700, groups=9)
    live = sum(1 for _, _, expired in rows.values() if not expired)
    keep = 5 if grouped else live + 40  # the table's newest: every live row, and 40 more
    fields = {"keep_last": keep, "windows": windows, **({"group_by": "user_id"} if grouped else {})}
    app = apps(db.url, policy(**fields))
    assert app.cleanup is not None
    expected = oracle(rows, keep, grouped)
    assert len(expected) < len(rows) and any(rows[i][2] for i in expected)  # both rules bite

    preview = app.cleanup.preview(POLICY, limit=1000)
    assert preview.candidates == len(rows) - len(expected)

    app.cleanup.open_run(POLICY)
    drain(app, concurrency=2)  # two threads' windows may retry (a deadlock on MySQL): to the end
    assert db.ids() == expected
    ledger = db.ledger()
    assert sum(r["rows"] for r in ledger) == len(rows) - len(expected)


def test_keep_last_is_read_as_the_window_runs(db: Db, apps: Apps) -> None:
    """Rows the application deletes after planning make older rows of their
    group the newest: the windows, which read keep_last as they run, keep them."""
    rows = seed(db, 450, groups=9)
    app = apps(db.url, policy(keep_last=3, group_by="user_id"))
    assert app.cleanup is not None
    opened = app.cleanup.open_run(POLICY)
    claim_plan(app)  # the planning job only: the windows wait
    assert db.windows(opened.run_id)
    # The application deletes the ten newest rows of user 1, all of whose rows
    # are expired: the next three, planned as candidates, are now its newest.
    group = sorted(
        (i for i in rows if rows[i][0] == 1), key=lambda i: (rows[i][1], i), reverse=True
    )
    gone = group[:10]
    assert all(rows[i][2] for i in group) and len(group) > 13
    db.execute(f"delete from sessions where id in ({', '.join(str(i) for i in gone)})")
    left = {i: r for i, r in rows.items() if i not in gone}

    run_worker(app)
    assert db.ids() == oracle(left, 3, grouped=True)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"group_by": "user_id"}, "set keep_last = N"),
        ({"keep_last": 0}, "keep_last"),
        ({"keep_last": 10, "partitions": "drop"}, 'write partitions = "rows"'),
        ({"keep_last": 10, "group_by": "user id"}, "group_by"),
    ],
)
def test_a_keep_last_that_cannot_work_is_refused_with_the_fix(
    fields: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(config_data("sqlite:///unused.db", policy(**fields)))
    message = str(refused.value)
    assert POLICY in message and words in message


def test_check_names_the_index_keep_last_wants(db: Db, apps: Apps) -> None:
    db.create_sessions()
    app = apps(db.url, policy(keep_last=3, group_by="user_id"))
    assert app.cleanup is not None
    warnings = app.cleanup.check()
    wanted = [w for w in warnings if "keep_last" in w]
    assert wanted and POLICY in wanted[0] and "(user_id, expires_at" in wanted[0], warnings
    db.execute("create index sessions_user_newest on sessions (user_id, expires_at)")
    assert not [w for w in app.cleanup.check() if "keep_last" in w]


def test_a_group_by_column_the_table_lacks_is_refused_by_the_check(db: Db, apps: Apps) -> None:
    db.create_sessions()
    app = apps(db.url, policy(keep_last=3, group_by="owner_id"))
    assert app.cleanup is not None
    with pytest.raises(SchemaError) as refused:
        app.cleanup.check()
    assert "group_by column 'owner_id' is not in table 'sessions'" in str(refused.value)


def test_status_and_plan_say_what_keep_last_keeps(db: Db, tmp_path: Path) -> None:
    """`expiry status` names the rule beside retain; `expiry plan` counts the
    candidates with it (the oracle's count)."""
    rows = seed(db, 450, groups=9)
    cfg = write_config(tmp_path / "expiry.toml", db.url, policy(keep_last=4, group_by="user_id"))
    env = cli_env(COLUMNS="250")  # one line a row, whatever the runner sets
    shown = subprocess.run(
        expiry_cmd("status", "--config", str(cfg)), capture_output=True, text=True, env=env
    )
    assert shown.returncode == 0, shown.stderr
    assert "keep 4 newest per user_id" in shown.stdout, shown.stdout
    planned = subprocess.run(
        expiry_cmd("plan", POLICY, "--config", str(cfg), "--json"),
        capture_output=True,
        text=True,
        env=env,
    )
    assert planned.returncode == 0, planned.stderr
    candidates = len(rows) - len(oracle(rows, 4, grouped=True))
    assert json.loads(planned.stdout)["candidates"] == candidates
