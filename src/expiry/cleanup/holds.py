"""Legal holds in the audit log: each hold placed (new in the config, or
changed) and lifted (gone from it) is written once, by the first worker,
scheduler or server that reads the config, and again on a reload. The holds
themselves are predicates on the policies' statements (statements.py)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ..config import Config, Hold
from ..engines import Engine
from ..types import AuditAction

log = logging.getLogger("expiry.cleanup")


class Counting(Protocol):
    def kept_by_holds(self, name: str) -> dict[str, int]: ...


def holds_report(cleanup: Counting, config: Config) -> list[dict[str, Any]]:
    """Each hold of the config: its table, the rows it names, why, and per
    policy on its table the rows older than retain it keeps now (`expiry
    holds`, GET /v1/holds)."""
    kept = {p.name: cleanup.kept_by_holds(p.name) for p in config.policy if p.holds}
    return [
        {
            "name": h.name,
            "table": h.table,
            "rows": h.where if h.where is not None else f"keys in {h.keys_table}.{h.keys_column}",
            "reason": h.reason,
            "kept": {policy: by[h.name] for policy, by in kept.items() if h.name in by},
        }
        for h in config.hold
    ]


def hold_detail(hold: Hold) -> dict[str, Any]:
    """What the log records of a hold: the rows it names, its table, why."""
    return {"hold": hold.name, **hold.model_dump(exclude={"name"}, exclude_none=True)}


def record_holds(engine: Engine, config: Config, actor: str) -> list[str]:
    """Audit what changed since the log last said: hold.placed for each hold in
    the config that the log does not show in force as it is now, hold.lifted
    for each it shows in force that the config no longer has. The changes, as
    one line each."""
    in_force: dict[str, dict[str, Any]] = {}
    for event in engine.audit_hold_events():  # oldest first: the newest word wins
        name = str(event.detail.get("hold"))
        if event.action == AuditAction.HOLD_PLACED:
            in_force[name] = event.detail
        else:
            in_force.pop(name, None)
    changes: list[str] = []
    for hold in config.hold:
        detail = hold_detail(hold)
        if in_force.get(hold.name) != detail:
            engine.audit_append(None, AuditAction.HOLD_PLACED, actor=actor, detail=detail)
            changes.append(f"hold {hold.name} placed on {hold.table}")
    for name, detail in in_force.items():
        if name not in {h.name for h in config.hold}:
            engine.audit_append(None, AuditAction.HOLD_LIFTED, actor=actor, detail=detail)
            changes.append(f"hold {name} lifted from {detail.get('table')}")
    for change in changes:
        log.info(change)
    return changes
