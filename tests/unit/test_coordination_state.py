"""The scheduler's coordination state machine (scheduler/coordination.py), without I/O."""

from __future__ import annotations

from typing import Any

from apportion.scheduler.coordination import Coordination

Message = dict[str, Any]


def machine() -> tuple[Coordination, list[tuple[str, Message]]]:
    sent: list[tuple[str, Message]] = []
    return Coordination(lambda dest, msg: sent.append((dest, msg))), sent


def test_every_request_is_answered_once_even_when_granted_before_its_cancel() -> None:
    coord, sent = machine()
    coord.handle("a", {"action": "lease-acquire", "name": "L", "id": 1})
    coord.handle("b", {"action": "lease-acquire", "name": "L", "id": 1})  # parked
    coord.handle("a", {"action": "lease-release", "name": "L", "id": 2})  # grants b's
    coord.handle("b", {"action": "cancel", "wait_id": 1, "id": 2})  # too late
    to_b = [m for dest, m in sent if dest == "b"]
    assert [(m["id"], m.get("value")) for m in to_b] == [(1, True), (2, None)]
    assert coord.semaphores["L"].holders == {"b": 1}


def test_a_cancelled_wait_is_answered_not_ok_and_gets_nothing_later() -> None:
    coord, sent = machine()
    coord.handle("a", {"action": "queue-get", "name": "q", "id": 7})
    coord.handle("a", {"action": "cancel", "wait_id": 7, "id": 8})
    coord.handle("b", {"action": "queue-put", "name": "q", "value": b"x", "id": 1})
    to_a = [m for dest, m in sent if dest == "a"]
    assert [(m["id"], m["ok"]) for m in to_a] == [(7, False), (8, True)]
    assert list(coord.queues["q"]) == [b"x"]


def test_a_client_leaving_gives_back_its_leases_to_the_next_waiter() -> None:
    coord, sent = machine()
    coord.handle("a", {"action": "lease-acquire", "name": "S", "max_leases": 1, "id": 1})
    coord.handle("b", {"action": "lease-acquire", "name": "S", "max_leases": 1, "id": 1})
    coord.client_left("a")
    assert coord.semaphores["S"].holders == {"b": 1}
    assert sent[-1] == ("b", {"op": "coord-reply", "id": 1, "ok": True, "value": True})


def test_unknown_actions_and_bad_names_are_answered_with_an_error() -> None:
    coord, sent = machine()
    coord.handle("a", {"action": "explode", "name": "x", "id": 1})
    coord.handle("a", {"action": "event-set", "name": "", "id": 2})
    assert "unknown coordination action 'explode'" in sent[0][1]["error"]
    assert "non-empty string" in sent[1][1]["error"]
