"""A worker or a claimer in its own OS process, for the queue tests.

    python _proc.py worker URL --lease 1 [--until-idle] [--marks DIR] [--ack-delay S]
    python _proc.py claimer URL --go FILE --out FILE

``worker`` builds an App on URL with the test handlers below and runs
expiry.worker.Worker until it stops; its exit code is the worker's.
``claimer`` waits for the file ``--go`` to appear (so that every claimer starts
at once), then claims and completes jobs until none is left, and writes the ids
it claimed to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from expiry.app import App
from expiry.engines import open_engine
from expiry.queue.jobs import Queue
from expiry.types import Job, JobState


def mark(marks: Path | None, job: Job) -> None:
    """Leave a file that says this process started ``job`` (the test waits on it)."""
    if marks is not None:
        (marks / f"{job.key}.{job.attempt}.started").write_text(str(os.getpid()))


def build_app(url: str, marks: Path | None) -> App:
    app = App(url)

    @app.handler("slow")
    def slow(job: Job, tx: Any) -> None:
        mark(marks, job)
        time.sleep(float(job.payload.get("seconds", 1.5)))

    @app.handler("sleep_forever")
    def sleep_forever(job: Job, tx: Any) -> None:
        mark(marks, job)
        while True:
            time.sleep(60)

    @app.handler("kill_self")
    def kill_self(job: Job, tx: Any) -> None:
        mark(marks, job)
        os.kill(os.getpid(), signal.SIGKILL)

    @app.handler("batched", transactional=False, batched_ack=True)
    def batched(job: Job) -> None:
        mark(marks, job)

    return app


def run_worker(args: argparse.Namespace) -> int:
    app = build_app(args.url, Path(args.marks) if args.marks else None)
    worker = app.worker(
        lease=args.lease,
        batch=args.batch,
        poll=0.05,
        rescue_every=args.rescue_every,
        until_idle=args.until_idle,
        ack_delay=args.ack_delay,
    )
    try:
        return worker.run()
    finally:
        app.close()


def run_claimer(args: argparse.Namespace) -> int:
    engine = open_engine(args.url)
    queue = Queue(engine)
    rng = random.Random(os.getpid())
    go = Path(args.go)
    while not go.exists():
        time.sleep(0.005)
    claimed: list[int] = []
    try:
        while True:
            jobs = queue.claim(rng.randint(1, 8), lease=600, owner=f"claimer-{os.getpid()}")
            if not jobs:
                # Empty can mean "the rest are locked by a claim in flight"
                # (SKIP LOCKED): stop only once nothing is waiting at all.
                if not engine.job_list(JobState.AVAILABLE, limit=1):
                    break
                continue
            claimed.extend(job.id for job in jobs)
            for job in jobs:
                queue.complete(job)
    finally:
        engine.close()
    Path(args.out).write_text(json.dumps(claimed))
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    worker = sub.add_parser("worker")
    worker.add_argument("url")
    worker.add_argument("--lease", type=float, default=60.0)
    worker.add_argument("--batch", type=int, default=16)
    worker.add_argument("--rescue-every", type=float, default=0.2)
    worker.add_argument("--until-idle", action="store_true")
    worker.add_argument("--marks")
    worker.add_argument("--ack-delay", type=float, default=0.1)
    claimer = sub.add_parser("claimer")
    claimer.add_argument("url")
    claimer.add_argument("--go", required=True)
    claimer.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    return run_worker(args) if args.mode == "worker" else run_claimer(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
