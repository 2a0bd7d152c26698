-- 0018: the audit log by run (postgres/migrations/0018 says why).
create index expiry_audit_run on expiry_audit (run_id);
