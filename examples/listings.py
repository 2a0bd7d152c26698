"""A custom cleanup handler: expire marketplace listings at a given revision.

Run it against the demo database (or any SQLite, PostgreSQL or MySQL database with a listings table):

    EXPIRY_DATABASE_URL=sqlite:///listings.db python examples/listings.py
    EXPIRY_DATABASE_URL=sqlite:///listings.db expiry worker --app examples.listings:app --until-idle

Each job carries identifiers only (listing id and revision). ``app.once`` records
the operation id in the ledger inside the job's own transaction, so a second
delivery of the same job, or another job for the same listing revision, changes
nothing.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from expiry import App, Job

app = App(os.environ.get("EXPIRY_DATABASE_URL", "sqlite:///listings.db"))

# tx.execute takes the driver's own parameter style.
EXPIRE = {
    "sqlite": "update listings set state = 'expired' where id = ? and revision = ?",
    "postgres": "update listings set state = 'expired' where id = %s and revision = %s",
    "mysql": "update listings set state = 'expired' where id = %s and revision = %s",
}


@app.handler("expire_listing")
def expire_listing(job: Job, tx: Any) -> None:
    listing, revision = job.payload["listing_id"], job.payload["revision"]
    with app.once(tx, f"expire-listing:{listing}:revision-{revision}"):
        tx.execute(EXPIRE[app.engine.dialect], (listing, revision))


def main() -> None:
    path = app.url.removeprefix("sqlite:///") if app.url else "listings.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "create table if not exists listings "
            "(id integer primary key, revision integer not null, state text not null)"
        )
        conn.executemany(
            "insert or ignore into listings values (?, ?, 'live')", [(i, 1) for i in range(1, 11)]
        )
    app.migrate()
    for listing in range(1, 11):
        # The same key twice: the second is not enqueued again.
        for _ in range(2):
            app.queue.enqueue(
                "expire_listing",
                {"listing_id": listing, "revision": 1},
                run_at=0,
                key=f"expire-listing:{listing}:1",
            )
    print("enqueued 10 jobs; run: expiry worker --app examples.listings:app --until-idle")


if __name__ == "__main__":
    main()
