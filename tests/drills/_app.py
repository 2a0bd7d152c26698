"""A test-only ``--app`` for `expiry worker`: the config's built-in policy handlers,
with the window handler's ``after`` hook wrapped to SIGKILL the worker with some
probability. ``after`` runs once the window's transaction has committed and
before the worker's own bookkeeping (pacing, finishing the run), so these kills
land exactly between commit and bookkeeping. With DRILL_KILL_BEFORE_WINDOW the
handler itself is wrapped too, to SIGKILL the worker with that probability once
it has claimed a window and before it works on it: a claim abandoned for sure,
which random kills from outside hit only when they land in the short time a
paced worker holds one.

    EXPIRY_CONFIG=expiry.toml DRILL_KILL_AFTER_COMMIT=0.02 \
        expiry worker --app drills._app:app
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sys
from typing import Any

from expiry import App
from expiry.cleanup.runs import WINDOW
from expiry.types import Job

app = App.from_config()

_window = app.handlers[WINDOW]
_chance = float(os.environ.get("DRILL_KILL_AFTER_COMMIT", "0") or 0)
_marks = os.environ.get("DRILL_MARKS")
_chance_before = float(os.environ.get("DRILL_KILL_BEFORE_WINDOW", "0") or 0)
_marks_before = os.environ.get("DRILL_MARKS_BEFORE")


def _maybe_die(chance: float, marks: str | None, job: Job) -> None:
    """SIGKILL this worker with probability ``chance``, noting the job in ``marks``."""
    if chance and random.random() < chance:
        if marks:
            with open(marks, "a") as out:
                out.write(f"{os.getpid()} {job.key}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _maybe_die_then_window(job: Job, *args: Any) -> Any:
    _maybe_die(_chance_before, _marks_before, job)
    return _window.fn(job, *args)


def _after_then_maybe_die(job: Job, result: Any, seconds: float) -> None:
    _maybe_die(_chance, _marks, job)
    assert _window.after is not None
    _window.after(job, result, seconds)


app.handlers[WINDOW] = dataclasses.replace(
    _window,
    fn=_maybe_die_then_window if _chance_before else _window.fn,
    after=_after_then_maybe_die,
)
