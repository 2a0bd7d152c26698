"""A bad config is refused at load, with the policy, the field and the fix named.

Both through the library (expiry.config.parse_config raises ConfigError) and
through the command line (`expiry --config BAD.toml check` exits 2 with one
line on stderr and no traceback).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from expiry.config import parse_config
from expiry.errors import ConfigError

from ._support import cli, write_config

GOOD: dict[str, Any] = {
    "name": "expired-sessions",
    "table": "sessions",
    "key": "id",
    "timestamp": "expires_at",
}


def problem(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    return str(caught.value)


def with_policy(**changes: Any) -> dict[str, Any]:
    policy = {**GOOD, **changes}
    return {
        "database": {"url": "sqlite:///app.db"},
        "policy": [{k: v for k, v in policy.items() if v is not None}],
    }


def test_a_good_config_loads() -> None:
    config = parse_config(with_policy(retain="30d", schedule="*/15 * * * *", window=500))
    policy = config.get_policy("expired-sessions")
    assert policy.retain == 30 * 86400 and policy.window == 500


# (case, policy changes, fragments the message must contain: policy, field, fix)
BAD_POLICIES = [
    (
        "unknown field",
        {"tabel": "sessions"},
        ["policy 'expired-sessions'", "unknown field 'tabel'", "did you mean 'table'?"],
    ),
    (
        "bad duration",
        {"retain": "30 days"},
        ["policy 'expired-sessions'", "'retain'", "'30 days' is not a duration", '"30d"'],
    ),
    (
        "negative duration",
        {"retain": -5},
        ["policy 'expired-sessions'", "'retain'", "cannot be negative"],
    ),
    (
        "bad cron",
        {"schedule": "61 * * * *"},
        [
            "policy 'expired-sessions'",
            "'schedule'",
            "not a valid cron expression",
            "minute 0-59",
        ],
    ),
    (
        "cron with too few fields",
        {"schedule": "* * * *"},
        ["policy 'expired-sessions'", "'schedule'", "has 4 fields", "standard 5-field cron"],
    ),
    (
        "nonstandard cron L",
        {"schedule": "0 0 L * *"},
        ["policy 'expired-sessions'", "'schedule'", "nonstandard", "use standard 5-field cron"],
    ),
    (
        "unknown cron alias",
        {"schedule": "@fortnightly"},
        ["policy 'expired-sessions'", "'schedule'", "not a known alias", "@daily"],
    ),
    (
        "bad timezone",
        {"timezone": "Mars/Olympus_Mons"},
        [
            "policy 'expired-sessions'",
            "'timezone'",
            "not an IANA time zone",
            '"Europe/Paris"',
        ],
    ),
    (
        "bad table identifier",
        {"table": "sessions; drop table x"},
        [
            "policy 'expired-sessions'",
            "'table'",
            "'sessions; drop table x'",
            "use letters, digits and underscores",
        ],
    ),
    (
        "three-part table name",
        {"table": "db.auth.sessions"},
        ["policy 'expired-sessions'", "'table'", "name or schema.name"],
    ),
    (
        "bad column identifier",
        {"timestamp": "expires_at desc"},
        ["policy 'expired-sessions'", "'timestamp'", "not a plain column name"],
    ),
    (
        "where with a second statement",
        {"where": "true; drop table sessions"},
        ["policy 'expired-sessions'", "'where'", "one SQL predicate without ';'"],
    ),
    (
        "where with a comment",
        {"where": "revoked_at is null -- keep"},
        ["policy 'expired-sessions'", "'where'", "without ';' or comments"],
    ),
    (
        "archive without archive_table",
        {"action": "archive"},
        ["policy 'expired-sessions'", 'action = "archive"', "needs archive_table = "],
    ),
    (
        "archive_table with delete",
        {"archive_table": "sessions_archive"},
        ["policy 'expired-sessions'", "archive_table is set", 'set action = "archive"'],
    ),
    (
        "unknown action",
        {"action": "truncate"},
        ["policy 'expired-sessions'", "'action'", "'delete' or 'archive'"],
    ),
    (
        "missing required field",
        {"timestamp": None},
        ["policy 'expired-sessions'", "'timestamp' is required", "add timestamp ="],
    ),
    (
        "window of zero",
        {"window": 0},
        ["policy 'expired-sessions'", "'window'", "greater than or equal to 1", "(got 0)"],
    ),
    (
        "negative window",
        {"window": -100},
        ["policy 'expired-sessions'", "'window'", "greater than or equal to 1", "(got -100)"],
    ),
    (
        "bad policy name",
        {"name": "Expired Sessions"},
        ["policy 'Expired Sessions'", "'name'", "[a-z0-9]"],
    ),
    (
        "max_attempts of zero",
        {"max_attempts": 0},
        ["policy 'expired-sessions'", "'max_attempts'", "greater than or equal to 1"],
    ),
    (
        "latency budget without a canary",
        {"max_latency_ratio": 1.25},
        ["policy 'expired-sessions'", "max_latency_ratio needs canary", "a cheap statement"],
    ),
    (
        "latency quantile of 1",
        {"canary": "select 1", "max_latency_ratio": 1.25, "latency_quantile": 1},
        ["policy 'expired-sessions'", "'latency_quantile'", "less than 1"],
    ),
]


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [pytest.param(changes, fragments, id=case) for case, changes, fragments in BAD_POLICIES],
)
def test_bad_policy_is_refused_naming_policy_field_and_fix(
    changes: dict[str, Any], fragments: list[str]
) -> None:
    message = problem(with_policy(**changes))
    assert message.startswith("expiry.toml is invalid: ")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_a_policy_without_name_is_named_by_position() -> None:
    data = with_policy()
    data["policy"].append({k: v for k, v in GOOD.items() if k != "name"})
    message = problem(data)
    assert "policy #2: field 'name' is required" in message


def test_duplicate_policy_names() -> None:
    data = with_policy()
    data["policy"].append({**GOOD, "table": "other_sessions"})
    message = problem(data)
    assert "policy 'expired-sessions'" in message
    assert "field 'name'" in message
    assert "rename one" in message


def test_every_problem_is_reported_at_once() -> None:
    message = problem(with_policy(retain="soon", window=0, timezone="Nowhere/Land"))
    for field in ("'retain'", "'window'", "'timezone'"):
        assert field in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        pytest.param(
            {"policy": []}, ["[database] is required", "add the section"], id="missing-database"
        ),
        pytest.param(
            {"database": {"url": "oracle://localhost/app"}},
            ["[database]", "'url'", "use postgresql://host/db, mysql://user@host/db or sqlite:///"],
            id="unsupported-url",
        ),
        pytest.param(
            {"database": {"url": "sqlite:///a.db"}, "polcy": []},
            ["unknown section 'polcy'", "did you mean 'policy'?"],
            id="unknown-section",
        ),
        pytest.param(
            {"database": {"url": "sqlite:///a.db"}, "worker": {"leese": "1s"}},
            ["[worker]", "unknown field 'leese'", "did you mean 'lease'?"],
            id="unknown-worker-field",
        ),
        pytest.param(
            {"database": {"url": "sqlite:///a.db"}, "worker": {"lease": "forever"}},
            ["[worker]", "'lease'", "is not a duration"],
            id="bad-worker-duration",
        ),
    ],
)
def test_bad_sections_are_refused(data: dict[str, Any], fragments: list[str]) -> None:
    message = problem(data)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# -- the command line ------------------------------------------------------------


def assert_one_line_error(result: Any, *fragments: str) -> None:
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("expiry: ")
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"


def test_cli_check_refuses_a_bad_config(tmp_path: Path) -> None:
    bad = write_config(
        tmp_path / "BAD.toml",
        f"sqlite:///{tmp_path / 'app.db'}",
        {"retain": "30 days", "schedule": "0 0 L * *"},
    )
    result = cli("--config", str(bad), "check", cwd=tmp_path)
    assert_one_line_error(
        result, "BAD.toml is invalid", "policy 'expired-sessions'", "'retain'", "'schedule'"
    )
    # The option is read after the command too.
    again = cli("check", "--config", str(bad), cwd=tmp_path)
    assert_one_line_error(again, "BAD.toml is invalid", "'retain'")


def test_cli_check_refuses_invalid_toml(tmp_path: Path) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text('[database]\nurl = "sqlite:///x.db"\n[[policy]]\nname = \n')
    result = cli("--config", str(bad), "check", cwd=tmp_path)
    assert_one_line_error(result, "broken.toml is not valid TOML", "line 4")


def test_cli_check_names_a_missing_config_file(tmp_path: Path) -> None:
    result = cli("--config", str(tmp_path / "nowhere.toml"), "check", cwd=tmp_path)
    assert_one_line_error(result, "no config file at", "nowhere.toml", "--config PATH")


def test_cli_check_accepts_a_good_config(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "create table sessions (id integer primary key, expires_at real not null,"
            " revoked_at real)"
        )
        conn.execute("create index sessions_expires_at on sessions (expires_at)")
    good = write_config(tmp_path / "good.toml", f"sqlite:///{path}")
    # The policies fit; expiry's own tables are not there yet: exit 2, said.
    result = cli("--config", str(good), "--json", "check", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert '"ok": false' in result.stdout and '"expired-sessions"' in result.stdout
    assert "run `expiry migrate`" in result.stderr
    assert cli("--config", str(good), "migrate", cwd=tmp_path).returncode == 0
    result = cli("--config", str(good), "--json", "check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"ok": true' in result.stdout
    assert '"expired-sessions"' in result.stdout


@pytest.mark.parametrize("url", ["postgresql://app@db/app", "sqlite:///app.db"])
def test_galera_signals_are_refused_off_mysql_naming_policy_and_field(url: str) -> None:
    for field, value in (("max_flow_control", 0.2), ("max_recv_queue", 100)):
        data = with_policy(**{field: value})
        data["database"]["url"] = url
        message = problem(data)
        assert "expired-sessions" in message and field in message, message
        assert "Galera" in message and "remove it" in message, message


def test_galera_signals_load_on_mysql_and_critical_is_not_below_max() -> None:
    data = with_policy(max_flow_control=0.2, critical_flow_control=0.5, max_recv_queue=100)
    data["database"]["url"] = "mysql://app@db/app"
    [policy] = parse_config(data).policy
    assert (policy.max_flow_control, policy.critical_flow_control) == (0.2, 0.5)
    assert policy.max_recv_queue == 100
    data = with_policy(max_flow_control=0.5, critical_flow_control=0.2)
    data["database"]["url"] = "mysql://app@db/app"
    assert "critical_flow_control must not be below max_flow_control" in problem(data)
    data = with_policy(max_flow_control=1.5)
    data["database"]["url"] = "mysql://app@db/app"
    assert "max_flow_control" in problem(data)
