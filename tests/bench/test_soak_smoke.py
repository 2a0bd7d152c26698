"""The soak runs end to end in a short form: real scheduler, workers and API
processes under load, then the invariant check (figures are not asserted here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ADMIN_URL = os.environ.get(
    "EXPIRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
PROCESSES = ("scheduler", "serve", "worker-1", "worker-2", "worker-3", "worker-4")


@pytest.mark.timeout(600)
def test_soak_quick_run_holds_the_invariants_and_prints_the_figures() -> None:
    env = {**os.environ, "EXPIRY_BENCH_ADMIN_URL": ADMIN_URL}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--duration", "30"],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "all invariants hold" in out, out
    assert "VIOLATION" not in out and "BROKEN" not in out, out

    # A line every 5 s from 0 to 30 s, and one after the final run.
    ticks = [
        line for line in out.splitlines() if re.match(r"^\s+\d+s\s+[\d.]+s\s+\d+\s+[\d.]+s", line)
    ]
    assert len(ticks) >= 7, out
    assert "watermark" in out and "oldest due" in out and "p99 ms" in out, out
    assert re.search(r"after the final run 0\.0 s", out), out
    assert "expiry status --json: watermark 0.0 s" in out, out

    # Every process was sampled and exited 0 on SIGTERM.
    codes = ", ".join(f"{name} 0" for name in PROCESSES)
    assert f"SIGTERM: exit codes {codes}" in out, out
    for name in PROCESSES:
        assert re.search(rf"^\s+{name}\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s", out, re.M), out

    # The load really ran: rows fed and deleted, API publishes acknowledged.
    published = re.search(r"API: ([\d,]+) publishes acknowledged", out)
    assert published and int(published.group(1).replace(",", "")) > 100, out
    deleted = re.search(r"cleanup: ([\d,]+) rows deleted", out)
    assert deleted and int(deleted.group(1).replace(",", "")) > 12_000, out
    assert "target (reported, not asserted)" in out, out
