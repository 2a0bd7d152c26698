"""The worker: claim, run each job in one transaction with its completion, and
account for every outcome.

Threads: ``concurrency`` job loops, the loops of the queues with threads of
their own (``pools``: cron calls), one heartbeat loop that extends the leases
of every job this process holds, and one rescuer that returns other workers'
expired claims to the queue (on its own connection on PostgreSQL). On SIGTERM or
SIGINT the loops finish the job in hand and give back claimed jobs they had
not started, without spending their attempts; a second signal, or a stop that
outlasts the grace period, exits at once (signals.py).

With ``claim_ahead=True``, a loop whose claim came back full of short jobs
claims the next batch while it runs this one (on a thread of its own, where
the engine has concurrent writers): the claim's round trip and the server's work on it overlap the
batch's transactions instead of following them. Those jobs are leased (and
heartbeated) meanwhile; a claim ahead whose queue has since come to rest goes
back, as does one still in hand at shutdown. Never for a paced queue (a claim
limit): each of its windows waits for the rest after the one before.

Its parts: runner.py runs one job and accounts for it; claims.py holds the
job loops; this module starts and stops the threads, and runs the heartbeat,
the rescuer, the roll call and the health monitor.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from .. import signals
from ..types import Gates
from .claims import Claiming
from .jobs import policy_queue
from .runner import job_fields

log = logging.getLogger("expiry.worker")


HELPER_JOIN_SECONDS = 10.0


ROLL_CALL_SECONDS = 5.0
"""With a health monitor, the roll call also tells the throttles this often."""


class Worker(Claiming):
    def run(self) -> int:
        """Run until stopped (or idle with ``until_idle``). Returns an exit code.
        SIGTERM and SIGINT stop it (signals.py: from the main thread, or in a
        process that listens already); the handlers are put back on return, so
        that a worker run inside a larger program (or a test) leaves Ctrl-C
        working as before."""
        with signals.listening(stop=self.stop):
            return self._run_loops()

    def _run_loops(self) -> int:
        log.info("worker started", extra={"worker": self.name})
        # Listen before the first claim: a hint sent between an empty claim and
        # the first wait (the planner's first page, at start-up) is not lost.
        self.engine.listen()
        helpers, loops = self._helpers(), self._loops()
        self._roll_call()
        for thread in helpers + loops:
            thread.start()
        for thread in loops:
            while thread.is_alive():
                thread.join(0.2)
        if self.acks is not None:  # the loops are done: what they ran, acknowledged now
            self.acks.flush()
        self.stopping.set()
        if self.acks is not None:
            self.acks.wake()
        # Let a heartbeat or rescue in flight finish before the caller closes the
        # engine: a helper still inside the driver as its connection closes (or
        # as the interpreter exits) can take the process down.
        for thread in helpers:
            thread.join(HELPER_JOIN_SECONDS)
        try:
            self.engine.worker_gone(self.name)
        except Exception as exc:  # the roll forgets it within a day anyway
            log.warning("could not leave the workers' roll: %s", exc)
        log.info("worker stopped", extra={"worker": self.name})
        return self._idle_exit_code()

    def _helpers(self) -> list[threading.Thread]:
        """The threads beside the job loops: heartbeat, rescuer, batched acks and
        the health monitor (its first reading taken now, before the first claim:
        a held policy is held from the start, and a canary's baseline is taken
        while nothing runs)."""
        helpers = [
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self._rescue_loop, name="rescuer", daemon=True),
        ]
        if self.acks is not None:
            helpers.append(
                threading.Thread(
                    target=self.acks.run, args=(self.stopping,), name="acks", daemon=True
                )
            )
        if self.hooks.monitor is not None:
            delay = self._monitor()
            helpers.append(
                threading.Thread(
                    target=self._monitor_loop, args=(delay,), name="health", daemon=True
                )
            )
        return helpers

    def _loops(self) -> list[threading.Thread]:
        """The ``concurrency`` job loops over the shared queues, and each pool's own."""
        loops = [
            threading.Thread(target=self._job_loop, args=(None,), name=f"job-{i}", daemon=True)
            for i in range(self.concurrency if self._shared() else 0)
        ]
        loops += [
            threading.Thread(target=self._job_loop, args=((q,),), name=f"{q}-{i}", daemon=True)
            for q, n in self.pools.items()
            for i in range(n)
        ]
        return loops

    def _idle_exit_code(self) -> int:
        """0, or 1 for an --until-idle worker that found nothing to do while a
        run stays open past its bound: idle is not done then, and the caller
        (a cron job, a CI step) must hear of it."""
        if not self.until_idle or self.hooks.stalled is None:
            return 0
        try:
            mine = set(self.queues)
            stalled = {p: age for p, age in self.hooks.stalled().items() if policy_queue(p) in mine}
        except Exception as exc:
            log.warning("could not read the open runs: %s", exc)
            return 0
        for policy, age in sorted(stalled.items()):
            log.error(
                "idle, but a run of this policy has been open for %.0fs: stalled",
                age,
                extra={"policy": policy},
            )
        return 1 if stalled else 0

    def set_queues(self, queues: tuple[str, ...]) -> None:
        """Work ``queues`` from now on (a config reload added or dropped a
        policy): the job loops read them at their next claim."""
        self.queues = tuple(dict.fromkeys(queues))

    def stop(self) -> None:
        """Finish the jobs in hand and give back the claimed jobs not started."""
        self.stopping.set()

    def _monitor(self) -> float:
        assert self.hooks.monitor is not None
        try:
            return max(0.05, self.hooks.monitor())
        except Exception as exc:  # the health must not stop the worker
            log.warning("health check failed: %s", exc)
            return self.poll

    def _monitor_loop(self, delay: float) -> None:
        told = time.monotonic()
        while not self.stopping.wait(delay):
            delay = self._monitor()
            if time.monotonic() - told > ROLL_CALL_SECONDS:  # the throttles, fresh enough
                told = time.monotonic()
                self._roll_call()

    def _roll_call(self) -> None:
        """Say on the workers' roll who this worker is, what it works, how many
        jobs it holds and which of its queues rest (the dashboard's workers page)."""
        now = time.monotonic()
        try:
            gates = self.hooks.gates() if self.hooks.gates is not None else Gates()
            with self._lock:
                holding = len(self._held)
            self.engine.worker_seen(
                self.name,
                host=socket.gethostname(),
                pid=os.getpid(),
                threads=self.concurrency + sum(self.pools.values()),
                queues=self.queues,
                resting={q: t - now for q, t in gates.resting.items() if t > now},
                holding=holding,
                health=self.hooks.report() if self.hooks.report is not None else None,
            )
        except Exception as exc:
            log.warning("roll call failed: %s", exc, extra={"worker": self.name})

    def _heartbeat_loop(self) -> None:
        while not self.stopping.wait(self.lease / 3):
            self._roll_call()
            with self._lock:
                held = list(self._held.values())
            for job in held:
                try:
                    if not self.queue.heartbeat(job, self.lease):
                        with self._lock:
                            still_held = job.id in self._held
                        if still_held:  # not merely finished since the snapshot above
                            log.warning("lease lost while running", extra=job_fields(job))
                except Exception as exc:
                    log.warning("heartbeat failed: %s", exc, extra=job_fields(job))

    def _rescue_loop(self) -> None:
        last_prune = 0.0
        while not self.stopping.wait(self.rescue_every * self.rng.uniform(0.5, 1.0)):
            try:
                self.queue.rescue()
                if self.hooks.sweep is not None:
                    self.hooks.sweep()
                if time.monotonic() - last_prune > 300:
                    last_prune = time.monotonic()
                    self.queue.prune(self.prune_after)
                    if self.hooks.prune is not None:
                        self.hooks.prune()
            except Exception as exc:
                log.warning("rescuer failed: %s", exc)
