CREATE TABLE `expiry_api_keys` (
  `name` varchar(255) NOT NULL,
  `hash` varchar(255) NOT NULL,
  `created_at` datetime(6) NOT NULL,
  `revoked_at` datetime(6) DEFAULT NULL,
  `scopes` varchar(1000) NOT NULL DEFAULT '["admin"]',
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE `expiry_audit` (
  `id` bigint(20) NOT NULL AUTO_INCREMENT,
  `at` datetime(6) NOT NULL,
  `actor` varchar(255) NOT NULL,
  `action` varchar(64) NOT NULL,
  `policy` varchar(255) DEFAULT NULL,
  `run_id` varchar(700) DEFAULT NULL,
  `job_key` varchar(700) DEFAULT NULL,
  `detail` longtext NOT NULL,
  PRIMARY KEY (`id`),
  KEY `expiry_audit_at` (`at`),
  KEY `expiry_audit_run` (`run_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE `expiry_cron_calls` (
  `id` bigint(20) NOT NULL AUTO_INCREMENT,
  `name` varchar(255) NOT NULL,
  `fire_time` datetime(6) NOT NULL,
  `attempt` int(11) NOT NULL,
  `status` int(11) DEFAULT NULL,
  `duration_ms` double DEFAULT NULL,
  `response` longtext DEFAULT NULL,
  `error` text DEFAULT NULL,
  `at` datetime(6) NOT NULL,
  PRIMARY KEY (`id`),
  KEY `expiry_cron_calls_name` (`name`,`id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE `expiry_cron_targets` (
  `name` varchar(255) NOT NULL,
  `http_url` varchar(2000) NOT NULL,
  `schedule` varchar(255) NOT NULL,
  `timezone` varchar(64) NOT NULL DEFAULT 'UTC',
  `secret` varchar(255) NOT NULL,
  `paused` tinyint(1) NOT NULL DEFAULT 0,
  `last_fire_at` datetime(6) DEFAULT NULL,
  `created_at` datetime(6) NOT NULL,
  `updated_at` datetime(6) NOT NULL,
  `owner` varchar(255) DEFAULT NULL,
  `timeout_seconds` double DEFAULT NULL,
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE `expiry_idempotency` (
  `api_key` varchar(255) NOT NULL,
  `key` varchar(255) NOT NULL,
  `request_hash` varchar(255) NOT NULL,
  `status` int(11) DEFAULT NULL,
  `body` longtext DEFAULT NULL,
  `created_at` datetime(6) NOT NULL,
  PRIMARY KEY (`api_key`,`key`),
  KEY `expiry_idempotency_created` (`created_at`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE `expiry_jobs` (
  `id` bigint(20) NOT NULL AUTO_INCREMENT,
  `queue` varchar(255) NOT NULL,
  `handler` varchar(255) NOT NULL,
  `key` varchar(700) NOT NULL,
  `payload` longtext NOT NULL,
  `state` varchar(16) NOT NULL DEFAULT 'available',
  `priority` smallint(6) NOT NULL DEFAULT 0,
  `attempt` int(11) NOT NULL DEFAULT 0,
  `max_attempts` int(11) NOT NULL DEFAULT 8,
  `run_at` datetime(6) NOT NULL,
  `run_id` varchar(700) DEFAULT NULL,
  `lease_owner` varchar(255) DEFAULT NULL,
  `lease_token` varchar(64) DEFAULT NULL,
  `lease_expires_at` datetime(6) DEFAULT NULL,
  `last_error` text DEFAULT NULL,
  `last_error_kind` varchar(255) DEFAULT NULL,
  `errors` longtext NOT NULL,
  `created_at` datetime(6) NOT NULL,
  `attempted_at` datetime(6) DEFAULT NULL,
  `finished_at` datetime(6) DEFAULT NULL,
  `updated_at` datetime(6) NOT NULL,
  `due_queue` varchar(255) GENERATED ALWAYS AS (case when `state` in ('scheduled','available','retryable') then `queue` end) STORED,
  `wait_reason` text DEFAULT NULL,
  `waiting_since` datetime(6) DEFAULT NULL,
  `unspent_since` datetime(6) DEFAULT NULL,
  PRIMARY KEY (`id`),
  UNIQUE KEY `expiry_jobs_key` (`key`),
  KEY `expiry_jobs_due` (`due_queue`,`priority`,`run_at`,`id`),
  KEY `expiry_jobs_running` (`state`,`lease_expires_at`),
  KEY `expiry_jobs_finished` (`state`,`finished_at`),
  KEY `expiry_jobs_run` (`run_id`,`state`),
  CONSTRAINT `expiry_jobs_state` CHECK (`state` in ('scheduled','available','running','retryable','completed','dead','cancelled')),
  CONSTRAINT `expiry_jobs_attempts` CHECK (`max_attempts` > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE `expiry_ledger` (
  `key` varchar(700) NOT NULL,
  `policy` varchar(255) DEFAULT NULL,
  `run_id` varchar(700) DEFAULT NULL,
  `lo` bigint(20) DEFAULT NULL,
  `hi` bigint(20) DEFAULT NULL,
  `action` varchar(32) DEFAULT NULL,
  `rows_affected` bigint(20) NOT NULL DEFAULT 0,
  `worker` varchar(255) DEFAULT NULL,
  `applied_at` datetime(6) NOT NULL,
  `bounds` text DEFAULT NULL,
  `blocked` text DEFAULT NULL,
  `rows_kept` bigint(20) NOT NULL DEFAULT 0,
  PRIMARY KEY (`key`),
  KEY `expiry_ledger_run` (`run_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE `expiry_runs` (
  `id` varchar(700) NOT NULL,
  `policy` varchar(255) NOT NULL,
  `cutoff` datetime(6) NOT NULL,
  `opened_by` varchar(255) NOT NULL,
  `state` varchar(16) NOT NULL DEFAULT 'planning',
  `windows_planned` int(11) NOT NULL DEFAULT 0,
  `opened_at` datetime(6) NOT NULL,
  `planned_at` datetime(6) DEFAULT NULL,
  `finished_at` datetime(6) DEFAULT NULL,
  `cancelled_at` datetime(6) DEFAULT NULL,
  `cancelled_by` varchar(255) DEFAULT NULL,
  `superseded_by` varchar(700) DEFAULT NULL,
  `stalled_at` datetime(6) DEFAULT NULL,
  PRIMARY KEY (`id`),
  KEY `expiry_runs_policy` (`policy`,`opened_at`),
  KEY `expiry_runs_open` (`state`,`policy`,`opened_at`),
  CONSTRAINT `expiry_runs_state` CHECK (`state` in ('planning','running','finished'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE `expiry_samples` (
  `policy` varchar(255) NOT NULL,
  `minute` datetime(6) NOT NULL,
  `backlog` bigint(20) NOT NULL,
  `retrying` bigint(20) NOT NULL,
  `dead` bigint(20) NOT NULL,
  `oldest_age` double DEFAULT NULL,
  `held` varchar(255) DEFAULT NULL,
  PRIMARY KEY (`policy`,`minute`),
  KEY `expiry_samples_minute` (`minute`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE `expiry_schedules` (
  `policy` varchar(255) NOT NULL,
  `paused` tinyint(1) NOT NULL DEFAULT 0,
  `last_fire_at` datetime(6) DEFAULT NULL,
  `updated_at` datetime(6) NOT NULL,
  `paused_by` varchar(255) DEFAULT NULL,
  PRIMARY KEY (`policy`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE `expiry_schema_migrations` (
  `version` int(11) NOT NULL,
  `applied_at` datetime(6) NOT NULL,
  PRIMARY KEY (`version`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci;

CREATE TABLE `expiry_workers` (
  `name` varchar(255) NOT NULL,
  `host` varchar(255) NOT NULL,
  `pid` int(11) NOT NULL,
  `threads` int(11) NOT NULL,
  `queues` longtext NOT NULL,
  `started_at` datetime(6) NOT NULL,
  `seen_at` datetime(6) NOT NULL,
  `resting` longtext NOT NULL,
  `holding` int(11) NOT NULL DEFAULT 0,
  `health` longtext DEFAULT NULL,
  PRIMARY KEY (`name`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE trigger expiry_audit_no_delete before delete on expiry_audit for each row
    signal sqlstate '45000' set message_text = 'expiry_audit is append-only';

CREATE trigger expiry_audit_no_update before update on expiry_audit for each row
    signal sqlstate '45000' set message_text = 'expiry_audit is append-only';

