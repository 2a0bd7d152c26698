"""The chaos soak runs end to end in its short form: a private PostgreSQL cluster,
real workers, scheduler and API under load while every kind of fault is dealt,
then the invariant check. The invariants are asserted (the exit status), the
watermark's target is not.

On the code of issue 36's start this fails, and that is its point: two runs of
one policy whose planning jobs each wait for the other stay open for ever once
the workers were down across two fires, and a worker killed by a second SIGTERM
exits -15."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"
INVARIANTS = (
    "live rows deleted before their run's cutoff: 0",
    "protected rows deleted: 0",
    "windows applied twice: 0",
    "rows gone vs the ledger:",
    "rows left below the last finished run's cutoff: 0",
    "jobs lost (not completed, dead with a reason, or cancelled): 0",
    "runs left open or stalled: 0",
    "dead jobs: 0",
    "processes not exited 0 within 30 s of SIGTERM: 0",
)


@pytest.mark.timeout(480)
def test_chaos_quick_run_holds_the_invariants_under_every_fault() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--seed", "1"],
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    out = done.stdout
    assert "watermark, period P = 10 s (from " in out, out + done.stderr
    assert re.search(r"outside outages: p50 [\d.]+ / p99 [\d.]+ / max [\d.]+ s", out), out
    assert "target (printed, not asserted): watermark p99 outside outages" in out, out
    faults = re.search(r"faults injected: (\d+) \(", out)
    assert faults and int(faults.group(1)) >= 8, out
    assert re.search(r"outages: \d+ \(database down \d+ times", out), out
    failing = [line for line in out.splitlines() if line.startswith("  FAIL")]
    assert not failing, "\n".join(failing) + "\n\n" + out
    for line in INVARIANTS:
        assert re.search(rf"^  ok    {re.escape(line)}", out, re.M), f"{line!r} missing:\n{out}"
    assert "chaos: all invariants hold" in out, out
    assert done.returncode == 0, out + done.stderr
