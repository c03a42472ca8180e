"""Restart back-off for crashed worker processes."""

from __future__ import annotations

from apportion.backoff import RestartBackoff


def test_a_process_that_keeps_crashing_is_restarted_ever_more_slowly() -> None:
    backoff = RestartBackoff(first=0.0, initial=0.5, maximum=4.0, stable_after=60.0)
    delays, now = [], 0.0
    for _ in range(6):
        backoff.started(now)
        now += 1.0  # crashes a second after each start
        delays.append(backoff.delay(now))
        now += delays[-1]
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0]


def test_a_crash_after_a_long_healthy_run_restarts_at_once() -> None:
    backoff = RestartBackoff(first=0.0, initial=0.5, stable_after=60.0)
    backoff.started(0.0)
    assert backoff.delay(1.0) == 0.0
    backoff.started(1.0)
    assert backoff.delay(2.0) == 0.5
    backoff.started(2.0)
    assert backoff.delay(500.0) == 0.0
