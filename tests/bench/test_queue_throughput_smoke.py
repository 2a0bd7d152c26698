"""The queue benchmark runs end to end (performance is not asserted here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ADMIN_URL = os.environ.get(
    "EXPIRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "queue_throughput.py"


@pytest.mark.timeout(600)
def test_queue_throughput_quick_run_prints_the_table() -> None:
    env = {**os.environ, "EXPIRY_BENCH_ADMIN_URL": ADMIN_URL}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "vs fastest peer" in out and "jobs/s" in out
    for line in (
        "drain    expiry ",
        "drain    expiry/group ",
        "drain    expiry/ack ",
        "drain    expiry/batched ",
        "drain    floor: commit/job ",
        "drain    procrastinate ",
        "enqueue  expiry ",
        "enqueue  procrastinate ",
    ):
        assert line in out, out
    assert "NOT EXACTLY ONCE" not in out, out
    assert "latency expiry, postgres" in out and "latency expiry, sqlite" in out
    assert "targets (reported, not asserted)" in out
