"""The ``--app`` of bench/soak.py's workers: the config's policies (from EXPIRY_CONFIG)
plus one trivial custom handler for the jobs the soak publishes through the HTTP API.

    EXPIRY_CONFIG=expiry.toml PYTHONPATH=bench \\
        expiry worker --app soak_app:app --queue default --queue soak.note

A published message is ``{"n": N}`` on the queue ``soak.note`` (the queue names the
handler). The handler records its effect, one ``soak_notes`` row, under
``app.once``: a redelivered job finds its ledger row and adds nothing. The table
has no unique key on purpose, so that a double effect would show as two rows.
"""

from __future__ import annotations

import os
from typing import Any

from expiry import App, Job
from expiry.queue.jobs import dedupe_key

NOTE = "soak.note"

app = App.from_config()


@app.handler(NOTE)
def note(job: Job, tx: Any) -> None:
    key = dedupe_key(job.key, job.queue)  # as published (the job key is QUEUE/KEY)
    with app.once(tx, f"{NOTE}:{key}"):
        tx.execute(
            "insert into soak_notes (key, n, pid) values (%s, %s, %s)",
            (key, int(job.payload["n"]), os.getpid()),
        )
