"""The PostgreSQL engine."""

from .engine import PostgresEngine

__all__ = ["PostgresEngine"]
