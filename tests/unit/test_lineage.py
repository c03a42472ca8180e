"""What a client re-registers after a scheduler restart (apportion/lineage.py)."""

from __future__ import annotations

import pickle

from apportion.futures import FutureState, MapPiece
from apportion.lineage import re_registration


def state(key: str, *deps: FutureState, status: str = "pending") -> FutureState:
    s = FutureState(key)
    s.spec = {"key": key, "deps": [d.key for d in deps]}
    s.deps = list(deps)
    s.status = status
    return s


def keys(specs: list[dict]) -> list[str]:
    return [spec["key"] for spec in specs]


def test_dependencies_come_before_their_dependents_and_each_key_once() -> None:
    a = state("a")
    b = state("b", a)
    c = state("c", a, b)
    specs, lineage_only = re_registration([c, b, a])
    assert keys(specs) == ["a", "b", "c"]
    assert lineage_only == []
    assert specs[2] is c.spec  # the spec as submitted, not a copy


def test_a_dependency_whose_future_was_dropped_is_sent_as_lineage_only() -> None:
    load = state("load", status="finished")
    process = state("process", load)
    specs, lineage_only = re_registration([process])  # the client dropped load's future
    assert keys(specs) == ["load", "process"]
    assert lineage_only == ["load"]


def test_failed_and_cancelled_futures_are_not_re_registered() -> None:
    ok = state("ok", status="finished")
    bad = state("bad", status="error")
    gone = state("gone", status="cancelled")
    specs, _ = re_registration([ok, bad, gone])
    assert keys(specs) == ["ok"]


def test_a_long_chain_is_walked_without_recursion() -> None:
    chain = [state("t0")]
    for i in range(1, 20_000):
        chain.append(state(f"t{i}", chain[-1]))
    specs, lineage_only = re_registration([chain[-1]])
    assert keys(specs) == [f"t{i}" for i in range(20_000)]
    assert len(lineage_only) == 19_999


def test_a_maps_states_share_their_message_and_give_it_whole() -> None:
    piece = MapPiece({"func": b"f", "resources": {"GPU": 1}})
    first, second = FutureState("inc-1"), FutureState("inc-2")
    piece.keep([first, second], [b"one", b"two"])
    specs, lineage_only = re_registration([first, second])
    assert specs == [
        {"key": "inc-1", "func": b"f", "resources": {"GPU": 1}, "args": b"one"},
        {"key": "inc-2", "func": b"f", "resources": {"GPU": 1}, "args": b"two"},
    ]
    assert lineage_only == []
    first.spec = {"key": "inc-1", "func": b"g", "args": b"again"}  # replaced (restored)
    assert first.spec == {"key": "inc-1", "func": b"g", "args": b"again"}
    assert second.spec is not None and second.spec["args"] == b"two"


def test_a_piece_gives_back_the_arguments_it_kept_without_their_pickle_heads() -> None:
    piece = MapPiece({"func": b"f"})
    sent = [pickle.dumps(((i,), {}), protocol=5) for i in (1, 300, 10**9)]
    states = [FutureState(f"inc-{i}") for i in range(3)]
    piece.keep(states, sent)
    assert [state.spec for state in states] == [
        {"key": f"inc-{i}", "func": b"f", "args": args} for i, args in enumerate(sent)
    ]  # the same bytes
    odd = MapPiece({"func": b"f"})
    odd.keep(states[:2], [b"not a pickle", sent[0]])
    assert [s.spec["args"] for s in states[:2]] == [b"not a pickle", sent[0]]


def test_a_piece_keeps_small_results_until_every_one_is_loaded() -> None:
    piece = MapPiece({"func": b"f"})
    states = [FutureState(f"inc-{i}") for i in range(3)]
    piece.keep(states, [b"args"] * 3)
    values = [10**6, "x" * 40, 5]  # a pickle with a head, another, one without
    for state, value in zip(states, values, strict=True):
        state.finish(["w"], pickle.dumps(value, protocol=5))
        assert state.data is None and state.has_value()  # kept by the piece
    large = FutureState("inc-large")
    large.submitted_with(piece, 0)
    large.finish(["w"], pickle.dumps(b"y" * 1000, protocol=5))
    assert large.data is not None  # too large for the piece: kept by its state
    assert [s.value() for s in states[:2]] == values[:2]
    assert piece.has_result(2) and not piece.has_result(0)
    assert states[2].value() == 5 and states[2].value() == 5
    assert piece.result(2) is None and piece._result_at is None  # let go once all loaded
