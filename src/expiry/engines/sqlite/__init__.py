"""The SQLite engine."""

from .engine import SQLiteEngine

__all__ = ["SQLiteEngine"]
