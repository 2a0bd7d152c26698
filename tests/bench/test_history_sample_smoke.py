"""The history benchmark runs end to end (its figures are not asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "history_sample.py"


@pytest.mark.timeout(300)
def test_history_sample_prints_its_figures() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--policies",
            "2",
            "--rows",
            "1000",
            "--jobs",
            "1000",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "round 1: the minute's sample" in done.stdout, done.stdout
    assert "(2 kept)" in done.stdout and "(0 kept)" in done.stdout, done.stdout
