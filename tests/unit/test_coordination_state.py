"""The scheduler's coordination state machine (scheduler/coordination.py), without I/O."""

from __future__ import annotations

from typing import Any

from apportion.scheduler.coordination import HOLDER, Coordination

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
    assert [value.data for value in coord.queues["q"]] == [b"x"]


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


def holding_machine() -> tuple[Coordination, list[tuple[str, Any]], dict[str, set[str]]]:
    """A machine whose holds are recorded: wanter -> keys held for it now."""
    sent: list[tuple[str, Any]] = []
    held: dict[str, set[str]] = {}

    def hold(wanter: str, keys: list[str]) -> None:
        held.setdefault(wanter, set()).update(keys)

    def release(wanter: str, keys: list[str]) -> None:
        held.get(wanter, set()).difference_update(keys)

    return Coordination(lambda d, m: sent.append((d, m)), hold, release), sent, held


def test_a_variable_holds_the_results_of_its_futures_until_replaced() -> None:
    coord, sent, held = holding_machine()
    coord.handle(
        "a", {"action": "variable-set", "name": "v", "value": b"1", "keys": ["k1"], "id": 1}
    )
    assert held[HOLDER] == {"k1"}
    coord.handle("b", {"action": "variable-get", "name": "v", "id": 2})
    assert held["b"] == {"k1"}  # held for the taker before it is answered
    assert sent[-1][1]["keys"] == ["k1"]
    coord.handle(
        "a", {"action": "variable-set", "name": "v", "value": b"2", "keys": ["k2"], "id": 3}
    )
    assert held[HOLDER] == {"k2"}
    coord.handle("a", {"action": "variable-delete", "name": "v", "id": 4})
    assert held[HOLDER] == set()


def test_a_queue_item_gives_its_results_to_the_taker() -> None:
    coord, _sent, held = holding_machine()
    for i, key in enumerate(["k", "k"]):  # the same future put twice: held while either is
        coord.handle(
            "a", {"action": "queue-put", "name": "q", "value": b"", "keys": [key], "id": i}
        )
    coord.handle("b", {"action": "queue-get", "name": "q", "id": 5})
    assert held[HOLDER] == {"k"} and held["b"] == {"k"}
    coord.handle("c", {"action": "queue-get", "name": "q", "id": 6})
    assert held[HOLDER] == set() and held["c"] == {"k"}


def test_datasets_refuse_a_taken_name_unless_overridden() -> None:
    coord, sent, _held = holding_machine()
    coord.handle("a", {"action": "dataset-publish", "name": "d", "value": b"1", "id": 1})
    coord.handle("a", {"action": "dataset-publish", "name": "d", "value": b"2", "id": 2})
    assert "already published" in sent[-1][1]["error"]
    coord.handle(
        "a", {"action": "dataset-publish", "name": "d", "value": b"2", "override": True, "id": 3}
    )
    coord.handle("a", {"action": "dataset-list", "name": "*", "id": 4})
    assert sent[-1][1]["names"] == ["d"]
    coord.handle("b", {"action": "dataset-get", "name": "missing", "id": 5})
    assert sent[-1][1] == {"op": "coord-reply", "id": 5, "ok": True, "found": False}
    coord.handle("b", {"action": "dataset-get", "name": "later", "wait": True, "id": 6})
    coord.handle("a", {"action": "dataset-publish", "name": "later", "value": b"3", "id": 7})
    assert [m["value"] for d, m in sent if d == "b" and m["id"] == 6] == [b"3"]
