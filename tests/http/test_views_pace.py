"""The dashboard's arithmetic of a run's pace and of the minute bars: pure,
checked against figures worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from expiry.http.views import minute_bars, run_pace
from expiry.times import format_time
from expiry.types import LedgerMinute

NOW = datetime(2026, 12, 6, 12, 0, 30, tzinfo=UTC)


def run(**fields: object) -> dict[str, object]:
    return {
        "opened_at": format_time(NOW - timedelta(seconds=100)),
        "finished_at": None,
        "state": "running",
        "cancelled_at": None,
        "windows_planned": 50,
        "windows_applied": 20,
        "rows_affected": 20_000,
        **fields,
    }


def test_a_running_runs_rate_and_when_its_windows_left_would_be_done() -> None:
    pace = run_pace(run(), NOW)
    assert pace["seconds"] == 100
    assert pace["rows_per_second"] == 200 and pace["windows_per_second"] == 0.2
    assert pace["windows_left"] == 30 and pace["eta_seconds"] == 150  # 30 at 0.2/s


def test_a_finished_or_cancelled_run_has_no_windows_left_and_its_rate_ends_with_it() -> None:
    done = run(state="finished", finished_at=format_time(NOW - timedelta(seconds=50)))
    pace = run_pace(done, NOW)
    assert pace["seconds"] == 50 and pace["rows_per_second"] == 400
    assert pace["windows_left"] is None and pace["eta_seconds"] is None
    cancelled = run_pace(run(cancelled_at=format_time(NOW)), NOW)
    assert cancelled["windows_left"] is None


def test_a_run_with_no_window_applied_yet_says_no_eta() -> None:
    pace = run_pace(run(windows_applied=0, rows_affected=0), NOW)
    assert pace["windows_left"] == 50 and pace["eta_seconds"] is None


def test_minute_bars_put_each_minute_in_its_slot_oldest_left() -> None:
    minute = NOW.replace(second=0)
    rows = [
        LedgerMinute("p", minute - timedelta(minutes=59), 2, 100),  # the oldest slot
        LedgerMinute("p", minute - timedelta(minutes=1), 1, 50),
        LedgerMinute("p", minute, 4, 400),  # the newest slot
        LedgerMinute("p", minute - timedelta(minutes=60), 9, 900),  # out of the hour
    ]
    chart = minute_bars(rows, NOW)
    assert chart.total == 550 and chart.peak == 400 and chart.minutes == 60
    assert [round(x, 1) for x, _, _ in chart.bars] == [0.0, 116.0, 118.0]
    heights = [h for _, _, h in chart.bars]
    assert heights[2] == 23 and heights[1] == 23 * 50 / 400  # scaled to the busiest
    assert all(y + h == 24 for _, y, h in chart.bars)  # standing on the bottom
    assert minute_bars([], NOW).bars == [] and minute_bars([], NOW).total == 0
