"""How a command opens the App: ``reading`` for one that only reads (read_only:
it creates and alters nothing, not even an SQLite file), ``migrated`` for one
that writes; ``--app`` loads the user's own App."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from datetime import datetime
from pathlib import Path

from ..app import App
from ..cleanup.service import Cleanup
from ..config import config_path
from ..errors import ConfigError
from ..times import parse_time

logger = logging.getLogger("expiry.cli")


def open_app(
    args: argparse.Namespace, *, need_config: bool = False, read_only: bool = False
) -> App:
    if args.database_url:
        os.environ["EXPIRY_DATABASE_URL"] = args.database_url
    path = config_path(Path(args.config) if args.config else None)
    if path.exists():
        return App.from_config(path, read_only=read_only)
    if need_config or not args.database_url:
        raise ConfigError(f"no config file at {path}: pass --config PATH or set EXPIRY_CONFIG")
    return App(args.database_url, read_only=read_only)


def migrated(args: argparse.Namespace, *, need_config: bool = False) -> App:
    """``open_app`` for a command that writes: expiry's own tables created or
    upgraded first."""
    app = open_app(args, need_config=need_config)
    app.migrate()
    return app


def reading(args: argparse.Namespace, *, need_config: bool = False) -> App:
    """``open_app`` for a command that only reads (check, plan, evidence, trigger
    --dry-run, status, runs, runs show, dlq list and show, keys list): it
    creates and alters nothing, an SQLite file included; where expiry's own
    tables are not there yet, reading them raises MigrationError (exit 2)
    saying to run `expiry migrate`."""
    return open_app(args, need_config=need_config, read_only=True)


def load_app(spec: str) -> App:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--app {spec!r}: write MODULE:ATTR, e.g. myapp.cleanup:app")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"--app {spec!r}: {module_name}.{attr} is not an expiry App")
    return app


def cleanup_of(app: App) -> Cleanup:
    """The App's policies; an App opened with ``need_config`` always has them."""
    if app.cleanup is None:
        raise ConfigError("no policies: this command needs a config file (--config PATH)")
    return app.cleanup


def log_warnings(app: App) -> None:
    """Check every policy against the live schema before running: one that
    fits with doubts is logged; one that does not fit is quarantined (logged
    as an error, checked again on its next use) and the others run. Then the
    holds placed or lifted since the audit log last said are audited."""
    if app.cleanup is not None:
        warnings, _ = app.cleanup.check_all()  # each quarantine is logged once
        for warning in warnings:
            logger.warning(warning)
        app.cleanup.record_holds()


def parse_cutoff(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError:
        raise ConfigError(f"--cutoff {text!r} is not ISO-8601, e.g. 2026-11-30T00:00:00Z") from None
