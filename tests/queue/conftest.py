"""Fixtures for the queue tests: a Queue with a seeded RNG over the test engine."""

from __future__ import annotations

import random

import pytest

from expiry.engines import Engine
from expiry.queue.jobs import Queue


@pytest.fixture
def queue(engine: Engine) -> Queue:
    return Queue(engine, rng=random.Random(0))
