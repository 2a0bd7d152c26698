"""Legal holds in the audit log: each hold placed (new in the config, or
changed) and lifted (gone from it) is written once, by the first worker,
scheduler or server that reads the config, and again on a reload. The holds
themselves are predicates on the policies' statements (statements.py)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ..config import Config, Hold
from ..engines import Engine
from ..types import AuditAction, AuditEvent

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
    for each it shows in force that the config no longer has. Read first
    without writing (nothing to say: nothing written, a read-only process
    included); else read again and written in one transaction under a lock,
    so that processes starting together write each change once. The
    changes, as one line each."""
    if not _changes(engine.audit_hold_events(), config):
        return []
    with engine.transaction() as conn:
        engine.audit_holds_lock(conn)  # two processes starting at once: one audits
        changes = _changes(engine.audit_hold_events(conn=conn), config)
        for action, detail in changes:
            engine.audit_append(conn, action, actor=actor, detail=detail)
    said = [
        f"hold {d['hold']} placed on {d['table']}"
        if action == AuditAction.HOLD_PLACED
        else f"hold {d['hold']} lifted from {d.get('table')}"
        for action, d in changes
    ]
    for line in said:
        log.info(line)
    return said


def _changes(events: list[AuditEvent], config: Config) -> list[tuple[AuditAction, dict[str, Any]]]:
    """What the log must say for the config's holds, given its hold events
    (oldest first: the newest word on a hold wins)."""
    in_force: dict[str, dict[str, Any]] = {}
    for event in events:
        name = str(event.detail.get("hold"))
        if event.action == AuditAction.HOLD_PLACED:
            in_force[name] = event.detail
        else:
            in_force.pop(name, None)
    changes = [
        (AuditAction.HOLD_PLACED, hold_detail(hold))
        for hold in config.hold
        if in_force.get(hold.name) != hold_detail(hold)
    ]
    names = {h.name for h in config.hold}
    changes += [
        (AuditAction.HOLD_LIFTED, detail) for name, detail in in_force.items() if name not in names
    ]
    return changes
