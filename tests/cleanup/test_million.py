"""A million rows on PostgreSQL, cleaned by two worker processes, then every
invariant checked by SQL against a copy of the rows that must survive."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from expiry.app import App

from ._support import Db, claim_plan, cli_env, expiry_cmd, write_config

Apps = Callable[..., App]
POLICY = "expired-sessions"
ROWS = 1_000_000


def test_a_million_rows_with_two_worker_processes(pg_db: Db, apps: Apps, tmp_path: Path) -> None:
    db = pg_db
    started = time.monotonic()
    db.execute(
        "create table sessions (id bigint primary key, user_id integer not null,"
        " expires_at timestamptz not null, revoked_at timestamptz, note text)"
    )
    # 80% expired (id % 10 < 8), some of those revoked (kept by `where`), 20% live.
    db.execute(
        "insert into sessions (id, user_id, expires_at, revoked_at)"
        " select g, g % 1000,"
        "  case when g % 10 < 8 then now() - make_interval(secs => 3600 + g % 86400)"
        "       else now() + interval '1 day' end,"
        "  case when g % 10 < 8 and g % 97 = 0 then now() end"
        f" from generate_series(1, {ROWS}) g"
    )
    db.execute("create index sessions_expires_at on sessions (expires_at)")
    db.execute("analyze sessions")

    app = apps(db.url, {"window": 10_000})
    assert app.cleanup is not None
    assert app.cleanup.check() == []
    opened = app.cleanup.open_run(POLICY)
    claim_plan(app)  # the windows are planned ...
    # ... and then some candidates are revived before their windows run.
    revived = db.execute(
        "update sessions set expires_at = now() + interval '1 hour'"
        " where id % 1000 = 3 and revoked_at is null"
    )
    assert 900 < revived <= ROWS // 1000
    db.execute(
        "create table expected_survivors as select id from sessions"
        " where not (expires_at < %s and revoked_at is null)",
        [opened.cutoff],
    )
    survivors = db.count("expected_survivors")
    doomed = ROWS - survivors
    assert 780_000 < doomed < 800_000
    assert db.scalar("select count(*) from sessions where revoked_at is not null") > 8000

    # Held by a pause file until both processes are on the roll: the first one up
    # would otherwise take every window before the second has started.
    pause = tmp_path / "pause"
    pause.touch()
    config = write_config(
        tmp_path / "expiry.toml", db.url, {"window": 10_000, "pause_file": str(pause)}
    )
    logs = [(tmp_path / f"worker-{i}.log").open("wb") for i in range(2)]
    workers = [
        subprocess.Popen(
            expiry_cmd("--config", str(config), "worker", "--until-idle", "--concurrency", "2"),
            env=cli_env(),
            cwd=tmp_path,
            stdout=log,
            stderr=log,
        )
        for log in logs
    ]
    try:
        deadline = time.monotonic() + 60
        while db.scalar("select count(*) from expiry.workers") < 2:
            assert time.monotonic() < deadline, "the two workers did not both start"
            time.sleep(0.05)
        pause.unlink()
        codes = [w.wait(120) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        for log in logs:
            log.close()
    assert codes == [0, 0], [(tmp_path / f"worker-{i}.log").read_text()[-2000:] for i in range(2)]

    # Nothing that was not expired (or was excluded, or revived) was deleted,
    # and no expired row is left: the table is exactly the expected survivors.
    assert (
        db.scalar(
            "select count(*) from sessions s full join expected_survivors e using (id)"
            " where s.id is null or e.id is null"
        )
        == 0
    )
    assert db.count("sessions") == survivors
    assert (
        db.scalar(
            "select count(*) from sessions where expires_at < %s and revoked_at is null",
            [opened.cutoff],
        )
        == 0
    )
    assert app.cleanup.watermark(POLICY) == 0

    # Every job completed; exactly one ledger row per window job key, and the
    # ledger accounts for every deleted row.
    assert db.rows("select distinct state from expiry.jobs") == [("completed",)]
    windows = db.scalar("select count(*) from expiry.jobs where handler = 'expiry.window'")
    assert windows >= 78
    assert (
        db.scalar(
            "select count(*) from expiry.jobs j full join expiry.ledger l on l.key = j.key"
            " where j.handler = 'expiry.window' and l.key is null"
            "    or l.key is not null and (j.key is null or j.handler <> 'expiry.window')"
        )
        == 0
    )
    assert db.count("expiry.ledger") == windows
    assert db.scalar("select sum(rows_affected) from expiry.ledger") == doomed
    assert db.audit("window.duplicate") == 0
    assert db.run_state(opened.run_id) == "finished"
    # Both processes took part.
    assert db.scalar("select count(distinct worker) from expiry.ledger") == 2
    assert time.monotonic() - started < 90
