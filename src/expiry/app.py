"""The App: one database, its queue, its handlers and (from a config) its policies.

    app = App.from_config("expiry.toml")
    @app.handler("expire_listing")
    def expire(job, tx):
        with app.once(tx, f"expire-listing:{job.payload['id']}:revision-{job.payload['rev']}"):
            tx.execute("update listings set state = 'expired' where id = %s", (job.payload["id"],))

A handler gets the job and ``tx``, the driver connection inside the open
transaction; the worker completes the job in that same transaction.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .engines import Engine, open_engine
from .errors import AlreadyApplied, ConfigError
from .queue import Queue
from .types import Job

if TYPE_CHECKING:
    from .cleanup import Cleanup

HandlerFn = Callable[[Job, Any], Any]


@dataclass(frozen=True)
class Handler:
    name: str
    fn: HandlerFn
    before: Callable[[Job], None] | None = None
    """Called before the job's transaction opens (pacing; never inside a transaction)."""
    after: Callable[[Job, Any, float], None] | None = None
    """Called after commit with the handler's result and the transaction's seconds."""
    after_batch: Callable[[list[Job]], None] | None = None
    """Called once the worker has run a claimed batch, with the batch's jobs of this
    handler whatever their outcome, outside any transaction: for a check that only
    matters once they are all done (a Worker.process call is a batch of one)."""
    group_commit: bool = False
    """Jobs of this handler claimed together may run in one transaction that
    completes them all (one commit for many short jobs). Any failure rolls the
    group back and each job runs again alone (``before`` hooks run again too).
    ``after`` and the job-duration metric get the whole group's seconds."""
    completes_job: bool = False
    """The handler completes its own job (``app.queue.complete(job, tx)``, or an
    engine call that completes it along with other work) inside its transaction,
    so that the completion shares a round trip with its last statement; the
    worker then does not complete it. Not with ``group_commit``."""
    pipelined: bool = False
    """Run the job's transaction pipelined where the engine can (PostgreSQL's
    pipeline mode): statements are sent when a result is read, BEGIN with the
    first of them and COMMIT with the last, saving their round trips. The handler
    must read every result it depends on (a query's rows, or a statement whose
    failure must stop it); an unread statement's error surfaces at commit."""
    statement: bool = False
    """Run the job outside any transaction where the engine can (PostgreSQL's
    autocommit): a handler whose work and completion are one statement then
    costs one round trip, with no BEGIN or COMMIT; work of several statements
    goes in ``engine.atomic(tx)``. Requires ``completes_job``."""


class Once:
    """The ledger guard for one operation id inside the caller's transaction.

    ``if app.once(tx, op):`` is true when this transaction now owns ``op``.
    ``with app.once(tx, op):`` runs the block only the first time; on a repeat it
    raises AlreadyApplied, which the worker treats as a successful duplicate
    (use the ``if`` form to guard several operations in one job)."""

    def __init__(self, engine: Engine, tx: Any, operation_id: str, worker: str | None) -> None:
        self.engine, self.tx, self.operation_id, self.worker = engine, tx, operation_id, worker
        self._owned: bool | None = None

    def __bool__(self) -> bool:
        if self._owned is None:
            self._owned = self.engine.ledger_insert(
                self.tx, self.operation_id, action="once", worker=self.worker
            )
        return self._owned

    def __enter__(self) -> Once:
        if not self:
            raise AlreadyApplied(f"operation {self.operation_id} already committed")
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class App:
    def __init__(self, url: str | None = None, *, config: Any = None, pool_size: int = 8) -> None:
        self.config = config
        self.url = url or (config.database.url if config is not None else None)
        if not self.url:
            raise ConfigError("no database url: set [database] url or EXPIRY_DATABASE_URL")
        self.pool_size = pool_size
        self.config_file: Path | None = None
        self.handlers: dict[str, Handler] = {}
        self._engine: Engine | None = None
        self._queue: Queue | None = None
        self.cleanup: Cleanup | None = None
        from .crons import register_crons

        self.crons = register_crons(self)
        if config is not None:
            from .cleanup import register_cleanup

            self.cleanup = register_cleanup(self)

    @classmethod
    def from_config(cls, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> App:
        from .config import config_path, load_config

        app = cls(config=load_config(Path(path) if path else None), **kwargs)
        app.config_file = config_path(Path(path) if path else None)
        return app

    def reload(self) -> None:
        """Re-read the config file (SIGHUP); a bad file keeps the old config."""
        if self.config_file is None:
            return
        from .config import load_config

        try:
            config = load_config(self.config_file)
        except ConfigError as exc:
            logging.getLogger("expiry.app").error(
                "config reload refused, keeping the old one: %s", exc
            )
            return
        self.config = config
        if self.cleanup is not None:
            self.cleanup.forget_targets()

    @property
    def engine(self) -> Engine:
        """Opened on first use, so importing a module that builds an App costs nothing."""
        if self._engine is None:
            assert self.url is not None
            self._engine = open_engine(self.url, pool_size=self.pool_size)
        return self._engine

    @property
    def queue(self) -> Queue:
        if self._queue is None:
            self._queue = Queue(self.engine)
        return self._queue

    def migrate(self) -> list[int]:
        return self.engine.migrate()

    def handler(
        self,
        name: str,
        *,
        before: Callable[[Job], None] | None = None,
        after: Callable[[Job, Any, float], None] | None = None,
        after_batch: Callable[[list[Job]], None] | None = None,
        group_commit: bool = False,
        completes_job: bool = False,
        pipelined: bool = False,
        statement: bool = False,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Register ``fn(job, tx)`` to run jobs enqueued under ``name``."""
        if group_commit and completes_job:
            raise ConfigError(
                f"handler {name!r}: a group commit completes its jobs together, "
                "so a handler that completes its own job cannot join one"
            )
        if statement and (pipelined or not completes_job):
            raise ConfigError(
                f"handler {name!r}: in statement mode each statement is its own "
                "transaction, so the handler must complete its job itself "
                "(completes_job=True), in the statement or engine.atomic() block "
                "that does its work; and it is not pipelined"
            )

        def register(fn: HandlerFn) -> HandlerFn:
            if name in self.handlers:
                raise ConfigError(f"handler {name!r} is registered twice")
            self.handlers[name] = Handler(
                name,
                fn,
                before,
                after,
                after_batch,
                group_commit,
                completes_job,
                pipelined,
                statement,
            )
            return fn

        return register

    def once(self, tx: Any, operation_id: str, *, worker: str | None = None) -> Once:
        """Guard an idempotent operation by its id in the caller's transaction."""
        return Once(self.engine, tx, operation_id, worker)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
            self._queue = None
