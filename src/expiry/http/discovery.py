"""Discovery: what this server can do, for callers without an SDK.

``GET /v1/discovery`` lists capabilities; ``GET /v1/discovery/{capability}``
gives method, path, request and response JSON Schema, errors, limits and
runnable examples in curl, Python, Node.js and Go. The schemas are cut from the
server's own OpenAPI document, which FastAPI builds from the models that
validate requests, so discovery cannot drift from behaviour. The two routes
are in routes/meta.py.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from fastapi import FastAPI

CAPABILITIES: dict[str, dict[str, Any]] = {
    "queue.publish": {
        "scope": "queue:publish:emails",
        "method": "POST",
        "path": "/v1/queue/publish",
        "summary": "enqueue one delayed job with an optional dedupe key (each queue's own)",
        "example": {
            "queue": "emails",
            "message": {"user_id": 42},
            "delay_seconds": 60,
            "key": "welcome:42",
        },
    },
    "queue.publish_batch": {
        "scope": "queue:publish:default",
        "method": "POST",
        "path": "/v1/queue/publish_batch",
        "summary": "enqueue up to 1,000 jobs in one statement (without queue: to default)",
        "example": {
            "messages": [{"run_id": "r1", "start_id": 0, "end_id": 50000}],
            "keys": ["r1:0"],
        },
    },
    "queue.receive": {
        "scope": "queue:consume:emails",
        "method": "POST",
        "path": "/v1/queue/receive",
        "summary": "lease jobs for a pull consumer; each comes with a receipt",
        "example": {"queue": "emails", "max": 10, "lease_seconds": 30},
    },
    "queue.ack": {
        "scope": "queue:consume:PATTERN",
        "method": "POST",
        "path": "/v1/queue/ack",
        "summary": "complete a received job",
        "example": {"receipt": "RECEIPT"},
    },
    "queue.nack": {
        "scope": "queue:consume:PATTERN",
        "method": "POST",
        "path": "/v1/queue/nack",
        "summary": "fail a received job: retry after delay_seconds (default backoff) or permanent",
        "example": {"receipt": "RECEIPT", "delay_seconds": 30, "error": "smtp timeout"},
    },
    "queue.heartbeat": {
        "scope": "queue:consume:PATTERN",
        "method": "POST",
        "path": "/v1/queue/heartbeat",
        "summary": "extend a lease",
        "example": {"receipt": "RECEIPT", "lease_seconds": 30},
    },
    "cron.create": {
        "scope": "cron:manage",
        "method": "POST",
        "path": "/v1/cron/create",
        "summary": "call http_url with a signed POST on a cron schedule",
        "example": {
            "name": "nightly-digest",
            "http_url": "https://app.example.com/hooks/digest",
            "schedule": "0 6 * * 1",
            "timezone": "Europe/Paris",
        },
    },
    "cleanup.trigger": {
        "scope": "cleanup:trigger",
        "method": "POST",
        "path": "/v1/cleanup/trigger",
        "summary": "open a cleanup run now (idempotent for the same cutoff), or dry-run it",
        "example": {"policy": "expired-sessions", "dry_run": True},
    },
    "runs.cancel": {
        "scope": "cleanup:trigger",
        "method": "POST",
        "path": "/v1/runs/cancel",
        "summary": "cancel a run: planning stops, waiting windows are cancelled, running ones finish",
        "example": {"run_id": "expired-sessions:2026-12-01T06:00:00Z"},
    },
    "runs.approve": {
        "scope": "cleanup:approve",
        "method": "POST",
        "path": "/v1/runs/approve",
        "summary": "approve a run awaiting approval (approve = true): its preview, under "
        "the policy as configured now; audited with the key's name",
        "example": {"run_id": "expired-sessions:2026-12-01T06:00:00Z"},
    },
    "dlq.redrive": {
        "scope": "dlq:manage",
        "method": "POST",
        "path": "/v1/dlq/redrive",
        "summary": "send dead jobs back with a fresh attempt budget",
        "example": {"all": True},
    },
}

LIMITS = {
    "message_bytes": 256 * 1024,
    "batch_messages": 1000,
    "idempotency_hours": 24,
    "auth": "Authorization: Bearer KEY on every route but /v1/discovery and /v1/health",
    "scopes": "each capability names the scope its key needs; admin keys hold every one",
    "reserved": "queues named expiry.* are expiry's own",
    "dedupe": "a dedupe key is unique within its queue only, from publish until the job is pruned",
    "message_depth": 32,
}

ERRORS = {
    "400": "invalid_idempotency_key: not 1 to 200 printable ASCII characters",
    "401": "unauthorized: missing or unknown API key",
    "403": "forbidden: the key lacks the scope this capability names",
    "409": "idempotency_in_flight, or receipt_expired for ack/nack/heartbeat",
    "413": "message_too_large (over 256 KiB) or body_too_large",
    "422": "invalid_request (bad JSON, wrong types, unknown fields) or idempotency_key_reused",
    "429": "rate_limited: wait Retry-After seconds",
}


def _resolve(node: Any, components: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            return _resolve(components.get(name, {}), components)
        return {k: _resolve(v, components) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, components) for v in node]
    return node


def examples(
    method: str, path: str, body: dict[str, Any], base_url: str = "http://127.0.0.1:8080"
) -> dict[str, str]:
    """Runnable calls of ``method path`` with ``body``; each reads the key from
    the EXPIRY_KEY environment variable."""
    data = json.dumps(body)
    url = f"{base_url.rstrip('/')}{path}"
    return {
        "curl": f"curl -sS -X {method} {shlex.quote(url)}"
        ' -H "Authorization: Bearer $EXPIRY_KEY"'
        " -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-1'"
        f" -d {shlex.quote(data)}",
        "python": (
            f"import json, os, urllib.request\nreq = urllib.request.Request({url!r}, method={method!r},\n"
            f"    data=json.dumps({body!r}).encode(),\n"
            "    headers={'Authorization': 'Bearer ' + os.environ['EXPIRY_KEY'],\n"
            "             'Content-Type': 'application/json'})\n"
            "print(json.load(urllib.request.urlopen(req)))"
        ),
        "node": (
            "// an ES module (save as .mjs): top-level await\n"
            f"const res = await fetch({json.dumps(url)}, {{method: {json.dumps(method)},\n"
            "  headers: {Authorization: `Bearer ${process.env.EXPIRY_KEY}`, 'Content-Type': 'application/json'},\n"
            f"  body: JSON.stringify({data})}});\nconsole.log(await res.json());"
        ),
        "go": _go(method, url, data),
    }


def _go(method: str, url: str, data: str) -> str:
    """A Go program making the call, with the standard library only."""
    return (
        "package main\n\n"
        'import (\n\t"fmt"\n\t"io"\n\t"net/http"\n\t"os"\n\t"strings"\n)\n\n'
        "func main() {\n"
        f"\tbody := strings.NewReader({json.dumps(data)})\n"
        f"\treq, err := http.NewRequest({json.dumps(method)}, {json.dumps(url)}, body)\n"
        "\tif err != nil {\n\t\tpanic(err)\n\t}\n"
        '\treq.Header.Set("Authorization", "Bearer "+os.Getenv("EXPIRY_KEY"))\n'
        '\treq.Header.Set("Content-Type", "application/json")\n'
        "\tres, err := http.DefaultClient.Do(req)\n"
        "\tif err != nil {\n\t\tpanic(err)\n\t}\n"
        "\tdefer res.Body.Close()\n"
        "\tout, _ := io.ReadAll(res.Body)\n"
        "\tfmt.Println(res.Status, string(out))\n"
        "}\n"
    )


def describe(
    api: FastAPI, name: str, base_url: str = "http://127.0.0.1:8080"
) -> dict[str, Any] | None:
    cap = CAPABILITIES.get(name)
    if cap is None:
        return None
    spec = api.openapi()
    components = spec.get("components", {}).get("schemas", {})
    operation = spec["paths"][cap["path"]][cap["method"].lower()]
    request = (
        operation.get("requestBody", {})
        .get("content", {})
        .get("application/json", {})
        .get("schema")
    )
    responses = {
        code: _resolve(r.get("content", {}).get("application/json", {}).get("schema"), components)
        for code, r in operation.get("responses", {}).items()
    }
    return {
        "capability": name,
        "summary": cap["summary"],
        "method": cap["method"],
        "path": cap["path"],
        "scope": cap["scope"],
        "request_schema": _resolve(request, components),
        "response_schemas": responses,
        "errors": ERRORS,
        "limits": LIMITS,
        "example_request": cap["example"],
        "examples": examples(cap["method"], cap["path"], cap["example"], base_url),
    }


def capabilities() -> dict[str, Any]:
    """The index: every capability with its method, path, summary and link."""
    return {
        "capabilities": [
            {
                "name": n,
                "method": c["method"],
                "path": c["path"],
                "summary": c["summary"],
                "scope": c["scope"],
                "href": f"/v1/discovery/{n}",
            }
            for n, c in CAPABILITIES.items()
        ],
        "openapi": "/openapi.json",
        "limits": LIMITS,
    }
