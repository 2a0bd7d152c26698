"""The Galera benchmark runs end to end on a cluster of its own: the loop, the
workers on one node and on all three, each checked by the benchmark's oracle
(performance is not asserted here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "galera.py"


@pytest.mark.timeout(400)
def test_galera_small_run_prints_every_method_against_the_loop() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", "20000", "--window", "1000", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=360,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for method in ("loop", "one node", "three nodes"):
        assert re.search(rf"{method} \d+\.\d\d s \([\d,]+ rows/s", done.stdout), done.stdout
    for method in ("one node", "three nodes"):
        found = re.search(rf"{method}: median (\d+\.\d\d)x the loop", done.stdout)
        assert found is not None and float(found.group(1)) > 0, done.stdout
