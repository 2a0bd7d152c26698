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
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import defaults
from .cleanup import service as cleanup_jobs
from .cleanup.runs import Runs
from .cleanup.service import Cleanup
from .config import Config, config_path, load_config
from .cron import targets as cron_jobs
from .cron.scheduler import Scheduler
from .cron.targets import Crons
from .engines import Engine, open_engine
from .errors import AlreadyApplied, ConfigError, MigrationError
from .health.database import Health
from .health.history import History
from .keys import Keys
from .queue.handlers import Handler, HandlerFn
from .queue.jobs import CRON_QUEUE, Queue, is_reserved, policy_queue
from .queue.runner import Hooks, WorkerSettings
from .queue.worker import Worker
from .types import Gates, Job

log = logging.getLogger("expiry.app")


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


def merge_gates(*gates: Gates) -> Gates:
    """Several services' gates as one: each queue rests until the latest of
    its rests, and takes the smallest of its limits."""
    resting: dict[str, float] = {}
    limits: dict[str, int] = {}
    for gate in gates:
        for queue, until in gate.resting.items():
            resting[queue] = max(until, resting.get(queue, until))
        for queue, n in gate.limits.items():
            limits[queue] = min(n, limits.get(queue, n))
    return Gates(resting, limits)


def schema_error(current: int, latest: int) -> MigrationError:
    """What to do about a database whose expiry schema is not there yet, or
    older than this expiry."""
    where = (
        "expiry's own tables are not in this database yet"
        if current == 0
        else f"the database has expiry schema version {current} and this expiry needs {latest}"
    )
    return MigrationError(
        f"{where}: run `expiry migrate` (or App.migrate()) first, as a role that may create tables"
    )


class App:
    """The wiring: one database, its queue, its handlers and (from a config) its
    policies. Services take their collaborators explicitly; the App builds them
    on first use and is the only module that knows them all."""

    def __init__(
        self,
        url: str | None = None,
        *,
        config: Config | None = None,
        pool_size: int = 8,
        read_only: bool = False,
        pooler: str | None = None,
    ) -> None:
        self.config = config
        self.read_only = read_only
        """Only reads: never migrates (not even an SQLite file of its own), and
        its SQLite file refuses writes. The CLI's reading commands open one."""
        self.url = url or (config.database.url if config is not None else None)
        if not self.url:
            raise ConfigError("no database url: set [database] url or EXPIRY_DATABASE_URL")
        self.pool_size = pool_size
        self.pooler = pooler or (config.database.pooler if config is not None else "none")
        """What stands between expiry and the database ([database] pooler)."""
        self.config_file: Path | None = None
        self.handlers: dict[str, Handler] = {}
        self._engine: Engine | None = None
        self._opened: Engine | None = None  # opened, its schema not yet checked
        self._queue: Queue | None = None
        self._cleanup: Cleanup | None = None
        self._crons: Crons | None = None
        self._keys: Keys | None = None
        self._runs: Runs | None = None
        self._health: Health | None = None
        self._history: History | None = None
        self._workers: list[tuple[Worker, tuple[str, ...]]] = []
        """The workers built here, with the queues each was asked for."""
        self._register_builtins()

    def _register_builtins(self) -> None:
        for handler in cron_jobs.handlers(lambda: self.crons):
            self.register(handler)
        if self.config is not None:
            for handler in cleanup_jobs.handlers(self._need_cleanup):
                self.register(handler)

    @classmethod
    def from_config(cls, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> App:
        app = cls(config=load_config(Path(path) if path else None), **kwargs)
        app.config_file = config_path(Path(path) if path else None)
        return app

    def reload(self) -> bool:
        """Re-read the config file (SIGHUP): the policies, their throttles and
        the cron calls' limits ([database] and [worker] take a restart). A bad
        or unreadable file keeps the old config. Whether it was reloaded."""
        if self.config_file is None:
            log.warning("config reload: this App was not built from a config file")
            return False
        try:
            config = load_config(self.config_file)
        except (ConfigError, OSError) as exc:
            log.error("config reload refused, keeping the old one: %s", exc)
            return False
        before = {p.name for p in self.config.policy} if self.config else set()
        self.config = config
        if self._cleanup is not None:
            self._cleanup.reload(config)
        if self._health is not None:
            self._health.reload(config)
        if self._history is not None:
            self._history.keep_seconds = config.retention.samples
        if self._crons is not None:
            self._crons.allowed_hosts = list(config.http.allowed_hosts)
            self._crons.call_timeout = config.http.call_timeout
        log.info("config reloaded from %s: %d policies", self.config_file, len(config.policy))
        for name in sorted({p.name for p in config.policy} - before):
            log.info("policy %s is new: its queue is worked from now on", name)
        for worker, asked in self._workers:
            worker.set_queues(self.worked_queues(asked))
        return True

    # -- the services, built on first use ------------------------------------------

    @property
    def engine(self) -> Engine:
        """The database, its schema checked on first use: an embedded SQLite
        file is migrated then and there (it is the application's own), unless
        the App is read_only; otherwise a schema not there yet, or older than
        this expiry, raises MigrationError saying to run `expiry migrate`,
        never a driver's "no such table"."""
        if self._engine is None:
            engine = self._open()
            current, latest = self.schema_versions()
            if current != latest:
                engine.check_schema_version(current)  # newer than this expiry: says so
                if not engine.kind.embedded or self.read_only:
                    raise schema_error(current, latest)
                engine.migrate()
            self._engine = engine
        return self._engine

    def schema_versions(self) -> tuple[int, int]:
        """(the database's expiry schema version, the one this expiry needs);
        0 for a database expiry's tables are not in yet. Reads, creates nothing."""
        engine = self._open()
        return engine.schema_version(), engine.migrations[-1][0]

    def schema_problem(self) -> MigrationError | None:
        """Why expiry's own tables cannot be used as they are (not there yet,
        older or newer than this expiry), or None. Reads, creates nothing."""
        current, latest = self.schema_versions()
        try:
            self._open().check_schema_version(current)  # newer than this expiry
        except MigrationError as exc:
            return exc
        return None if current == latest else schema_error(current, latest)

    def _open(self) -> Engine:
        if self._opened is None:
            assert self.url is not None
            self._opened = open_engine(
                self.url, pool_size=self.pool_size, read_only=self.read_only, pooler=self.pooler
            )
        return self._opened

    @property
    def queue(self) -> Queue:
        if self._queue is None:
            self._queue = Queue(self.engine)
        return self._queue

    @property
    def cleanup(self) -> Cleanup | None:
        """The policies' cleanup; None for an App without a config."""
        if self._cleanup is None and self.config is not None:
            self._cleanup = Cleanup(self.engine, self.config, self.runs)
            health = self.health
            assert health is not None
            self._cleanup.observer = health.observe  # the throttle's running rate
            self._cleanup.quiet = health.quiet  # nice_ratio rests for the application's load
        return self._cleanup

    def table_reader(self) -> Cleanup:
        """The policies over the database as it is, expiry's schema not checked:
        for what reads the application's tables and the catalog alone (the
        schema check, a dry run), which answers before `expiry migrate`. Runs,
        windows and the queue need expiry's tables: those go through
        ``cleanup``."""
        if self.config is None:
            raise ConfigError("no policies: this command needs a config file (--config PATH)")
        if self._cleanup is not None:
            return self._cleanup
        return Cleanup(self._open(), self.config)

    def _need_cleanup(self) -> Cleanup:
        cleanup = self.cleanup
        if cleanup is None:
            raise ConfigError("this App has no config: build it with App.from_config")
        return cleanup

    @property
    def crons(self) -> Crons:
        if self._crons is None:
            http = self.config.http if self.config else None
            self._crons = Crons(
                self.engine,
                list(http.allowed_hosts) if http else [],
                call_timeout=http.call_timeout if http else defaults.CALL_TIMEOUT_SECONDS,
                max_per_owner=(
                    http.max_cron_targets_per_key if http else defaults.MAX_CRON_TARGETS_PER_KEY
                ),
            )
        return self._crons

    @property
    def runs(self) -> Runs:
        """Runs: finishing them, their summaries, waiting for them."""
        if self._runs is None:
            self._runs = Runs(self.engine)
        return self._runs

    @property
    def keys(self) -> Keys:
        """API keys: one cache for the HTTP API and the dashboard."""
        if self._keys is None:
            self._keys = Keys(self.engine)
        return self._keys

    @property
    def health(self) -> Health | None:
        """The policies' throttles (None for an App without a config)."""
        if self._health is None and self.config is not None:
            self._health = Health(self.engine, self.config)
        return self._health

    @property
    def history(self) -> History | None:
        """The policies' per-minute history (None for an App without a config)."""
        if self._history is None and self.cleanup is not None and self.config is not None:
            self._history = History(self.engine, self.cleanup, self.config.retention.samples)
        return self._history

    @property
    def hooks(self) -> Hooks:
        """What the worker calls back into: the cleanup's run bookkeeping and
        pacing, and the throttles' health readings and holds."""
        cleanup, health, history = self.cleanup, self.health, self.history
        if cleanup is None or health is None or history is None or self.config is None:
            return Hooks()
        retention = self.config.retention.ledger

        def sweep() -> None:
            cleanup.sweep()
            history.sample()

        def prune() -> None:
            self.runs.prune(retention)
            history.prune()

        return Hooks(
            gates=lambda: merge_gates(cleanup.gates(), health.gates()),
            monitor=health.check,
            report=health.snapshot,
            sweep=sweep,
            prune=prune,
            stalled=cleanup.stalled,
            dead=lambda job: cleanup.finish_runs(
                {job.payload["run_id"]} if job.payload.get("run_id") else set()
            ),
        )

    def own_queues(self) -> tuple[str, ...]:
        """expiry's own queues: each policy's, and the cron calls'."""
        mine = [policy_queue(p.name) for p in self.config.policy] if self.config else []
        return (*mine, CRON_QUEUE)

    def worked_queues(self, queues: Sequence[str] = ()) -> tuple[str, ...]:
        """The queues a worker works: ``queues`` (the application's; by default
        the default queue and the queue of each handler the app registered,
        where a message published to that name waits), and expiry's own
        (own_queues) unless ``queues`` names some of those itself (a worker
        given to one policy: ``expiry.policy.NAME``)."""
        if not queues:
            named = sorted(name for name in self.handlers if not is_reserved(name))
            queues = [defaults.QUEUE, *named]
        if any(is_reserved(q) for q in queues):
            return tuple(dict.fromkeys(queues))
        return tuple(dict.fromkeys([*queues, *self.own_queues()]))

    def worker(
        self, *, name: str | None = None, rng: random.Random | None = None, **options: Any
    ) -> Worker:
        """A Worker over this App's queue and handlers (options: the fields of
        worker.WorkerSettings; its queues are worked_queues(queues); cron calls
        get threads of their own, [worker] cron_threads)."""
        asked = tuple(options.get("queues") or ())
        options["queues"] = self.worked_queues(asked)
        threads = self.config.worker.cron_threads if self.config else defaults.CRON_THREADS
        options.setdefault("pools", {CRON_QUEUE: threads})
        if self.config is not None:
            options.setdefault("outage_budget", self.config.worker.outage_budget)
        settings = WorkerSettings(**options)
        worker = Worker(
            self.engine, self.queue, self.handlers, self.hooks, settings, name=name, rng=rng
        )
        self._workers.append((worker, asked))  # a reload adds or drops its policies' queues
        return worker

    def scheduler(self, **options: Any) -> Scheduler:
        """A Scheduler of this App's policies and cron targets (options: its clock)."""
        return Scheduler(
            self.engine,
            self.cleanup,
            self.crons,
            reload=self.reload,
            history=self.history,
            **options,
        )

    def migrate(self) -> list[int]:
        """Create or upgrade expiry's own tables (nothing to do: nothing created).
        A read_only App refuses: it creates nothing."""
        if self.read_only:
            raise MigrationError("this App only reads (read_only=True): it migrates nothing")
        applied = self._open().migrate()
        self._engine = self._open()
        return applied

    # -- handlers -----------------------------------------------------------------

    def handler(
        self,
        name: str,
        *,
        transactional: bool = True,
        group_commit: bool = False,
        batched_ack: bool = False,
        before: Callable[[Job], None] | None = None,
        after: Callable[[Job, Any, float], None] | None = None,
        after_batch: Callable[[list[Job]], None] | None = None,
        failed: Callable[[Job, str], None] | None = None,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Register ``fn(job, tx)`` to run jobs enqueued under ``name`` in the job's
        transaction; with ``transactional=False``, ``fn(job)`` outside any
        (queue/handlers.py says what each choice promises)."""

        def register(fn: HandlerFn) -> HandlerFn:
            self.register(
                Handler(
                    name,
                    fn,
                    before=before,
                    after=after,
                    after_batch=after_batch,
                    failed=failed,
                    transactional=transactional,
                    group_commit=group_commit,
                    batched_ack=batched_ack,
                )
            )
            return fn

        return register

    def register(self, handler: Handler) -> None:
        """Register a Handler built in full (the built-in jobs' private modes)."""
        if handler.name in self.handlers:
            raise ConfigError(f"handler {handler.name!r} is registered twice")
        self.handlers[handler.name] = handler

    def once(self, tx: Any, operation_id: str, *, worker: str | None = None) -> Once:
        """Guard an idempotent operation by its id in the caller's transaction."""
        return Once(self.engine, tx, operation_id, worker)

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()
            self._engine = self._opened = None
            self._queue = None
            self._cleanup = None
            self._crons = None
            self._keys = None
            self._runs = None
        if self._health is not None:
            self._health.close()
            self._health = None
