"""The exposure benchmark runs end to end (its figures are not asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "exposure.py"


@pytest.mark.timeout(300)
def test_exposure_prints_its_figures() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("answered 401") == 4, done.stdout
    assert "server peak RSS" in done.stdout and "scrape 2" in done.stdout
