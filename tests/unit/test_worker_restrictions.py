"""Placement by worker (``workers=`` / ``allow_other_workers=``), on the pure state machine."""

from __future__ import annotations

from typing import Any

import pytest
from apportion.scheduler.restrictions import RestrictedShape, placeable, restrict

from tests.unit.sim import Sim, task


def restricted(
    key: str,
    workers: list[str],
    resources: dict[str, float] | None = None,
    loose: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    spec = task(key, resources=resources, **kw)
    spec["workers"] = workers
    if loose:
        spec["allow_other_workers"] = True
    return spec


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.add_client("c")
    return s


def test_a_restricted_shape_is_its_demand_for_accounting_but_a_bucket_of_its_own() -> None:
    plain = (("GPU", 1),)
    shape = restrict(plain, ["a"], False)
    assert list(shape) == [("GPU", 1)]
    assert shape != plain and plain != shape
    assert len({shape, plain, restrict(plain, ["a"], False), restrict(plain, ["a"], True)}) == 3
    assert restrict(plain, [], False) is plain
    assert isinstance(shape, RestrictedShape)


def test_restricted_tasks_run_only_on_the_listed_worker(sim: Sim) -> None:
    for name in ("a", "b", "d"):
        sim.add_worker(name, {"GPU": 2}, nthreads=4)
    sim.submit_many([restricted(f"t{i}", ["b"]) for i in range(6)])
    assert sim.computed_keys() == sim.computed_keys("b")
    assert sim.computed_keys("b") == ["t0", "t1", "t2", "t3", "t4"]  # 4 threads + prefetch 1
    sim.finish("t0")
    assert sim.computed_keys("b")[-1] == "t5"


def test_restriction_and_resources_combine_a_listed_worker_runs_it_only_when_its_units_are_free(
    sim: Sim,
) -> None:
    sim.add_worker("a", {"GPU": 1}, nthreads=4)
    sim.add_worker("b", {"GPU": 1}, nthreads=4)
    sim.submit_many([restricted(f"t{i}", ["a"], {"GPU": 1}) for i in range(3)])
    assert sim.outstanding() == ["t0"]  # b has a free GPU, but is not listed
    assert sim.used("a") == {"GPU": 1} and sim.used("b") == {"GPU": 0}
    sim.finish("t0")
    assert sim.outstanding() == ["t1"]
    assert sim.computed_keys("b") == []


def test_names_and_addresses_both_select_a_worker(sim: Sim) -> None:
    sim.state.add_worker("tcp://10.0.0.1:1", "alpha", 1, {})
    sim.worker_addresses.add("tcp://10.0.0.1:1")
    sim.runs["tcp://10.0.0.1:1"] = {}
    sim.add_worker("other")
    sim.submit_many(
        [restricted("by-name", ["alpha"]), restricted("by-address", ["tcp://10.0.0.1:1"])]
    )
    assert sim.computed_keys("tcp://10.0.0.1:1") == ["by-name", "by-address"]


def test_restricted_to_an_absent_worker_waits_saying_why_then_runs_when_it_joins(
    sim: Sim,
) -> None:
    sim.add_worker("a", {"GPU": 2})
    sim.submit_many([restricted("t", ["late"], {"GPU": 1})])
    assert sim.states()["t"] == "no-worker"
    (notice,) = sim.client_messages("no-worker")
    assert "may run only on worker(s) ['late']" in notice["why"]
    assert "none of them is connected" in notice["why"]
    (waiting,) = sim.state.info()["no_worker"]
    assert waiting["workers"] == ["late"] and waiting["resources"] == {"GPU": 1}
    sim.add_worker("late", {"GPU": 1})
    assert sim.computed_keys("late") == ["t"]


def test_a_listed_worker_too_small_for_the_demand_is_explained(sim: Sim) -> None:
    sim.add_worker("small", {"GPU": 1})
    sim.add_worker("big", {"GPU": 4})
    sim.submit_many([restricted("t", ["small"], {"GPU": 2})])
    assert sim.states()["t"] == "no-worker"
    (notice,) = sim.client_messages("no-worker")
    assert "none has GPU=2 (small has GPU=1)" in notice["why"]


def test_losing_the_only_listed_worker_sends_queued_tasks_to_no_worker(sim: Sim) -> None:
    sim.add_worker("a")
    sim.add_worker("b")
    sim.submit_many([restricted(f"t{i}", ["a"]) for i in range(4)])
    sim.remove_worker("a")
    assert set(sim.states().values()) == {"no-worker"}
    assert sim.computed_keys("b") == []


def test_an_empty_demand_restricted_to_one_worker_is_not_offered_to_the_others(sim: Sim) -> None:
    sim.add_worker("a")
    sim.add_worker("b", nthreads=4)
    sim.submit_many([restricted(f"t{i}", ["a"]) for i in range(5)])
    sim.submit("free")  # makes b pull from the queues
    assert sim.computed_keys("b") == ["free"]
    sim.finish("free")
    assert sim.computed_keys("b") == ["free"]


def test_a_restricted_multi_unit_task_reserves_a_listed_worker(sim: Sim) -> None:
    sim.add_worker("a", {"GPU": 2}, nthreads=4)
    sim.submit_many([task(f"small{i}", resources={"GPU": 1}) for i in range(2)])
    sim.submit_many([restricted("big", ["a"], {"GPU": 2})])
    sim.submit_many([task(f"late{i}", resources={"GPU": 1}) for i in range(2)])
    sim.finish("small0")
    sim.finish("small1")
    assert sim.outstanding() == ["big"]  # the freed units were held for it


def test_allow_other_workers_prefers_the_listed_worker_but_never_waits_for_it(sim: Sim) -> None:
    sim.add_worker("a", {"GPU": 1})
    sim.add_worker("b", {"GPU": 1})
    sim.submit_many([restricted("first", ["b"], {"GPU": 1}, loose=True)])
    assert sim.computed_keys("b") == ["first"]
    sim.submit_many([restricted("second", ["b"], {"GPU": 1}, loose=True)])
    assert sim.computed_keys("a") == ["second"]  # b is busy: any worker with a free GPU


def test_allow_other_workers_with_no_listed_worker_runs_anywhere(sim: Sim) -> None:
    sim.add_worker("a")
    sim.submit_many([restricted("t", ["nobody"], loose=True)])
    assert sim.computed_keys("a") == ["t"]


def test_placeable_is_totals_and_listing() -> None:
    sim = Sim()
    sim.add_worker("a", {"GPU": 2})
    ws = sim.state.workers["a"]
    assert placeable(restrict((("GPU", 2),), ["a"], False), ws)
    assert not placeable(restrict((("GPU", 3),), ["a"], False), ws)
    assert not placeable(restrict((), ["b"], False), ws)
    assert placeable(restrict((), ["b"], True), ws)
