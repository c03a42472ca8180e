"""Which arguments are stored on a worker, and on which worker (apportion/stored_args.py)."""

from __future__ import annotations

import numpy as np
import pytest
from apportion.worker.stored import StoredArguments

from apportion.serialize import Pickled
from apportion.stored_args import (
    VIEW_FRESH_S,
    VIEW_STALE_S,
    WorkerView,
    choose_holder,
    large_arguments,
    replace,
)


class FakeFuture:
    key = "x"


def worker(name: str, resources: dict[str, float], **info: object) -> dict[str, object]:
    return {"name": name, "resources": resources, "processing": 0, "nbytes": 0, **info}


WORKERS = {
    "tcp://a:1": worker("a", {"GPU": 1}),
    "tcp://b:1": worker("b", {"GPU": 2}, processing=3),
    "tcp://c:1": worker("c", {"GPU": 2}),
    "tcp://d:1": worker("d", {"GPU": 4}, retiring=True),
}


def test_the_holder_can_run_the_task_and_is_the_least_busy() -> None:
    assert choose_holder(WORKERS, {"GPU": 2}, {}) == "tcp://c:1"
    assert choose_holder(WORKERS, {}, {}) == "tcp://a:1"


def test_no_holder_when_no_worker_has_the_resources() -> None:
    assert choose_holder(WORKERS, {"GPU": 3}, {}) is None  # d retires
    assert choose_holder(WORKERS, {"FPGA": 1}, {}) is None
    assert choose_holder({}, {}, {}) is None


def test_named_workers_bind_or_are_preferred() -> None:
    assert choose_holder(WORKERS, {"GPU": 2}, {"workers": ["b"]}) == "tcp://b:1"
    assert choose_holder(WORKERS, {"GPU": 2}, {"workers": ["tcp://a:1"]}) is None
    preferred = {"workers": ["a"], "allow_other_workers": True}
    assert choose_holder(WORKERS, {}, preferred) == "tcp://a:1"
    assert choose_holder(WORKERS, {"GPU": 2}, preferred) == "tcp://c:1"


def test_large_arguments_are_found_by_position_and_keyword() -> None:
    big, small = np.ones(10_000), np.ones(10)  # 80 kB: its buffer pickles out of band
    found = large_arguments((small, big), {"w": big, "n": 3}, 40_000, FakeFuture)
    assert [(position, value is big) for position, value, _ in found] == [(1, True), ("w", True)]
    assert all(isinstance(payload, Pickled) for _, _, payload in found)
    assert large_arguments((b"x" * 5000,), {}, 4000, FakeFuture)[0][0] == 0


def test_arguments_holding_futures_stay_with_the_task() -> None:
    big = np.ones(1000)
    assert large_arguments(([big, FakeFuture()],), {"f": FakeFuture()}, 10, FakeFuture) == []


def test_replace_puts_futures_where_the_arguments_were() -> None:
    args, kwargs = replace((1, 2, 3), {"a": 4, "b": 5}, {1: "f1", "b": "fb"})
    assert args == (1, "f1", 3)
    assert kwargs == {"a": 4, "b": "fb"}


def test_a_stored_value_is_taken_once_or_dropped_with_its_owner() -> None:
    store = StoredArguments()
    owner, other = object(), object()
    store.put("k1", 1, owner)
    store.put("k2", 2, other)
    store.put("k3", 3, owner)
    assert store.take("k1") == 1
    with pytest.raises(LookupError, match="'k1' is no longer on this worker"):
        store.take("k1")
    store.drop_from(owner)
    assert store.keys() == ["k2"]
    store.drop(["k2"])
    assert store.keys() == []


def test_a_renamed_value_keeps_its_owner_and_a_missing_one_is_not_renamed() -> None:
    store = StoredArguments()
    owner = object()
    store.put("upload-1", 1, owner)
    assert store.rename("upload-1", "int-abc")
    assert store.keys() == ["int-abc"]
    assert not store.rename("upload-1", "int-def")  # gone: nothing to name
    store.drop_from(owner)
    assert store.keys() == []


def test_the_worker_view_is_described_again_when_old_and_weighs_each_choice() -> None:
    view = WorkerView()
    assert view.due(0.0) == "wait"  # never described
    view.describe({"a": worker("a", {"G": 1}), "b": worker("b", {"G": 1})}, 10.0)
    assert view.due(10.0 + VIEW_FRESH_S / 2) == ""
    assert view.due(10.0 + VIEW_FRESH_S * 2) == "refresh"
    view.refreshing = True
    assert view.due(10.0 + VIEW_FRESH_S * 2) == ""  # one refresh at a time
    assert view.due(10.0 + VIEW_STALE_S * 2) == "wait"
    # Each choice counts its bytes on its holder: equal workers take turns.
    chosen = []
    for _ in range(4):
        holder = choose_holder(view.workers, {"G": 1}, {})
        assert holder is not None
        view.chose(holder, 1_000_000)
        chosen.append(holder)
    assert chosen == ["a", "b", "a", "b"]
    # A holder that could not be reached is not chosen until described again.
    view.unreachable("a")
    assert choose_holder(view.workers, {"G": 1}, {}) == "b"
    # A description asked for before the one held does not replace it.
    view.describe({}, 9.0)
    assert set(view.workers) == {"b"}
    view.describe({"a": worker("a", {"G": 1})}, 11.0)
    assert set(view.workers) == {"a"}
