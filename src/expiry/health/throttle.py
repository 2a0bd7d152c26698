"""The throttle's controller: from the database's health signals to a hold or a
rate of windows, per policy. Pure: it is told the time and the readings.

    open ──breach──► held ──all healthy──► open (rate limited) ──...──► open
      └──────────────── any signal past its critical value ──► critical (stays)

A breach holds new windows (in-flight ones finish) and halves the rate the
policy may start windows at (multiplicative decrease, from the rate it was
running at); each healthy second afterwards adds a twentieth of the rate it
ran at before its first breach, or of the rate now if higher (additive
increase, in proportion to the time between checks, so that a short
health_interval does not recover faster), until the next breach or until the
limit is twice what the policy runs at (it binds no more): the rate settles
near the highest the database takes. A critical reading stops the
policy until an operator resumes it (``reset``). Held and critical time is
counted by reason.

With a ``start_rate`` (slow start, as TCP's), a policy begins at that rate
and doubles it each healthy second until its first breach, so that the
first seconds of a run do not cost the application what the budget is set
to prevent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

OPEN, HELD, CRITICAL = "open", "held", "critical"

DECREASE = 0.5
"""The rate a breach leaves, as a share of the rate before it."""
INCREASE_SHARE = 0.05
"""Each healthy second adds this share of the rate before the first breach
(or of the rate now, if higher)."""
MIN_RATE = 0.2
"""Windows a second the rate never goes below once held: recovery is
measured by running, not by waiting."""
STEP = 0.5
"""The additive increase (windows a second, each healthy second) while the
unthrottled rate is unknown (a breach before the policy's first windows)."""
LONGEST_STEP = 1.0
"""Seconds of increase one check adds at most (a check after a long gap is
one step, not many)."""


@dataclass(frozen=True)
class Change:
    """A state change, worth one log line."""

    state: str
    reason: str | None
    rate: float | None
    detail: str


@dataclass
class Controller:
    """One policy's throttle. ``limits`` and ``critical`` map a signal's name to
    the value past which it holds (or stops) the policy; a reading of a signal
    without a limit is ignored."""

    limits: dict[str, float]
    critical: dict[str, float] = field(default_factory=dict)
    state: str = OPEN
    reason: str | None = None
    rate: float | None = None
    """Windows a second the policy may start; None: no limit."""
    ceiling: float | None = None
    """The rate it ran at before its first breach: the additive increase's unit."""
    throttled: dict[str, float] = field(default_factory=dict)
    """Seconds held or stopped, by reason."""
    start_rate: float | None = None
    """Slow start: the rate a policy begins at, doubled each healthy second
    until its first breach (None: it begins unlimited)."""
    _since: float | None = None
    """The last check (or reset): held time counts from it, and the increase."""
    detail: str | None = None
    """While held or stopped: the reading past its limit, as of the last
    check ("active_backends 6 > 3")."""
    held_since: float | None = None
    """While held or stopped: when it began (the clock ``observe`` is given)."""

    def observe(
        self, now: float, readings: dict[str, float], running_rate: float | None
    ) -> Change | None:
        """Take one check's readings (``running_rate``: windows a second the
        policy has been starting lately, None when unknown); the change of
        state, if any."""
        elapsed = LONGEST_STEP if self._since is None else now - self._since
        step = min(LONGEST_STEP, max(0.0, elapsed))
        self._count(now)
        if self.state == CRITICAL:
            return None
        critical = self._past(readings, self.critical)
        if critical is not None:
            detail = self._describe(critical, readings, self.critical)
            return self._move(now, CRITICAL, critical, detail)
        breached = self._past(readings, self.limits)
        if breached is not None:
            detail = self._describe(breached, readings, self.limits)
            if self.state == OPEN:  # a new breach: multiplicative decrease
                running = [r for r in (self.rate, running_rate) if r]
                before = min(running) if running else self.ceiling
                if self.ceiling is None:
                    self.ceiling = running_rate or before
                self.rate = max(MIN_RATE, (before or MIN_RATE / DECREASE) * DECREASE)
                return self._move(now, HELD, breached, detail)
            if breached != self.reason:
                return self._move(now, HELD, breached, detail)
            self.detail = detail  # the same breach: its reading as of now
            return None
        if self.state == HELD:
            resumed = f"healthy again; resuming at {self.rate:.2f} windows/s"
            return self._move(now, OPEN, None, resumed)
        self._increase(step, running_rate)
        return None

    def _increase(self, step: float, running_rate: float | None) -> None:
        """A healthy check ``step`` seconds after the last, while open."""
        if self.rate is None:
            if self.ceiling is None and self.start_rate is not None:
                self.rate = self.start_rate  # slow start begins
            return
        if running_rate is not None and self.rate >= 2 * running_rate:
            return  # past twice the rate the policy runs at, the limit binds no more
        if self.ceiling is None and self.start_rate is not None:  # slow start
            self.rate *= 2**step
        elif self.ceiling is None:
            self.rate += STEP * step
        else:  # additive increase
            self.rate += max(self.ceiling, self.rate) * INCREASE_SHARE * step

    def reset(self, now: float) -> Change | None:
        """An operator resumed the policy: a critical stop ends, the rate stays."""
        self._count(now)
        if self.state != CRITICAL:
            return None
        return self._move(now, OPEN, None, "resumed by an operator")

    @property
    def holding(self) -> bool:
        return self.state != OPEN

    def throttled_at(self, now: float) -> dict[str, float]:
        """Seconds held or stopped by reason, the current stretch counted to ``now``."""
        out = dict(self.throttled)
        if self.reason is not None and self._since is not None:
            out[self.reason] = out.get(self.reason, 0.0) + max(0.0, now - self._since)
        return out

    def _count(self, now: float) -> None:
        if self._since is not None and self.reason is not None:
            self.throttled[self.reason] = self.throttled.get(self.reason, 0.0) + max(
                0.0, now - self._since
            )
        self._since = now

    def _move(self, now: float, state: str, reason: str | None, detail: str) -> Change:
        if state == OPEN:
            self.detail = self.held_since = None
        else:
            self.detail = detail
            if self.state == OPEN:  # a hold begins; a change of reason goes on holding
                self.held_since = now
        self.state, self.reason = state, reason
        return Change(state, reason, self.rate, detail)

    def held_for(self, now: float) -> float | None:
        """Seconds the current hold (or stop) has lasted; None while open."""
        return None if self.held_since is None else max(0.0, now - self.held_since)

    @staticmethod
    def _past(readings: dict[str, float], limits: dict[str, float]) -> str | None:
        """The first signal (in the limits' order) whose reading is past its limit."""
        for name, limit in limits.items():
            value = readings.get(name)
            if value is not None and not math.isnan(value) and value > limit:
                return name
        return None

    @staticmethod
    def _describe(name: str, readings: dict[str, float], limits: dict[str, float]) -> str:
        return f"{name} {readings[name]:g} > {limits[name]:g}"
