"""What the database and the workers look like: the database's health signals
read by each worker process (``database``), the throttle they feed
(``throttle``, pure), the workers' roll (``roll``) and the Prometheus collector
that reads the state at scrape time (``metrics``)."""
