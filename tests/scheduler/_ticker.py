"""One scheduler in its own OS process, ticking over a fake clock shared by file.

    python _ticker.py CONFIG_JSON CLOCK_FILE READY_FILE

CONFIG_JSON is the config as JSON (for expiry.config.parse_config). CLOCK_FILE
holds the fake time as ISO-8601, or ``stop``; the test replaces it atomically as
its clock moves on. The process ticks as fast as it can, re-reading the clock
before every tick, writes READY_FILE after its first tick (and READY_FILE with the
suffix ``.fired`` once it has claimed a fire), and on ``stop`` prints
the fires it claimed as JSON lines ({"policy", "fire_time", "run_id"}) and exits 0.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

from expiry.app import App
from expiry.config import parse_config
from expiry.cron.scheduler import Fire
from expiry.times import format_time, parse_time


def main() -> int:
    config_json, clock_file, ready_file = sys.argv[1:4]
    app = App(config=parse_config(json.loads(config_json)))
    clock = Path(clock_file)
    now: list[datetime] = [parse_time(clock.read_text().strip())]
    scheduler = app.scheduler(clock=lambda: now[0])
    fired: list[Fire] = []
    ready = False
    while True:
        text = clock.read_text().strip()
        if text == "stop":
            break
        now[0] = parse_time(text)
        claimed = scheduler.tick()
        if claimed:
            fired += claimed
            Path(ready_file).with_suffix(".fired").touch()  # the test can see who fired
        if not ready:
            Path(ready_file).write_text("ready")
            ready = True
    for fire in fired:
        print(
            json.dumps(
                {
                    "policy": fire.policy,
                    "fire_time": format_time(fire.fire_time),
                    "run_id": fire.run_id,
                }
            )
        )
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
