"""Windows: how a run splits a policy's expired rows, and how each is named.

Two strategies, chosen once per run (Target.choose) and carried by its jobs:

* ``key``: windows ``(lo, hi]`` over an integer key, ``window`` keys wide; the
  planner jumps over empty stretches of the key space. Cheapest where expired
  keys are dense (serial ids, rows inserted in time order).
* ``time``: windows over the timestamp's order, each holding ``window``
  candidates: ``(lower, upper]`` between two positions ``(timestamp, tie)``,
  where the tie is the key (or, on SQLite, the rowid that every index on the
  timestamp already ends with), so rows sharing one timestamp are split too.
  Any key type works (text, UUID, part of a composite key), and the number of
  windows follows the expired rows, never the key range.

* ``blocks`` (PostgreSQL): windows over the heap's blocks, each about
  ``window`` candidates wide by the planner's statistics, read in physical
  order (a TID range scan). For tables where a large share of the rows is
  expired and the timestamp does not follow the heap's order (sessions
  inserted at random expiry dates): each window then reads its own pages once,
  where an index-ordered window would visit a page per row. Planned by
  arithmetic, without a scan; the last window is open-ended.

A window's job key is ``<run id>:<lower bound>``: an integer for key windows,
a position for time windows (``(start)`` for a run's first). Windows of a run
cover disjoint ranges, so each ledger row books its own rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

KEY = "key"
TIME = "time"
BLOCKS = "blocks"

BLOCK = 65536
"""A row address as one integer: block * BLOCK + item."""
LAST_ADDRESS = (2**32 - 1) * BLOCK + (BLOCK - 1)
"""Past every row: the upper bound of a run's last block window."""

BLOCKS_SHARE = 0.2
"""Block windows need at least this share of the table's rows expired (by
the planner's estimate): with fewer, index-ordered windows read less."""

BLOCKS_CORRELATION = 0.5
"""... and the timestamp's physical correlation under this (in absolute
value): a timestamp that follows the heap already gives time windows
contiguous pages."""

BLOCKS_SPAN = 0.8
"""Dense expired keys take block windows instead where their range spans at
least this share of the table's rows (the planner's estimate): the block
windows then read about the pages the key windows would, in heap order, with
no index (a TID range scan: 5.3 against 8.6 ms for one window's 8,000 rows
here, docs/performance.md)."""

DENSE_ENOUGH = 0.25
"""Key windows are chosen only where at least this share of the expired key
range holds candidates: sparser, each key window would hold under a quarter of
``window`` rows, and time windows need fewer jobs."""

MAX_KEY_TEXT = 120
"""A position longer than this is named by its digest in job keys."""

Position = tuple[Any, Any]
"""(timestamp, tie) as the run's planner read it, in a form JSON carries."""


@dataclass(frozen=True)
class Strategy:
    name: str  # KEY | TIME
    reason: str
    bounds: tuple[int, int] | None = None
    """The expired keys' range, when the choice read it (key windows chosen
    from the data): the planner starts from it rather than reading it again."""

    def describe(self) -> str:
        return f"{'block' if self.name == BLOCKS else self.name} windows: {self.reason}"


@dataclass(frozen=True)
class Span:
    """One window's bounds: integer keys (lo, hi], or positions (lower, upper]
    in the (timestamp, tie) order, lower None for a run's first window."""

    strategy: str
    lo: Any
    hi: Any

    @classmethod
    def keys(cls, lo: int, hi: int) -> Span:
        return cls(KEY, lo, hi)

    @classmethod
    def positions(cls, lower: Position | None, upper: Position) -> Span:
        return cls(TIME, None if lower is None else tuple(lower), tuple(upper))

    @classmethod
    def blocks(cls, lo: int, hi: int) -> Span:
        return cls(BLOCKS, lo, hi)

    @classmethod
    def of(cls, payload: dict[str, Any]) -> Span:
        """The span a window job's payload carries."""
        if payload.get("windows") == BLOCKS:
            return cls.blocks(int(payload["lo"]), int(payload["hi"]))
        if payload.get("windows") == TIME:
            lower = payload.get("after")
            return cls.positions(None if lower is None else tuple(lower), tuple(payload["upto"]))
        return cls.keys(int(payload["lo"]), int(payload["hi"]))

    def payload(self, *, windows: bool = True) -> dict[str, Any]:
        """The bounds as a job carries them (with ``windows``, the strategy's
        marker that time windows need)."""
        if self.strategy == TIME:
            after = None if self.lo is None else list(self.lo)
            marker = {"windows": TIME} if windows else {}
            return marker | {"after": after, "upto": list(self.hi)}
        if self.strategy == BLOCKS and windows:
            return {"windows": BLOCKS, "lo": self.lo, "hi": self.hi}
        return {"lo": self.lo, "hi": self.hi}

    def split(self, middle: Any) -> tuple[Span, Span]:
        """The two spans either side of ``middle`` (a key or a position inside)."""
        if self.strategy == TIME:
            return Span.positions(self.lo, middle), Span.positions(middle, self.hi)
        return Span(self.strategy, self.lo, middle), Span(self.strategy, middle, self.hi)

    def job_key(self, run_id: str) -> str:
        """The window's job and ledger key: its run and its lower bound."""
        if self.strategy == KEY:
            return f"{run_id}:{self.lo}"
        if self.strategy == BLOCKS:
            return f"{run_id}:row {address(self.lo)}"
        return f"{run_id}:{position_name(self.lo)}"

    def part_key(self, run_id: str) -> str:
        """The key of a part of a window split around a row a foreign key
        protects: both bounds, as halves may share a lower bound with their
        window."""
        if self.strategy == KEY:
            return f"{run_id}:{self.lo}..{self.hi}"
        if self.strategy == BLOCKS:
            return f"{run_id}:rows {address(self.lo)}..{address(self.hi)}"
        return f"{run_id}:{position_name(self.lo)}..{position_name(self.hi)}"

    def describe(self) -> str:
        """The range as the ledger and the pages show it."""
        if self.strategy == KEY:
            return f"keys ({self.lo}, {self.hi}]"
        if self.strategy == BLOCKS:
            upper = "end" if self.hi == LAST_ADDRESS else address(self.hi)
            return f"rows at ({address(self.lo)}, {upper}]"
        lower = "(start" if self.lo is None else f"({self.lo[0]}, {self.lo[1]}"
        return f"positions {lower}) .. ({self.hi[0]}, {self.hi[1]})]"


def position_name(position: Position | None) -> str:
    if position is None:
        return "(start)"
    text = f"({position[0]}, {position[1]})"
    if len(text) > MAX_KEY_TEXT:
        return "(sha1 " + hashlib.sha1(text.encode()).hexdigest() + ")"
    return text


def address(encoded: int) -> str:
    """A row address as PostgreSQL writes a tid: (block,item)."""
    return f"({encoded // BLOCK},{encoded % BLOCK})"
