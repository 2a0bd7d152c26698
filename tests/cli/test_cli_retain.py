"""`expiry trigger` with a non-zero retain, as a real subprocess on each engine:
the run's cutoff is the database's now() minus retain, so rows that expired less
than retain ago stay, and the dry run counts only the older ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from expiry.app import App

POLICY = "expired-sessions"
OLD, RECENT, LIVE = range(1, 101), range(101, 201), range(201, 251)
"""Expired two hours ago, expired half an hour ago, expiring in a day."""


def seed(url: str) -> None:
    app = App(url)
    app.migrate()
    with app.engine.transaction() as conn:
        if app.engine.dialect == "postgres":
            conn.execute(
                "create table sessions (id bigint primary key, expires_at timestamptz not null)"
            )
            conn.execute(
                "insert into sessions select i, now() + case when i <= 100 then interval '-2h'"
                " when i <= 200 then interval '-30m' else interval '1 day' end"
                " from generate_series(1, 250) i"
            )
        elif app.engine.dialect == "mysql":
            conn.execute(
                "create table sessions (id bigint primary key, expires_at datetime(6) not null)"
            )
            offsets = [(OLD, -7200), (RECENT, -1800), (LIVE, 86400)]
            values = ", ".join(
                f"({i}, utc_timestamp(6) + interval {offset} second)"
                for ids, offset in offsets
                for i in ids
            )
            conn.execute(f"insert into sessions values {values}")
        else:
            now = datetime.now(UTC).timestamp()
            conn.execute("create table sessions (id integer primary key, expires_at real not null)")
            offsets = [(OLD, -7200), (RECENT, -1800), (LIVE, 86400)]
            conn.executemany(
                "insert into sessions values (?, ?)",
                [(i, now + offset) for ids, offset in offsets for i in ids],
            )
        conn.execute("create index sessions_expires_at on sessions (expires_at)")
    app.close()


def expiry(config: Path, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    proc = subprocess.run(
        [sys.executable, "-m", "expiry", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc
    return json.loads(proc.stdout) if "--json" in args else proc.stdout


def remaining(url: str) -> set[int]:
    app = App(url)
    try:
        with app.engine.transaction() as conn:
            rows = conn.execute("select id from sessions").fetchall()
    finally:
        app.close()
    return {int(row["id"] if isinstance(row, dict) else row[0]) for row in rows}


def test_trigger_with_retain_keeps_rows_expired_less_than_retain_ago(
    db_url: str, tmp_path: Path
) -> None:
    seed(db_url)
    config = tmp_path / "expiry.toml"
    config.write_text(
        f'[database]\nurl = "{db_url}"\n\n[[policy]]\nname = "{POLICY}"\ntable = "sessions"\n'
        'key = "id"\ntimestamp = "expires_at"\nretain = "1h"\nwindow = 100\n'
    )

    dry = expiry(config, "--json", "trigger", POLICY, "--dry-run")
    assert (dry["candidates"], dry["windows"]) == (len(OLD), 1)

    opened = expiry(config, "--json", "trigger", POLICY)
    assert opened["created"] is True
    cutoff = datetime.fromisoformat(opened["cutoff"].replace("Z", "+00:00"))
    assert timedelta(minutes=59) < datetime.now(UTC) - cutoff < timedelta(minutes=62)

    expiry(config, "worker", "--until-idle")
    assert remaining(db_url) == set(RECENT) | set(LIVE)
    shown = expiry(config, "--json", "runs", "show", opened["run_id"])
    assert (shown["state"], shown["rows_affected"]) == ("finished", len(OLD))
