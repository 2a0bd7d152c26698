"""The statements expiry runs on a policy's table: the one place Python builds
SQL. Each statement is written once (sql.py), for every engine; identifiers from
the config are validated (config.check_identifier) and quoted by the engine
(the driver's API), values are always bound parameters in the engine's style,
and the ``where`` predicate (trusted config only) is wrapped in parentheses.
What differs by dialect (quoting, binding, the time predicate of a storage,
the catalog, how a window runs) is the engine's: engines/*/tables.py.

A Target is built in floors: Statements (statements.py) renders them;
Strategies (strategy.py) chooses a run's windows; Detection (detection.py)
reads how the timestamp column stores time; Checks (checks.py) checks the
table against the live schema.

The retention predicate ``{ts} < cutoff AND (where)`` is evaluated by the
database when the statement runs, so a row revived after planning survives.
Dry-run, planning, the watermark and the delete all use the same predicate.

A window is applied and booked in the ledger together, by one engine
operation (Engine.window_apply): its delete (or move) is guarded by the
ledger, then the ledger row is inserted with the count of rows it affected.
"""

from __future__ import annotations

from .checks import Checks


class Target(Checks):
    """A policy's table in one engine's dialect."""
