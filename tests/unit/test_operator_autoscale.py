"""apportion.operator.autoscale: the pure planner deciding each worker group's size.

Pure functions only: groups and demand are built by hand (or by ``observe`` from pod dicts
and a scheduler ``/api/v1/info`` answer); nothing talks to Kubernetes.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Sequence
from typing import Any

import pytest
from apportion.operator.autoscale import (
    Demand,
    GroupView,
    ScaleDecision,
    cost,
    decide,
    eligible_groups,
    observe,
    slots_per_pod,
    unmet_demand,
    why_impossible,
)
from apportion.operator.manifests import LABEL_CLUSTER, LABEL_GROUP
from apportion.operator.spec import parse

from tests.unit.sim import Sim as SchedulerSim

MEM = 100e9


def group(
    name: str,
    resources: dict[str, float] | None = None,
    *,
    nthreads: int = 1,
    lo: int = 0,
    hi: int = 4,
    timeout: float = 60.0,
    desired: int | None = None,
    connected: dict[str, float | None] | None = None,
    unconnected: dict[str, float] | None = None,
) -> GroupView:
    """A group; autoscaled unless ``lo == hi``; its target defaults to its current pods."""
    connected, unconnected = connected or {}, unconnected or {}
    return GroupView(
        name=name,
        resources=dict(resources or {}),
        nthreads=nthreads,
        min_replicas=lo,
        max_replicas=hi,
        idle_timeout=timeout,
        desired=len(connected) + len(unconnected) if desired is None else desired,
        connected=connected,
        unconnected=unconnected,
    )


def fixed(name: str, resources: dict[str, float] | None, n: int, **kw: Any) -> GroupView:
    return group(name, resources, lo=n, hi=n, desired=n, **kw)


def need(tasks: int, **resources: float) -> Demand:
    return Demand(resources, tasks)


def busy(*names: str) -> dict[str, float | None]:
    return dict.fromkeys(names)


def seed(**gpu: Any) -> list[GroupView]:
    """The seed setup: plain fixed, gpu autoscaled 0..4 with GPU=2, highmem fixed."""
    return [
        fixed("plain", None, 2, nthreads=4),
        group("gpu", {"GPU": 2}, **{"lo": 0, "hi": 4, **gpu}),
        fixed("highmem", {"MEMORY": MEM}, 1),
    ]


def by_name(groups: list[GroupView]) -> dict[str, GroupView]:
    return {g.name: g for g in groups}


# --------------------------------------------------------------------------- slots and cost


@pytest.mark.parametrize(
    ("resources", "nthreads", "demand", "slots"),
    [
        ({"GPU": 2}, 4, {"GPU": 1}, 2),  # limited by the GPUs
        ({"GPU": 2}, 1, {"GPU": 1}, 1),  # limited by the threads
        ({"GPU": 2}, 4, {"GPU": 2}, 1),
        ({"GPU": 2}, 8, {"GPU": 0.5}, 4),
        ({"GPU": 2}, 4, {}, 4),  # a plain task takes a thread only
        ({}, 3, {}, 3),
        ({"GPU": 2, "MEMORY": 10e9}, 8, {"GPU": 0.5, "MEMORY": 4e9}, 2),  # the scarcest wins
        ({"GPU": 2, "MEMORY": 10e9}, 8, {"GPU": 1, "MEMORY": 1e9}, 2),
        ({"GPU": 0.3}, 8, {"GPU": 0.1}, 3),  # 0.3 / 0.1 is 2.999...: still three
        ({"GPU": 2}, 4, {"GPU": 3}, 0),  # too much of it
        ({"GPU": 2}, 4, {"MEMORY": 1}, 0),  # none of it
        ({"GPU": 2}, 4, {"GPU": 1, "MEMORY": 1}, 0),  # one of two is missing
        ({"GPU": 2}, 4, {"MEMORY": 0}, 4),  # asking for none of something asks for nothing
    ],
)
def test_slots_per_pod_is_limited_by_threads_and_by_each_resource(
    resources: dict[str, float], nthreads: int, demand: dict[str, float], slots: int
) -> None:
    assert slots_per_pod(group("g", resources, nthreads=nthreads), demand) == slots


def test_cost_is_each_resource_relative_to_the_largest_amount_of_it_summed() -> None:
    groups = [
        group("plain"),
        group("gpu2", {"GPU": 2}),
        group("gpu4", {"GPU": 4}),
        group("mem", {"MEMORY": MEM}),
        group("both", {"GPU": 1, "MEMORY": MEM / 2}),
    ]
    costs = {g.name: cost(g, groups) for g in groups}
    assert costs == pytest.approx({"plain": 0, "gpu2": 0.5, "gpu4": 1, "mem": 1, "both": 0.75})


# --------------------------------------------------------------------------- which groups fit


@pytest.mark.parametrize(
    ("groups", "demand", "order"),
    [
        # Plain work goes only to plain groups while one exists, fixed or not.
        (seed(), {}, ["plain"]),
        ([group("p"), group("gpu", {"GPU": 2})], {}, ["p"]),
        # Without a plain group: the fewest extra kinds of resource, then the cheapest.
        (
            [group("gpu", {"GPU": 2}), group("big", {"GPU": 4}), group("hm", {"MEMORY": MEM})],
            {},
            ["gpu", "big", "hm"],
        ),
        (
            [
                group("gpu", {"GPU": 2}),
                group("hm", {"MEMORY": MEM / 2}),
                group("hm2", {"MEMORY": MEM}),
            ],
            {},
            ["hm", "gpu", "hm2"],
        ),
        ([group("both", {"GPU": 1, "MEMORY": 1}), group("gpu", {"GPU": 4})], {}, ["gpu"]),
        # The cheapest fitting group first: GPU=2 before GPU=4, whatever the listing order.
        ([group("gpu4", {"GPU": 4}), group("gpu2", {"GPU": 2})], {"GPU": 1}, ["gpu2", "gpu4"]),
        ([group("gpu4", {"GPU": 4}), group("gpu2", {"GPU": 2})], {"GPU": 3}, ["gpu4"]),
        # A GPU task prefers a GPU-only group over one that also carries memory.
        ([group("gm", {"GPU": 1, "MEMORY": 1}), group("g", {"GPU": 4})], {"GPU": 1}, ["g"]),
        (
            [group("gm", {"GPU": 1, "MEMORY": 1}), group("g", {"GPU": 4})],
            {"GPU": 1, "MEMORY": 1},
            ["gm"],
        ),
        # Groups that cannot fit it, or may never have a worker, are not candidates.
        (seed(), {"MEMORY": 70e9}, ["highmem"]),
        (seed(), {"GPU": 8}, []),
        ([fixed("zero", {"GPU": 2}, 0), group("gpu", {"GPU": 1})], {"GPU": 1}, ["gpu"]),
        # Equal cost: by name, so the order never depends on the listing order.
        ([group("b", {"GPU": 2}), group("a", {"GPU": 2})], {"GPU": 1}, ["a", "b"]),
    ],
)
def test_eligible_groups(
    groups: list[GroupView], demand: dict[str, float], order: list[str]
) -> None:
    assert [g.name for g in eligible_groups(groups, demand)] == order


# --------------------------------------------------------------------------- scale-up


@pytest.mark.parametrize(
    ("resources", "nthreads", "hi", "tasks", "asked", "pods"),
    [
        ({"GPU": 2}, 4, 8, 5, {"GPU": 1}, 3),  # two per pod
        ({"GPU": 2}, 1, 8, 5, {"GPU": 1}, 5),  # one thread: one per pod
        ({"GPU": 2}, 4, 8, 4, {"GPU": 2}, 4),
        ({"GPU": 2}, 4, 8, 1, {"GPU": 1}, 1),
        ({"GPU": 2}, 4, 8, 7, {"GPU": 0.5}, 2),  # four per pod
        ({"GPU": 2}, 2, 8, 7, {"GPU": 0.5}, 4),  # two threads: two per pod
        ({"GPU": 2}, 4, 8, 8, {}, 2),  # plain tasks, no plain group: four per pod
        ({"GPU": 2}, 1, 4, 100, {"GPU": 1}, 4),  # never past maxReplicas
        ({"GPU": 2}, 4, 3, 7, {"GPU": 1}, 3),
    ],
)
def test_scale_up_from_zero_starts_ceil_tasks_over_slots_pods(
    resources: dict[str, float],
    nthreads: int,
    hi: int,
    tasks: int,
    asked: dict[str, float],
    pods: int,
) -> None:
    gpu = group("gpu", resources, nthreads=nthreads, hi=hi)
    decision = decide([gpu], [Demand(asked, tasks)])
    slots = slots_per_pod(gpu, asked)
    assert pods == min(hi, math.ceil(tasks / slots))
    assert decision.targets == {"gpu": pods}
    assert decision.remove == {}
    assert decision.impossible == []
    routed = min(tasks, pods * slots)
    assert decision.reasons == {"gpu": f"{routed} waiting task(s) fit gpu (GPU=2 per pod)"}


def test_connected_busy_workers_are_not_counted_as_room_for_waiting_tasks() -> None:
    gpu = group("gpu", {"GPU": 2}, nthreads=2, connected=busy("w0", "w1"))
    decision = decide([gpu], [need(3, GPU=1)])
    assert decision.targets == {"gpu": 4}  # 2 busy + ceil(3 / 2)
    gpu = group("gpu", {"GPU": 2}, nthreads=2, hi=3, connected=busy("w0", "w1"))
    assert decide([gpu], [need(3, GPU=1)]).targets == {"gpu": 3}


def test_scale_up_is_the_seed_setups_gpu_group_only() -> None:
    decision = decide(seed(), [need(3, GPU=2), need(5), need(2, MEMORY=70e9)])
    assert decision.targets == {"gpu": 3}
    assert decision.remove == {}
    assert decision.impossible == []
    assert set(decision.reasons) == {"gpu"}


def test_memory_demand_never_touches_the_gpu_group() -> None:
    for gpu in ({}, {"desired": 2, "connected": {"w0": 1.0, "w1": None}}):
        groups = seed(**gpu)
        decision = decide(groups, [need(10, MEMORY=70e9)])
        assert decision.targets == {"gpu": by_name(groups)["gpu"].desired}
        assert decision.reasons == {} and decision.remove == {}


def test_a_full_cheapest_group_spills_to_the_next_cheapest() -> None:
    groups = [
        group("gpu4", {"GPU": 4}, hi=4),
        group("gpu2", {"GPU": 2}, hi=2),
        group("mem", {"MEMORY": MEM}, hi=9),
    ]
    decision = decide(groups, [need(5, GPU=1)])
    assert decision.targets == {"gpu2": 2, "gpu4": 3, "mem": 0}
    assert decision.reasons["gpu2"].startswith("2 waiting task(s) fit gpu2")
    assert decision.reasons["gpu4"].startswith("3 waiting task(s) fit gpu4")
    assert "mem" not in decision.reasons


def test_a_cheapest_group_at_max_with_busy_workers_spills_without_changing() -> None:
    groups = [group("gpu2", {"GPU": 2}, hi=2, connected=busy("a", "b")), group("gpu4", {"GPU": 4})]
    decision = decide(groups, [need(3, GPU=1)])
    assert decision.targets == {"gpu2": 2, "gpu4": 3}
    assert set(decision.reasons) == {"gpu4"}


def test_when_every_fitting_group_is_full_the_demand_waits_and_nothing_grows() -> None:
    groups = [
        group("gpu2", {"GPU": 2}, hi=2, connected=busy("a", "b")),
        group("gpu4", {"GPU": 4}, hi=1, connected=busy("c")),
    ]
    decision = decide(groups, [need(30, GPU=1)])
    assert decision.targets == {"gpu2": 2, "gpu4": 1}
    assert decision.reasons == {} and decision.impossible == []


def test_the_cheapest_fitting_group_grows_first() -> None:
    groups = [group("gpu4", {"GPU": 4}), group("gpu2", {"GPU": 2})]
    decision = decide(groups, [need(1, GPU=1)])
    assert decision.targets == {"gpu2": 1, "gpu4": 0}
    # A task only the larger group fits goes there.
    decision = decide(groups, [need(1, GPU=3)])
    assert decision.targets == {"gpu2": 0, "gpu4": 1}


@pytest.mark.parametrize("plain_hi", [1, 3])
def test_plain_tasks_never_start_gpu_pods_while_a_plain_group_exists(plain_hi: int) -> None:
    # A fixed plain group (busy): its workers will get to the tasks; no GPU pod starts.
    groups = seed()
    decision = decide(groups, [need(50)])
    assert decision.targets == {"gpu": 0}
    assert decision.reasons == {}
    # An autoscaled plain group grows instead.
    groups = [group("plain", None, lo=0, hi=plain_hi), group("gpu", {"GPU": 2})]
    decision = decide(groups, [need(50)])
    assert decision.targets == {"plain": plain_hi, "gpu": 0}


def test_the_reason_for_growing_a_plain_group_says_it_has_no_resources() -> None:
    decision = decide([group("plain", nthreads=2)], [need(3)])
    assert decision.reasons == {"plain": "3 waiting task(s) fit plain (no resources per pod)"}


@pytest.mark.parametrize(
    ("groups", "grows"),
    [
        ([group("gpu", {"GPU": 2}), group("big", {"GPU": 4}), group("hm", {"MEMORY": MEM})], "gpu"),
        (
            [
                group("gpu", {"GPU": 2}),
                group("hm", {"MEMORY": MEM / 2}),
                group("hm2", {"MEMORY": MEM}),
            ],
            "hm",
        ),
        # Fewest extra kinds beats a lower cost.
        (
            [
                group("gm", {"GPU": 1, "MEMORY": 1}),
                group("hm", {"MEMORY": MEM}),
                group("x", {"GPU": 8}),
            ],
            "hm",
        ),
    ],
)
def test_without_a_plain_group_plain_tasks_pick_the_cheaper_group(
    groups: list[GroupView], grows: str
) -> None:
    decision = decide(groups, [need(1)])
    assert {name for name, n in decision.targets.items() if n} == {grows}
    assert set(decision.reasons) == {grows}


@pytest.mark.parametrize(
    ("asked", "fragments"),
    [
        ({"GPU": 8}, ["GPU=8 needed, the most a group offers is 2 (gpu)"]),
        ({"license": 1}, ["license=1 needed, no group has any"]),
        ({"GPU": 1, "MEMORY": 70e9}, ["no single group has all of these together"]),
        ({"GPU": 8, "MEMORY": 2e11}, ["GPU=8 needed", "MEMORY=2e+11 needed", "(highmem)"]),
    ],
)
def test_impossible_demand_is_reported_and_never_scaled_for(
    asked: dict[str, float], fragments: list[str]
) -> None:
    groups = seed()
    decision = decide(groups, [Demand(asked, 3)])
    assert decision.targets == {"gpu": 0}
    assert decision.reasons == {} and decision.remove == {}
    ((item, why),) = decision.impossible
    assert item == Demand(asked, 3)
    assert why.startswith("no worker group can ever run it: ")
    for fragment in fragments:
        assert fragment in why
    assert why == why_impossible(groups, asked)


def test_impossible_demand_does_not_hold_back_the_shrinking_of_groups() -> None:
    gpu = group("gpu", {"GPU": 2}, connected={"w0": 500.0})
    decision = decide([gpu], [need(3, GPU=8)])
    assert decision.targets == {"gpu": 0}
    assert decision.remove == {"gpu": ["w0"]}
    assert len(decision.impossible) == 1


def test_with_no_group_that_may_have_workers_every_demand_is_impossible() -> None:
    for groups in ([], [fixed("a", None, 0), fixed("b", {"GPU": 1}, 0)]):
        decision = decide(groups, [need(1), need(2, GPU=1)])
        assert [d.tasks for d, _ in decision.impossible] == [2, 1]
        assert {why for _, why in decision.impossible} == {"no worker group may have any workers"}


def test_a_group_that_may_have_no_workers_is_not_an_offer() -> None:
    groups = [fixed("zero", {"GPU": 8}, 0), group("gpu", {"GPU": 2})]
    ((_, why),) = decide(groups, [need(1, GPU=8)]).impossible
    assert "the most a group offers is 2 (gpu)" in why


def test_demand_with_no_tasks_is_ignored() -> None:
    decision = decide(seed(), [need(0, GPU=1), need(0, GPU=8)])
    assert decision == ScaleDecision(targets={"gpu": 0})


def test_the_most_constrained_demand_is_served_first() -> None:
    # Only one pod may start: the two-resource task (which only "gm" fits) gets it, though
    # the one-resource demand is listed first.
    groups = [group("gm", {"GPU": 1, "MEMORY": MEM}, hi=1)]
    decision = decide(groups, [need(1, GPU=1), need(1, GPU=1, MEMORY=1)])
    assert decision.targets == {"gm": 1}
    assert decision.reasons == {"gm": "1 waiting task(s) fit gm (GPU=1, MEMORY=100e9 per pod)"}


# --------------------------------------------------------------------------- no thrash


def test_starting_pods_count_as_capacity_no_second_scale_up() -> None:
    gpu = group("gpu", {"GPU": 2}, nthreads=2)
    demand = [need(5, GPU=1)]
    first = decide([gpu], demand)
    assert first.targets == {"gpu": 3}
    # Next round: the three pods exist but have not connected; the same tasks still wait.
    pods = {f"gpu-{i}": 5.0 for i in range(3)}
    starting = dataclasses.replace(gpu, desired=3, unconnected=pods)
    second = decide([starting], demand)
    assert second.targets == {"gpu": 3}
    assert second.reasons == {} and second.remove == {}
    # Even when the pods are slow (past the timeout): tasks wait for them, none goes.
    slow = dataclasses.replace(starting, unconnected={n: 600.0 for n in pods})
    assert decide([slow], demand) == ScaleDecision(targets={"gpu": 3})
    # Wanted but not created yet (e.g. the listing lags): still counted.
    assert decide([dataclasses.replace(gpu, desired=3)], demand).targets == {"gpu": 3}


def test_one_connected_and_two_starting_pods_still_cover_the_waiting_tasks() -> None:
    gpu = group(
        "gpu",
        {"GPU": 2},
        nthreads=2,
        hi=8,
        desired=3,
        connected=busy("w0"),
        unconnected={"w1": 3.0, "w2": 3.0},
    )
    # Two of five tasks run on w0; three wait for the two starting pods.
    assert decide([gpu], [need(3, GPU=1)]) == ScaleDecision(targets={"gpu": 3})
    # More tasks than the starting pods can take: only the difference is added.
    decision = decide([gpu], [need(7, GPU=1)])
    assert decision.targets == {"gpu": 5}


def test_pods_starting_in_the_cheapest_group_take_demand_before_spilling() -> None:
    groups = [
        group("gpu2", {"GPU": 2}, hi=2, desired=2, unconnected={"a": 1.0, "b": 1.0}),
        group("gpu4", {"GPU": 4}),
    ]
    assert decide(groups, [need(2, GPU=1)]).targets == {"gpu2": 2, "gpu4": 0}
    assert decide(groups, [need(3, GPU=1)]).targets == {"gpu2": 2, "gpu4": 1}


# --------------------------------------------------------------------------- scale-down


@pytest.mark.parametrize(
    ("connected", "lo", "desired", "removed", "target"),
    [
        ({"a": 100.0, "b": 200.0, "c": 30.0}, 0, 3, ["b", "a"], 1),  # longest idle first
        ({"a": 100.0, "b": 200.0, "c": 30.0}, 2, 3, ["b"], 2),  # never below minReplicas
        ({"a": 100.0, "b": 200.0, "c": 30.0}, 3, 3, [], 3),
        ({"a": 60.0}, 0, 1, ["a"], 0),  # exactly the timeout: goes
        ({"a": 59.9}, 0, 1, [], 1),
        ({"a": None, "b": None}, 0, 2, [], 2),  # busy workers never go
        ({"a": None, "b": 1e6, "c": None}, 0, 3, ["b"], 2),
        ({"a": 70.0, "b": 70.0}, 0, 2, ["b", "a"], 0),  # equal idleness: by name, stably
    ],
)
def test_idle_workers_past_the_timeout_go_longest_idle_first(
    connected: dict[str, float | None], lo: int, desired: int, removed: list[str], target: int
) -> None:
    gpu = group("gpu", {"GPU": 2}, lo=lo, desired=desired, connected=connected)
    decision = decide([gpu], [])
    assert decision.targets == {"gpu": target}
    assert decision.remove == ({"gpu": removed} if removed else {})
    if removed:
        assert decision.reasons["gpu"] == (
            f"no task waits for gpu and {len(removed)} worker(s) idled or did not start "
            "within idleTimeoutSeconds=60"
        )
    else:
        assert decision.reasons == {}


def test_nothing_goes_while_demand_waits_for_the_group() -> None:
    gpu = group("gpu", {"GPU": 2}, connected={"a": 500.0, "b": 600.0}, unconnected={"c": 900.0})
    decision = decide([gpu], [need(1, GPU=1)])
    assert decision.targets == {"gpu": 3}
    assert decision.remove == {} and decision.reasons == {}


def test_demand_waiting_for_another_group_does_not_keep_idle_workers() -> None:
    groups = seed(connected={"g0": 300.0, "g1": None})
    decision = decide(groups, [need(4, MEMORY=70e9), need(9)])
    assert decision.targets == {"gpu": 1}
    assert decision.remove == {"gpu": ["g0"]}


def test_a_timeout_of_zero_removes_every_idle_worker_at_once() -> None:
    gpu = group("gpu", {"GPU": 2}, timeout=0, connected={"a": 0.0, "b": 0.5, "c": None})
    decision = decide([gpu], [])
    assert decision.targets == {"gpu": 1}
    assert decision.remove == {"gpu": ["b", "a"]}


def test_stale_unconnected_pods_go_when_nothing_waits() -> None:
    gpu = group(
        "gpu",
        {"GPU": 2},
        hi=8,
        connected={"idle": 100.0, "busy": None},
        unconnected={"stuck": 120.0, "older": 300.0, "young": 10.0},
    )
    decision = decide([gpu], [])
    # Pods that never started go before idle workers (removing them loses nothing).
    assert decision.remove == {"gpu": ["older", "stuck", "idle"]}
    assert decision.targets == {"gpu": 2}
    assert "3 worker(s)" in decision.reasons["gpu"]
    # With minReplicas=3, only two may go: the never-connected ones.
    decision = decide([dataclasses.replace(gpu, min_replicas=3)], [])
    assert decision.remove == {"gpu": ["older", "stuck"]}
    assert decision.targets == {"gpu": 3}


def test_young_starting_pods_are_kept_when_the_demand_is_gone() -> None:
    gpu = group("gpu", {"GPU": 2}, unconnected={"a": 10.0, "b": 59.0})
    assert decide([gpu], []) == ScaleDecision(targets={"gpu": 2})


@pytest.mark.parametrize(
    ("desired", "connected", "unconnected", "lo", "target", "removed"),
    [
        (3, {"a": None}, {}, 0, 1, []),  # two never created: dropped
        (3, {}, {}, 0, 0, []),
        (3, {}, {}, 2, 2, []),  # not below minReplicas
        (4, {"a": 90.0}, {"b": 5.0}, 0, 1, ["a"]),  # two missing, an idle one, a young one
        (4, {"a": 90.0}, {"b": 5.0}, 2, 2, []),  # the missing go first
    ],
)
def test_pods_wanted_but_never_created_are_dropped_when_nothing_waits(
    desired: int,
    connected: dict[str, float | None],
    unconnected: dict[str, float],
    lo: int,
    target: int,
    removed: list[str],
) -> None:
    gpu = group(
        "gpu", {"GPU": 2}, lo=lo, desired=desired, connected=connected, unconnected=unconnected
    )
    decision = decide([gpu], [])
    assert decision.targets == {"gpu": target}
    assert decision.remove == ({"gpu": removed} if removed else {})
    assert "idleTimeoutSeconds=60" in decision.reasons["gpu"]


def test_pods_wanted_but_never_created_are_kept_while_demand_waits() -> None:
    gpu = group("gpu", {"GPU": 2}, desired=3, connected=busy("a"))
    assert decide([gpu], [need(1, GPU=1)]) == ScaleDecision(targets={"gpu": 3})


def test_a_settled_idle_group_within_the_timeout_is_left_alone() -> None:
    groups = seed(lo=1, connected={"a": 5.0, "b": None})
    assert decide(groups, []) == ScaleDecision(targets={"gpu": 2})


# --------------------------------------------------------------------------- bounds


def test_fixed_groups_are_never_in_the_targets() -> None:
    groups = [
        fixed("plain", None, 2, connected={"p0": 1e6, "p1": 1e6}),
        fixed("gpu", {"GPU": 2}, 0),
        fixed("hm", {"MEMORY": MEM}, 1, unconnected={"h0": 1e6}),
        group("auto", {"GPU": 4}),
    ]
    for demand in ([], [need(9)], [need(9, GPU=2)], [need(9, MEMORY=1)], [need(1, GPU=4)]):
        decision = decide(groups, demand)
        assert set(decision.targets) == {"auto"}
        assert set(decision.remove) <= {"auto"}
        assert set(decision.reasons) <= {"auto"}


@pytest.mark.parametrize("demand", [[], [need(1, GPU=1)], [need(100, GPU=1)]])
def test_a_lowered_max_clamps_the_target_and_says_why(demand: list[Demand]) -> None:
    gpu = group("gpu", {"GPU": 2}, hi=4, desired=6, connected=busy(*"abcdef"))
    decision = decide([gpu], demand)
    assert decision.targets == {"gpu": 4}
    assert decision.reasons == {"gpu": "kept within minReplicas=0, maxReplicas=4"}
    assert decision.remove == {}


def test_a_raised_min_clamps_the_target_and_says_why() -> None:
    gpu = group("gpu", {"GPU": 2}, lo=2, hi=4, desired=0)
    decision = decide([gpu], [])
    assert decision.targets == {"gpu": 2}
    assert decision.reasons == {"gpu": "kept within minReplicas=2, maxReplicas=4"}


def test_a_raised_min_on_a_group_demand_could_use_but_does_not_get_says_why() -> None:
    # gpu4 fits the waiting task but gpu2 is cheaper and takes it: gpu4 grows only to its
    # new minimum, and the reason must say so (not "0 waiting task(s) fit gpu4").
    groups = [group("gpu2", {"GPU": 2}), group("gpu4", {"GPU": 4}, lo=1, desired=0)]
    decision = decide(groups, [need(1, GPU=1)])
    assert decision.targets == {"gpu2": 1, "gpu4": 1}
    assert decision.reasons["gpu4"] == "kept within minReplicas=1, maxReplicas=4"
    assert decision.reasons["gpu2"].startswith("1 waiting task(s) fit gpu2")


def test_a_raised_min_above_what_the_demand_asks_for_says_why() -> None:
    gpu = group("gpu", {"GPU": 2}, lo=3, hi=6, desired=0)
    decision = decide([gpu], [need(1, GPU=1)])
    assert decision.targets == {"gpu": 3}
    assert decision.reasons == {"gpu": "kept within minReplicas=3, maxReplicas=6"}
    # Demand beyond the minimum: the tasks are the reason.
    decision = decide([gpu], [need(5, GPU=1)])
    assert decision.targets == {"gpu": 5}
    assert decision.reasons == {"gpu": "5 waiting task(s) fit gpu (GPU=2 per pod)"}


def test_a_lowered_max_with_idle_workers_removes_the_longest_idle() -> None:
    gpu = group("gpu", {"GPU": 2}, hi=2, desired=4, connected={"a": 100.0, "b": 5.0, "c": 300.0})
    decision = decide([gpu], [])
    assert decision.targets == {"gpu": 0}
    assert decision.remove == {"gpu": ["c", "a"]}


# --------------------------------------------------------------------------- observe


NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def _stamp(seconds_ago: float) -> str:
    moment = datetime.datetime.fromtimestamp(NOW - seconds_ago, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def worker_pod(
    group_name: str, index: int, *, age: float | None = 30.0, deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"c-{group_name}-{index}",
        "labels": {LABEL_CLUSTER: "c", LABEL_GROUP: group_name},
    }
    if age is not None:
        meta["creationTimestamp"] = _stamp(age)
    if deleting:
        meta["deletionTimestamp"] = _stamp(0)
    return {"metadata": meta}


def scheduler_info(
    workers: dict[str, float | None] | None = None,
    queued: Sequence[dict[str, Any]] = (),
    no_worker: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """``/api/v1/info``: workers by address with name and idle seconds, and waiting demand."""
    out = {}
    for i, (name, idle) in enumerate((workers or {}).items()):
        address = f"tcp://10.0.0.{i}:4000"
        out[address] = {"name": name, "address": address, "idle_seconds": idle}
    return {"workers": out, "queued": list(queued), "no_worker": list(no_worker)}


SEED_SPEC = parse(
    "c",
    "ns",
    {
        "workerGroups": [
            {"name": "plain", "replicas": 2, "nthreads": 4},
            {"name": "gpu", "minReplicas": 0, "maxReplicas": 4, "resources": {"GPU": 2}},
            {"name": "highmem", "replicas": 1, "resources": {"MEMORY": MEM}},
        ]
    },
)


def test_observe_splits_connected_from_starting_pods_per_group() -> None:
    pods = [
        worker_pod("plain", 0),
        worker_pod("plain", 1),
        worker_pod("gpu", 0, age=500),
        worker_pod("gpu", 1, age=90),
        worker_pod("gpu", 2, age=None),  # just created: no timestamp yet
        worker_pod("gpu", 3, deleting=True),  # going away: not counted
        worker_pod("other", 0),  # not a group of this spec
    ]
    info = scheduler_info({"c-plain-0": None, "c-gpu-0": 75.5, "c-gpu-3": 1.0, "stranger": 5.0})
    views, demand = observe(SEED_SPEC, pods, info, {"gpu": 3}, NOW)
    groups = by_name(views)
    assert list(groups) == ["plain", "gpu", "highmem"]
    assert groups["plain"] == GroupView(
        "plain", {}, 4, 2, 2, 60.0, 2, connected={"c-plain-0": None}, unconnected={"c-plain-1": 30}
    )
    gpu = groups["gpu"]
    assert (gpu.resources, gpu.nthreads, gpu.min_replicas, gpu.max_replicas) == (
        {"GPU": 2.0},
        1,
        0,
        4,
    )
    assert gpu.desired == 3  # from the previous status
    assert gpu.connected == {"c-gpu-0": 75.5}
    assert gpu.unconnected == {"c-gpu-1": 90.0, "c-gpu-2": 0.0}
    assert groups["highmem"].desired == 1
    assert (groups["highmem"].connected, groups["highmem"].unconnected) == ({}, {})
    assert demand == []


def test_observe_starts_an_autoscaled_group_without_a_target_from_its_pods() -> None:
    pods = [worker_pod("gpu", i) for i in range(3)] + [worker_pod("gpu", 3, deleting=True)]
    views, _ = observe(SEED_SPEC, pods, scheduler_info(), {}, NOW)
    assert by_name(views)["gpu"].desired == 3
    # A fixed group's target is its replicas, whatever the previous status said.
    views, _ = observe(SEED_SPEC, [], scheduler_info(), {"plain": 7, "highmem": 0}, NOW)
    assert (by_name(views)["plain"].desired, by_name(views)["highmem"].desired) == (2, 1)


def test_observe_reads_a_worker_without_idle_seconds_as_busy() -> None:
    info = scheduler_info()
    info["workers"]["tcp://x:1"] = {"name": "c-gpu-0", "address": "tcp://x:1"}
    views, _ = observe(SEED_SPEC, [worker_pod("gpu", 0)], info, {}, NOW)
    assert by_name(views)["gpu"].connected == {"c-gpu-0": None}


def test_observe_merges_queued_and_no_worker_demand_by_shape() -> None:
    info = scheduler_info(
        queued=[
            {"resources": {"GPU": 1}, "tasks": 3},
            {"resources": {}, "tasks": 5},
            {"resources": {"MEMORY": 70e9}, "tasks": 0},  # nothing waits: dropped
        ],
        no_worker=[
            {"resources": {"GPU": 1}, "tasks": 2, "why": "no worker has GPU"},
            {"resources": {"GPU": 8}, "tasks": 1, "why": "too big"},
            {"tasks": 4},  # no resources: plain
        ],
    )
    _, demand = observe(SEED_SPEC, [], info, {}, NOW)
    assert sorted(demand, key=lambda d: sorted(d.resources.items())) == [
        Demand({}, 9),
        Demand({"GPU": 1}, 5),
        Demand({"GPU": 8}, 1),
    ]


def test_observe_reads_the_demand_of_a_real_scheduler() -> None:
    sim = SchedulerSim()
    sim.add_client()
    sim.add_worker("c-plain-0", nthreads=1)
    slots = sim.state.workers["c-plain-0"].slots  # the thread, and what it may prefetch
    for i in range(slots + 2):
        sim.submit(f"plain-{i}")  # two wait
    for i in range(2):
        sim.submit(f"gpu-{i}", resources={"GPU": 1})  # no worker has a GPU
    pods = [worker_pod("plain", 0), worker_pod("plain", 1)]
    views, demand = observe(SEED_SPEC, pods, sim.state.info(), {}, NOW)
    assert set(by_name(views)["plain"].connected) == {"c-plain-0"}
    assert by_name(views)["plain"].unconnected == {"c-plain-1": 30.0}
    assert sorted(demand, key=lambda d: len(d.resources)) == [
        Demand({}, 2),
        Demand({"GPU": 1}, 2),
    ]
    assert decide(views, demand).targets == {"gpu": 2}  # one thread per pod: one each


def test_observe_tolerates_an_info_without_workers_or_demand() -> None:
    views, demand = observe(SEED_SPEC, [worker_pod("gpu", 0, age=10)], {}, {}, NOW)
    assert by_name(views)["gpu"].unconnected == {"c-gpu-0": 10.0}
    assert demand == []


def test_observe_then_decide_on_the_seed_setup() -> None:
    pods = [worker_pod("plain", i) for i in range(2)] + [worker_pod("highmem", 0)]
    pods += [worker_pod("gpu", 0, age=900), worker_pod("gpu", 1, age=900)]
    info = scheduler_info(
        {
            "c-plain-0": None,
            "c-plain-1": 3.0,
            "c-highmem-0": None,
            "c-gpu-0": 400.0,
            "c-gpu-1": 20.0,
        },
        queued=[{"resources": {"MEMORY": 70e9}, "tasks": 6}, {"resources": {}, "tasks": 2}],
        no_worker=[{"resources": {"GPU": 2, "MEMORY": 1e9}, "tasks": 1, "why": "none"}],
    )
    views, demand = observe(SEED_SPEC, pods, info, {"gpu": 2}, NOW)
    decision = decide(views, demand)
    assert decision.targets == {"gpu": 1}
    assert decision.remove == {"gpu": ["c-gpu-0"]}
    ((item, why),) = decision.impossible
    assert item == Demand({"GPU": 2, "MEMORY": 1e9}, 1)
    assert "no single group has all of these together" in why


# --------------------------------------------------------------------------- unmet demand


def test_unmet_demand_lists_impossible_demand_with_its_reason_once() -> None:
    info = scheduler_info(
        queued=[{"resources": {"GPU": 8}, "tasks": 2}],
        no_worker=[{"resources": {"GPU": 8}, "tasks": 3, "why": "scheduler's reason"}],
    )
    views, demand = observe(SEED_SPEC, [], info, {}, NOW)
    decision = decide(views, demand)
    assert unmet_demand(decision, views, info) == [
        {
            "resources": {"GPU": 8},
            "tasks": 5,
            "why": "no worker group can ever run it: GPU=8 needed, the most a group offers "
            "is 2 (gpu)",
        }
    ]


def test_unmet_demand_lists_what_only_a_fixed_group_without_workers_could_run() -> None:
    info = scheduler_info(
        no_worker=[
            {"resources": {"MEMORY": 70e9}, "tasks": 2, "why": "no worker has MEMORY"},
            {"resources": {"GPU": 1}, "tasks": 4, "why": "no worker has GPU"},
        ]
    )
    views, demand = observe(SEED_SPEC, [], info, {}, NOW)
    decision = decide(views, demand)
    assert decision.targets == {"gpu": 4}  # workers will start for the GPU tasks
    assert unmet_demand(decision, views, info) == [
        {"resources": {"MEMORY": 70e9}, "tasks": 2, "why": "no worker has MEMORY"}
    ]


def test_unmet_demand_is_empty_when_every_waiting_task_gets_a_worker() -> None:
    info = scheduler_info(queued=[{"resources": {"GPU": 2}, "tasks": 2}])
    views, demand = observe(SEED_SPEC, [], info, {}, NOW)
    assert unmet_demand(decide(views, demand), views, info) == []


# --------------------------------------------------------------------------- simulation


class Sim:
    """A toy cluster of one autoscaled group: pods connect ``start`` seconds after being
    created, take waiting tasks (``duration`` seconds each) while they have threads free."""

    def __init__(self, view: GroupView, start: float, duration: float) -> None:
        self.view, self.start, self.duration = view, start, duration
        self.now = 0.0
        self.waiting = 0
        self.pods: dict[str, float] = {}  # name -> created
        self.running: dict[str, list[float]] = {}  # name -> end times
        self.idle_since: dict[str, float] = {}
        self.target = view.desired
        self.changes = 0
        self.unprompted = 0  # scale-ups in a round where no task arrived
        self.shrunk_while_waiting = 0
        self.most = 0
        self.serial = 0
        self.done = 0

    def step(self, dt: float, arrive: int = 0) -> None:
        self.now += dt
        self.waiting += arrive
        slots = slots_per_pod(self.view, {"GPU": 1})
        for name, created in self.pods.items():
            if self.now - created < self.start:
                continue
            ends = [t for t in self.running.setdefault(name, []) if t > self.now]
            self.done += len(self.running[name]) - len(ends)
            take = min(self.waiting, slots - len(ends))
            ends += [self.now + self.duration] * take
            self.waiting -= take
            self.running[name] = ends
            if ends:
                self.idle_since.pop(name, None)
            else:
                self.idle_since.setdefault(name, self.now)
        connected = {
            n: (None if self.running.get(n) else self.now - self.idle_since[n])
            for n, c in self.pods.items()
            if self.now - c >= self.start
        }
        unconnected = {n: self.now - c for n, c in self.pods.items() if n not in connected}
        view = dataclasses.replace(
            self.view, desired=self.target, connected=connected, unconnected=unconnected
        )
        demand = [need(self.waiting, GPU=1)] if self.waiting else []
        decision = decide([view], demand)
        for name in decision.remove.get(view.name, []):
            assert not self.running.get(name), f"{name} removed while busy"
            del self.pods[name]
        new = decision.targets[view.name]
        if new != self.target:
            self.changes += 1
            self.unprompted += new > self.target and not arrive
            self.shrunk_while_waiting += new < self.target and bool(self.waiting)
            self.target = new
        while len(self.pods) < self.target:
            self.pods[f"p{self.serial}"] = self.now
            self.serial += 1
        while len(self.pods) > self.target:  # the plan's surplus: never-connected first
            young = sorted(n for n in self.pods if n not in connected)
            del self.pods[(young or sorted(self.pods))[-1]]
        self.most = max(self.most, len(self.pods))


@pytest.mark.parametrize(("start", "duration"), [(20, 30), (60, 10), (5, 200), (90, 90)])
def test_a_bursty_load_scales_up_once_and_down_once_per_burst(
    start: float, duration: float
) -> None:
    view = group("gpu", {"GPU": 2}, nthreads=2, hi=4, timeout=60)
    sim = Sim(view, start, duration)
    bursts = [(0, 5), (1000, 3), (1010, 2), (2500, 20), (4000, 1)]
    for at, tasks in bursts:
        while sim.now + 10 < at:
            sim.step(10)
        sim.step(at - sim.now, tasks)
        assert sim.most <= 4
    for _ in range(200):  # then quiet: everything idles out
        sim.step(10)
    assert sim.waiting == 0 and sim.done == 31
    assert sim.target == 0 and sim.pods == {}
    # Growth only when tasks arrive (never again while the pods start), no shrinking while
    # tasks wait; workers idle out one round apart at most twice per burst.
    assert sim.unprompted == 0 and sim.shrunk_while_waiting == 0
    assert sim.changes <= 11


def test_a_steady_trickle_settles_and_does_not_thrash() -> None:
    view = group("gpu", {"GPU": 2}, nthreads=2, hi=4, timeout=60)
    sim = Sim(view, start=30, duration=25)
    # One task every 10 s, each running 25 s: at most three at once, two pods' worth; the
    # backlog while the first pods start may add one more, which idles out once.
    for _ in range(30):
        sim.step(10, 1)
    settled, changes = sim.target, sim.changes
    assert settled == 2 and sim.most <= 3 and changes <= 4
    for _ in range(300):
        sim.step(10, 1)
    assert (sim.target, sim.changes, sim.waiting) == (settled, changes, 0)
    assert sim.shrunk_while_waiting == 0


# --------------------------------------------------------------------------- properties

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

_OFFERS = {"GPU": [1.0, 2.0, 4.0], "MEMORY": [16e9, MEM], "license": [1.0]}
_ASKS = {"GPU": [0.5, 1.0, 2.0, 3.0, 8.0], "MEMORY": [1e9, 50e9, 2e11], "license": [1.0]}


def _shape(choices: dict[str, list[float]]) -> Any:
    return st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in choices.items()})


@st.composite
def _view(draw: Any, name: str) -> GroupView:
    lo = draw(st.integers(0, 3))
    hi = draw(st.integers(lo, lo + 5))
    idle = st.one_of(st.none(), st.floats(0, 300))
    connected = draw(st.lists(idle, max_size=hi + 1))
    unconnected = draw(st.lists(st.floats(0, 300), max_size=3))
    return GroupView(
        name=name,
        resources=draw(_shape(_OFFERS)),
        nthreads=draw(st.integers(1, 4)),
        min_replicas=lo,
        max_replicas=hi,
        idle_timeout=draw(st.sampled_from([0.0, 30.0, 60.0])),
        desired=draw(st.integers(0, hi + 2)),
        connected={f"{name}-c{i}": s for i, s in enumerate(connected)},
        unconnected={f"{name}-u{i}": s for i, s in enumerate(unconnected)},
    )


@st.composite
def _round(draw: Any) -> tuple[list[GroupView], list[Demand]]:
    n = draw(st.integers(1, 4))
    groups = [draw(_view(f"g{i}")) for i in range(n)]
    shapes = draw(st.lists(_shape(_ASKS), max_size=4, unique_by=lambda d: tuple(sorted(d.items()))))
    demand = [Demand(shape, draw(st.integers(0, 20))) for shape in shapes]
    return groups, demand


def _bounded(g: GroupView, n: int) -> int:
    return max(g.min_replicas, min(g.max_replicas, n))


_PROPERTY = hypothesis.settings(derandomize=True, max_examples=200, deadline=None)


@_PROPERTY
@hypothesis.given(_round())
def test_property_targets_removals_and_reasons_are_consistent(
    case: tuple[list[GroupView], list[Demand]],
) -> None:
    groups, demand = case
    decision = decide(groups, demand)
    waiting = [d for d in demand if d.tasks > 0]
    wanted_by = {
        g.name: [d for d in waiting if g in eligible_groups(groups, d.resources)] for g in groups
    }
    assert set(decision.targets) == {g.name for g in groups if g.autoscaled}
    for g in groups:
        if not g.autoscaled:
            continue
        target, removed = decision.targets[g.name], decision.remove.get(g.name, [])
        # Always within the bounds.
        assert g.min_replicas <= target <= g.max_replicas
        # Only workers idle past the timeout, or pods that never connected within it, go,
        # each once, and only from a group no waiting task could use.
        assert len(set(removed)) == len(removed)
        for name in removed:
            if name in g.connected:
                idle = g.connected[name]
                assert idle is not None and idle >= g.idle_timeout
            else:
                assert g.unconnected[name] >= g.idle_timeout
        if removed:
            assert not wanted_by[g.name]
            assert target + len(removed) <= _bounded(g, g.desired)
        # Growth past the current target only for demand the group fits, and no more
        # than that demand needs (or up to minReplicas).
        if target > _bounded(g, g.desired):
            assert wanted_by[g.name]
            assert all(slots_per_pod(g, d.resources) > 0 for d in wanted_by[g.name])
            need_pods = sum(
                math.ceil(d.tasks / slots_per_pod(g, d.resources)) for d in wanted_by[g.name]
            )
            assert target <= max(g.min_replicas, len(g.connected) + need_pods)
        # A reason exactly for each change.
        assert (g.name in decision.reasons) == (target != g.desired)
    assert set(decision.remove) <= {g.name for g in groups if g.autoscaled}
    # Impossible: exactly the waiting demand no group may ever run.
    assert [d for d, _ in decision.impossible] == [
        d
        for d in sorted(waiting, key=lambda d: (-len(d.resources), sorted(d.resources.items())))
        if not eligible_groups(groups, d.resources)
    ]


@_PROPERTY
@hypothesis.given(_round())
def test_property_the_decision_is_deterministic_and_ignores_listing_order(
    case: tuple[list[GroupView], list[Demand]],
) -> None:
    groups, demand = case
    decision = decide(groups, demand)
    assert decide(groups, demand) == decision
    again = decide(groups[::-1], demand[::-1])
    assert (again.targets, again.remove, again.reasons) == (
        decision.targets,
        decision.remove,
        decision.reasons,
    )


@_PROPERTY
@hypothesis.given(_round())
def test_property_the_next_round_with_the_pods_starting_does_not_grow_again(
    case: tuple[list[GroupView], list[Demand]],
) -> None:
    groups, demand = case
    first = decide(groups, demand)
    following = []
    for g in groups:
        target = first.targets.get(g.name, g.desired)
        gone = set(first.remove.get(g.name, []))
        connected = {n: s for n, s in g.connected.items() if n not in gone}
        unconnected = {n: s for n, s in g.unconnected.items() if n not in gone}
        for i in range(target - len(connected) - len(unconnected)):
            unconnected[f"{g.name}-new{i}"] = 0.0  # just created
        following.append(
            dataclasses.replace(g, desired=target, connected=connected, unconnected=unconnected)
        )
    second = decide(following, demand)
    for name, target in second.targets.items():
        assert target <= first.targets[name]


def test_observe_keeps_a_starting_target_within_the_bounds() -> None:
    spec = parse("c", "ns", {"workerGroups": [{"name": "gpu", "minReplicas": 1, "maxReplicas": 2}]})
    pods = [worker_pod("gpu", i) for i in range(3)]
    assert observe(spec, [], scheduler_info(), {}, NOW)[0][0].desired == 1  # no event at birth
    assert observe(spec, pods, scheduler_info(), {}, NOW)[0][0].desired == 2
    assert observe(spec, [], scheduler_info(), {"gpu": 9}, NOW)[0][0].desired == 2


def test_pods_that_never_started_are_no_capacity_so_demand_spills_on() -> None:
    # gpu2 is at its max with two pods stuck unscheduled for longer than the timeout.
    stuck = group("gpu2", {"GPU": 2}, hi=2, timeout=60, unconnected={"a": 300, "b": 300})
    spare = group("gpu4", {"GPU": 4}, nthreads=4, hi=2)
    decision = decide([stuck, spare], [need(2, GPU=1)])
    assert decision.targets == {"gpu2": 2, "gpu4": 1}
    # Pods still within the timeout are capacity on the way: nothing spills.
    starting = dataclasses.replace(stuck, unconnected={"a": 5, "b": 5})
    assert decide([starting, spare], [need(2, GPU=1)]).targets == {"gpu2": 2, "gpu4": 0}


# ----- pods the nodes cannot place ----------------------------------------------------------


def test_growth_stops_at_what_the_nodes_place_keeping_one_pod_pending() -> None:
    """Ten GPU workers allowed, room for four: the target comes down to the four placed and
    one pending (a cluster autoscaler's cue), the other unplaceable pods go, and it says so."""
    connected = busy("w0", "w1", "w2", "w3")
    unplaced = {f"u{i}": 5.0 for i in range(6)}
    gpu = group("gpu", {"GPU": 2}, hi=10, desired=10, connected=connected, unconnected=unplaced)
    gpu = dataclasses.replace(gpu, unplaced=frozenset(unplaced))
    decision = decide([gpu], [need(50, GPU=2)])
    assert decision.targets == {"gpu": 5}
    assert len(decision.remove["gpu"]) == 5 and set(decision.remove["gpu"]) < set(unplaced)
    assert decision.reasons["gpu"] == (
        "the nodes place 4 pod(s) of gpu now: 6 cannot be placed; one stays pending for "
        "capacity that appears"
    )
    assert decision.limited == {"gpu": 4}


def test_a_group_with_unplaceable_pods_takes_no_more_demand_and_it_spills_on() -> None:
    stuck = group("gpu2", {"GPU": 2}, hi=4, connected=busy("a"), unconnected={"b": 5.0})
    stuck = dataclasses.replace(stuck, unplaced=frozenset({"b"}))
    spare = group("gpu4", {"GPU": 4}, nthreads=4, hi=2)
    decision = decide([stuck, spare], [need(8, GPU=1)])
    assert decision.targets["gpu2"] == 2  # the placed one and the pending one: no more
    assert decision.targets["gpu4"] == 2
    assert "gpu2" not in decision.remove


def test_observe_names_the_pods_kubernetes_cannot_place() -> None:
    spec = parse(
        "c", "ns", {"workerGroups": [{"name": "gpu", "maxReplicas": 4, "resources": {"GPU": 2}}]}
    )
    placed, unplaced = worker_pod("gpu", 0), worker_pod("gpu", 1)
    unplaced["status"] = {
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no"}
        ]
    }
    (view,), _ = observe(spec, [placed, unplaced], scheduler_info(), {"gpu": 2}, NOW)
    assert view.unplaced == frozenset({unplaced["metadata"]["name"]})
