"""Retry timing: capped exponential backoff with full jitter. Pure.

The delay before retry n (n = the attempt that just failed, from 1) is drawn
uniformly from [0, min(cap, base * 2**n)]. Full jitter spreads a burst of
failures (a lock held by live traffic, a restart) so the retries do not arrive
together. ``schedule`` prints the table published in the docs.
"""

from __future__ import annotations

import random

from ..defaults import BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS


def ceiling(
    attempt: int, base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_CAP_SECONDS
) -> float:
    """The largest delay retry ``attempt`` may wait."""
    return min(cap, base * 2.0 ** max(0, min(attempt, 62)))


def backoff(
    attempt: int,
    rng: random.Random | None = None,
    base: float = BACKOFF_BASE_SECONDS,
    cap: float = BACKOFF_CAP_SECONDS,
) -> float:
    """Seconds to wait before retrying after ``attempt`` failed."""
    return (rng or random).uniform(0.0, ceiling(attempt, base, cap))


def schedule(
    max_attempts: int, base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_CAP_SECONDS
) -> list[tuple[int, float]]:
    """[(failed attempt, longest wait before the next)] for every retry."""
    return [(n, ceiling(n, base, cap)) for n in range(1, max_attempts)]
