"""`expiry serve` as its own process: a key made with `expiry keys create`, the API
on the address given by --listen, a cleanup triggered over HTTP and carried out by
the server's own workers, /metrics afterwards, and a clean exit on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
from _http_live import (
    Db,
    cli_env,
    config_data,
    expiry_cmd,
    free_port,
    wait_for,
    write_config,
)
from prometheus_client.parser import text_string_to_metric_families


def test_expiry_serve_end_to_end(pg_url: str, tmp_path: Path) -> None:
    db = Db(pg_url)
    db.create_sessions()
    db.insert_sessions(expired=120, live=30)
    config = write_config(
        tmp_path / "expiry.toml", config_data(pg_url, http={"allowed_hosts": ["127.0.0.1:*"]})
    )
    made = subprocess.run(
        expiry_cmd("--config", str(config), "--json", "keys", "create", "ops"),
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
        check=False,
    )
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["key"]

    port = free_port()
    server = subprocess.Popen(
        expiry_cmd("--config", str(config), "serve", "--listen", f"127.0.0.1:{port}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    try:

        def healthy() -> bool:
            assert server.poll() is None, server.communicate()
            try:
                return client.get("/v1/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, timeout=30, what="expiry serve to answer")
        assert client.get("/v1/policies").status_code == 200
        assert client.get("/v1/policies", headers={"Authorization": "Bearer x"}).status_code == 401

        opened = client.post("/v1/cleanup/trigger", json={"policy": "expired-sessions"})
        assert opened.status_code == 200, opened.text
        run_id = opened.json()["run_id"]
        finished = wait_for(
            lambda: (r := client.get(f"/v1/runs/{run_id}").json())["state"] == "finished" and r,
            timeout=60,
            what="the run to finish in the server's workers",
        )
        assert finished["rows_affected"] == 120
        assert db.count() == 30

        samples = {
            (s.name, s.labels.get("policy")): s.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for s in family.samples
        }
        assert samples[("expiry_rows_affected_total", "expired-sessions")] == 120
        assert samples[("expiry_watermark_seconds", "expired-sessions")] == 0

        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0
    finally:
        client.close()
        if server.poll() is None:
            server.kill()
        server.communicate()
        db.close()
