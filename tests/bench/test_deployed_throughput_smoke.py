"""The deployed-form cleanup benchmark runs end to end: an idle `expiry worker`
process, `expiry trigger --wait`, the loop beside it, under two pacings, each
checked by the benchmark's own oracle (performance is not asserted here)."""

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
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "deployed_throughput.py"


@pytest.mark.timeout(600)
def test_deployed_throughput_small_run_prints_each_pacing_against_the_loop() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--rows",
            "20000",
            "--window",
            "1000",
            "--rounds",
            "2",
            "--connections",
            "1",
            "--pacing",
            "zero,shipped",
            "--baseline",
            "loop,single",
            "--admin-url",
            ADMIN_URL,
        ],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for each in ("expiry/zero", "expiry/shipped", "shipped/zero", "expiry/zero/single"):
        found = re.search(rf"N=1: median {each} (\d+\.\d\d)x", out)
        assert found is not None and float(found.group(1)) > 0, out
    assert "FAIL" not in out + done.stderr


@pytest.mark.timeout(300)
def test_deployed_throughput_on_a_text_key_runs_against_one_delete() -> None:
    """Django's text key: no integer windows for the loop, so the baseline is one
    unbounded DELETE; the bench's oracle checks what expiry left."""
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *("--rows", "20000", "--window", "2000", "--rounds", "1"),
            *("--connections", "2", "--key", "text", "--admin-url", ADMIN_URL),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"N=2: median expiry/zero/single (\d+\.\d\d)x", done.stdout)
    assert found is not None and float(found.group(1)) > 0, done.stdout
    assert "text key" in done.stdout and "FAIL" not in done.stdout + done.stderr
