"""The throttle's controller on a fake clock with scripted readings: a breach
holds and halves the rate, recovery adds back a share of it per healthy second
until the limit binds no more (as fast at any check interval), flapping settles lower, a critical
reading stops the policy until an operator resets it, and held time is
counted by reason."""

from __future__ import annotations

from expiry.health.throttle import CRITICAL, HELD, MIN_RATE, OPEN, STEP, Controller

LIMITS = {"replica_lag": 5.0, "latency_ratio": 1.25}
CRITICAL_LIMITS = {"replica_lag": 60.0}


def controller() -> Controller:
    return Controller(dict(LIMITS), dict(CRITICAL_LIMITS))


def test_a_breach_holds_and_halves_the_running_rate() -> None:
    c = controller()
    assert c.observe(0.0, {"replica_lag": 0.5}, running_rate=10.0) is None
    assert (c.state, c.rate) == (OPEN, None)  # healthy: no limit at all

    change = c.observe(1.0, {"replica_lag": 7.0}, running_rate=10.0)
    assert change is not None and (change.state, change.reason) == (HELD, "replica_lag")
    assert "replica_lag 7 > 5" in change.detail
    assert c.holding and c.rate == 5.0 and c.ceiling == 10.0
    # Still over: held, no new change and no further decrease.
    assert c.observe(2.0, {"replica_lag": 9.0}, running_rate=0.0) is None
    assert c.rate == 5.0


def test_recovery_resumes_at_the_halved_rate_and_adds_back_up_to_the_old_one() -> None:
    c = controller()
    c.observe(0.0, {"replica_lag": 7.0}, running_rate=10.0)
    change = c.observe(1.0, {"replica_lag": 1.0}, running_rate=0.0)
    assert change is not None and change.state == OPEN and c.rate == 5.0
    rates = []
    for second in range(2, 60):
        # the policy runs at its limit, and at 10 windows a second at most
        running = min(c.rate or 10.0, 10.0)
        assert c.observe(float(second), {"replica_lag": 1.0}, running_rate=running) is None
        rates.append(c.rate)
    assert rates[0] == 5.5  # a twentieth of the 10 windows/s before the breach, a second
    assert rates == sorted(rates)
    assert 20.0 <= rates[-1] <= 21.0  # it stops once twice what runs: it binds no more
    assert not c.holding


def test_recovery_takes_as_long_at_a_short_health_interval() -> None:
    """The increase is per healthy second: checks ten times as often recover
    in the same time, not ten times faster."""
    c = controller()
    c.observe(0.0, {"replica_lag": 7.0}, running_rate=10.0)
    c.observe(1.0, {"replica_lag": 1.0}, running_rate=0.0)  # open again, at 5
    now = 1.0
    while c.rate is not None and c.rate < 10.0:
        now += 0.1
        c.observe(now, {"replica_lag": 1.0}, running_rate=c.rate)
    assert 10.5 <= now <= 11.5  # 5 windows/s back at half a window/s each second


def test_slow_start_doubles_each_healthy_second_until_the_first_breach() -> None:
    c = Controller(dict(LIMITS), start_rate=1.0)
    rates = []
    for second in range(5):
        c.observe(float(second), {"latency_ratio": 1.0}, running_rate=c.rate)
        rates.append(c.rate)
    assert rates == [1.0, 2.0, 4.0, 8.0, 16.0]
    # The database takes 6 windows a second: past that, halved from what ran.
    change = c.observe(5.0, {"latency_ratio": 2.0}, running_rate=6.0)
    assert change is not None and change.state == HELD
    assert c.rate == 3.0 and c.ceiling == 6.0
    c.observe(6.0, {"latency_ratio": 1.0}, running_rate=0.0)  # open, at 3
    c.observe(7.0, {"latency_ratio": 1.0}, running_rate=3.0)
    assert c.rate == 3.0 + 6.0 * 0.05  # additive from now on, no more doubling


def test_an_early_breach_in_slow_start_does_not_cap_the_rate() -> None:
    """A breach at 2 windows a second (the run's planning, say) halves the
    rate; healthy seconds then add to it past 2, as far as the database takes."""
    c = Controller(dict(LIMITS), start_rate=1.0)
    c.observe(0.0, {"latency_ratio": 1.0}, running_rate=None)
    c.observe(1.0, {"latency_ratio": 1.0}, running_rate=1.0)
    c.observe(2.0, {"latency_ratio": 9.0}, running_rate=2.0)
    assert c.rate == 1.0 and c.ceiling == 2.0
    for second in range(3, 60):
        c.observe(float(second), {"latency_ratio": 1.0}, running_rate=c.rate)
    assert c.rate is not None and c.rate > 4.0


def test_slow_start_stops_doubling_once_the_limit_binds_no_more() -> None:
    """A policy that runs at 3 windows a second however fast it may: the
    limit stops at twice that, so that a breach halves what really ran."""
    c = Controller(dict(LIMITS), start_rate=1.0)
    for second in range(10):
        c.observe(float(second), {"latency_ratio": 1.0}, running_rate=3.0)
    assert c.rate == 8.0


def test_flapping_settles_near_the_rate_the_database_takes() -> None:
    """The database lags when windows start faster than 4 a second (and
    recovers while they are held): every return above that halves the rate
    again, and it ends oscillating at or below 4, never at 10."""
    c = controller()
    c.observe(0.0, {}, running_rate=10.0)
    now, peaks = 0.0, []
    for _ in range(300):
        now += 1.0
        rate = 0.0 if c.holding else (c.rate if c.rate is not None else 10.0)
        lag = 9.0 if rate > 4.0 else 1.0
        c.observe(now, {"replica_lag": lag}, running_rate=rate)
        peaks.append(c.rate)
    tail = [r for r in peaks[-100:] if r is not None]
    assert tail and max(tail) <= 4.0 + 10.0 * 0.05 and min(tail) >= MIN_RATE
    assert sum(tail) / len(tail) > 2.0  # near the limit, not collapsed to the floor


def test_a_critical_reading_stops_the_policy_until_it_is_reset() -> None:
    c = controller()
    c.observe(0.0, {"replica_lag": 1.0}, running_rate=5.0)
    change = c.observe(1.0, {"replica_lag": 90.0}, running_rate=5.0)
    assert change is not None and change.state == CRITICAL and c.reason == "replica_lag"
    # Healthy readings do not lift a critical stop: an operator does.
    assert c.observe(2.0, {"replica_lag": 0.0}, running_rate=0.0) is None
    assert c.state == CRITICAL
    resumed = c.reset(3.0)
    assert resumed is not None and resumed.state == OPEN
    assert c.reset(4.0) is None  # not stopped: nothing to reset


def test_held_time_is_counted_by_reason() -> None:
    c = controller()
    c.observe(0.0, {"replica_lag": 8.0}, running_rate=5.0)
    c.observe(2.0, {"replica_lag": 1.0, "latency_ratio": 2.0}, running_rate=0.0)
    c.observe(5.0, {"latency_ratio": 1.0}, running_rate=0.0)
    c.observe(9.0, {}, running_rate=2.5)
    assert c.throttled == {"replica_lag": 2.0, "latency_ratio": 3.0}


def test_a_breach_before_any_window_recovers_by_steps() -> None:
    c = controller()
    c.observe(0.0, {"latency_ratio": 3.0}, running_rate=None)
    assert c.rate == MIN_RATE and c.ceiling is None
    c.observe(1.0, {}, running_rate=None)
    c.observe(2.0, {}, running_rate=None)
    assert c.rate == MIN_RATE + STEP


def test_a_signal_without_a_limit_and_a_missing_reading_are_ignored() -> None:
    c = controller()
    assert c.observe(0.0, {"active_backends": 900.0}, running_rate=1.0) is None
    assert c.observe(1.0, {"replica_lag": float("nan")}, running_rate=1.0) is None
    assert c.state == OPEN


def test_a_hold_says_its_reading_as_of_the_last_check_and_since_when() -> None:
    """What status and the dashboard show while a policy waits: the reading
    past its limit now ("replica_lag 9 > 5", not only "replica_lag") and how
    long the hold has lasted, through a change of reason and a stop; nothing
    once it is open again."""
    c = controller()
    c.observe(0.0, {"replica_lag": 0.5}, running_rate=10.0)
    assert (c.detail, c.held_for(0.0)) == (None, None)
    c.observe(1.0, {"replica_lag": 7.0}, running_rate=10.0)
    assert (c.detail, c.held_for(3.0)) == ("replica_lag 7 > 5", 2.0)
    c.observe(2.0, {"replica_lag": 9.0}, running_rate=0.0)
    assert c.detail == "replica_lag 9 > 5"  # as of the last check
    c.observe(3.0, {"replica_lag": 1.0, "latency_ratio": 2.0}, running_rate=0.0)
    assert (c.reason, c.detail, c.held_for(4.0)) == ("latency_ratio", "latency_ratio 2 > 1.25", 3.0)
    c.observe(5.0, {"replica_lag": 61.0}, running_rate=0.0)
    assert (c.state, c.detail, c.held_for(6.0)) == (CRITICAL, "replica_lag 61 > 60", 5.0)
    c.reset(7.0)
    assert (c.state, c.detail, c.held_for(8.0)) == (OPEN, None, None)
