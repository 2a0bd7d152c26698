"""Failure drills: the short forms CI runs, or the long forms.

    .venv/bin/python bench/drills.py                 # the CI forms (tests/drills), with their figures
    .venv/bin/python bench/drills.py --long          # the long forms: 5,000,000 rows and 500 kills, ...
    .venv/bin/python bench/drills.py --long -k crash # one drill (pytest -k expression)

Each drill is a test in tests/drills; EXPIRY_DRILL_LONG=1 switches them to their
long scale (see each module's ``scale(ci, long)`` constants):

    worker crashes    1,000,000 rows, 50 kills      ->  5,000,000 rows, 500 kills
    database restart    150,000 rows, 1 restart     ->  3,000,000 rows, 5 restarts
    lock contention     40,000 rows                 ->  1,000,000 rows
    revival race        60,000 rows                 ->  2,000,000 rows
    duplicate storm     20,000 rows                 ->  1,000,000 rows
    read-only target    20,000 rows                 ->    500,000 rows
    poison work, clock skew: the same in both forms

Every drill ends with tests/drills/_invariants.py's checker. The database-restart
drill restarts the local PostgreSQL cluster (pg_ctlcluster 15 main): do not run
it on a server other people are using.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="run the long forms")
    parser.add_argument("-k", dest="select", help="only drills matching this pytest -k expression")
    parser.add_argument(
        "--timeout", type=int, default=0, help="seconds per drill (default: 300, long: 7200)"
    )
    args = parser.parse_args()
    env = {**os.environ, "EXPIRY_DRILL_LONG": "1" if args.long else "0"}
    timeout = args.timeout or (7200 if args.long else 300)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests/drills",
        "-s",
        "-p",
        "no:cacheprovider",
        "-o",
        f"timeout={timeout}",
        "--durations=0",
    ]
    if args.select:
        command += ["-k", args.select]
    print(("long" if args.long else "CI") + " forms: " + " ".join(command[2:]), flush=True)
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
