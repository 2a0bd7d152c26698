"""The storage seam: one Engine interface, one implementation per database.

Every method is named noun-first (job_claim, run_insert, schedule_advance,
key_active, ledger_insert, audit_append) after the named query it runs from the
engine's ``queries/`` (one file a noun), takes typed parameters and returns plain values or the
small frozen rows of ``expiry.types`` (times as aware datetimes). The methods
below are written once against a few primitives that each engine provides: open
a transaction, run a named query (``_rows``, private: nothing outside
``engines/`` names a query), read a stored time (``_time``), turn a row into a
Job, and shape the batch parameters of ``job_insert_many``.

Methods that take ``conn`` run inside the caller's transaction (so a handler's
effect and its completion commit together); without it they open and commit
their own. A service that runs either way uses ``transaction_or(conn)``.

The seam's parts live in ``engines/seam/``, one module a noun (primitives,
jobs, ledger, runs, cron, access, catalog, health, samples); Engine is all of
them.
What every engine shares beside it is ``engines/common.py``'s.
"""

from __future__ import annotations

from .seam.access import AccessSeam
from .seam.catalog import CatalogSeam
from .seam.cron import CronSeam
from .seam.health import HealthSeam
from .seam.ledger import LedgerSeam
from .seam.runs import RunsSeam
from .seam.samples import SamplesSeam


class Engine(LedgerSeam, RunsSeam, CronSeam, AccessSeam, CatalogSeam, HealthSeam, SamplesSeam):
    """One database that holds both the application's tables and expiry's."""
