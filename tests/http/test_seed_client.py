"""The seed articles' own Python client, unchanged but for its base URL and
its cron target, against `expiry serve` as its own process: it creates a cron
target, publishes windows in batches with an Idempotency-Key each (no
``queue`` field: they go to the public queue ``default``) and backs off on
429 by Retry-After, and reads discovery. The HTTP contract is the request
bodies such clients send; a field made required later breaks them (the 422
"name the queue" regression).

``SeedClient`` is written as the article's client is: the standard library
only, one method per call, no knowledge of expiry's models."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _http_live import (
    Db,
    Receiver,
    cli_env,
    config_data,
    expiry_cmd,
    free_port,
    wait_for,
    write_config,
)


class SeedClient:
    """The publisher of the article: cron create, publish_batch with an
    Idempotency-Key and Retry-After backoff, discovery."""

    def __init__(self, base_url: str, api_key: str, max_retries: int = 20) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.max_retries = max_retries
        self.backoffs: list[float] = []

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        for _ in range(self.max_retries):
            request = urllib.request.Request(
                self.base_url + path,
                data=data,
                method=method,
                headers={
                    "Authorization": f"Bearer {self.api_key}",
                    "Content-Type": "application/json",
                    **(headers or {}),
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code in (429, 503):
                    wait = float(exc.headers.get("Retry-After", "1"))
                    self.backoffs.append(wait)
                    time.sleep(wait)
                    continue
                raise
        raise RuntimeError(f"{path}: still limited after {self.max_retries} tries")

    def create_cron(self, name: str, http_url: str, schedule: str) -> dict[str, Any]:
        return self._request(
            "POST", "/v1/cron/create", {"name": name, "http_url": http_url, "schedule": schedule}
        )

    def publish_windows(
        self, run_id: str, start: int, end: int, step: int, batch: int
    ) -> list[dict[str, Any]]:
        messages = [
            {"run_id": run_id, "start_id": lo, "end_id": min(lo + step, end)}
            for lo in range(start, end, step)
        ]
        answers = []
        for i in range(0, len(messages), batch):
            answers.append(
                self._request(
                    "POST",
                    "/v1/queue/publish_batch",
                    {"messages": messages[i : i + batch]},
                    {"Idempotency-Key": f"{run_id}:{i}"},
                )
            )
        return answers

    def discovery(self, capability: str = "") -> dict[str, Any]:
        return self._request("GET", "/v1/discovery" + (f"/{capability}" if capability else ""))


@pytest.fixture
def serve(pg_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`expiry serve --no-workers` on its own port, with a low per-key rate
    limit (the client must meet 429) and its cron targets allowed on loopback."""
    db = Db(pg_url)
    db.create_sessions()
    db.close()
    http = {
        "allowed_hosts": ["127.0.0.1:*"],
        "rate_limit_per_second": 2.0,
        "rate_limit_burst": 3,
    }
    config = write_config(tmp_path / "expiry.toml", config_data(pg_url, http=http))
    made = subprocess.run(
        expiry_cmd("--config", str(config), "--json", "keys", "create", "seed"),
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
        check=True,
    )
    key = json.loads(made.stdout)["key"]
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            expiry_cmd(
                "--config", str(config), "serve", "--no-workers", "--listen", f"127.0.0.1:{port}"
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cli_env(),
        )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert server.poll() is None, log.read_text()
        try:
            return httpx.get(base + "/v1/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(healthy, timeout=30, what="expiry serve to answer")
        yield base, key
    finally:
        server.terminate()
        server.wait(30)


def test_the_seed_client_runs_unchanged_against_expiry_serve(serve: tuple[str, str]) -> None:
    base, key = serve
    client = SeedClient(base, key)

    capabilities = client.discovery()
    assert {"queue.publish", "queue.publish_batch", "cron.create"} <= {
        c["name"] for c in capabilities["capabilities"]
    }, capabilities
    publish = client.discovery("queue.publish_batch")
    schema = json.dumps(publish)
    assert '"default"' in schema  # the queue a message without one goes to, described

    with Receiver() as receiver:
        made = client.create_cron(
            "weekly-digest", f"http://127.0.0.1:{receiver.port}/digest", "0 6 * * 1"
        )
    assert made["name"] == "weekly-digest"

    run_id = str(uuid.uuid4())
    answers = client.publish_windows(run_id, 0, 500_000, 50_000, batch=2)
    # The same batches again, as a client retrying after a lost answer would:
    # each Idempotency-Key returns its first answer, nothing is enqueued twice.
    again = client.publish_windows(run_id, 0, 500_000, 50_000, batch=2)
    assert again == answers
    assert sum(a["enqueued"] for a in answers) == 10
    assert {r["queue"] for a in answers for r in a["results"]} == {"default"}
    assert client.backoffs, "the rate limit (2/s, burst 3) was never met: nothing backed off"
    assert all(0 < wait <= 60 for wait in client.backoffs)

    # A consumer of "default" receives exactly the ten windows.
    headers = {"Authorization": f"Bearer {key}"}
    got: list[dict[str, Any]] = []

    def received_all() -> bool:
        r = httpx.post(base + "/v1/queue/receive", json={"max": 100}, headers=headers, timeout=30)
        if r.status_code == 429:
            return False
        assert r.status_code == 200, r.text
        got.extend(r.json()["jobs"])
        return len(got) >= 10

    wait_for(received_all, timeout=30, what="ten windows from the default queue")
    spans = sorted((j["message"]["start_id"], j["message"]["end_id"]) for j in got)
    assert spans == [(lo, lo + 50_000) for lo in range(0, 500_000, 50_000)]
    assert {j["message"]["run_id"] for j in got} == {run_id}
