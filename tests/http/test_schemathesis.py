"""Property-based tests of the whole API from its own /openapi.json, against a live
server on PostgreSQL: schemathesis generates valid and invalid requests for every
operation (but /metrics, which is Prometheus text), sends them with a real key over
the socket, and checks that none gets a 5xx, that every response has a documented
status and matches the schema and content type declared for it, and that requests
the schema does not allow are refused.

(The installed schemathesis's lazy pytest integration, ``from_fixture``, does not
run under this pytest, so each operation gets a Hypothesis test built from
``operation.as_strategy`` here; a failure names the operation and the request.)
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from _http_live import Live, Serve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

MAX_EXAMPLES = int(os.environ.get("EXPIRY_SCHEMATHESIS_EXAMPLES", "20"))


@pytest.fixture
def schema_live(pg_url: str, serve: Serve) -> Live:
    # A rate limit this fuzzer cannot reach: a 429 would hide what the route does.
    http = {
        "allowed_hosts": ["127.0.0.1:*"],
        "rate_limit_per_second": 1e6,
        "rate_limit_burst": 10**6,
        # Publish quotas a narrow key meets at once: q1 and q2 hold jobs.
        "max_queues_per_key": 2,
        "max_pending_per_key": 20,
    }
    live = serve(pg_url, http=http)
    live.db.insert_sessions(expired=30, live=5)
    # Something for the reading routes to find: a run, a cron target, a dead job.
    live.client.post("/v1/cleanup/trigger", json={"policy": "expired-sessions"})
    live.client.post(
        "/v1/cron/create",
        json={"name": "digest", "http_url": "http://127.0.0.1:9/", "schedule": "@daily"},
    )
    for queue in ("q1", "q2"):
        live.client.post("/v1/queue/publish", json={"queue": queue, "message": {}})
    live.client.post("/v1/queue/publish", json={"queue": "q", "message": {}, "key": "dead"})
    [job] = live.client.post("/v1/queue/receive", json={"queue": "q"}).json()["jobs"]
    live.client.post("/v1/queue/nack", json={"receipt": job["receipt"], "permanent": True})
    return live


@pytest.mark.parametrize(
    "scopes",
    [("admin",), ("read", "queue:publish:q*", "queue:consume:q*")],
    ids=["admin", "narrow"],
)
def test_every_operation_against_its_schema(schema_live: Live, scopes: tuple[str, ...]) -> None:
    """With an admin key every route does its work; with a narrow one most
    answer 403: both without a 5xx and as the schema says."""
    schema = schemathesis.openapi.from_url(f"{schema_live.url}/openapi.json").exclude(
        path="/metrics"
    )
    secret = schema_live.key if scopes == ("admin",) else schema_live.app.keys.create("n", scopes)
    headers = {"Authorization": f"Bearer {secret}"}
    checks = [
        not_a_server_error,
        response_schema_conformance,
        content_type_conformance,
        status_code_conformance,  # every status it answers is documented
        negative_data_rejection,  # wrong types, unknown fields... are refused
    ]
    tested: list[str] = []
    failures: dict[str, BaseException] = {}
    statuses: dict[str, set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        strategy = st.one_of(
            operation.as_strategy(GenerationMode.POSITIVE),
            operation.as_strategy(GenerationMode.NEGATIVE),
        )

        @given(case=strategy)
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            print_blob=True,
        )
        def run(case: schemathesis.Case) -> None:
            response = case.call_and_validate(
                base_url=schema_live.url, headers=headers, checks=checks, timeout=30
            )
            statuses.setdefault(case.operation.label, set()).add(response.status_code)

        tested.append(operation.label)
        try:
            run()
        except (Exception, FailureGroup) as exc:  # every operation's failure, then report
            failures[operation.label] = exc
    assert len(tested) >= 20, tested
    assert "POST /v1/queue/publish" in tested and "GET /metrics" not in tested
    assert not failures, "\n\n".join(f"{label}:\n{exc}" for label, exc in failures.items())
    # The requests reached the routes: no operation answered only 401 or 429.
    for label, seen in statuses.items():
        assert seen - {401, 429}, (label, seen)
