"""Guards against typos that delete: a duration without a unit, a zero limit and
a cutoff later than now - retain are refused with exit 2 and a line that says
what to do; --force accepts the late cutoff on purpose."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from test_cli import POLICY, Workspace, assert_usage_error, make_workspace

from expiry.times import format_time


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_workspace(f"sqlite:///{tmp_path / 'cli.db'}", tmp_path)


def with_policy_line(ws: Workspace, line: str) -> None:
    ws.config.write_text(ws.config.read_text() + line + "\n")


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ("retain = 30", ["field 'retain'", "30 has no unit", '"30d", "30h", "30m" or "30s"']),
        ('lock_timeout = "0s"', ["field 'lock_timeout'", "0 turns the limit off", '"2s"']),
        ('statement_timeout = "0ms"', ["field 'statement_timeout'", "turns the limit off"]),
    ],
)
def test_a_typo_that_would_delete_is_refused(ws: Workspace, line: str, needles: list[str]) -> None:
    with_policy_line(ws, line)
    for command in (["check"], ["plan", POLICY], ["trigger", POLICY]):
        assert_usage_error(ws.run(*command), f"policy '{POLICY}'", *needles)
    assert ws.runs() == 0


def test_a_cutoff_later_than_now_minus_retain_is_refused_unless_forced(ws: Workspace) -> None:
    with_policy_line(ws, 'retain = "1d"')
    before = ws.sessions_left()
    future = datetime.now(UTC) + timedelta(days=400)
    refused = ws.run("trigger", POLICY, "--cutoff", format_time(future))
    assert_usage_error(
        refused,
        f"cutoff {format_time(future)} is later than now - retain (",
        " - 1d = ",
        "pass --force",
    )
    assert ws.runs() == 0 and ws.sessions_left() == before
    # The edge is now - retain, not now: a cutoff twelve hours ago is within the
    # day kept, and refused as well.
    inside = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=12)
    assert_usage_error(
        ws.run("trigger", POLICY, "--cutoff", format_time(inside)), "is later than now - retain"
    )
    assert ws.runs() == 0 and ws.sessions_left() == before
    # A dry run changes nothing, so it shows what the late cutoff would take.
    assert ws.json("trigger", POLICY, "--cutoff", format_time(future), "--dry-run")["candidates"]
    opened = ws.json("trigger", POLICY, "--cutoff", format_time(future), "--force")
    assert opened["created"] is True and opened["cutoff"] == format_time(future)


def test_retain_is_subtracted_from_now(ws: Workspace) -> None:
    """retain = "1d": the rows that expired a day ago are at the edge; the
    cutoff is exactly the database's now minus a day."""
    with_policy_line(ws, 'retain = "1d"')
    opened = ws.json("trigger", POLICY)
    cutoff = datetime.fromisoformat(opened["cutoff"].replace("Z", "+00:00"))
    expected = datetime.now(UTC) - timedelta(days=1)
    assert abs((cutoff - expected).total_seconds()) < 30
