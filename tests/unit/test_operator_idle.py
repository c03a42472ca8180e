"""apportion.operator.idle: when a cluster nobody uses ends, and what its status says."""

from __future__ import annotations

from typing import Any

import pytest
from apportion.operator.idle import (
    Idleness,
    busy_reason,
    idleness,
    parse_stamp,
    scaled_to_zero,
    stamp,
)

NOW = 1_700_000_000.0


def info(clients: int = 0, **tasks: int) -> dict[str, Any]:
    return {"workers": {}, "clients": clients, "tasks": tasks}


def test_a_cluster_without_a_timeout_is_never_idle() -> None:
    assert idleness(None, info(), NOW - 1000, NOW) == Idleness()


def test_idleness_starts_when_first_seen_idle() -> None:
    found = idleness(60, info(), None, NOW)
    assert (found.since, found.deadline, found.due) == (NOW, NOW + 60, False)
    assert found.status() == {"idleSince": stamp(NOW), "idleDeadline": stamp(NOW + 60)}


def test_idleness_keeps_its_start_and_is_due_at_the_deadline() -> None:
    assert not idleness(60, info(), NOW - 59, NOW).due
    found = idleness(60, info(), NOW - 60, NOW)
    assert found.due and found.since == NOW - 60
    assert "no client connected and no task for 60 s" in found.why


@pytest.mark.parametrize(
    ("observed", "why"),
    [
        (info(clients=1), "1 client(s) connected"),
        (info(processing=2, waiting=1), "tasks under way: 2 processing, 1 waiting"),
        (info(**{"no-worker": 3}), "tasks under way: 3 no-worker"),
    ],
)
def test_a_client_or_a_task_under_way_resets_the_clock(observed: Any, why: str) -> None:
    found = idleness(60, observed, NOW - 3600, NOW)
    assert found == Idleness(why=why)
    assert found.status() == {"idleSince": None, "idleDeadline": None}


def test_results_held_without_a_client_count_as_idle() -> None:
    assert busy_reason(info(memory=5, erred=1, released=2)) is None
    assert idleness(60, info(memory=5), NOW - 61, NOW).due


def test_an_unreachable_scheduler_neither_starts_nor_fires_the_clock() -> None:
    assert idleness(60, None, None, NOW) == Idleness(why="the scheduler is not answering")
    kept = idleness(60, None, NOW - 600, NOW)
    assert (kept.since, kept.deadline, kept.due) == (NOW - 600, NOW - 540, False)


def test_an_idle_start_in_the_future_is_not_trusted() -> None:
    assert idleness(60, info(), NOW + 500, NOW).since == NOW


def test_scale_to_zero_sets_fixed_replicas_and_autoscaled_minimums() -> None:
    groups = [
        {"name": "gpu", "replicas": 2, "resources": {"GPU": 2}},
        {"name": "cpu", "minReplicas": 1, "maxReplicas": 4},
        {"name": "one"},  # replicas default to 1
    ]
    assert scaled_to_zero(groups) == [
        {"name": "gpu", "replicas": 0, "resources": {"GPU": 2}},
        {"name": "cpu", "minReplicas": 0, "maxReplicas": 4},
        {"name": "one", "replicas": 0},
    ]
    assert groups[0]["replicas"] == 2  # the input is left as it was


def test_scale_to_zero_of_a_cluster_at_zero_changes_nothing() -> None:
    assert scaled_to_zero([{"name": "gpu", "replicas": 0}, {"name": "c", "maxReplicas": 3}]) is None
    assert scaled_to_zero([]) is None


def test_stamps_round_trip_and_bad_ones_are_ignored() -> None:
    assert parse_stamp(stamp(NOW)) == NOW
    assert parse_stamp("yesterday") is None
    assert parse_stamp(None) is None
