"""POST /v1/cleanup/trigger with a non-zero retain: the run's cutoff is the
database's now() minus retain, so rows that expired less than retain ago stay."""

from __future__ import annotations

from datetime import datetime, timedelta
from urllib.parse import quote

from _http_live import Db, Serve

from dialects import dialect

POLICY = "expired-sessions"


def insert(db: Db, first: int, last: int, seconds: float) -> None:
    """Rows first..last that expire ``seconds`` from now (negative: expired)."""
    if db.dialect == "mysql":  # WITH goes after INSERT there: the rows as values
        values = ", ".join(
            f"({i}, utc_timestamp(6) + {dialect('mysql').seconds(seconds)})"
            for i in range(first, last + 1)
        )
        db.execute(f"insert into sessions (id, expires_at) values {values}")
        return
    db.execute(
        "with recursive g(i) as (select cast(%s as bigint) union all"
        " select i + 1 from g where i < %s)"
        f" insert into sessions (id, expires_at) select i, {{now}} + {dialect(db.dialect).seconds('%s')}"
        " from g",
        (first, last, seconds),
    )


def test_trigger_with_retain_keeps_rows_expired_less_than_retain_ago(
    db_url: str, serve: Serve
) -> None:
    live = serve(db_url, policies=({"retain": "1h"},))
    insert(live.db, 1, 100, -7200.0)
    insert(live.db, 101, 200, -1800.0)
    insert(live.db, 201, 250, 86400.0)

    dry = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY, "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert (dry.json()["candidates"], dry.json()["windows"]) == (100, 1)

    real = live.client.post("/v1/cleanup/trigger", json={"policy": POLICY})
    assert real.status_code == 200, real.text
    opened = real.json()
    cutoff = datetime.fromisoformat(opened["cutoff"].replace("Z", "+00:00"))
    assert timedelta(minutes=59) < live.app.engine.now() - cutoff < timedelta(minutes=61)

    assert live.app.worker(until_idle=True, poll=0.05, rescue_every=0.2).run() == 0
    assert live.db.count() == 150
    assert live.db.scalar("select min(id) from sessions") == 101
    run = live.client.get(f"/v1/runs/{quote(opened['run_id'], safe='')}").json()
    assert (run["state"], run["rows_affected"]) == ("finished", 100)
