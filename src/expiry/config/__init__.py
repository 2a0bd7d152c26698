"""Load and validate expiry.toml. A bad config is refused before anything runs,
with the policy, the field, what was wrong and how to fix it.

Path: --config, else EXPIRY_CONFIG, else ./expiry.toml. EXPIRY_DATABASE_URL
overrides [database] url.

The sections' models live beside this module: fields.py (shared checks),
sections.py ([database], [http], [worker], [[replica]], [retention]) and
policy.py ([[policy]], [[hold]]); every name stays importable from here.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError, model_validator

from ..engines.kinds import kind_of
from ..errors import ConfigError
from .fields import Duration, Strict, check_identifier, check_listen, check_zone
from .policy import Hold, Policy, same_table
from .sections import (
    HEALTH_FIELDS,
    DatabaseConfig,
    HealthSettings,
    HttpConfig,
    ReplicaConfig,
    RetentionConfig,
    WorkerConfig,
)

__all__ = [
    "HEALTH_FIELDS",
    "Config",
    "DatabaseConfig",
    "Duration",
    "HealthSettings",
    "Hold",
    "HttpConfig",
    "Policy",
    "ReplicaConfig",
    "RetentionConfig",
    "Strict",
    "WorkerConfig",
    "check_identifier",
    "check_listen",
    "check_zone",
    "config_path",
    "load_config",
    "parse_config",
]


class Config(Strict):
    database: DatabaseConfig
    http: HttpConfig = HttpConfig()
    worker: WorkerConfig = WorkerConfig()
    retention: RetentionConfig = RetentionConfig()
    replica: list[ReplicaConfig] = []
    policy: list[Policy] = []
    hold: list[Hold] = []

    @model_validator(mode="after")
    def _health_defaults(self) -> Config:
        """Each policy's health knobs it does not set come from [worker]."""
        given = self.worker.model_fields_set & set(HEALTH_FIELDS)
        if given:
            policies = []
            for policy in self.policy:
                inherited = {f: getattr(self.worker, f) for f in given - policy.model_fields_set}
                policies.append(policy.model_copy(update=inherited) if inherited else policy)
            object.__setattr__(self, "policy", policies)
        kind = kind_of(self.database.url)
        signals = kind is None or kind.health_signals
        for policy in self.policy:
            for name in ("max_replica_lag", "max_active_backends", "max_dead_tuple_ratio"):
                if not signals and getattr(policy, name) is not None:
                    raise ValueError(
                        f"policy {policy.name!r}: field {name!r}: SQLite has no such signal "
                        "(it has no replicas, backends or vacuum): remove it"
                    )
        for policy in self.policy:
            for name in ("max_flow_control", "critical_flow_control", "max_recv_queue"):
                if kind is not None and not kind.galera and getattr(policy, name) is not None:
                    raise ValueError(
                        f"policy {policy.name!r}: field {name!r} reads a Galera cluster's "
                        f"flow control, and this database is {kind.dialect}: remove it"
                    )
        if kind is not None and not kind.replica and self.replica:
            raise ValueError("[[replica]] is for PostgreSQL standbys; this database is SQLite")
        return self

    @model_validator(mode="after")
    def _timestamp_zones(self) -> Config:
        """Each policy knows [database] timestamp_zone, kept apart from its own
        timestamp_zone: a stated zone on a column that carries its zone is
        refused, the database's default is not applied there (cleanup/target.py)."""
        for policy in self.policy:
            policy._database_zone = self.database.timestamp_zone
        return self

    @model_validator(mode="after")
    def _holds(self) -> Config:
        """Each policy knows the holds on its table. A hold whose table is written
        otherwise than a policy's same-named table (another schema, or the same
        one qualified) is refused: it could leave that policy's rows unheld."""
        seen: set[str] = set()
        for hold in self.hold:
            if hold.name in seen:
                raise ValueError(
                    f"hold {hold.name!r}: field 'name' is used by two holds: rename one"
                )
            seen.add(hold.name)
        for policy in self.policy:
            for hold in self.hold:
                same_name = hold.table.split(".")[-1].lower() == policy.table.split(".")[-1].lower()
                if same_name and not same_table(hold.table, policy.table):
                    raise ValueError(
                        f"hold {hold.name!r}: table {hold.table!r} and policy {policy.name!r}'s "
                        f"table {policy.table!r} may be one table: write it the same way in both"
                    )
            policy._holds = tuple(h for h in self.hold if same_table(h.table, policy.table))
        return self

    @model_validator(mode="after")
    def _unique(self) -> Config:
        seen: set[str] = set()
        for policy in self.policy:
            if policy.name in seen:
                raise ValueError(
                    f"policy {policy.name!r}: field 'name' is used by two policies: "
                    "rename one (names must be unique)"
                )
            seen.add(policy.name)
        return self

    def get_policy(self, name: str) -> Policy:
        for policy in self.policy:
            if policy.name == name:
                return policy
        known = [p.name for p in self.policy]
        hint = difflib.get_close_matches(name, known, n=1)
        suggestion = (
            f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(known) or 'none'}"
        )
        raise ConfigError(f"no policy named {name!r}{suggestion}")


_SECTIONS: dict[str, type[BaseModel]] = {
    "database": DatabaseConfig,
    "http": HttpConfig,
    "worker": WorkerConfig,
    "replica": ReplicaConfig,
    "policy": Policy,
    "hold": Hold,
}


def _located(loc: list[Any], data: dict[str, Any]) -> tuple[str, str, list[Any]]:
    """Where an error is, in the user's words (``policy 'sessions'``,
    ``[worker]``), its section, and the rest of its location."""
    section = str(loc[0]) if loc else ""
    if section == "policy" and len(loc) >= 2 and isinstance(loc[1], int):
        index = loc[1]
        policies = data.get("policy") or []
        name = (
            policies[index].get("name")
            if index < len(policies) and isinstance(policies[index], dict)
            else None
        )
        return (f"policy {name!r}" if name else f"policy #{index + 1}"), section, loc[2:]
    if section:
        return f"[{section}]", section, loc[1:]
    return "config", section, loc


def _describe(error: dict[str, Any], data: dict[str, Any]) -> str:
    where, section, loc = _located(list(error["loc"]), data)
    field = ".".join(str(part) for part in loc if not str(part).startswith("function-"))
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden" and not field:
        # An unknown top-level section: loc is just its name.
        close = difflib.get_close_matches(section, list(Config.model_fields), n=1)
        fix = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(_SECTIONS)}"
        return f"config: unknown section {section!r}: {fix}"
    if error["type"] == "extra_forbidden":
        model = _SECTIONS.get(section, Config)
        close = difflib.get_close_matches(field, list(model.model_fields), n=1)
        fix = (
            f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(model.model_fields)}"
        )
        return f"{where}: unknown field {field!r}: {fix}"
    if error["type"] == "missing":
        if not field:
            return f"{where} is required: add the section with its fields"
        return f"{where}: field {field!r} is required: add {field} = ..."
    if error["type"] == "literal_error":
        return f"{where}: field {field!r}: {message}"
    if field:
        got = error.get("input")
        shown = f" (got {got!r})" if got is not None and not isinstance(got, dict | list) else ""
        return f"{where}: field {field!r}: {message}{shown}"
    return f"{where}: {message}"


def parse_config(data: dict[str, Any], source: str = "expiry.toml") -> Config:
    """Validate a parsed TOML document; ConfigError lists every problem."""
    if url := os.environ.get("EXPIRY_DATABASE_URL"):
        data = {**data, "database": {**(data.get("database") or {}), "url": url}}
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(error, data) for error in exc.errors()]  # type: ignore[arg-type]
        # One line, so that the CLI's error is one line on stderr.
        raise ConfigError(f"{source} is invalid: " + "; ".join(problems)) from None


def config_path(path: Path | None = None) -> Path:
    return path or Path(os.environ.get("EXPIRY_CONFIG", "expiry.toml"))


def load_config(path: Path | None = None) -> Config:
    path = config_path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"no config file at {path}: pass --config PATH or set EXPIRY_CONFIG"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return parse_config(data, str(path))
