"""The cleanup benchmark runs end to end (performance is not asserted here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ADMIN_URL = os.environ.get(
    "EXPIRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "cleanup_throughput.py"


@pytest.mark.timeout(600)
def test_cleanup_throughput_quick_run_prints_the_table() -> None:
    env = {**os.environ, "EXPIRY_BENCH_ADMIN_URL": ADMIN_URL}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--queue-only"],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "rows/s" in out and "expiry/raw" in out and "rows deleted" in out, out
    rows = [line.split() for line in out.splitlines()]
    for engine, methods in (
        ("postgres", ("raw", "expiry", "queue-only")),
        ("sqlite", ("raw", "expiry")),
    ):
        for method in methods:
            found = [r for r in rows if r[:2] == [engine, method] and len(r) >= 9]
            assert found, f"no {engine} {method} row in:\n{out}"
            # 20,000 rows, 80% of them expired: every method deletes exactly these.
            assert found[0][6] == "16,000", out
    assert "target (reported, not asserted)" in out
    assert "queue-only (the queue alone, raw DELETEs as jobs)" in out
