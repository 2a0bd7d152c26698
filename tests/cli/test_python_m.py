"""`python -m expiry` is the same command as `expiry`, whatever is first on the PATH."""

from __future__ import annotations

import subprocess
import sys

from test_cli import environment


def test_python_m_expiry_runs_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "expiry", "plan", "--help"],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: expiry plan")
