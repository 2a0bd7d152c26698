CREATE SCHEMA expiry;

CREATE FUNCTION expiry.audit_is_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
begin
    raise exception 'expiry.audit is append-only';
end $$;

CREATE FUNCTION expiry.job_complete(job_id bigint, token text) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
declare
    done bigint;
begin
    update expiry.jobs j
    set state = 'completed', finished_at = now(), updated_at = now(),
        lease_owner = null, lease_token = null, lease_expires_at = null
    where j.id = job_id and j.lease_token = token and j.state = 'running'
      and j.lease_expires_at > now()
    returning j.id into done;
    return done;
end
$$;

CREATE FUNCTION expiry.job_complete_strict(job_id bigint, token text) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
declare
    done bigint;
begin
    done := expiry.job_complete(job_id, token);
    if done is null then
        raise exception 'job %: lease lost before completion', job_id using errcode = 'EX001';
    end if;
    return done;
end
$$;

CREATE FUNCTION expiry.job_keys_truncate() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
begin
    begin
        truncate expiry.job_keys;
    exception when object_in_use then
        delete from expiry.job_keys;
    end;
    return null;
end
$$;

CREATE FUNCTION expiry.window_apply(statement text, lo bigint, hi bigint, cutoff timestamp with time zone, key text, policy text, run_id text, action text, worker text, job_id bigint, lease_token text, positions text[], bounds text) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
declare
    taken bigint;
begin
    -- Deliveries of one window take turns (bounded by the session's
    -- lock_timeout): the delete below, a statement of its own with its own
    -- snapshot, then sees an earlier delivery's ledger row and takes nothing.
    perform pg_advisory_xact_lock(hashtextextended(key, 0));
    execute statement using lo, hi, cutoff, key, positions;
    get diagnostics taken = row_count;

    if job_id is not null and expiry.job_complete(job_id, lease_token) is null then
        raise exception 'job %: lease lost before completion', key using errcode = 'EX001';
    end if;

    if taken > 0 then
        -- This delivery must own the key: a conflict fails the transaction.
        insert into expiry.ledger
            (key, policy, run_id, lo, hi, bounds, action, worker, rows_affected)
        values (window_apply.key, policy, run_id, lo, hi, bounds, action, worker, taken);
        return taken;
    end if;
    insert into expiry.ledger (key, policy, run_id, lo, hi, bounds, action, worker, rows_affected)
    values (window_apply.key, policy, run_id, lo, hi, bounds, action, worker, 0)
    on conflict on constraint ledger_pkey do nothing;
    if found then
        return 0;
    end if;
    insert into expiry.audit (actor, action, policy, run_id, job_key)
    values (coalesce(worker, 'worker'), 'window.duplicate', policy, run_id, window_apply.key);
    return null;
end
$$;

CREATE TABLE expiry.api_keys (
    name text NOT NULL,
    hash text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    revoked_at timestamp with time zone,
    scopes jsonb DEFAULT '["admin"]'::jsonb NOT NULL
);

CREATE TABLE expiry.audit (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    policy text,
    run_id text,
    job_key text,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL
);

ALTER TABLE expiry.audit ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME expiry.audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE expiry.cron_calls (
    id bigint NOT NULL,
    name text NOT NULL,
    fire_time timestamp with time zone NOT NULL,
    attempt integer NOT NULL,
    status integer,
    duration_ms double precision,
    response text,
    error text,
    at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE expiry.cron_calls ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME expiry.cron_calls_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE expiry.cron_targets (
    name text NOT NULL,
    http_url text NOT NULL,
    schedule text NOT NULL,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    secret text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    last_fire_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    owner text,
    timeout_seconds double precision
);

CREATE TABLE expiry.idempotency (
    api_key text NOT NULL,
    key text NOT NULL,
    request_hash text NOT NULL,
    status integer,
    body text,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE expiry.job_keys (
    key text NOT NULL,
    job_id bigint NOT NULL
);

CREATE TABLE expiry.jobs (
    id bigint NOT NULL,
    queue text NOT NULL,
    handler text NOT NULL,
    key text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    state text DEFAULT 'available'::text NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 8 NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    run_id text,
    lease_owner text,
    lease_token text,
    lease_expires_at timestamp with time zone,
    last_error text,
    last_error_kind text,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    attempted_at timestamp with time zone,
    finished_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    wait_reason text,
    waiting_since timestamp with time zone,
    unspent_since timestamp with time zone,
    CONSTRAINT jobs_max_attempts_check CHECK ((max_attempts > 0)),
    CONSTRAINT jobs_state_check CHECK ((state = ANY (ARRAY['scheduled'::text, 'available'::text, 'running'::text, 'retryable'::text, 'completed'::text, 'dead'::text, 'cancelled'::text])))
)
WITH (fillfactor='85', autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='0');

ALTER TABLE expiry.jobs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME expiry.jobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE expiry.ledger (
    key text NOT NULL,
    policy text,
    run_id text,
    lo bigint,
    hi bigint,
    action text,
    rows_affected bigint DEFAULT 0 NOT NULL,
    worker text,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    bounds text,
    blocked text,
    rows_kept bigint DEFAULT 0 NOT NULL
);

CREATE TABLE expiry.runs (
    id text NOT NULL,
    policy text NOT NULL,
    cutoff timestamp with time zone NOT NULL,
    opened_by text NOT NULL,
    state text DEFAULT 'planning'::text NOT NULL,
    windows_planned integer DEFAULT 0 NOT NULL,
    opened_at timestamp with time zone DEFAULT now() NOT NULL,
    planned_at timestamp with time zone,
    finished_at timestamp with time zone,
    cancelled_at timestamp with time zone,
    cancelled_by text,
    superseded_by text,
    stalled_at timestamp with time zone,
    CONSTRAINT runs_state_check CHECK ((state = ANY (ARRAY['planning'::text, 'running'::text, 'finished'::text])))
);

CREATE TABLE expiry.samples (
    policy text NOT NULL,
    minute timestamp with time zone NOT NULL,
    backlog bigint NOT NULL,
    retrying bigint NOT NULL,
    dead bigint NOT NULL,
    oldest_age double precision,
    held text
);

CREATE TABLE expiry.schedules (
    policy text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    last_fire_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_by text
);

CREATE TABLE expiry.schema_migrations (
    version integer NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE expiry.workers (
    name text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    threads integer NOT NULL,
    queues jsonb NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    seen_at timestamp with time zone DEFAULT now() NOT NULL,
    resting jsonb DEFAULT '{}'::jsonb NOT NULL,
    holding integer DEFAULT 0 NOT NULL,
    health jsonb DEFAULT '{}'::jsonb NOT NULL
);

ALTER TABLE ONLY expiry.api_keys
    ADD CONSTRAINT api_keys_pkey PRIMARY KEY (name);

ALTER TABLE ONLY expiry.audit
    ADD CONSTRAINT audit_pkey PRIMARY KEY (id);

ALTER TABLE ONLY expiry.cron_calls
    ADD CONSTRAINT cron_calls_pkey PRIMARY KEY (id);

ALTER TABLE ONLY expiry.cron_targets
    ADD CONSTRAINT cron_targets_pkey PRIMARY KEY (name);

ALTER TABLE ONLY expiry.idempotency
    ADD CONSTRAINT idempotency_pkey PRIMARY KEY (api_key, key);

ALTER TABLE ONLY expiry.job_keys
    ADD CONSTRAINT job_keys_pkey PRIMARY KEY (key);

ALTER TABLE ONLY expiry.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY expiry.ledger
    ADD CONSTRAINT ledger_pkey PRIMARY KEY (key);

ALTER TABLE ONLY expiry.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY expiry.samples
    ADD CONSTRAINT samples_pkey PRIMARY KEY (policy, minute);

ALTER TABLE ONLY expiry.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (policy);

ALTER TABLE ONLY expiry.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY expiry.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (name);

CREATE INDEX audit_at ON expiry.audit USING btree (at);

CREATE INDEX audit_run ON expiry.audit USING btree (run_id);

CREATE INDEX cron_calls_name ON expiry.cron_calls USING btree (name, id DESC);

CREATE INDEX idempotency_created ON expiry.idempotency USING btree (created_at);

CREATE INDEX jobs_dead ON expiry.jobs USING btree (finished_at) WHERE (state = 'dead'::text);

CREATE INDEX jobs_due ON expiry.jobs USING btree (queue, priority, run_at, id) WHERE (state = ANY (ARRAY['scheduled'::text, 'available'::text, 'retryable'::text]));

CREATE INDEX jobs_finished ON expiry.jobs USING btree (finished_at) WHERE (state = ANY (ARRAY['completed'::text, 'cancelled'::text]));

CREATE INDEX jobs_run ON expiry.jobs USING btree (run_id, state) WHERE (run_id IS NOT NULL);

CREATE INDEX jobs_running ON expiry.jobs USING btree (lease_expires_at) WHERE (state = 'running'::text);

CREATE INDEX ledger_run ON expiry.ledger USING btree (run_id) WHERE (run_id IS NOT NULL);

CREATE INDEX runs_open ON expiry.runs USING btree (policy, opened_at) WHERE (state <> 'finished'::text);

CREATE INDEX runs_policy ON expiry.runs USING btree (policy, opened_at DESC);

CREATE INDEX samples_minute ON expiry.samples USING btree (minute);

CREATE TRIGGER audit_is_append_only BEFORE DELETE OR UPDATE ON expiry.audit FOR EACH ROW EXECUTE FUNCTION expiry.audit_is_append_only();

CREATE TRIGGER jobs_truncate_frees_keys AFTER TRUNCATE ON expiry.jobs FOR EACH STATEMENT EXECUTE FUNCTION expiry.job_keys_truncate();
