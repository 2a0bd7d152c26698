"""The MySQL and MariaDB engine."""

from .engine import MySQLEngine

__all__ = ["MySQLEngine"]
