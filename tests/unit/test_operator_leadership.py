"""Which operator replica may act: the Lease decisions, as pure functions."""

from __future__ import annotations

from apportion.operator.leadership import (
    LEASE_SECONDS,
    RENEW_DEADLINE,
    Fence,
    Record,
    next_move,
)

OTHER = Record("op-b", "2026-11-26T10:00:00+00:00", 3)


def test_a_missing_or_released_lease_is_taken() -> None:
    assert next_move(None, "op-a", None, 0.0, 1.0) == "take"
    assert next_move(Record(None, None), "op-a", None, 0.0, 1.0) == "take"


def test_the_holder_renews_it() -> None:
    mine = Record("op-a", "2026-11-26T10:00:00+00:00")
    assert next_move(mine, "op-a", mine, 0.0, 1000.0) == "renew"


def test_another_holders_lease_is_taken_only_after_it_went_unrenewed_long_enough() -> None:
    # Just seen (or seen to change): its holder is alive, whatever the clocks say.
    assert next_move(OTHER, "op-a", None, 0.0, 1000.0) == "wait"
    seen_at = 100.0
    assert next_move(OTHER, "op-a", OTHER, seen_at, seen_at + LEASE_SECONDS - 0.1) == "wait"
    assert next_move(OTHER, "op-a", OTHER, seen_at, seen_at + LEASE_SECONDS) == "take"
    renewed = Record("op-b", "2026-11-26T10:00:02+00:00", 3)
    assert next_move(renewed, "op-a", OTHER, seen_at, seen_at + 60) == "wait"


def test_a_replica_acts_only_within_the_deadline_of_its_last_renewal() -> None:
    fence = Fence()
    assert not fence.acting(5.0)  # never renewed: a follower
    fence.renewed_at = 10.0
    assert fence.acting(10.0 + RENEW_DEADLINE - 0.01)
    # Frozen past the deadline (a paused container): it must not act on waking.
    assert not fence.acting(10.0 + RENEW_DEADLINE)


def test_the_fence_closes_before_another_replica_may_take_the_lease() -> None:
    """The holder's last renewal was sent at t; another replica saw it no earlier, so it
    takes the Lease no earlier than t + LEASE_SECONDS, after the holder stopped acting."""
    assert RENEW_DEADLINE < LEASE_SECONDS
