"""`expiry demo`: a sample marketplace on SQLite, cleaned end to end.

It builds four tables (sessions, tokens, listing events, digest rows) with most
rows expired, writes a four-policy config beside the database (one policy
archives), opens a run per policy, and runs real workers until every run has
finished. To show the ledger at work it then redelivers a few completed
windows, as a broker would after a lost acknowledgement: each is skipped as a
duplicate and changes nothing. Running it again starts from scratch.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..app import App
from ..config import load_config
from ..status import Status
from ..times import format_duration

CONFIG = """\
[database]
url = "sqlite:///{db}"

[[policy]]
name = "expired-sessions"
table = "sessions"
key = "id"
timestamp = "expires_at"
retain = "0s"
where = "revoked_at is null"       # revoked sessions are kept for the security team
window = 10000
nice_ratio = 0                     # nothing else uses this database: no rests
schedule = "*/15 * * * *"

[[policy]]
name = "expired-tokens"
table = "tokens"
key = "id"
timestamp = "expires_at"
retain = "1h"
window = 10000
nice_ratio = 0
schedule = "0 * * * *"

[[policy]]
name = "old-listing-events"
table = "listing_events"
key = "id"
timestamp = "created_at"
retain = "30d"
action = "archive"
archive_table = "listing_events_archive"
window = 10000
nice_ratio = 0
schedule = "@daily"

[[policy]]
name = "digest-rows"
table = "digest_rows"
key = "id"
timestamp = "created_at"
retain = "7d"
window = 10000
nice_ratio = 0
schedule = "0 6 * * 1"
"""

# Shares of the demo's rows, and the fraction of each table that is expired.
TABLES = {"sessions": 0.4, "tokens": 0.25, "listing_events": 0.25, "digest_rows": 0.1}

SCHEMA = """
create table sessions (id integer primary key, user_id integer not null,
                       expires_at real not null, revoked_at real);
create index sessions_expires_at on sessions (expires_at);
create table tokens (id integer primary key, user_id integer not null, kind text not null,
                     expires_at real not null);
create index tokens_expires_at on tokens (expires_at);
create table listing_events (id integer primary key, listing_id integer not null,
                             kind text not null, created_at text not null);
create index listing_events_created_at on listing_events (created_at);
create table listing_events_archive (id integer primary key, listing_id integer not null,
                                     kind text not null, created_at text not null);
create table digest_rows (id integer primary key, digest_id integer not null,
                          created_at real not null);
create index digest_rows_created_at on digest_rows (created_at);
"""

# Each table is filled by one statement: ids 1..$n, older ids older. The first
# 80% of each table is past its deadline (by up to a few days or months), the
# rest is live; 2% of sessions are revoked, and the policy keeps those.
FILL = {
    "sessions": """
        insert into sessions
        select i, abs(random()) % 50000, $time(3 * 86400, 86400), case when i % 50 = 0 then unixepoch() end
        from c""",
    "tokens": """
        insert into tokens
        select i, abs(random()) % 50000, case i % 3 when 0 then 'reset' else 'api' end,
               $time(2 * 86400 + 3600, 86400)
        from c""",
    "listing_events": """
        insert into listing_events
        select i, abs(random()) % 20000, case i % 4 when 0 then 'view' else 'price' end,
               datetime($time(150 * 86400, -29 * 86400), 'unixepoch')
        from c""",
    "digest_rows": """
        insert into digest_rows
        select i, i / 1000, $time(35 * 86400, -6 * 86400)
        from c""",
}
EXPIRED_SHARE = 0.8


def _time_sql(n: int, past: str, future: str) -> str:
    """Epoch seconds for row i: expired rows spread over the ``past`` seconds ending
    two hours ago (so that no token sits on the cutoff of the tokens policy, which
    retains 1h); live rows spread from an hour ahead to ``future``."""
    cut = int(n * EXPIRED_SHARE)
    return (
        f"(case when i <= {cut} then unixepoch() - 7200 - ({past}) * (1.0 - i * 1.0 / {cut}) "
        f"else unixepoch() + 3600 + abs({future}) * (i - {cut}) * 1.0 / {max(1, n - cut)} end)"
    )


def build_database(path: Path, rows: int) -> dict[str, int]:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    counts = {}
    for table, share in TABLES.items():
        n = max(1, int(rows * share))
        fill = FILL[table]
        for match in re.finditer(r"\$time\(([^,]+), ([^)]+)\)", fill):
            fill = fill.replace(match.group(0), _time_sql(n, match.group(1), match.group(2)))
        # Our own fixed statements with integer counts: nothing here comes from input.
        series = f"with recursive c(i) as (select 1 union all select i + 1 from c where i < {n}) "
        conn.execute(series + fill)
        counts[table] = n
    conn.commit()
    conn.close()
    return counts


def run_demo(
    path: Path, *, rows: int = 1_000_000, workers: int = 2, show: bool = True
) -> dict[str, Any]:
    console = Console(stderr=not show, quiet=not show)
    if not console.is_terminal:
        console.width = max(console.width, 132)
    if logging.getLogger("expiry").level < logging.WARNING:
        logging.getLogger("expiry").setLevel(logging.WARNING)
    started = time.monotonic()
    path = path.resolve()
    with console.status(f"building {rows:,} rows in {path} ..."):
        counts = build_database(path, rows)
    config_file = path.with_suffix(".toml")
    config_file.write_text(CONFIG.format(db=path))
    app = App(config=load_config(config_file))
    app.migrate()
    cleanup = app.cleanup
    assert cleanup is not None
    cleanup.check()
    before = {p.name: cleanup.watermark(p.name) for p in cleanup.policies}
    console.print(
        f"built {sum(counts.values()):,} rows in {time.monotonic() - started:.1f}s; "
        f"config written to {config_file}"
    )
    cleaning = time.monotonic()
    runs, redelivered = _clean(console, app, workers)
    report = {
        "database": str(path),
        "rows_built": counts,
        "seconds_cleaning": round(time.monotonic() - cleaning, 2),
        "redelivered_windows": redelivered,
        "policies": _policy_reports(app, runs, before),
    }
    _print_report(console, report)
    app.close()
    return report


def _clean(console: Console, app: App, workers: int) -> tuple[dict[str, str], int]:
    """A run for each policy, its workers until idle, then a few windows
    delivered again: the runs' ids and how many windows were redelivered."""
    cleanup = app.cleanup
    assert cleanup is not None
    runs = {
        p.name: cleanup.open_run(p.name, opened_by="demo", actor="demo").run_id
        for p in cleanup.policies
    }
    worker = app.worker(concurrency=workers, until_idle=True, poll=0.05, name="demo-worker")
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    _progress(console, app, runs, thread)
    thread.join()
    redelivered = _redeliver(app, runs, 5)
    again = app.worker(concurrency=1, until_idle=True, poll=0.05, name="demo-redelivery")
    again.run()
    return runs, redelivered


def _policy_reports(
    app: App, runs: dict[str, str], before: dict[str, float]
) -> list[dict[str, Any]]:
    """Each policy's line of the report: its run's summary and its watermark
    before and after."""
    cleanup = app.cleanup
    assert cleanup is not None
    summaries = {name: Status.of(app).run_summary(rid) for name, rid in runs.items()}
    after = {p.name: cleanup.watermark(p.name) for p in cleanup.policies}
    return [
        {
            "policy": p.name,
            "action": p.action,
            "rows_affected": s["rows_affected"],
            "windows": s["windows_applied"],
            "duplicates_skipped": s["duplicates_skipped"],
            "retries": s["retries"],
            "redelivered": s["redelivered"],
            "dead": s["jobs_dead"],
            "watermark_before_seconds": round(before[p.name], 1),
            "watermark_after_seconds": round(after[p.name], 1),
        }
        for p in cleanup.policies
        if (s := summaries[p.name]) is not None
    ]


def _progress(console: Console, app: App, runs: dict[str, str], thread: threading.Thread) -> None:
    columns = (
        TextColumn("{task.description:<20}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("windows"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        tasks = {name: progress.add_task(name, total=None) for name in runs}
        while True:
            alive = thread.is_alive()
            for name, rid in runs.items():
                s = Status.of(app).run_summary(rid)
                if s is not None:
                    progress.update(
                        tasks[name],
                        total=max(s["jobs_total"], 1),
                        completed=s["jobs_done"] + s["jobs_dead"],
                    )
            if not alive:
                return
            time.sleep(0.1)


def _redeliver(app: App, runs: dict[str, str], per_run: int) -> int:
    """Put a few completed windows back in the queue, as a lost ack would."""
    engine = app.engine
    total = 0
    with engine.transaction() as conn:
        for rid in runs.values():
            cur = conn.execute(
                "update expiry_jobs set state = 'available', run_at = 0, finished_at = null "
                "where id in (select id from expiry_jobs where run_id = ? and handler = 'expiry.window' "
                "and state = 'completed' order by id limit ?)",
                (rid, per_run),
            )
            total += cur.rowcount
    return total


def _print_report(console: Console, report: dict[str, Any]) -> None:
    table = Table(title=f"expiry demo: cleaned in {report['seconds_cleaning']}s")
    for col in (
        "policy",
        "action",
        "rows",
        "windows",
        "duplicates skipped",
        "retries",
        "dead",
        "watermark before",
        "after",
    ):
        table.add_column(col, justify="left" if col in ("policy", "action") else "right")
    for p in report["policies"]:
        table.add_row(
            p["policy"],
            p["action"],
            f"{p['rows_affected']:,}",
            str(p["windows"]),
            str(p["duplicates_skipped"]),
            str(p["retries"]),
            str(p["dead"]),
            format_duration(round(p["watermark_before_seconds"])),
            format_duration(round(p["watermark_after_seconds"])),
        )
    console.print(table)
    console.print(
        f"{report['redelivered_windows']} completed windows were delivered a second time "
        "(as after a lost ack); the ledger turned each into a no-op. "
        # The interpreter that ran the demo: a bare `expiry` may be another
        # program (Debian's passwd package installs /usr/bin/expiry).
        f"Inspect with: {sys.executable} -m expiry --config "
        f"{Path(report['database']).with_suffix('.toml')} status"
    )
