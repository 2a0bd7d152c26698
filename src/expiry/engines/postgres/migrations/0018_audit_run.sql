-- 0018: the audit log by run.
--
-- A run's approval is read from its audited events (cleanup/approval.py): by
-- the planning job as it looks again, by `expiry runs approve`, and by every
-- run's summary (`expiry runs`, the dashboard's runs). Each was a scan of the
-- whole log, which keeps every window.duplicate and schedule.fired it ever
-- wrote; this index reads a run's few events.
create index audit_run on expiry.audit (run_id);
