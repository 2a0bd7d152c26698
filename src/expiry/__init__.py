"""expiry: durable, idempotent retention cleanup for PostgreSQL, MySQL/MariaDB and SQLite.

The public API. Everything else is an implementation detail.
"""

from __future__ import annotations

from .app import App, Once
from .config import Config, Policy, load_config, parse_config
from .engines import Engine, open_engine
from .errors import (
    AlreadyApplied,
    ConfigError,
    DatabaseUnavailable,
    ExpiryError,
    JobError,
    LeaseLost,
    MigrationError,
    PayloadTooLarge,
    PermanentError,
    SchemaError,
    Snooze,
    TransientError,
)
from .queue.jobs import Queue, new_job
from .queue.runner import WorkerSettings
from .queue.worker import Worker
from .types import EnqueueResult, Job, JobState, NewJob, QueueStats

__version__ = "0.1.0"

__all__ = [
    "AlreadyApplied",
    "App",
    "Config",
    "ConfigError",
    "DatabaseUnavailable",
    "Engine",
    "EnqueueResult",
    "ExpiryError",
    "Job",
    "JobError",
    "JobState",
    "LeaseLost",
    "MigrationError",
    "NewJob",
    "Once",
    "PayloadTooLarge",
    "PermanentError",
    "Policy",
    "Queue",
    "QueueStats",
    "SchemaError",
    "Snooze",
    "TransientError",
    "Worker",
    "WorkerSettings",
    "load_config",
    "new_job",
    "open_engine",
    "parse_config",
]
