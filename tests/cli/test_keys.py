"""`expiry keys`: scopes given at creation, listed, narrowed later (old keys
become admin at migration 0009 and an operator narrows them), and a scope
that does not exist refused with the list of those that do."""

from __future__ import annotations

import json
from pathlib import Path

from cleanup._support import cli, write_config
from expiry.app import App


def test_keys_get_scopes_and_an_old_admin_key_is_narrowed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    config = str(write_config(tmp_path / "expiry.toml", url))
    made = cli(
        "--config", config, "keys", "create", "ci", "--scope", "queue:publish:ci.*", "--json"
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["scopes"] == ["queue:publish:ci.*"]
    old = cli("--config", config, "keys", "create", "legacy")
    assert old.returncode == 0 and "admin key may do everything" in old.stdout

    listed = json.loads(cli("--config", config, "keys", "list", "--json").stdout)
    assert {k["name"]: k["scopes"] for k in listed} == {
        "ci": ["queue:publish:ci.*"],
        "legacy": ["admin"],
    }
    narrowed = cli("--config", config, "keys", "scope", "legacy", "--scope", "read")
    assert narrowed.returncode == 0, narrowed.stderr
    app = App(url)
    try:
        principal = app.keys.principal("legacy")
        assert principal is not None and principal.scopes == ("read",)
        actions = [e.action for e in app.engine.audit_list(limit=10)]
        assert "key.scoped" in actions
    finally:
        app.close()


def test_a_scope_that_does_not_exist_is_refused_naming_the_real_ones(tmp_path: Path) -> None:
    config = str(write_config(tmp_path / "expiry.toml", f"sqlite:///{tmp_path / 'app.db'}"))
    for scope in ("write", "queue:publish:", "queue:consume:expiry.*", "queue:drop:x"):
        refused = cli("--config", config, "keys", "create", "k", "--scope", scope)
        assert refused.returncode == 2, (scope, refused.stdout)
        assert "Traceback" not in refused.stderr
        assert "cleanup:trigger" in refused.stderr or "expiry's own" in refused.stderr, scope
    missing = cli("--config", config, "keys", "scope", "nobody", "--scope", "read")
    assert missing.returncode == 2 and "no key named 'nobody'" in missing.stderr
