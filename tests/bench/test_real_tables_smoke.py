"""The real-tables benchmark runs end to end on small tables (its figures are not
asserted here; every method must still delete exactly the expired rows)."""

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
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "real_tables.py"

METHODS = {
    "django": ("single", "batched-in", "expiry"),
    "random-ids": ("single", "expiry"),
    "partitions": ("by-hand", "expiry", "expiry-rows"),
    "keep-last": ("per-group", "window-fn", "expiry"),
}


@pytest.mark.timeout(400)
def test_real_tables_quick_run_prints_every_scenario_and_method() -> None:
    env = {**os.environ, "EXPIRY_BENCH_ADMIN_URL": ADMIN_URL}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # "<scenario>: <what was built>; <N> expired", after the table.
    expired = {
        m[1]: int(m[2].replace(",", ""))
        for m in re.finditer(r"^([a-z-]+): .*; ([\d,]+) expired$", out, re.MULTILINE)
    }
    assert expired.get("django") == 10_000, out  # 20,000 sessions, half of them expired
    assert expired.get("random-ids") == 1_000, out  # 100,000 tokens, 1% expired
    # 12,000 events, 1,000 a month: ten whole months and part of this one.
    assert 10_000 <= expired.get("partitions", 0) < 11_000, out
    # 100,000 events of 1,000 users: the rows past each user's 20 newest that are
    # older than 30 days (the fifth of users idle for 30 days keep their 20).
    assert 40_000 < expired.get("keep-last", 0) < 80_000, out
    rows = [line.split() for line in out.splitlines()]
    for scenario, methods in METHODS.items():
        for method in methods:
            found = [r for r in rows if r[:3] == [scenario, method, "1"]]
            assert found, f"no {scenario} {method} line in:\n{out}"
            assert found[0][3] == f"{expired[scenario]:,}", found[0]
    assert "targets (printed, not asserted)" in out
    assert re.search(r"random-ids\s+jobs planned <= ceil", out), out
