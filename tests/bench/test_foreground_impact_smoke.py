"""The foreground-impact benchmark runs end to end on a small table (its figures
are not asserted here; every scenario must still delete exactly the expired rows)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ADMIN_URL = os.environ.get(
    "EXPIRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "foreground_impact.py"


def test_foreground_impact_small_run_prints_every_scenario() -> None:
    env = {**os.environ, "EXPIRY_BENCH_ADMIN_URL": ADMIN_URL}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", "20000", "--duration", "1", "--lead", "0.3"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name in (
        "baseline",
        "defaults",
        "budget",
        "hand-loop",
        "hand-loop-50x",
        "unthrottled",
        "naive DELETE",
    ):
        assert f"round 1 {name}" in done.stdout, done.stdout
    assert "target (reported, not asserted)" in done.stdout
    assert (
        "target: budget p99" in done.stdout and "target: defaults p99 <= hand-loop" in done.stdout
    )
