"""The cron floor: the scheduler that turns schedules into runs and calls
(``scheduler``), cron over HTTP (``targets``) and its signed calls
(``webhooks``). Cron expressions themselves are ``expiry.crontab``'s (pure,
read by the config too)."""
