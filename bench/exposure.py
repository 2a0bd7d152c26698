"""What an unauthenticated caller and a busy /metrics cost the server.

    .venv/bin/python bench/exposure.py                     # this checkout
    .venv/bin/python bench/exposure.py --src OTHER/src     # another checkout, side by side

Starts `expiry serve --no-workers` on a scratch SQLite file (the code under
``--src``), then, over loopback:

1. four concurrent POSTs of a 15 MB body without a key, while /v1/health is
   timed every 20 ms (with a key, so that the probes measure the server and
   not the keyless rate limit): each POST's time to its answer and status, /v1/health's
   median and worst latency meanwhile, and the server's peak RSS (VmHWM);
2. /metrics with 100,000 jobs over 500 caller-named queues: the scrape's bytes
   and time, twice (the second within [http] metrics_cache).

Prints one table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BODY = b'{"queue": "q", "message": {"pad": "' + b"x" * 15_000_000 + b'"}}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def seed_jobs(db: Path, jobs: int, queues: int) -> None:
    """Jobs straight into expiry's table (as 100k publishes would leave them)."""
    conn = sqlite3.connect(db)
    now = time.time()
    conn.executemany(
        "insert into expiry_jobs (queue, handler, key, payload, state, run_at, created_at,"
        " updated_at) values (?, ?, ?, '{}', 'available', ?, ?, ?)",
        [(f"caller-{i % queues}", "x", f"k{i}", now, now, now) for i in range(jobs)],
    )
    conn.commit()
    conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=str(ROOT / "src"), help="the expiry package's src dir")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="expiry-exposure-"))
    db, port = work / "app.db", free_port()
    (work / "expiry.toml").write_text(
        f'[database]\nurl = "sqlite:///{db}"\n\n[http]\nlisten = "127.0.0.1:{port}"\n'
    )
    env = {**os.environ, "PYTHONPATH": args.src, "EXPIRY_CONFIG": str(work / "expiry.toml")}
    cli = [sys.executable, "-m", "expiry"]
    subprocess.run([*cli, "migrate"], env=env, check=True, capture_output=True)
    key = subprocess.run(
        [*cli, "keys", "create", "bench", "--json"], env=env, check=True, capture_output=True
    ).stdout
    secret = __import__("json").loads(key)["key"]
    seed_jobs(db, 100_000, 500)
    server = subprocess.Popen([*cli, "serve", "--no-workers"], env=env, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/v1/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
        rss_before = peak_rss_mb(server.pid)
        health: list[float] = []
        posts: list[tuple[float, int]] = []
        done = threading.Event()

        auth = {"Authorization": f"Bearer {secret}"}

        def probe() -> None:
            # With a key: the probes measure the server, not the keyless rate limit.
            with httpx.Client(base_url=base, timeout=30, headers=auth) as client:
                while not done.is_set():
                    began = time.perf_counter()
                    client.get("/v1/health")
                    health.append((time.perf_counter() - began) * 1000)
                    time.sleep(0.02)

        def post() -> None:
            began = time.perf_counter()
            try:
                status = httpx.post(
                    f"{base}/v1/queue/publish",
                    content=BODY,
                    headers={"Content-Type": "application/json"},
                    timeout=60,
                ).status_code
            except httpx.HTTPError:
                status = 0  # the server answered and closed before the body was sent
            posts.append((time.perf_counter() - began, status))

        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(0.3)
        senders = [threading.Thread(target=post) for _ in range(4)]
        for thread in senders:
            thread.start()
        for thread in senders:
            thread.join()
        time.sleep(0.3)
        done.set()
        prober.join()
        scrapes = []
        for _ in range(2):
            began = time.perf_counter()
            answer = httpx.get(f"{base}/metrics", timeout=60, headers=auth)
            scrapes.append(((time.perf_counter() - began) * 1000, len(answer.content)))
            assert answer.status_code == 200, answer.text
        print(f"code under test: {args.src}")
        print("four 15 MB POSTs without a key, at once:")
        for seconds, status in posts:
            print(f"  answered {status or 'closed'} in {seconds * 1000:.0f} ms")
        print(
            f"  /v1/health meanwhile: median {statistics.median(health):.1f} ms, "
            f"worst {max(health):.1f} ms ({len(health)} probes)"
        )
        print(
            f"  server peak RSS: {peak_rss_mb(server.pid):.0f} MB (at start-up {rss_before:.0f} MB)"
        )
        print("/metrics with 100,000 jobs in 500 caller-named queues:")
        for i, (ms, size) in enumerate(scrapes, 1):
            print(f"  scrape {i}: {size / 1024:.1f} KB in {ms:.0f} ms")
        return 0
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    sys.exit(main())
