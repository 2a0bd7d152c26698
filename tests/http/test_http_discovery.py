"""Discovery over a real socket: the capability list without a key, and for each
capability its method, path, the request schema exactly as /openapi.json has it,
and examples in curl, Python, Node.js and Go, which are run for real where the
tool is installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
from _http_live import Live, Serve, assert_error


@pytest.fixture
def live(sqlite_url: str, serve: Serve) -> Live:
    """Discovery does not touch the database: one engine is enough."""
    return serve(sqlite_url)


# Capabilities whose example request runs as-is against a server with the
# standard policy; the others name placeholders (a receipt, a public host).
RUNNABLE = ("queue.publish", "queue.publish_batch", "queue.receive", "cleanup.trigger")


def resolve(node: Any, components: dict[str, Any]) -> Any:
    """Inline every $ref of an OpenAPI fragment (the test's own resolver)."""
    if isinstance(node, dict):
        if "$ref" in node:
            prefix = "#/components/schemas/"
            assert node["$ref"].startswith(prefix), node
            return resolve(components[node["$ref"].removeprefix(prefix)], components)
        return {k: resolve(v, components) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, components) for v in node]
    return node


def test_the_index_is_open_and_lists_capabilities(live: Live) -> None:
    response = live.new_client().get("/v1/discovery")
    assert response.status_code == 200, response.text
    index = response.json()
    names = {c["name"] for c in index["capabilities"]}
    assert {"queue.publish", "queue.publish_batch", "cron.create", "cleanup.trigger"} <= names
    for cap in index["capabilities"]:
        assert cap["method"] in ("GET", "POST") and cap["path"].startswith("/v1/")
        assert cap["href"] == f"/v1/discovery/{cap['name']}"
        assert cap["summary"]
    assert index["openapi"] == "/openapi.json"
    assert index["limits"]["message_bytes"] == 256 * 1024


def test_each_capability_matches_openapi(live: Live) -> None:
    spec = live.new_client().get("/openapi.json").json()
    components = spec["components"]["schemas"]
    index = live.new_client().get("/v1/discovery").json()
    for cap in index["capabilities"]:
        response = live.client.get(cap["href"])
        assert response.status_code == 200, response.text
        found = response.json()
        assert found["capability"] == cap["name"]
        assert (found["method"], found["path"]) == (cap["method"], cap["path"])
        operation = spec["paths"][found["path"]][found["method"].lower()]
        in_openapi = operation["requestBody"]["content"]["application/json"]["schema"]
        assert found["request_schema"] == resolve(in_openapi, components), cap["name"]
        ok = operation["responses"]["200" if cap["name"] != "cron.create" else "201"]
        assert found["response_schemas"][
            "200" if cap["name"] != "cron.create" else "201"
        ] == resolve(ok["content"]["application/json"]["schema"], components)
        assert set(found["examples"]) == {"curl", "python", "node", "go"}
        for text in found["examples"].values():
            assert found["path"] in text
        # The example request is one the request schema describes: only known fields,
        # every required one present.
        schema = found["request_schema"]
        assert set(found["example_request"]) <= set(schema["properties"]), cap["name"]
        assert set(schema.get("required", ())) <= set(found["example_request"]), cap["name"]


def test_an_unknown_capability_is_404(live: Live) -> None:
    message = assert_error(live.client.get("/v1/discovery/queue.teleport"), 404, "not_found")
    assert "GET /v1/discovery" in message


def test_the_example_requests_are_accepted(live: Live) -> None:
    for name in RUNNABLE:
        found = live.client.get(f"/v1/discovery/{name}").json()
        response = live.client.request(
            found["method"], found["path"], json=found["example_request"]
        )
        assert response.status_code == 200, (name, response.text)


def run_example(live: Live, argv: list[str]) -> str:
    env = {**os.environ, "EXPIRY_KEY": live.key}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env, check=False)
    assert result.returncode == 0, (argv, result.stdout, result.stderr)
    return result.stdout


def example(live: Live, language: str, name: str = "queue.publish") -> str:
    text: str = live.client.get(f"/v1/discovery/{name}").json()["examples"][language]
    assert live.url + "/v1/" in text, "the example should call the server it came from"
    return text


def test_the_python_example_runs(live: Live) -> None:
    out = run_example(live, [sys.executable, "-c", example(live, "python")])
    assert "'enqueued': True" in out
    assert live.app.queue.pending("emails") == 1


def test_the_curl_example_runs(live: Live) -> None:
    assert shutil.which("curl"), "curl is part of the machine; the example must run"
    out = run_example(live, ["bash", "-c", example(live, "curl")])
    assert '"enqueued":true' in out.replace(" ", "")
    assert live.app.queue.pending("emails") == 1


def test_the_node_example_runs(live: Live) -> None:
    assert shutil.which("node"), "node is part of the machine; the example must run"
    out = run_example(live, ["node", "--input-type=module", "-e", example(live, "node")])
    assert "enqueued: true" in out
    assert live.app.queue.pending("emails") == 1


def test_the_go_example_is_a_whole_program(live: Live) -> None:
    text = example(live, "go")
    for part in ("package main", '"net/http"', "func main()", 'os.Getenv("EXPIRY_KEY")'):
        assert part in text, part
    if shutil.which("go") is None:
        return
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"expiry-example-{os.getpid()}.go")
    with open(path, "w") as f:
        f.write(text)
    try:
        out = run_example(live, ["go", "run", path])
        assert "enqueued" in out
    finally:
        os.unlink(path)


def test_the_reference_page_loads_a_pinned_swagger_ui_checked_by_hash(live: Live) -> None:
    """/docs (no key) names one Swagger UI version, each of its files with its
    Subresource Integrity hash, and runs no inline script under a CSP that
    allows only this server and that CDN; its own script is served here.
    /redoc (an unpinned CDN page) is gone."""
    from expiry.http.routes import meta

    with live.new_client() as client:
        page = client.get("/docs")
        assert page.status_code == 200
        html = page.text
        policy = page.headers["content-security-policy"]
        assert "script-src 'self' https://cdn.jsdelivr.net;" in policy
        assert "unsafe-inline" not in policy.split("style-src")[0]  # no inline script
        assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert (
            f'src="{meta.SWAGGER_UI}/swagger-ui-bundle.js" integrity="{meta.SWAGGER_UI_JS}"' in html
        )
        assert f'href="{meta.SWAGGER_UI}/swagger-ui.css" integrity="{meta.SWAGGER_UI_CSS}"' in html
        assert meta.SWAGGER_UI.endswith("@5.17.14")  # one version, not a moving tag
        scripts = re.findall(r"<script([^>]*)>(.*?)</script>", html, re.S)
        assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
        own = client.get("/static/docs.js")
        assert own.status_code == 200 and "/openapi.json" in own.text
        assert client.get("/redoc").status_code == 404
        assert client.get("/openapi.json").status_code == 200
