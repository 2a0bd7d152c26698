#!/usr/bin/env python3
"""Plant known safety bugs one at a time and check that the tests catch each.

Each mutant is a text substitution in one file (the old text must occur
exactly once), with more substitutions for the few double faults, and the
pytest node ids that must fail with it planted. For each mutant the script
applies it, runs

    .venv/bin/pytest -q -x -p no:cacheprovider NODE_IDS

and always puts the files back. A mutant is caught when pytest exits non-zero,
survived when the tests pass with the bug in place. Before the mutants, the
selected tests run once on the unmodified code: they must pass there, or a
"caught" would mean nothing.

    python tools/mutants.py              # every mutant; exit 1 if any survived
    python tools/mutants.py --list       # the mutants and their tests
    python tools/mutants.py --only ID    # one mutant (repeatable)
    python tools/mutants.py --each       # every test of a mutant alone: which catch it
    python tools/mutants.py --copy       # in a temporary copy: this tree is untouched

Without --copy the files are planted in this checkout (one at a time, for a
few seconds each): use --copy while anyone else works or runs tests in it.

Exit codes: 0 every mutant caught, 1 some survived (or a node id selected
nothing), 2 a mutant's old text is not found exactly once or the tests fail
without any mutant.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SAFETY = "tests/cleanup/test_safety_mutants.py"
RETRY = "tests/queue/test_retry_schedule.py"
TIMESTAMPS = "tests/cleanup/test_timestamps.py"
TURNS = "tests/cleanup/test_run_turns.py"
QUARANTINE = "tests/cleanup/test_quarantine.py"
STALLED = "tests/cleanup/test_stalled.py"
OUTAGE = "tests/cleanup/test_outage.py"
DASHBOARD = "tests/dashboard/test_dashboard.py"
SCHEDULER = "tests/scheduler/test_scheduler.py"
PGBOUNCER = "tests/drills/test_pgbouncer.py"
GALERA = "tests/drills/test_galera.py"
APPROVAL = "tests/cleanup/test_approval.py"
REFERENCED = (
    "tests/cleanup/test_real_tables.py::test_many_referenced_rows_split_no_window_and_every_"
    "run_counts_them"
)
PARTITION_HELD = (
    "tests/cleanup/test_real_tables.py::test_a_partition_behind_a_long_read_waits_its_short_"
    "lock_timeout_and_spends_no_attempt"
)
PGBOUNCER_RUN = "test_a_run_through_pgbouncer_in_transaction_mode_deletes_exactly_the_expired_rows"

UNBOOKED = (
    'UNBOOKED = WINDOW + " and not exists (select 1 from {ledger} where {ledger_key} = {p_key})"'
)
WINDOW_APPLY = "src/expiry/engines/postgres/migrations/0007_time_windows.sql"
LEDGER_INSERT = (
    "values (window_apply.key, policy, run_id, lo, hi, bounds, action, worker, taken);\n"
)
LEDGER_INSERT_LAX = (
    "values (window_apply.key, policy, run_id, lo, hi, bounds, action, worker, taken)\n"
    "        on conflict on constraint ledger_pkey do nothing;\n"
)
ORACLE = "tests/cleanup/test_oracle.py"
TIMEOUTS = "tests/cleanup/test_timeouts.py"
ANONYMOUS = "tests/http/test_http_anonymous.py"
PACING = "tests/cleanup/test_pacing.py"
QUIET = "test_nice_ratio_rests_while_the_application_is_at_work_and_not_on_a_quiet_database"
KEEP_LAST = "tests/cleanup/test_keep_last.py"
HOLDS = "tests/cleanup/test_holds.py"
KEPT = "test_keep_last_leaves_exactly_the_newest_rows_and_the_live_ones"
FOREGROUND = (
    "tests/engines/test_conformance_health.py::"
    "test_health_foreground_sessions_counts_the_applications_and_not_expirys"
)
SIGNALS = "tests/cli/test_signals.py"
READ_ONLY = "tests/cli/test_read_only.py"
ZONES = "tests/cleanup/test_timestamp_zones.py"
HISTORY = "tests/dashboard/test_history.py"
SAMPLED = "test_a_sample_holds_the_backlog_retries_dead_and_oldest_age_that_sql_reads"
DJANGO = f"{ZONES}::test_django_local_times_delete_exactly_djangos_expired_half"
FALL_BACK = f"{ZONES}::test_a_repeated_hour_is_kept_until_both_its_instants_have_passed"
SPRING_FORWARD = f"{ZONES}::test_a_skipped_hour_is_kept_until_both_its_readings_have_passed"


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str
    also: tuple[tuple[str, str, str], ...] = ()
    """More (file, old, new) substitutions planted with the first: a double fault."""

    def edits(self) -> list[tuple[str, str, str]]:
        return [(self.file, self.old, self.new), *self.also]


MUTANTS = [
    Mutant(
        "where-parens",
        "src/expiry/cleanup/statements.py",
        'pred += " and ({where})" if p.where else ""',
        'pred += " and {where}" if p.where else ""',
        (
            f"{SAFETY}::test_a_where_with_or_is_applied_as_one_predicate[sqlite]",
            f"{SAFETY}::test_a_where_with_or_is_applied_as_one_predicate[postgres]",
        ),
        "the user's where without its parentheses: `a or b` deletes live rows",
    ),
    Mutant(
        "retain-sign",
        "src/expiry/cleanup/service.py",
        "latest = now - timedelta(seconds=policy.retain)",
        "latest = now + timedelta(seconds=policy.retain)",
        (
            f"{SAFETY}::test_retain_keeps_rows_expired_less_than_retain_ago[sqlite]",
            f"{SAFETY}::test_retain_keeps_rows_expired_less_than_retain_ago[postgres]",
            "tests/cli/test_cli_retain.py::"
            "test_trigger_with_retain_keeps_rows_expired_less_than_retain_ago[sqlite]",
            "tests/http/test_http_retain.py::"
            "test_trigger_with_retain_keeps_rows_expired_less_than_retain_ago[postgres]",
        ),
        "a run's cutoff is now + retain instead of now - retain",
    ),
    Mutant(
        "preview-retain-sign",
        "src/expiry/cleanup/preview.py",
        "cutoff = engine.now(conn).replace(microsecond=0) - timedelta(seconds=policy.retain)",
        "cutoff = engine.now(conn).replace(microsecond=0) + timedelta(seconds=policy.retain)",
        (
            f"{SAFETY}::test_retain_keeps_rows_expired_less_than_retain_ago[sqlite]",
            "tests/cli/test_cli_retain.py::"
            "test_trigger_with_retain_keeps_rows_expired_less_than_retain_ago[postgres]",
        ),
        "the dry run (plan, trigger --dry-run) counts with now + retain",
    ),
    Mutant(
        "watermark-retain-sign",
        "src/expiry/cleanup/preview.py",
        "cutoff = self.engine.now(conn) - timedelta(seconds=policy.retain)",
        "cutoff = self.engine.now(conn) + timedelta(seconds=policy.retain)",
        (f"{SAFETY}::test_retain_keeps_rows_expired_less_than_retain_ago[postgres]",),
        "the watermark measures from now + retain",
    ),
    Mutant(
        "scheduler-retain-sign",
        "src/expiry/cron/scheduler.py",
        "cutoff = fire - timedelta(seconds=policy.retain)",
        "cutoff = fire + timedelta(seconds=policy.retain)",
        (
            "tests/scheduler/test_scheduler.py::"
            "test_a_fire_per_due_time_with_cutoff_fire_minus_retain[sqlite]",
        ),
        "a scheduled run's cutoff is fire + retain",
    ),
    Mutant(
        "cutoff-inclusive",
        "src/expiry/cleanup/sql.py",
        'PREDICATE = "{ts} < {bound}{guard}"',
        'PREDICATE = "{ts} <= {bound}{guard}"',
        (
            "tests/cleanup/test_cleanup.py::test_rows_at_the_cutoff_are_kept[sqlite]",
            "tests/cleanup/test_cleanup.py::test_rows_at_the_cutoff_are_kept[postgres]",
        ),
        "expired means timestamp <= cutoff: the row at the cutoff goes",
    ),
    Mutant(
        "run-finish-pending-pg",
        "src/expiry/engines/postgres/queries/runs.sql",
        "where r.id = %(id)s and r.state = 'running'\n"
        "      and not exists (select 1 from expiry.jobs j\n"
        "                      where j.run_id = r.id\n"
        "                        and j.state in ('scheduled', 'available', 'retryable', 'running'))",
        "where r.id = %(id)s and r.state = 'running'",
        (f"{SAFETY}::test_a_run_is_not_finished_while_a_window_is_pending[postgres]",),
        "PostgreSQL: a run is finished with windows pending (run_finish)",
    ),
    Mutant(
        "run-finish-running-pg",
        "src/expiry/engines/postgres/queries/runs.sql",
        "where r.id = %(id)s and r.state = 'running'\n"
        "      and not exists (select 1 from expiry.jobs j\n"
        "                      where j.run_id = r.id\n"
        "                        and j.state in ('scheduled', 'available', 'retryable', 'running'))",
        "where r.id = %(id)s and r.state = 'running'\n"
        "      and not exists (select 1 from expiry.jobs j\n"
        "                      where j.run_id = r.id\n"
        "                        and j.state in ('scheduled', 'available', 'retryable'))",
        (f"{SAFETY}::test_a_run_is_not_finished_while_a_window_is_pending[postgres]",),
        "PostgreSQL: a run is finished while its last window is running",
    ),
    Mutant(
        "run-finish-idle-pending-pg",
        "src/expiry/engines/postgres/queries/runs.sql",
        "where r.state = 'running'\n      and not exists (select 1 from expiry.jobs j\n",
        "where r.state = 'running'\n      and exists (select 1 from expiry.jobs j\n",
        (f"{SAFETY}::test_a_run_is_not_finished_while_a_window_is_pending[postgres]",),
        "PostgreSQL: the rescuer's sweep finishes runs with windows pending",
    ),
    Mutant(
        "run-finish-pending-sqlite",
        "src/expiry/engines/sqlite/queries/runs.sql",
        "where id = :id and state = 'running'\n"
        "  and not exists (select 1 from expiry_jobs j\n"
        "                  where j.run_id = expiry_runs.id\n"
        "                    and j.state in ('scheduled', 'available', 'retryable', 'running'))",
        "where id = :id and state = 'running'",
        (f"{SAFETY}::test_a_run_is_not_finished_while_a_window_is_pending[sqlite]",),
        "SQLite: a run is finished right after planning (run_finish)",
    ),
    Mutant(
        "run-finish-idle-pending-sqlite",
        "src/expiry/engines/sqlite/queries/runs.sql",
        "where state = 'running'\n  and not exists (select 1 from expiry_jobs j\n",
        "where state = 'running'\n  and exists (select 1 from expiry_jobs j\n",
        (f"{SAFETY}::test_a_run_is_not_finished_while_a_window_is_pending[sqlite]",),
        "SQLite: the rescuer's sweep finishes runs with windows pending",
    ),
    Mutant(
        "claim-skip-locked",
        "src/expiry/engines/postgres/queries/jobs.sql",
        "for update skip locked",
        "for update",
        (
            "tests/queue/test_claim_skip_locked.py::"
            "test_a_claim_skips_a_due_job_locked_by_another_transaction",
        ),
        "PostgreSQL: a claim waits for a due job another transaction has locked",
    ),
    Mutant(
        "retry-jitter",
        "src/expiry/queue/retry.py",
        "return (rng or random).uniform(0.0, ceiling(attempt, base, cap))",
        "return ceiling(attempt, base, cap)",
        (
            f"{RETRY}::test_delays_for_the_same_attempt_spread_over_zero_to_the_ceiling",
            f"{RETRY}::test_jobs_failing_together_retry_at_different_times[sqlite]",
        ),
        "retries without jitter: every job retries after the ceiling",
    ),
    Mutant(
        "retry-half-jitter",
        "src/expiry/queue/retry.py",
        "return (rng or random).uniform(0.0, ceiling(attempt, base, cap))",
        "return (rng or random).uniform(ceiling(attempt, base, cap) / 2, ceiling(attempt, base, cap))",
        (f"{RETRY}::test_delays_for_the_same_attempt_spread_over_zero_to_the_ceiling",),
        "retries with equal jitter instead of full jitter",
    ),
    Mutant(
        "retry-cap",
        "src/expiry/queue/retry.py",
        "return min(cap, base * 2.0 ** max(0, min(attempt, 62)))",
        "return base * 2.0 ** max(0, min(attempt, 62))",
        (
            f"{RETRY}::test_no_delay_exceeds_the_cap",
            f"{RETRY}::test_a_late_attempt_retries_within_the_cap[postgres]",
        ),
        "retries without the 600 s cap",
    ),
    Mutant(
        "ledger-guard",
        "src/expiry/cleanup/sql.py",
        UNBOOKED,
        "UNBOOKED = WINDOW",
        (
            f"{SAFETY}::test_a_redelivered_window_does_not_wait_for_rows_locked_by_live_traffic",
            "tests/cleanup/test_cleanup.py::test_duplicate_delivery_changes_nothing[sqlite]",
        ),
        "the delete is not guarded by the ledger (a duplicate deletes, then rolls back)",
    ),
    Mutant(
        "ledger-strict-pg",
        WINDOW_APPLY,
        LEDGER_INSERT,
        LEDGER_INSERT_LAX,
        (
            "tests/cleanup/test_window_booking.py::"
            "test_a_delivery_racing_an_uncommitted_one_rolls_back_its_delete[statement]",
        ),
        "PostgreSQL: a delivery that took rows need not own the window's ledger row",
    ),
    # The ledger guard and the ledger's primary key each stop a duplicate delivery
    # on their own (ledger-guard survives the data tests: the duplicate's delete
    # rolls back). With both gone, a duplicate deletes rows that expired since.
    Mutant(
        "ledger-guard+strict-sqlite",
        "src/expiry/cleanup/sql.py",
        UNBOOKED,
        "UNBOOKED = WINDOW",
        (f"{SAFETY}::test_a_redelivered_window_takes_nothing_that_expired_since[sqlite]",),
        "SQLite: no ledger guard, and the ledger insert after a delete is not strict",
        also=(("src/expiry/engines/seam/ledger.py", "strict=rows > 0,", "strict=False,"),),
    ),
    Mutant(
        "ledger-guard+strict-pg",
        "src/expiry/cleanup/sql.py",
        UNBOOKED,
        "UNBOOKED = WINDOW",
        (f"{SAFETY}::test_a_redelivered_window_takes_nothing_that_expired_since[postgres]",),
        "PostgreSQL: no ledger guard, and window_apply's ledger insert is not strict",
        also=((WINDOW_APPLY, LEDGER_INSERT, LEDGER_INSERT_LAX),),
    ),
    Mutant(
        "ledger-guard+strict-mysql",
        "src/expiry/cleanup/sql.py",
        UNBOOKED,
        "UNBOOKED = WINDOW",
        (f"{SAFETY}::test_a_redelivered_window_takes_nothing_that_expired_since[mysql]",),
        "MySQL: no ledger guard, and the ledger insert after a delete is not strict",
        also=(("src/expiry/engines/seam/ledger.py", "strict=rows > 0,", "strict=False,"),),
    ),
    Mutant(
        "mysql-epoch-bound",
        "src/expiry/engines/mysql/tables.py",
        'bound = "cast(ceil(unix_timestamp({p_cutoff})) as signed)"',
        'bound = "cast(floor(unix_timestamp({p_cutoff})) + 1 as signed)"',
        ("tests/cleanup/test_oracle.py::test_mysql_every_column_type",),
        "MySQL: epoch seconds compared with the cutoff's next whole second (takes live rows)",
    ),
    Mutant(
        "iso-guard",
        "src/expiry/engines/sqlite/tables.py",
        " and typeof({ts}) = 'text' and julianday({ts}) < julianday({p_exact})",
        " and typeof({ts}) = 'text'",
        (
            f"{TIMESTAMPS}::test_a_row_written_in_another_storage_after_planning_is_never_deleted"
            "[TEXT iso T and Z]",
        ),
        "ISO text compared only lexically: another spelling written after planning goes",
    ),
    Mutant(
        "numeric-guard",
        "src/expiry/engines/sqlite/tables.py",
        'return "{p_cutoff}", f" and {storage.plausible()}"',
        'return "{p_cutoff}", ""',
        (
            f"{TIMESTAMPS}::test_a_row_written_in_another_storage_after_planning_is_never_deleted"
            "[DATETIME epoch seconds]",
        ),
        "numbers without their storage class and range: a julianday in an epoch column goes",
    ),
    Mutant(
        "mixed-classes",
        "src/expiry/cleanup/detection.py",
        'if "blob" in classes or ("text" in classes and len(classes) > 1):',
        'if "blob" in classes:',
        (f"{TIMESTAMPS}::test_a_column_that_could_be_misread_is_refused[integers and ISO text]",),
        "a column mixing numbers and text is read as text",
    ),
    Mutant(
        "numeric-ranges",
        "src/expiry/cleanup/detection.py",
        "if low is None or high is None or low != high:",
        "if low is None and high is None:",
        (
            f"{TIMESTAMPS}::test_a_column_that_could_be_misread_is_refused"
            "[epoch seconds and milliseconds]",
        ),
        "numbers of two formats read as one",
    ),
    Mutant(
        "late-cutoff",
        "src/expiry/cleanup/service.py",
        "elif cutoff > latest and not force:",
        "elif cutoff > latest and force:",
        (
            "tests/cli/test_cli_guards.py::"
            "test_a_cutoff_later_than_now_minus_retain_is_refused_unless_forced",
        ),
        "a cutoff later than now - retain is accepted without force",
    ),
    Mutant(
        "time-upper-open",
        "src/expiry/cleanup/sql.py",
        '" and {ts} <= {p_hi_ts} and ({ts}, {tie}) <= ({p_hi_ts}, {p_hi_tie})",',
        '" and {ts} <= {p_hi_ts} and ({ts}, {tie}) < ({p_hi_ts}, {p_hi_tie})",',
        (
            f"{ORACLE}::test_sqlite_deletes_exactly_what_the_oracle_expires",
            f"{ORACLE}::test_postgres_deletes_exactly_what_the_oracle_expires",
        ),
        "time windows exclude their upper position: the row at each bound is never deleted",
    ),
    Mutant(
        "time-position-seconds",
        "src/expiry/cleanup/statements.py",
        "        return value.isoformat()\n",
        '        return value.isoformat(timespec="seconds")\n',
        (f"{ORACLE}::test_postgres_deletes_exactly_what_the_oracle_expires",),
        "PostgreSQL positions lose their microseconds: windows miss or repeat rows",
    ),
    Mutant(
        "blocks-lower-item",
        "src/expiry/cleanup/planner.py",
        "Span.blocks(block * BLOCK, LAST_ADDRESS",
        "Span.blocks(block * BLOCK + 1, LAST_ADDRESS",
        (f"{ORACLE}::test_postgres_deletes_exactly_what_the_oracle_expires",),
        "block windows start past their first block's first row: it is never deleted",
    ),
    Mutant(
        "sample-check",
        "src/expiry/cleanup/statements.py",
        "if when is None or not when < self.edge(cutoff):",
        "if when is None:",
        (
            f"{TIMESTAMPS}::test_the_sample_check_stops_a_run_whose_predicate_takes_live_rows[sqlite]",
        ),
        "the run's sample check reads the candidates but never stops the run",
    ),
    Mutant(
        "turns-wait-for-any-run",
        "src/expiry/cleanup/planner.py",
        "earlier = [t for t in turns if (t.cutoff, t.id) < order]",
        "earlier = [t for t in turns if t.id != rid]",
        (
            f"{TURNS}::test_a_run_with_an_earlier_cutoff_never_waits_for_a_later_one[sqlite]",
            f"{TURNS}::test_runs_opened_worked_and_abandoned_in_any_order_all_end_and_clean[postgres]",
        ),
        "a run waits for every other run of its policy, later ones too: two runs wait for ever",
    ),
    Mutant(
        "turns-no-coalescing",
        "src/expiry/cleanup/planner.py",
        "if newest and newest[0].id != rid and not mine.started:",
        "if False:",
        (f"{TURNS}::test_two_runs_opened_before_any_worker_finish_in_one_pass[mysql]",),
        "runs queued behind one are not coalesced into the newest: each plans in turn",
    ),
    Mutant(
        "turns-wait-on-backoff",
        "src/expiry/cleanup/planner.py",
        "moving = [t for t in earlier if t.started and t.active]",
        "moving = [t for t in earlier if t.started and t.pending]",
        (
            f"{TURNS}::test_a_run_supersedes_an_earlier_run_whose_jobs_only_wait_for_a_retry"
            "[postgres]",
        ),
        "a run waits for an earlier one whose windows only back off (behind a held lock): "
        "the policy stops cleaning for minutes",
    ),
    Mutant(
        "quarantine-dead-letters",
        "src/expiry/cleanup/policies.py",
        '            raise Snooze(QUARANTINE_WAIT_SECONDS, f"policy quarantined: {exc}") from exc\n',
        '            raise PermanentError(f"policy quarantined: {exc}") from exc\n',
        (
            f"{QUARANTINE}::test_a_worker_that_starts_while_the_table_is_missing_leaves_the_run_waiting",
        ),
        "a quarantined policy's jobs are dead-lettered instead of waiting for the repair",
    ),
    Mutant(
        "tie-index-advised-everywhere",
        "src/expiry/cleanup/strategy.py",
        "        ends = relation is not None and p.key in (relation.rowid, relation.clustered)\n",
        "        ends = False\n",
        (
            "tests/cleanup/test_schema_check.py::test_the_tie_index_is_advised_only_where_the_"
            "database_would_sort",
        ),
        "check advises a (timestamp, key) index on InnoDB and SQLite rowid tables, where "
        "the index on the timestamp already ends with the key: a redundant index to keep up",
    ),
    Mutant(
        "unscheduled-silent",
        "src/expiry/health/roll.py",
        "        if late > grace:\n",
        "        if late > grace * 1000:\n",
        (
            "tests/scheduler/test_scheduler.py::test_a_schedule_no_scheduler_keeps_is_said_until_"
            "one_takes_its_fires",
        ),
        "a schedule whose fires no scheduler takes is said only once it is days late: "
        "no run opens and nothing says why",
    ),
    Mutant(
        "redelivered-from-attempts",
        "src/expiry/cleanup/runs.py",
        '        "redelivered": sum(j.redelivered for j in windows),',
        '        "redelivered": sum(\n            j.attempts - j.n - j.failures for j in windows if j.state == "completed"\n        ),',
        (
            "tests/cleanup/test_window_booking.py::test_a_run_counts_a_window_delivered_again_"
            "after_its_lease_was_lost",
        ),
        "a run's redeliveries read off attempts spent: a lost lease is not counted, and a "
        "redrive or a refunded attempt makes the figure negative",
    ),
    Mutant(
        "redrive-leaves-run-finished",
        "src/expiry/engines/seam/jobs.py",
        '                self._rows(conn, "run_reopen", {"ids": self._list(runs)})\n',
        "                pass\n",
        (
            "tests/engines/test_conformance_runs.py::test_job_redrive_opens_the_finished_runs_"
            "of_the_jobs_it_sends_back",
        ),
        "a redriven window's run stays finished with its old finish time while the window "
        "retries: 'finished 0 of 4', and the run never finishes again",
    ),
    Mutant(
        "throttle-detail-stale",
        "src/expiry/health/throttle.py",
        "            self.detail = detail  # the same breach: its reading as of now\n",
        "",
        (
            "tests/test_throttle.py::test_a_hold_says_its_reading_as_of_the_last_check_and_since_when",
        ),
        "a hold shows the reading of its first check for as long as it lasts: "
        "'replica_lag 7 > 5' while the lag is 60 s",
    ),
    Mutant(
        "cron-dead-letter-every-fire",
        "src/expiry/cron/targets.py",
        "            if job.attempt >= job.max_attempts and self._next_soon(target, job, result.error):",
        "            if False:",
        (
            "tests/http/test_http_cron.py::test_a_call_failing_at_its_last_attempt_gives_way_to_a_"
            "fire_soon_or_is_dead_lettered",
        ),
        "a per-minute cron target that is down dead-letters a call a minute: the dead-letter "
        "queue floods and hides the cleanup's own dead windows",
    ),
    Mutant(
        "drift-dead-letters",
        "src/expiry/cleanup/policies.py",
        "            if not self.engine.schema_drift(exc):\n                raise\n",
        "            if True:\n                raise\n",
        (
            f"{QUARANTINE}::test_a_table_renamed_mid_run_quarantines_the_policy_and_its_return"
            "_resumes_the_run[postgres]",
            "tests/http/test_http_cleanup.py::test_a_table_renamed_under_a_running_server_is"
            "_shown_broken_never_a_500[mysql]",
        ),
        "a table renamed under a running worker dead-letters its windows instead of waiting",
    ),
    Mutant(
        "stall-never-said",
        "src/expiry/queue/worker.py",
        "return 1 if stalled else 0",
        "return 0",
        (f"{STALLED}::test_an_idle_worker_exits_1_while_a_run_it_serves_is_stalled[sqlite]",),
        "an idle --until-idle worker exits 0 with a run stalled: nobody hears of it",
    ),
    Mutant(
        "shrink-retry-backs-off",
        "src/expiry/cleanup/window.py",
        "retry_within=defaults.SHRINK_RETRY_SECONDS,",
        "retry_within=None,",
        (f"{TIMEOUTS}::test_a_slow_row_is_isolated_in_seconds_after_spent_attempts",),
        "a window retried smaller after a timeout waits its growing backoff: minutes per slow row",
    ),
    Mutant(
        "shrink-spends-attempts",
        "src/expiry/cleanup/window.py",
        "                spend=False,\n",
        "",
        (f"{TIMEOUTS}::test_a_held_row_is_isolated_in_seconds_with_the_backoff_as_shipped",),
        "each smaller retry of a timed-out window spends an attempt: a worker lost on the "
        "last one dead-letters the window",
    ),
    Mutant(
        "late-sigterm-kills",
        "src/expiry/cli/main.py",
        "signals.listening(grace=args.stop_grace, exiting=True)",
        "signals.listening(grace=args.stop_grace)",
        (f"{SIGNALS}::test_a_second_sigterm_during_a_clean_exit_never_kills_the_worker",),
        "a second SIGTERM during a clean exit kills the worker (-15) once its handlers are back",
    ),
    Mutant(
        "outage-spends-attempts",
        "src/expiry/queue/runner.py",
        "            return self.outage_budget\n",
        "            return None\n",
        (
            f"{OUTAGE}::test_a_full_disk_fails_a_window_many_times_and_spends_no_attempt[sqlite]",
            f"{OUTAGE}::test_a_full_disk_fails_a_window_many_times_and_spends_no_attempt[mysql]",
        ),
        "a full disk or a restart spends a window's attempts: a long outage dead-letters it",
    ),
    Mutant(
        "timeout-no-shrink",
        "src/expiry/cleanup/window.py",
        "rows = max(1, -(-n // 2 ** min(halvings, 62)))",
        "rows = max(1, n)",
        (
            f"{TIMEOUTS}::test_the_rest_of_a_shrunk_window_starts_small_and_grows_back",
            f"{TIMEOUTS}::test_a_row_slower_than_statement_timeout_is_kept_and_the_rest_deleted"
            "[postgres]",
        ),
        "a window retried after a timeout tries its whole span again: it shrinks only by the "
        "split at each job's last attempt, max_attempts timeouts a halving",
    ),
    Mutant(
        "shrunk-rest-full-size",
        "src/expiry/cleanup/jobs.py",
        "halvings=max(0, halvings - 1), held=held)",
        "halvings=0, held=held)",
        (f"{TIMEOUTS}::test_the_rest_of_a_shrunk_window_starts_small_and_grows_back",),
        "the rest of a window shrunk around a held row starts at full size again: every held "
        "row ahead costs log2(window) timeouts more (O(log² n)), its run open for minutes",
    ),
    Mutant(
        "timeout-last-attempt-dies",
        "src/expiry/cleanup/window.py",
        "if not alone and job.attempt < job.max_attempts:",
        "if not alone:",
        (
            f"{TIMEOUTS}::test_a_window_that_times_out_at_its_last_attempt_is_split_not_dead"
            "[postgres-1]",
        ),
        "a window that times out at its last attempt is dead-lettered, its run never finishes",
    ),
    Mutant(
        "second-signal-ignored",
        "src/expiry/signals.py",
        '            self._exit(f"{name} while stopping", signum)\n',
        "            return\n",
        (f"{SIGNALS}::test_a_second_sigterm_exits_at_once[worker]",),
        "a second SIGTERM is ignored: a worker stuck on a lock outlives its operator's patience",
    ),
    Mutant(
        "stop-grace-unbounded",
        "src/expiry/signals.py",
        "        if self.stopping_since is None:\n            return None\n",
        "        if True:\n            return None\n",
        (f"{SIGNALS}::test_a_stop_that_outlasts_the_grace_exits_at_once[scheduler]",),
        "the grace period never ends: a stop stuck on a lock waits for it for ever",
    ),
    Mutant(
        "check-migrates",
        "src/expiry/cli/running.py",
        "    app = reading(args, need_config=True)\n    cleanup = app.table_reader()\n",
        "    app = migrated(args, need_config=True)\n    cleanup = app.table_reader()\n",
        (f"{READ_ONLY}::test_reading_commands_create_nothing_on_a_never_migrated_postgres[owner]",),
        "`expiry check` migrates again: a validation creates expiry's schema in the database",
    ),
    Mutant(
        "read-only-sqlite-migrates",
        "src/expiry/app.py",
        "                if not engine.kind.embedded or self.read_only:\n",
        "                if not engine.kind.embedded:\n",
        (f"{READ_ONLY}::test_reading_commands_create_nothing_in_an_application_sqlite_file",),
        "a reading command migrates the application's SQLite file on first use",
    ),
    Mutant(
        "nice-rests-never-under-load",
        "src/expiry/health/database.py",
        "return foreground == 0 and self.clock() - when <= 2 * self.interval",
        "return foreground is not None and self.clock() - when <= 2 * self.interval",
        (f"{PACING}::{QUIET}[postgres]", f"{PACING}::{QUIET}[mysql]"),
        "nice_ratio skips its rest while the application's sessions are at work",
    ),
    Mutant(
        "foreground-sees-no-one",
        "src/expiry/engines/postgres/tables.py",
        "  and application_name is distinct from current_setting('application_name')\n",
        "  and false\n",
        (f"{FOREGROUND}[postgres]",),
        "PostgreSQL: the application's sessions at work are not seen: nice_ratio never rests",
    ),
    Mutant(
        "foreground-counts-its-own-connections",
        "src/expiry/engines/mysql/engine.py",
        "and id <> connection_id() and id not in %(own)s\n",
        "and id <> connection_id()\n",
        (f"{PACING}::{QUIET}[mysql]",),
        "MySQL: the worker's own idle connections read as the application's: it always rests",
    ),
    Mutant(
        "sqlite-key-windows-through-the-timestamp-index",
        "src/expiry/engines/sqlite/tables.py",
        '    unindexed = "+{}"\n',
        "",
        (f"{TIMESTAMPS}::test_sqlite_key_windows_scan_the_key_not_the_timestamps_index[epoch]",),
        "SQLite reads every expired row through the timestamp's index for each key window",
    ),
    Mutant(
        "hold-left-out-of-the-windows",
        "src/expiry/cleanup/statements.py",
        "        pred += self._beyond_newest() + unheld\n",
        "        pred += self._beyond_newest()\n",
        (f"{HOLDS}::test_no_window_deletes_a_held_row_and_every_other_expired_row_goes[mysql]",),
        "a [[hold]] is read by the check and the counts, not by the windows: held rows go",
    ),
    Mutant(
        "hold-changed-not-audited",
        "src/expiry/cleanup/holds.py",
        "        if in_force.get(hold.name) != hold_detail(hold)\n",
        "        if hold.name not in in_force\n",
        (f"{HOLDS}::test_placing_changing_and_lifting_a_hold_is_audited_once_each[sqlite]",),
        "a hold whose rows changed in the config is not audited: the log says the old rows",
    ),
    Mutant(
        "hold-partition-dropped",
        "src/expiry/cleanup/statements.py",
        'if row.fetchone()["expired"] and not self._holds_a_row(conn, part):\n',
        'if row.fetchone()["expired"]:\n',
        (
            f"{HOLDS}::test_a_partition_holding_a_held_row_is_cleaned_by_windows_and_the_others_dropped[auto]",
        ),
        "a whole expired partition is dropped with the held row in it",
    ),
    Mutant(
        "hold-on-a-table-written-otherwise",
        "src/expiry/config/__init__.py",
        "                if same_name and not same_table(hold.table, policy.table):\n",
        "            if False:\n",
        (f"{HOLDS}::test_a_hold_that_could_be_misread_is_refused_with_the_fix",),
        "a hold on public.sessions is silently not applied to a policy on sessions",
    ),
    Mutant(
        "keep-last-one-too-few",
        "src/expiry/cleanup/statements.py",
        "limit 1 offset {int(p.keep_last) - 1})",
        "limit 1 offset {int(p.keep_last) - 2})",
        (f"{KEEP_LAST}::{KEPT}[sqlite-per-user]", f"{KEEP_LAST}::{KEPT}[postgres-whole-table]"),
        "keep_last keeps N - 1 rows: the N-th newest of each group is deleted",
    ),
    Mutant(
        "keep-last-across-groups",
        "src/expiry/cleanup/statements.py",
        'same = f" where n.{q(p.group_by)} = {table}.{q(p.group_by)}" if p.group_by else ""\n',
        'same = ""\n',
        (f"{KEEP_LAST}::{KEPT}[mysql-per-user]",),
        "keep_last counts the table's newest rows, not each group's: a user's newest go",
    ),
    Mutant(
        "keep-last-read-at-planning",
        "src/expiry/cleanup/statements.py",
        "        pred += self._beyond_newest() + unheld\n",
        '        pred += (self._beyond_newest() if "delete" not in template else "") + unheld\n',
        (f"{KEEP_LAST}::test_keep_last_is_read_as_the_window_runs[postgres]",),
        "the windows' statements leave keep_last out: what planning chose is deleted whole",
    ),
    Mutant(
        "lock-holders-of-every-database",
        "src/expiry/engines/mysql/queries/database.sql",
        "  and p.db = database()\n",
        "",
        (
            "tests/engines/test_conformance_tables.py::"
            "test_lock_holders_leaves_out_a_session_of_another_database[mysql]",
        ),
        "MariaDB: a lock wait names another database's transactions as the table's holders",
    ),
    Mutant(
        "foreground-counts-expiry",
        "src/expiry/engines/mysql/engine.py",
        "  and coalesce(info, '') not like '%%expiry\\\\_%%'\n",
        "",
        (f"{FOREGROUND}[mysql]",),
        "MySQL: expiry's own statements counted as the application's: an idle database rests",
    ),
    Mutant(
        "history-by-the-hour",
        "src/expiry/engines/postgres/queries/ledger.sql",
        "select l.policy, date_trunc('minute', l.applied_at) as minute,",
        "select l.policy, date_trunc('hour', l.applied_at) as minute,",
        (
            "tests/engines/test_conformance_ledger_audit.py::"
            "test_ledger_minutes_sum_each_policys_windows_and_rows_per_minute_since[postgres]",
        ),
        "the dashboard's rows per minute summed by the hour: the history a shape it never had",
        also=(
            (
                "src/expiry/engines/postgres/queries/ledger.sql",
                "group by l.policy, date_trunc('minute', l.applied_at)",
                "group by l.policy, date_trunc('hour', l.applied_at)",
            ),
        ),
    ),
    Mutant(
        "server-kind-embedded",
        "src/expiry/engines/kinds.py",
        '    poolers=("none", "session", "transaction"),\n)',
        '    poolers=("none", "session", "transaction"),\n    embedded=True,\n)',
        ("tests/test_first_use.py::test_a_server_database_without_the_schema_says_to_migrate",),
        "PostgreSQL taken for an embedded file: the App alters a server's schema on first use",
    ),
    Mutant(
        "zone-ignored-in-predicate",
        "src/expiry/timestamps.py",
        "        if not self.zone:\n            return cutoff\n",
        "        if True:\n            return cutoff\n",
        (
            f"{DJANGO}[sqlite]",
            f"{DJANGO}[postgres]",
            f"{DJANGO}[mysql]",
            f"{ZONES}::test_a_partition_of_naive_local_times_is_dropped_once_its_range_has_passed"
            "_there",
        ),
        "the delete (and a partition's drop) compares naive local times with the cutoff as UTC",
    ),
    Mutant(
        "zone-ignored",
        "src/expiry/timestamps.py",
        "        if not self.zone:\n            return cutoff\n",
        "        if True:\n            return cutoff\n",
        (f"{DJANGO}[mysql]", f"{DJANGO}[sqlite]"),
        "the zone ignored by the predicate and the sample check alike: live sessions go",
        also=(
            (
                "src/expiry/cleanup/statements.py",
                'when = UNIX_EPOCH if zero else instant(row["v"], storage.zone)',
                'when = UNIX_EPOCH if zero else instant(row["v"])',
            ),
        ),
    ),
    Mutant(
        "repeated-hour-earlier",
        "src/expiry/timestamps.py",
        "    return max(readings)\n",
        "    return min(readings)\n",
        (f"{FALL_BACK}[sqlite]", f"{FALL_BACK}[postgres]"),
        "a repeated hour's value read as its first pass: it goes an hour early",
    ),
    Mutant(
        "repeated-hour-start",
        "src/expiry/timestamps.py",
        "        candidates.add(_repeat_start(wall, zone))\n",
        "        pass\n",
        (f"{FALL_BACK}[mysql]",),
        "a cutoff in a repeated hour's first pass bounds at its own wall-clock time",
    ),
    Mutant(
        "skipped-hour-offsets",
        "src/expiry/timestamps.py",
        "    for back in LOOKBACK:\n",
        "    for back in LOOKBACK[:1]:\n",
        (f"{SPRING_FORWARD}[postgres]",),
        "the hour after clocks go forward bounds at the cutoff's own wall-clock time",
    ),
    Mutant(
        "zone-on-zoned-column",
        "src/expiry/cleanup/detection.py",
        "        if self._naive:\n            return storage.zoned(zone) if zone else storage\n",
        "        if True:\n            return storage.zoned(zone) if zone else storage\n",
        (
            f"{ZONES}::test_a_zone_stated_for_a_column_that_carries_its_own_is_refused[postgres]",
            f"{ZONES}::test_the_database_default_zone_does_not_apply_to_a_column_that_carries"
            "_its_own[mysql]",
        ),
        "a timestamptz or TIMESTAMP column read as wall-clock time of the zone: shifted cutoffs",
    ),
    Mutant(
        "watermark-zone",
        "src/expiry/timestamps.py",
        "        return instant(value, self.zone)\n",
        "        return instant(value)\n",
        (f"{ZONES}::test_the_watermark_reads_naive_values_in_the_zone[postgres]",),
        "the watermark reads a naive value as UTC whatever the zone",
    ),
    Mutant(
        "form-limit-is-api-limit",
        "src/expiry/http/api.py",
        "form_limit=http.form_body_bytes,",
        "form_limit=http.max_body_bytes,",
        (f"{ANONYMOUS}::test_a_form_over_form_body_bytes_or_64_fields_is_413_before_any_check",),
        "a dashboard form is read up to the API's 4 MiB before any sign-in or CSRF check",
    ),
    Mutant(
        "form-fields-unbounded",
        "src/expiry/http/render.py",
        "keep_blank_values=True, max_num_fields=FORM_FIELDS",
        "keep_blank_values=True, max_num_fields=None",
        (f"{ANONYMOUS}::test_a_form_over_form_body_bytes_or_64_fields_is_413_before_any_check",),
        "a dashboard form of any number of fields is parsed for a caller without a key",
    ),
    Mutant(
        "form-posts-unlimited",
        "src/expiry/http/security.py",
        'if dashboard and scope["method"] == "POST" and self.forms is not None:',
        'if dashboard and scope["method"] == "POST" and self.forms is None:',
        (
            f"{ANONYMOUS}::test_form_posts_are_limited_per_address_and_forwarded_for_does_not"
            "_escape",
        ),
        "dashboard form posts (sign-in attempts) are not limited per address",
    ),
    Mutant(
        "forwarded-for-from-loopback",
        "src/expiry/http/serving.py",
        "proxy_headers=bool(http.trusted_proxies),",
        "proxy_headers=True,",
        (
            f"{ANONYMOUS}::test_form_posts_are_limited_per_address_and_forwarded_for_does_not"
            "_escape",
        ),
        "X-Forwarded-For from loopback is believed: a rotating header escapes every limit",
    ),
    Mutant(
        "head-deadline-unarmed",
        "src/expiry/http/serving.py",
        "        self._disarm()\n        self._head_timer = self.loop.call_later(",
        "        return\n        self._head_timer = self.loop.call_later(",
        (f"{ANONYMOUS}::test_a_request_head_that_trickles_in_is_cut_off",),
        "a connection trickling its request head is held for as long as the client likes",
    ),
    Mutant(
        "partition-books-estimate",
        "src/expiry/engines/postgres/tables.py",
        '            conn.execute(f"drop table {name}")\n        return rows\n',
        '            conn.execute(f"drop table {name}")\n'
        "        return partition.rows if partition.rows >= 0 else rows\n",
        (
            "tests/cleanup/test_real_tables.py::test_a_removed_partition_books_the_rows_it_held"
            "_not_the_estimate",
        ),
        "a dropped or detached partition is booked in the ledger with the planner's estimate "
        "(2.3x the rows it held after a bulk delete): the evidence of deletion is wrong",
    ),
    Mutant(
        "evidence-skips-a-run",
        "src/expiry/cleanup/runs.py",
        "            if run is None or entry.run_id is None:",
        '            if run is None or entry.run_id is None or run.state != "finished":',
        ("tests/cli/test_cli.py::test_evidence_lists_what_each_run_deleted_as_the_table_lost_it",),
        "expiry evidence leaves out the bookings of a run not marked finished",
    ),
    Mutant(
        "prune-open-run-evidence",
        "src/expiry/engines/postgres/queries/ledger.sql",
        "    where r.state = 'finished' and r.finished_at < now() - make_interval(secs => %(age)s)\n"
        "    limit %(limit)s\n)\ndelete from expiry.ledger",
        "    where r.opened_at < now() - make_interval(secs => %(age)s)\n"
        "    limit %(limit)s\n)\ndelete from expiry.ledger",
        (
            "tests/engines/test_conformance_ledger_audit.py::test_ledger_prune_deletes_old_finished"
            "_runs_evidence_and_then_the_runs[postgres]",
        ),
        "PostgreSQL: the ledger of a run still open, opened long ago, is pruned with the old ones",
    ),
    Mutant(
        "late-cutoff-against-now",
        "src/expiry/cleanup/service.py",
        "        elif cutoff > latest and not force:",
        "        elif cutoff > now and not force:",
        (
            "tests/cli/test_cli_guards.py::test_a_cutoff_later_than_now_minus_retain_is_refused"
            "_unless_forced",
        ),
        "the late-cutoff guard compares with now, not now - retain: a cutoff inside the "
        "retention is accepted and deletes rows still kept",
    ),
    Mutant(
        "key-window-lower-inclusive",
        "src/expiry/cleanup/sql.py",
        '"key": "{key} > {p_lo} and {key} <= {p_hi}",',
        '"key": "{key} >= {p_lo} and {key} <= {p_hi}",',
        (
            "tests/cleanup/test_window_booking.py::test_a_key_window_takes_and_books_exactly_the"
            "_rows_of_its_range",
        ),
        "a key window reaches its lower bound: it takes the key of the window below (the table "
        "ends the same, the ledger's counts are wrong)",
    ),
    Mutant(
        "iso-cutoff-offset-dropped",
        "src/expiry/timestamps.py",
        "        return text + self.offset\n",
        "        return text\n",
        (
            "tests/cleanup/test_timestamps.py::test_a_row_written_in_another_storage_after_planning"
            "_is_never_deleted[TEXT iso +02:00]",
        ),
        "the ISO cutoff loses its offset: the per-row guard on a +02:00 column runs two hours "
        "late, and a live value spelled in another offset goes",
    ),
    Mutant(
        "turns-wait-on-two",
        "src/expiry/cleanup/planner.py",
        "moving = [t for t in earlier if t.started and t.active]",
        "moving = [t for t in earlier if t.started and t.active > 1]",
        (f"{TURNS}::test_a_run_waits_for_an_earlier_run_that_started_and_says_so",),
        "a new run does not wait for an earlier one with exactly one job running or due: two "
        "runs of a policy apply windows at once",
    ),
    Mutant(
        "heartbeat-every-lease",
        "src/expiry/queue/worker.py",
        "        while not self.stopping.wait(self.lease / 3):",
        "        while not self.stopping.wait(self.lease):",
        ("tests/queue/test_worker.py::test_a_job_longer_than_its_lease_keeps_it_by_heartbeats",),
        "heartbeats every lease, not every third: a long job's lease runs out between two and "
        "another worker takes it over",
    ),
    Mutant(
        "inclusive-ignored",
        "src/expiry/cleanup/statements.py",
        "        return cutoff + timedelta(microseconds=1) if self.policy.inclusive else cutoff\n",
        "        return cutoff\n",
        (
            "tests/cleanup/test_cleanup.py::test_inclusive_deletes_the_rows_at_the_cutoff_and_none_after",
        ),
        "inclusive = true is ignored: the rows at the cutoff stay (Laravel's <= is not applied)",
    ),
    Mutant(
        "inclusive-a-second",
        "src/expiry/cleanup/statements.py",
        "        return cutoff + timedelta(microseconds=1) if self.policy.inclusive else cutoff\n",
        "        return cutoff + timedelta(seconds=1) if self.policy.inclusive else cutoff\n",
        (
            "tests/cleanup/test_cleanup.py::test_inclusive_deletes_the_rows_at_the_cutoff_and_none_after",
        ),
        "inclusive widens the cutoff by a second: rows up to a second past it, not yet expired, go",
    ),
    Mutant(
        "epoch-zero-kept",
        "src/expiry/timestamps.py",
        '        return f"({low} or {{ts}} = 0)" if self.zero else low\n',
        "        return low\n",
        (
            "tests/cleanup/test_timestamps.py::test_a_zero_in_a_stated_epoch_column_is_the_epoch"
            "_itself",
        ),
        "a 0 in a stated epoch column is never deleted, though the policy reads it as 1970 "
        "(the run counts it and books fewer rows: Nextcloud's never-used tokens stay for ever)",
    ),
    Mutant(
        "held-rows-halved",
        "src/expiry/cleanup/window.py",
        '        return bool(job.payload.get("held"))\n',
        "        return False\n",
        (
            f"{TIMEOUTS}::test_a_window_behind_a_held_row_is_cut_around_it_after_one_lock_wait"
            "[postgres]",
            f"{TIMEOUTS}::test_rows_held_apart_in_one_window_cost_one_lock_wait[postgres]",
        ),
        "a window behind a held row is halved one lock wait at a time, never cut around it: "
        "log2(window) lock timeouts a held row, the run open as long as the lock (the soak's "
        "p99 miss)",
    ),
    Mutant(
        "held-rest-dropped",
        "src/expiry/cleanup/window.py",
        "part, rest = (span, None) if held[0] == span.hi else span.split(held[0])",
        "part, rest = (span, None) if held[0] == span.hi else (span, None)",
        (f"{TIMEOUTS}::test_rows_held_apart_in_one_window_cost_one_lock_wait[postgres]",),
        "the rows after a held one are dropped from the run: booked with the held row, never "
        "deleted",
    ),
    Mutant(
        "probe-refusal-fatal",
        "src/expiry/cleanup/window.py",
        'if self.engine.classify(exc)[1] != "insufficient_privilege":',
        "if True:",
        (f"{TIMEOUTS}::test_a_role_that_may_not_lock_rows_halves_around_a_held_row",),
        "a role without UPDATE (the README's worker grants) has its probe refused: the window "
        "is dead-lettered at its first lock wait, the run never finishes",
    ),
    Mutant(
        "scratch-kept",
        "src/expiry/engines/postgres/engine.py",
        "with conn.transaction(force_rollback=True):",
        "with conn.transaction():",
        (
            "tests/engines/test_conformance_scratch.py::"
            "test_what_a_scratch_block_writes_is_gone_after_it[postgres]",
        ),
        "the probe's savepoint is released, not rolled back: its row locks on the rest of the "
        "window last to the commit, live transactions wait on expiry",
    ),
    Mutant(
        "next-key-ignored",
        "src/expiry/engines/mysql/engine.py",
        "    next_key_reads = True\n",
        "    next_key_reads = False\n",
        (f"{TIMEOUTS}::test_rows_held_apart_in_one_window_cost_one_lock_wait[mysql]",),
        "on MariaDB the part cut before a held row ends at the row below it: its range read "
        "waits on the held row's lock, every cut times out again",
    ),
    Mutant(
        "reader-sees-every-queue",
        "src/expiry/keys.py",
        '        return self.can("dlq:manage") or self.can_queue("consume", queue)\n',
        '        return self.can("read") or self.can_queue("consume", queue)\n',
        (f"{DASHBOARD}::test_a_read_key_sees_in_the_dashboard_only_what_the_api_shows_it[sqlite]",),
        "a read key sees in the dashboard the payloads and dead letters of every queue, as "
        "the API never shows them",
    ),
    Mutant(
        "audit-shows-every-cron",
        "src/expiry/http/views.py",
        '        return owners.get(str(detail.get("name"))) == who.name\n',
        "        return True\n",
        (f"{DASHBOARD}::test_a_read_key_sees_in_the_dashboard_only_what_the_api_shows_it[sqlite]",),
        "the audit page shows a read key another key's cron target with the token in its URL",
    ),
    Mutant(
        "cron-busy-called-again",
        "src/expiry/cron/targets.py",
        "            if unfinished > 0:\n",
        "            if False:\n",
        (
            f"{SCHEDULER}::test_a_cron_target_whose_call_has_not_finished_is_not_called_again"
            "[sqlite]",
        ),
        "a target whose call has not finished is called again at every fire: a slow or "
        "failing target builds a backlog of calls, one a minute",
    ),
    Mutant(
        "cron-owners-unfair",
        "src/expiry/cron/targets.py",
        "            priority = ahead.get(target.owner, 0)\n",
        "            priority = 0\n",
        (
            f"{SCHEDULER}::test_cron_calls_are_shared_fairly_across_the_keys_that_own_targets"
            "[postgres]",
        ),
        "cron calls are claimed first come first served: one key's many targets delay "
        "another key's call behind all of theirs",
    ),
    Mutant(
        "cron-quota-ignored",
        "src/expiry/cron/targets.py",
        "            if owner is not None:\n                self._check_quota(owner, conn)\n",
        "",
        ("tests/http/test_http_exposure.py::test_a_key_owns_at_most_its_quota_of_cron_targets",),
        "one key creates cron targets without end and fills the cron threads",
    ),
    Mutant(
        "unserved-silent",
        "src/expiry/health/roll.py",
        "        if queue in stats.oldest_due_seconds and queue not in worked:\n",
        "        if queue in stats.oldest_due_seconds and queue in worked:\n",
        (
            "tests/dashboard/test_pages.py::"
            "test_due_work_that_no_live_worker_serves_is_said_on_every_surface[sqlite]",
        ),
        "with every worker down the overview, status and /metrics stay quiet while the "
        "policy's jobs wait: nothing cleans and nobody is told",
    ),
    Mutant(
        "pooler-prepares",
        "src/expiry/engines/postgres/engine.py",
        '{"prepare_threshold": None} if self.transaction_pooler else {}',
        "{}",
        (f"{PGBOUNCER}::{PGBOUNCER_RUN}",),
        "behind pgbouncer in transaction mode statements are prepared on lent server "
        "connections: another client's finds the name taken, the plan job dead-letters",
    ),
    Mutant(
        "pooler-session-limits",
        "src/expiry/engines/postgres/engine.py",
        "        if self.transaction_pooler:\n            # Never on the session",
        "        if False:\n            # Never on the session",
        (f"{PGBOUNCER}::{PGBOUNCER_RUN}",),
        "a window's lock_timeout and statement_timeout are set on the session: the pooler "
        "lends that server connection to the application, whose statements then time out",
    ),
    Mutant(
        "pooler-timezone-dropped",
        "src/expiry/engines/postgres/sessions.py",
        '    connection and stay there for the pooler\'s other clients."""\n'
        "    conn.execute(\"set timezone to 'UTC'\")\n",
        '    connection and stay there for the pooler\'s other clients."""\n',
        (f"{PGBOUNCER}::{PGBOUNCER_RUN}",),
        "behind a pooler expiry's sessions keep the database's default time zone: naive "
        "deadlines are read in it, and the run refuses (or, east of UTC, would read live "
        "rows as expired)",
    ),
    Mutant(
        "pooler-mismatch-permanent",
        "src/expiry/engines/postgres/sessions.py",
        '    "42P05": "pooler_mismatch",\n    "26000": "pooler_mismatch",\n',
        "",
        (
            f"{PGBOUNCER}::test_behind_pgbouncer_without_the_setting_nothing_dead_letters_and_"
            "the_log_says_the_fix",
        ),
        "behind an undeclared transaction pooler a taken statement name is the job's "
        "permanent failure: the plan job dead-letters and nothing says why",
    ),
    Mutant(
        "partition-waits-lock-timeout",
        "src/expiry/cleanup/partitions.py",
        "lock_timeout_ms=int(policy.partition_lock_timeout * 1000),",
        "lock_timeout_ms=int(policy.lock_timeout * 1000),",
        (PARTITION_HELD,),
        "a partition's detach waits the policy's 2 s lock_timeout: the application's "
        "queries queue behind it for 2 s at each try while a long read holds the table",
    ),
    Mutant(
        "partition-lock-spends-attempts",
        "src/expiry/cleanup/partitions.py",
        '        kind="lock_timeout",\n        retry_within=within,\n        spend=False,\n',
        '        kind="lock_timeout",\n        retry_within=within,\n        spend=True,\n',
        (PARTITION_HELD,),
        "each try of a partition's detach behind a long read spends an attempt: the "
        "partition is dead-lettered while the read lasts",
    ),
    Mutant(
        "referenced-rows-split",
        "src/expiry/cleanup/window.py",
        "        if not target.skips_referenced:\n            return None\n        first =",
        "        if target.skips_referenced:\n            return None\n        first =",
        (REFERENCED,),
        "a window a foreign key refuses is split in halves down to each referenced row, "
        "two jobs a referenced row, every run",
    ),
    Mutant(
        "referenced-kept-uncounted",
        "src/expiry/cleanup/window.py",
        "        kept = target.count_span(tx, cutoff, span, storage)\n        if kept:",
        "        kept = target.count_span(tx, cutoff, span, storage)\n        if not kept:",
        (REFERENCED,),
        "the rows a window left out because other tables reference them are not counted: "
        "the ledger and the run's rows_blocked say nothing was kept",
    ),
    Mutant(
        "referenced-skip-forgotten",
        "src/expiry/cleanup/window.py",
        "        skip = policy.name in self._referenced and target.skips_referenced\n",
        "        skip = False\n",
        (REFERENCED,),
        "a policy's windows never leave referenced rows out from the start: each pays a "
        "refused delete, then the split",
    ),
    Mutant(
        "dedupe-across-queues",
        "src/expiry/queue/jobs.py",
        '    return f"{queue}/{key}"\n',
        "    return key\n",
        ("tests/http/test_http_exposure.py::test_a_dedupe_key_is_its_queues_own[sqlite]",),
        "dedupe keys are shared by every queue: one publisher's key silently drops another "
        "queue's message of that key (200 enqueued:false) and tells that the key exists",
    ),
    Mutant(
        "receipt-unbound",
        "src/expiry/http/routes/queue.py",
        "    if key.admin:\n        return {job.id for job in jobs}\n",
        "    return {job.id for job in jobs}\n",
        ("tests/http/test_http_exposure.py::test_a_receipt_is_bound_to_its_queue[sqlite]",),
        "a consumer of one queue acks, nacks or heartbeats another queue's job with a "
        "receipt it got hold of",
    ),
    Mutant(
        "publish-quota-counts-nothing",
        "src/expiry/http/quotas.py",
        '            mine = {q: c for q, c in self._counts.items() if key.can_queue("publish", q)}\n',
        "            mine = {}\n",
        (
            "tests/http/test_http_exposure.py::test_a_key_publishes_within_its_quotas_of_queues_"
            "jobs_and_bytes[sqlite_url]",
        ),
        "a publish key's queues, jobs and bytes are never counted: one key fills the "
        "database with queues and messages",
    ),
    Mutant(
        "lock-wait-names-no-one",
        "src/expiry/cleanup/window.py",
        '            words += self._behind(self.policy(job.payload["policy"]))\n',
        '            words += ""\n',
        (f"{TIMEOUTS}::test_a_lock_wait_says_whom_it_waited_behind[postgres]",),
        "a window's lock wait that ran out says nothing of the session it waited behind: "
        "on-call hunts for the blocker by hand",
    ),
    Mutant(
        "redrive-reaches-other-queues",
        "src/expiry/http/routes/dlq.py",
        '    if key.can("dlq:manage"):\n        return wanted\n',
        "    return wanted\n",
        (
            "tests/http/test_http_exposure.py::test_a_dead_message_is_redriven_by_its_key_in_its_"
            "queue_only[sqlite]",
        ),
        "a consumer's redrive of its dead message's key also redrives another queue's dead "
        "message of that key",
    ),
    Mutant(
        "history-sampled-every-sweep",
        "src/expiry/health/history.py",
        "        minute = self.engine.now().replace(second=0, microsecond=0)\n",
        "        minute = self.engine.now()\n",
        (f"{HISTORY}::{SAMPLED}[sqlite]",),
        "every sweep of every process adds a sample: minutes counted many times, the table "
        "growing with the workers",
    ),
    Mutant(
        "history-backlog-without-retries",
        "src/expiry/health/history.py",
        "            backlog=sum(states.get(s, 0) for s in UNFINISHED_STATES),\n",
        "            backlog=states.get(JobState.AVAILABLE, 0),\n",
        (f"{HISTORY}::{SAMPLED}[postgres]",),
        "the backlog drawn leaves out the windows retrying and running: a failing policy "
        "looks drained",
    ),
    Mutant(
        "history-gap-joined",
        "src/expiry/http/views.py",
        "            if segments[-1]:\n                segments.append([])\n",
        "",
        (f"{HISTORY}::test_a_gap_in_the_samples_breaks_the_line[sqlite]",),
        "minutes no process sampled are drawn as a line between the minutes around them",
    ),
    Mutant(
        "cron-target-timeout-ignored",
        "src/expiry/cron/targets.py",
        "timeout=self.call_timeout if target.timeout is None else target.timeout,",
        "timeout=self.call_timeout,",
        (
            "tests/http/test_http_exposure.py::"
            "test_a_cron_targets_own_timeout_cuts_its_calls_and_can_be_changed_back",
        ),
        "a target's own timeout_seconds is stored and shown but its calls keep [http] call_timeout",
    ),
    Mutant(
        "holds-audited-without-the-lock",
        "src/expiry/cleanup/holds.py",
        "        engine.audit_holds_lock(conn)",
        "        pass",
        (f"{HOLDS}::test_processes_starting_together_audit_each_hold_once[postgres]",),
        "processes starting together each read a new hold as not yet placed and each "
        "audit it: the log says it was placed several times",
    ),
    Mutant(
        "bounds-aggregate-stops-short",
        "src/expiry/cleanup/sql.py",
        "select min({key}) as lo, max({key}) as hi, count(*) as n from {table} where {pred}",
        "select min({key}) as lo, max({key}) - 1 as hi, count(*) as n from {table} where {pred}",
        (f"{ORACLE}::test_sqlite_deletes_exactly_what_the_oracle_expires",),
        "SQLite's bounds in one read end a key before the last candidate: it is never deleted",
    ),
    Mutant(
        "blocks-for-any-dense-keys",
        "src/expiry/cleanup/strategy.py",
        "        if keys < BLOCKS_SPAN * layout.rows:\n",
        "        if keys < 0:\n",
        (
            "tests/cleanup/test_real_tables.py::"
            "test_dense_keys_across_the_whole_table_get_block_windows[oldest-third]",
        ),
        "dense expired keys in a corner of the table take block windows: every run reads "
        "the whole heap",
    ),
    Mutant(
        "dense-keys-never-blocks",
        "src/expiry/cleanup/strategy.py",
        "                if whole is not None:\n",
        "                if whole is not None and False:\n",
        (
            "tests/cleanup/test_real_tables.py::"
            "test_dense_keys_across_the_whole_table_get_block_windows[interleaved]",
        ),
        "expired keys across the whole table keep key windows: each window reads the "
        "key's index beside the same pages (0.68x the loop against 0.83x)",
        also=(
            (
                "src/expiry/cleanup/strategy.py",
                "            if whole is not None and (estimate := ",
                "            if False and (estimate := ",
            ),
        ),
    ),
    Mutant(
        "dense-keys-counted-exactly",
        "src/expiry/cleanup/strategy.py",
        "            if whole is not None and (estimate := ",
        "            if False and (estimate := ",
        (
            "tests/cleanup/test_real_tables.py::"
            "test_dense_keys_across_the_whole_table_get_block_windows[interleaved]",
        ),
        "expired keys across the whole table are counted before block windows are chosen, "
        "where the planner's estimate says so: the first planning page 18 ms to 56 ms",
    ),
    Mutant(
        "galera-claim-conflict-backoff",
        "src/expiry/queue/claims.py",
        '            if kind == "deadlock":\n',
        "            if False:\n",
        (f"{GALERA}::test_workers_on_every_node_hold_the_invariants_when_one_node_is_killed",),
        "a claim that lost to another Galera node's is taken for the database gone away: a "
        "warning each time and a back-off that grows with every conflict",
    ),
    Mutant(
        "write-set-unshrunk",
        "src/expiry/engines/mysql/engine.py",
        "            if code in (1105, 1180) and any(",
        "            if False and any(",
        (f"{GALERA}::test_windows_over_the_write_set_limit_are_retried_smaller_and_none_dies",),
        "a window over a Galera cluster's wsrep_max_ws_rows is retried at the same size "
        "until its attempts run out: dead-lettered after 8 refusals, its rows left",
    ),
    Mutant(
        "write-set-no-ceiling",
        "src/expiry/cleanup/pacing.py",
        "min(policy.window, pace.ceiling or policy.window, pace.chunk * 2)",
        "min(policy.window, pace.chunk * 2)",
        (f"{GALERA}::test_windows_over_the_write_set_limit_are_retried_smaller_and_none_dies",),
        "after a write-set refusal the windows grow back past the cluster's limit after "
        "each fast one: a refused transaction every few windows",
    ),
    Mutant(
        "node-not-ready-permanent",
        "src/expiry/engines/mysql/engine.py",
        '            if (code == 1047 and "wsrep" in str(exc).lower()) or (\n',
        '            if (code == 1047 and "wsrep" in str(exc).lower() and False) or (\n',
        (f"{GALERA}::test_a_node_out_of_rotation_is_an_outage_not_a_failed_job",),
        "a Galera node out of the primary component (1047) reads as the job's own transient "
        "failure: each attempt during the outage is spent (8, then dead), where an outage "
        "spends none",
    ),
    Mutant(
        "flow-control-unread",
        "src/expiry/health/database.py",
        "                readings.update(self._flow_control(engine.health_flow_control(conn), now))\n",
        "                pass\n",
        (f"{GALERA}::test_flow_control_holds_the_policy_until_the_cluster_catches_up",),
        "max_flow_control holds nothing: the cleanup piles write sets onto a cluster that "
        "flow control already stopped",
    ),
    Mutant(
        "write-set-page-unhalved",
        "src/expiry/cleanup/planner.py",
        "            self._page_ceilings[policy.name] = max(1, tried // 2)\n",
        "            self._page_ceilings[policy.name] = tried\n",
        (
            f"{GALERA}::test_planning_pages_over_the_write_set_limit_are_halved_and_the_rest_"
            "start_there",
        ),
        "a refused planning page leaves the page ceiling at the size refused: the page is "
        "retried at that size until it is dead, and the run plans nothing more",
    ),
    Mutant(
        "write-set-page-forgotten",
        "src/expiry/cleanup/planner.py",
        "            page = min(page, self._page_ceilings.get(policy.name, page))\n",
        "            page = page\n",
        (
            f"{GALERA}::test_planning_pages_over_the_write_set_limit_are_halved_and_the_rest_"
            "start_there",
        ),
        "the page ceiling is never applied: the refused page is retried at full size until "
        "it is dead, and the run plans nothing more",
    ),
    Mutant(
        "write-set-spends-attempts",
        "src/expiry/queue/runner.py",
        '        if kind == "write_set_limit":\n            return defaults.UNSPENT_WRITE_SET_SECONDS\n',
        "",
        (
            f"{GALERA}::test_planning_pages_over_the_write_set_limit_are_halved_and_the_rest_"
            "start_there",
        ),
        "each refused write set spends an attempt: a page or window halved a few times "
        "runs out of attempts and dies",
    ),
    Mutant(
        "write-set-window-not-fitted",
        "src/expiry/cleanup/window.py",
        '        if kind == "write_set_limit":\n            self._fit_write_set(',
        "        if False:\n            self._fit_write_set(",
        (f"{GALERA}::test_windows_over_the_write_set_size_are_retried_smaller_and_none_dies",),
        "a refused window halves only itself: every later window is refused once before "
        "it is retried smaller",
    ),
    Mutant(
        "approval-skipped",
        "src/expiry/cleanup/planner.py",
        "            if not self._approved(policy, target, p, cutoff, storage, parts, tx):",
        "            if False:",
        (
            f"{APPROVAL}::test_a_run_deletes_nothing_until_approved_then_exactly_the_"
            "expired_rows[postgres]",
        ),
        "a policy with approve = true deletes at its run's first planning job, unapproved",
    ),
    Mutant(
        "approval-of-any-version",
        "src/expiry/cleanup/approval.py",
        "approval.config_hash == digest and approval.state == APPROVED",
        "approval.state == APPROVED",
        (f"{APPROVAL}::test_a_changed_policy_invalidates_the_approval[postgres]",),
        "an approval of an earlier preview lets a run go on under a policy changed since",
    ),
    Mutant(
        "approval-wait-holds-up-later-runs",
        "src/expiry/cleanup/planner.py",
        '                        mine = self._take_turn(policy, p["run_id"], turn, started=False)',
        "                        mine = True",
        (
            f"{APPROVAL}::test_a_later_run_supersedes_one_awaiting_approval_and_awaits_"
            "its_own[postgres]",
        ),
        "a run awaiting approval is never superseded: its snooze undoes the later run's turn",
    ),
    Mutant(
        "approval-unchecked-by-windows",
        "src/expiry/cleanup/window.py",
        "        self.approval_stands(policy, p, job.key)\n",
        "",
        (
            f"{APPROVAL}::test_a_policy_changed_after_its_runs_approval_stops_the_run_before_"
            "any_window[postgres]",
        ),
        "an approved run's windows delete under a policy changed since its approval",
    ),
    Mutant(
        "approval-late-accepted",
        "src/expiry/cleanup/approval.py",
        "approval.state == EXPIRED or (approval.state == AWAITING and engine.now() >= deadline)",
        "approval.state == EXPIRED",
        (
            f"{APPROVAL}::test_an_approval_after_its_deadline_or_of_a_cancelled_run_is_"
            "refused[postgres]",
        ),
        "an approval given after approve_within lets the run delete (workers were behind)",
    ),
    Mutant(
        "approval-stopped-run-left-open",
        "src/expiry/cleanup/policies.py",
        "                self.engine.job_discard([key])\n",
        "",
        (
            f"{APPROVAL}::test_two_windows_running_when_the_policy_changed_both_end_and_the_"
            "run_finishes[sqlite]",
        ),
        "a window running beside the one that stopped an unapproved run snoozes for ever: "
        "the run never finishes",
    ),
    Mutant(
        "approval-unapproved-supersedes-started",
        "src/expiry/cleanup/planner.py",
        'if not self._take_turn(policy, p["run_id"], tx, started=not policy.approve):',
        'if not self._take_turn(policy, p["run_id"], tx, started=True):',
        (
            f"{APPROVAL}::test_a_run_never_approved_leaves_an_approved_run_that_started_"
            "alone[postgres]",
        ),
        "a run whose approval expires has cancelled the waiting windows of an approved run "
        "that started before it",
    ),
    Mutant(
        "approval-never-expires",
        "src/expiry/cleanup/approval.py",
        "    if approval is not None and now >= deadline:",
        "    if False:",
        (f"{APPROVAL}::test_a_run_not_approved_in_time_finishes_without_deleting[postgres]",),
        "a run awaiting approval waits for ever: approve_within is never read",
    ),
]


class Tree:
    """The tree the mutants are planted in: this checkout, or a copy of it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def copy_of(cls, root: Path, into: Path) -> Tree:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.db", "*.db-*")
        for name in ("src", "tests", "tools"):
            shutil.copytree(root / name, into / name, ignore=ignore)
        shutil.copy2(root / "pyproject.toml", into / "pyproject.toml")
        (into / ".venv").symlink_to(root / ".venv")
        return cls(into)

    def pytest(self, node_ids: tuple[str, ...], *, stop_first: bool = True) -> tuple[int, str]:
        """Run the node ids; (exit code, last lines of output)."""
        env = dict(os.environ)
        # This tree's src first (a copy's too: the venv's editable install points
        # at the checkout), and no bytecode written for a planted bug.
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(self.root / "src"), env.get("PYTHONPATH")])
        )
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        pytest = self.root / ".venv" / "bin" / "pytest"
        command = [str(pytest)] if pytest.exists() else [sys.executable, "-m", "pytest"]
        command += ["-q", "-p", "no:cacheprovider", *(["-x"] if stop_first else []), *node_ids]
        proc = subprocess.run(
            command, cwd=self.root, env=env, capture_output=True, text=True, check=False
        )
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        return proc.returncode, "\n".join(lines[-15:])


def check_texts(tree: Tree, mutants: list[Mutant]) -> list[str]:
    """Every mutant's old texts must occur exactly once in their files."""
    problems = []
    for m in mutants:
        for file, old, _ in m.edits():
            path = tree.root / file
            if not path.exists():
                problems.append(f"{m.id}: {file} does not exist")
                continue
            found = path.read_text(encoding="utf-8").count(old)
            if found != 1:
                problems.append(f"{m.id}: old text found {found} times in {file}: {old!r}")
    return problems


@contextmanager
def planted(tree: Tree, m: Mutant) -> Iterator[None]:
    """The mutant in place; the original bytes back after, whatever happens (an
    exception, Ctrl-C, SIGTERM)."""
    with ExitStack() as stack:
        for file, old, new in m.edits():
            stack.enter_context(_substituted(tree.root / file, old, new, m.id))
        yield


@contextmanager
def _substituted(path: Path, old: str, new: str, mutant: str) -> Iterator[None]:
    original = path.read_bytes()
    text = original.decode("utf-8")
    if text.count(old) != 1:
        raise SystemExit(f"{mutant}: old text not found exactly once in {path}: {old!r}")
    mutated = text.replace(old, new).encode("utf-8")
    path.write_bytes(mutated)
    try:
        yield
    finally:
        current = path.read_bytes()
        if current == mutated:
            path.write_bytes(original)
        elif current.decode("utf-8").count(new) == 1:
            # Someone edited the file meanwhile: take only the mutant out.
            path.write_bytes(current.decode("utf-8").replace(new, old).encode("utf-8"))
            print(f"warning: {path} changed during the run; only the mutant was undone")
        else:
            backup = path.with_name(path.name + ".orig")
            backup.write_bytes(original)
            raise SystemExit(f"could not revert {path}: it changed; the original is in {backup}")


def run(tree: Tree, mutants: list[Mutant], each: bool) -> list[tuple[Mutant, str, str, float]]:
    results = []
    for m in mutants:
        groups = [(t,) for t in m.tests] if each else [m.tests]
        for tests in groups:
            started = time.monotonic()
            with planted(tree, m):
                code, tail = tree.pytest(tests)
            seconds = time.monotonic() - started
            # 1: a test failed; 2, 3: collection or pytest broke on the mutant
            # (caught too); 4, 5: a node id is wrong or selects nothing.
            outcome = {0: "SURVIVED", 4: "ERROR", 5: "ERROR"}.get(code, "caught")
            label = (
                tests[0].split("::")[-1] if each else f"{len(tests)} test" + "s" * (len(tests) > 1)
            )
            results.append((m, outcome, label, seconds))
            print(f"{m.id:<32} {outcome:<9} {seconds:6.1f}s  {label}", flush=True)
            if code not in (0, 1):  # not a plain test failure: worth a look
                print(f"  pytest exit {code}:\n  " + tail.replace("\n", "\n  "), flush=True)
    return results


def where(m: Mutant) -> str:
    files = list(dict.fromkeys(file.removeprefix("src/expiry/") for file, _, _ in m.edits()))
    return " + ".join(files)


def table(results: list[tuple[Mutant, str, str, float]]) -> str:
    rows = [("mutant", "file", "result", "seconds", "tests")]
    rows += [(m.id, where(m), r, f"{s:.1f}", t) for m, r, t, s in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--only", action="append", metavar="ID", help="run only this mutant")
    parser.add_argument("--each", action="store_true", help="run each test of a mutant alone")
    parser.add_argument("--copy", action="store_true", help="plant in a temporary copy")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the run on the unmodified code"
    )
    args = parser.parse_args(argv)

    mutants = MUTANTS
    if args.only:
        known = {m.id for m in MUTANTS}
        unknown = [i for i in args.only if i not in known]
        if unknown:
            parser.error(f"unknown mutant {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        mutants = [m for m in MUTANTS if m.id in args.only]
    if args.list:
        for m in mutants:
            files = ", ".join(dict.fromkeys(file for file, _, _ in m.edits()))
            print(f"{m.id}  ({files})\n    {m.what}")
            for test in m.tests:
                print(f"    - {test}")
        return 0

    # SIGTERM unwinds like Ctrl-C, so the planted file is put back.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="expiry-mutants-") as scratch:
        tree = Tree.copy_of(ROOT, Path(scratch)) if args.copy else Tree(ROOT)
        problems = check_texts(tree, mutants)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            return 2
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            started = time.monotonic()
            code, tail = tree.pytest(tests, stop_first=False)
            if code != 0:
                print(f"the selected tests fail without any mutant:\n{tail}", file=sys.stderr)
                return 2
            print(f"baseline: {len(tests)} tests pass in {time.monotonic() - started:.1f}s")
        results = run(tree, mutants, args.each)

    print()
    print(table(results))
    survived = sorted({m.id for m, outcome, _, _ in results if outcome != "caught"})
    caught = len({m.id for m in mutants}) - len(survived)
    print(
        f"\n{caught} of {len(mutants)} mutants caught"
        + (f"; survived: {survived}" if survived else "")
    )
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
