"""The queue floor: the durable delayed queue (``jobs``), the worker that
claims and runs its jobs (``worker``), the handler model (``handlers``), retry
timing (``retry``) and batched acknowledgement (``acks``). It knows jobs, not
policies: cleanup and cron put their jobs on it."""
