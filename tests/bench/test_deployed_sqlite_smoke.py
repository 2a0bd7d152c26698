"""The SQLite deployed-form benchmark runs end to end: an idle `expiry worker`
process on a file, `expiry trigger --cutoff C --wait`, the loop beside it, each
checked by the benchmark's oracle (performance is not asserted here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "deployed_sqlite.py"


@pytest.mark.timeout(300)
def test_deployed_sqlite_small_run_prints_expiry_against_the_loop() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", "20000", "--window", "1000", "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for method in ("loop", "expiry"):  # each round ran both, every row checked
        assert len(re.findall(rf"round \d {method} +16,000 rows", done.stdout)) == 2, done.stdout
    found = re.search(r"expiry against the loop: median (\d+\.\d\d)x", done.stdout)
    assert found is not None and float(found.group(1)) > 0, done.stdout
