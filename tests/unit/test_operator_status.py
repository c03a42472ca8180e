"""apportion.operator.status: a ResourceCluster's status from observed pods and scheduler info."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from apportion.operator.autoscale import ScaleDecision, Scaling
from apportion.operator.manifests import HASH_ANNOTATION, LABEL_CLUSTER, LABEL_GROUP, group_hash
from apportion.operator.spec import ClusterSpec, parse
from apportion.operator.status import (
    compute_status,
    invalid_status,
    pod_ready,
    suspended_status,
    unschedulable,
    with_condition,
)

T0, T1 = "2024-01-01T00:00:00Z", "2024-01-01T00:05:00Z"
NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def cluster(**replicas: int) -> ClusterSpec:
    groups = [
        {"name": name, "replicas": n, "resources": {"GPU": 1, "process": 1}}
        for name, n in replicas.items()
    ]
    return parse("c", "ns", {"workerGroups": groups})


def pod(
    group: str,
    index: int,
    *,
    ready: bool = False,
    stuck: str | None = None,
    deleting: bool = False,
    outdated: bool = False,
) -> dict[str, Any]:
    """A worker pod; built from the current group spec unless ``outdated``."""
    conditions = []
    if stuck is not None:
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": stuck}
        )
    else:
        conditions.append({"type": "PodScheduled", "status": "True"})
    conditions.append({"type": "Ready", "status": "True" if ready else "False"})
    meta: dict[str, Any] = {
        "name": f"c-{group}-{index}",
        "labels": {LABEL_CLUSTER: "c", LABEL_GROUP: group},
        "annotations": {HASH_ANNOTATION: "old" if outdated else _current_hash(group)},
    }
    if deleting:
        meta["deletionTimestamp"] = T0
    return {"metadata": meta, "status": {"conditions": conditions}}


def _current_hash(group: str) -> str:
    spec = cluster(**{group: 1})  # replicas do not enter the hash
    return group_hash(spec, spec.groups[0])


def info(*workers: str | tuple[str, dict[str, float]], no_worker: Any = ()) -> dict[str, Any]:
    """Scheduler ``/api/v1/info``: workers by address, each with name and used resources."""
    out: dict[str, Any] = {}
    for i, worker in enumerate(workers):
        name, used = (worker, {}) if isinstance(worker, str) else worker
        address = f"tcp://10.0.0.{i}:4000"
        out[address] = {"name": name, "address": address, "used_resources": used}
    return {"workers": out, "tasks": {}, "no_worker": list(no_worker)}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


# --------------------------------------------------------------------------- pod helpers


@pytest.mark.parametrize(
    ("conditions", "ready"),
    [
        ([{"type": "Ready", "status": "True"}], True),
        ([{"type": "Ready", "status": "False"}], False),
        ([{"type": "ContainersReady", "status": "True"}], False),
        ([], False),
        (None, False),
    ],
)
def test_pod_ready_reads_the_ready_condition(conditions: Any, ready: bool) -> None:
    assert pod_ready({"metadata": {}, "status": {"conditions": conditions}}) is ready


def test_pod_ready_of_a_pod_without_status_is_false() -> None:
    assert pod_ready({"metadata": {}}) is False


@pytest.mark.parametrize(
    ("conditions", "why"),
    [
        (
            [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": NO_GPU,
                }
            ],
            NO_GPU,
        ),
        (
            [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            "unschedulable",
        ),
        ([{"type": "PodScheduled", "status": "True"}], None),
        ([{"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}], None),
        ([{"type": "Ready", "status": "False", "reason": "Unschedulable"}], None),
        ([], None),
    ],
)
def test_unschedulable_reports_why_kubernetes_cannot_place_a_pod(
    conditions: list[dict[str, Any]], why: str | None
) -> None:
    assert unschedulable({"metadata": {}, "status": {"conditions": conditions}}) == why


# --------------------------------------------------------------------------- phase


# Each row: previous phase, scheduler reachable, connected workers of 2 wanted, expected phase.
PHASES = [
    (None, False, 0, "Pending"),
    (None, True, 0, "Pending"),
    (None, True, 1, "Pending"),
    (None, True, 2, "Running"),
    ("Pending", True, 2, "Running"),
    ("Invalid", True, 1, "Pending"),
    ("Running", True, 2, "Running"),
    ("Running", True, 1, "Degraded"),
    ("Running", False, 0, "Degraded"),
    ("Degraded", True, 1, "Degraded"),
    ("Degraded", False, 0, "Degraded"),
    ("Degraded", True, 2, "Running"),
]


@pytest.mark.parametrize(("previous", "reachable", "connected", "phase"), PHASES)
def test_phase_follows_connected_workers_and_history(
    previous: str | None, reachable: bool, connected: int, phase: str
) -> None:
    spec = cluster(a=2)
    pods = [pod("a", i, ready=True) for i in range(2)]
    seen = info(*[f"c-a-{i}" for i in range(connected)]) if reachable else None
    prior = {"phase": previous} if previous else {}
    status = compute_status(spec, pods, seen, prior, 3, T1)
    assert status["phase"] == phase
    assert status["workers"] == f"{connected}/2"
    assert condition(status, "Ready")["status"] == ("True" if phase == "Running" else "False")
    assert condition(status, "Valid")["status"] == "True"


def test_a_deliberate_scale_down_is_scaling_not_degraded() -> None:
    """replicas 2 -> 1 while both workers still run: the surplus is being retired."""
    spec = cluster(a=1)
    pods = [pod("a", i, ready=True) for i in range(2)]
    before = {"phase": "Running", "workerGroups": [{"name": "a", "desiredReplicas": 2}]}
    status = compute_status(spec, pods, info("c-a-0", "c-a-1"), before, 4, T1)
    assert status["phase"] == "Scaling"
    # Later, one worker left but the other not connected back: lost, not scaling.
    steady = {"phase": "Running", "workerGroups": [{"name": "a", "desiredReplicas": 1}]}
    status = compute_status(spec, [pod("a", 0, ready=True)], info(), steady, 4, T1)
    assert status["phase"] == "Degraded"


def test_a_deliberate_scale_up_is_scaling_until_complete() -> None:
    spec = cluster(a=3)
    pods = [pod("a", i, ready=i < 2) for i in range(3)]
    before = {"phase": "Running", "workerGroups": [{"name": "a", "desiredReplicas": 2}]}
    first = compute_status(spec, pods, info("c-a-0", "c-a-1"), before, 4, T1)
    assert first["phase"] == "Scaling"
    assert compute_status(spec, pods, info("c-a-0", "c-a-1"), first, 4, T1)["phase"] == "Scaling"
    done = compute_status(spec, pods, info("c-a-0", "c-a-1", "c-a-2"), first, 4, T1)
    assert done["phase"] == "Running"


def test_a_refused_spec_shows_as_valid_false_while_the_last_valid_one_runs() -> None:
    spec = cluster(a=2)
    pods = [pod("a", i, ready=True) for i in range(2)]
    status = compute_status(
        spec, pods, info("c-a-0", "c-a-1"), {}, 5, T1, invalid="GPU=1.5 is not whole"
    )
    assert status["phase"] == "Running"
    valid = condition(status, "Valid")
    assert (valid["status"], valid["reason"], valid["message"]) == (
        "False",
        "KeptLastValidSpec",
        "GPU=1.5 is not whole",
    )


def test_with_condition_replaces_the_condition_of_its_type() -> None:
    status = {"phase": "Running", "conditions": [{"type": "A", "status": "True"}]}
    new = {"type": "A", "status": "False"}
    assert with_condition(status, new)["conditions"] == [new]
    other = {"type": "B", "status": "True"}
    assert with_condition(status, other)["conditions"] == [status["conditions"][0], other]


def test_a_cluster_with_no_workers_wanted_runs_once_the_scheduler_answers() -> None:
    spec = cluster(a=0)
    assert compute_status(spec, [], info(), {}, 1, T0)["phase"] == "Running"
    assert compute_status(spec, [], None, {}, 1, T0)["phase"] == "Pending"


@pytest.mark.parametrize(
    ("reachable", "connected", "stuck", "reason", "fragments"),
    [
        (False, 0, False, "SchedulerUnreachable", ["not answering"]),
        (True, 2, False, "AllWorkersConnected", ["2 workers connected"]),
        (True, 1, False, "WorkersMissing", ["1 of 2 workers connected"]),
        (
            True,
            1,
            True,
            "Unschedulable",
            ["1 of 2 workers connected", "cannot be placed", "group a", NO_GPU],
        ),
    ],
)
def test_ready_condition_says_why(
    reachable: bool, connected: int, stuck: bool, reason: str, fragments: list[str]
) -> None:
    spec = cluster(a=2)
    pods = [pod("a", 0, ready=True), pod("a", 1, stuck=NO_GPU if stuck else None)]
    seen = info(*[f"c-a-{i}" for i in range(connected)]) if reachable else None
    ready = condition(compute_status(spec, pods, seen, {}, 1, T0), "Ready")
    assert ready["reason"] == reason
    for fragment in fragments:
        assert fragment in ready["message"]


# --------------------------------------------------------------------------- per group


def test_group_status_counts_pods_readiness_and_connections() -> None:
    spec = cluster(a=3)
    pods = [pod("a", 0, ready=True), pod("a", 1, ready=True), pod("a", 2)]
    status = compute_status(spec, pods, info("c-a-0"), {}, 1, T0)
    assert status["workerGroups"] == [
        {
            "name": "a",
            "desiredReplicas": 3,
            "currentReplicas": 3,
            "updatedReplicas": 3,
            "readyReplicas": 2,
            "connectedWorkers": 1,
            "resources": {"GPU": 1.0, "process": 1.0},
            "usedResources": {},
        }
    ]


def test_terminating_pods_and_their_workers_are_not_counted() -> None:
    spec = cluster(a=1)
    pods = [pod("a", 0, ready=True, deleting=True), pod("a", 1)]
    status = compute_status(spec, pods, info("c-a-0"), {}, 1, T0)
    group = status["workerGroups"][0]
    assert (group["currentReplicas"], group["readyReplicas"], group["connectedWorkers"]) == (
        1,
        0,
        0,
    )
    assert status["workers"] == "0/1"


def test_workers_are_matched_to_groups_by_pod_name() -> None:
    spec = cluster(a=1, b=2)
    pods = [pod("a", 0), pod("b", 0), pod("b", 1)]
    seen = info("c-b-0", "c-b-1", "c-a-9", "someone-else")
    groups = {g["name"]: g for g in compute_status(spec, pods, seen, {}, 1, T0)["workerGroups"]}
    assert groups["a"]["connectedWorkers"] == 0
    assert groups["b"]["connectedWorkers"] == 2


def test_used_resources_sum_over_the_groups_connected_workers() -> None:
    spec = cluster(a=3, b=1)
    pods = [pod("a", i) for i in range(3)] + [pod("b", 0)]
    seen = info(
        ("c-a-0", {"GPU": 1, "process": 1}),
        ("c-a-1", {"GPU": 1}),
        ("c-a-2", {}),
        ("c-b-0", {"process": 1}),
        ("stranger", {"GPU": 5}),
    )
    groups = {g["name"]: g for g in compute_status(spec, pods, seen, {}, 1, T0)["workerGroups"]}
    assert groups["a"]["usedResources"] == {"GPU": 2, "process": 1}
    assert groups["b"]["usedResources"] == {"process": 1}


def test_groups_keep_spec_order_and_resources_are_the_advertised_amounts() -> None:
    spec = parse(
        "c",
        "ns",
        {
            "workerGroups": [
                {"name": "z", "resources": {"MEMORY": 100e9}},
                {
                    "name": "a",
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                            ]
                        }
                    },
                },
            ]
        },
    )
    groups = compute_status(spec, [], None, {}, 1, T0)["workerGroups"]
    assert [g["name"] for g in groups] == ["z", "a"]
    assert groups[0]["resources"] == {"MEMORY": 100e9}
    assert groups[1]["resources"] == {"GPU": 1.0}


def test_surplus_connected_workers_do_not_count_beyond_replicas() -> None:
    spec = cluster(a=1, b=1)
    pods = [pod("a", 0), pod("a", 1), pod("b", 0)]
    status = compute_status(spec, pods, info("c-a-0", "c-a-1"), {}, 1, T0)
    assert status["workers"] == "1/2"
    assert status["phase"] == "Pending"
    assert status["workerGroups"][0]["connectedWorkers"] == 2


def test_unschedulable_messages_are_listed_per_group_once_each() -> None:
    spec = cluster(a=3, b=1)
    other = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity."
    pods = [
        pod("a", 0, stuck=NO_GPU),
        pod("a", 1, stuck=NO_GPU),
        pod("a", 2, stuck=other),
        pod("b", 0, ready=True),
    ]
    status = compute_status(spec, pods, info("c-b-0"), {}, 1, T0)
    groups = {g["name"]: g for g in status["workerGroups"]}
    assert groups["a"]["unschedulable"] == sorted([NO_GPU, other])
    assert "unschedulable" not in groups["b"]
    ready = condition(status, "Ready")
    assert ready["reason"] == "Unschedulable"
    assert f"group a: {'; '.join(sorted([NO_GPU, other]))}" in ready["message"]
    assert "group b" not in ready["message"]


def test_terminating_unschedulable_pods_are_not_reported() -> None:
    spec = cluster(a=1)
    status = compute_status(spec, [pod("a", 0, stuck=NO_GPU, deleting=True)], info(), {}, 1, T0)
    assert "unschedulable" not in status["workerGroups"][0]
    assert condition(status, "Ready")["reason"] == "WorkersMissing"


# --------------------------------------------------------------------------- cluster-wide


def test_status_names_the_scheduler_address_and_observed_generation() -> None:
    status = compute_status(cluster(a=1), [], None, {}, 7, T0)
    assert status["schedulerAddress"] == "tcp://c-scheduler.ns.svc:8786"
    assert status["observedGeneration"] == 7


@pytest.mark.parametrize(
    ("no_worker", "unmet"),
    [
        ([], []),
        (
            [{"resources": {"GPU": 8}, "tasks": 3, "why": "no worker has GPU=8"}],
            [{"resources": {"GPU": 8}, "tasks": 3, "why": "no worker has GPU=8"}],
        ),
        (
            [{"resources": {"license": 1}, "tasks": 1}],
            [{"resources": {"license": 1}, "tasks": 1, "why": None}],
        ),
        (
            [
                {"resources": {"GPU": 8}, "tasks": 2, "why": "a"},
                {"resources": {"MEMORY": 1e12}, "tasks": 5, "why": "b"},
            ],
            [
                {"resources": {"GPU": 8}, "tasks": 2, "why": "a"},
                {"resources": {"MEMORY": 1e12}, "tasks": 5, "why": "b"},
            ],
        ),
    ],
)
def test_unmet_demand_comes_from_the_schedulers_no_worker_list(
    no_worker: list[dict[str, Any]], unmet: list[dict[str, Any]]
) -> None:
    status = compute_status(cluster(a=0), [], info(no_worker=no_worker), {}, 1, T0)
    assert status["unmetDemand"] == unmet


def test_unmet_demand_is_empty_when_the_scheduler_is_unreachable() -> None:
    assert compute_status(cluster(a=1), [], None, {}, 1, T0)["unmetDemand"] == []


def test_unmet_demand_reads_the_real_scheduler_info_shape() -> None:
    from apportion.scheduler.state import SchedulerState

    real = SchedulerState().info()
    assert compute_status(cluster(a=0), [], real, {}, 1, T0)["unmetDemand"] == []


# --------------------------------------------------------------------------- transitions


def test_condition_transition_time_is_kept_while_the_status_holds() -> None:
    spec = cluster(a=1)
    first = compute_status(spec, [pod("a", 0)], info(), {}, 1, T0)
    # Same status (False) but a new reason: the time stays.
    second = compute_status(spec, [pod("a", 0, stuck=NO_GPU)], info(), first, 1, T1)
    assert condition(second, "Ready")["lastTransitionTime"] == T0
    assert condition(second, "Ready")["reason"] == "Unschedulable"
    assert condition(second, "Valid")["lastTransitionTime"] == T0


def test_condition_transition_time_moves_when_the_status_changes() -> None:
    spec = cluster(a=1)
    first = compute_status(spec, [pod("a", 0)], info(), {}, 1, T0)
    second = compute_status(spec, [pod("a", 0, ready=True)], info("c-a-0"), first, 1, T1)
    assert condition(second, "Ready") == {
        "type": "Ready",
        "status": "True",
        "reason": "AllWorkersConnected",
        "message": "1 workers connected",
        "lastTransitionTime": T1,
    }
    assert condition(second, "Valid")["lastTransitionTime"] == T0


def test_a_condition_without_a_previous_time_gets_now() -> None:
    previous = {"conditions": [{"type": "Ready", "status": "False"}]}
    status = compute_status(cluster(a=1), [], None, previous, 1, T1)
    assert condition(status, "Ready")["lastTransitionTime"] == T1


def test_compute_status_does_not_mutate_previous() -> None:
    spec = cluster(a=1)
    previous = compute_status(spec, [], None, {}, 1, T0)
    snapshot = repr(previous)
    compute_status(spec, [pod("a", 0, ready=True)], info("c-a-0"), previous, 2, T1)
    assert repr(previous) == snapshot


# --------------------------------------------------------------------------- invalid


def test_invalid_status_names_the_problem_and_is_not_ready() -> None:
    status = invalid_status("group 'g' is wrong", {}, 4, T0)
    assert status["phase"] == "Invalid"
    assert status["observedGeneration"] == 4
    valid, ready = condition(status, "Valid"), condition(status, "Ready")
    assert (valid["status"], valid["reason"], valid["message"]) == (
        "False",
        "InvalidSpec",
        "group 'g' is wrong",
    )
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert valid["lastTransitionTime"] == ready["lastTransitionTime"] == T0


def test_becoming_invalid_moves_valid_and_ready_times_as_their_statuses_change() -> None:
    spec = cluster(a=1)
    running = compute_status(spec, [pod("a", 0, ready=True)], info("c-a-0"), {}, 1, T0)
    invalid = invalid_status("bad", running, 2, T1)
    assert condition(invalid, "Valid")["lastTransitionTime"] == T1
    assert condition(invalid, "Ready")["lastTransitionTime"] == T1


def test_staying_invalid_keeps_the_transition_time() -> None:
    first = invalid_status("bad", {}, 2, T0)
    again = invalid_status("still bad", first, 3, T1)
    assert condition(again, "Valid")["lastTransitionTime"] == T0
    assert condition(again, "Valid")["message"] == "still bad"


def test_fixing_an_invalid_spec_makes_it_valid_again_and_pending() -> None:
    spec = cluster(a=1)
    invalid = invalid_status("bad", {}, 2, T0)
    fixed = compute_status(spec, [], None, invalid, 3, T1)
    assert fixed["phase"] == "Pending"
    assert condition(fixed, "Valid")["status"] == "True"
    assert condition(fixed, "Valid")["lastTransitionTime"] == T1
    assert condition(fixed, "Ready")["lastTransitionTime"] == T0


def test_a_group_with_pods_from_an_old_spec_is_not_yet_running() -> None:
    spec = cluster(g=1)
    status = compute_status(
        spec, [pod("g", 0, ready=True, outdated=True)], info("c-g-0"), {}, 1, T0
    )
    (group,) = status["workerGroups"]
    assert (group["currentReplicas"], group["updatedReplicas"]) == (1, 0)
    assert status["phase"] == "Pending"
    fresh = compute_status(spec, [pod("g", 1, ready=True)], info("c-g-1"), {}, 1, T0)
    assert fresh["phase"] == "Running" and fresh["workerGroups"][0]["updatedReplicas"] == 1


# --------------------------------------------------------------------------- autoscaling


def autoscaled(targets: dict[str, int], **bounds: tuple[int, int]) -> ClusterSpec:
    """Groups named by ``bounds`` (min, max; equal: fixed), each sized to its target the
    way the operator does before computing the status."""
    groups = []
    for name, (low, high) in bounds.items():
        sizing = (
            {"replicas": low}
            if low == high
            else {"minReplicas": low, "maxReplicas": high, "idleTimeoutSeconds": 90}
        )
        groups.append({"name": name, "resources": {"GPU": 1, "process": 1}, **sizing})
    spec = parse("c", "ns", {"workerGroups": groups})
    return dataclasses.replace(
        spec,
        groups=[
            dataclasses.replace(g, replicas=targets.get(g.name, g.replicas)) for g in spec.groups
        ],
    )


def scaling(
    before: dict[str, int],
    reasons: dict[str, str] | None = None,
    unmet: list[dict[str, Any]] | None = None,
) -> Scaling:
    decision = ScaleDecision(reasons=dict(reasons or {}))
    return Scaling(decision, before, list(unmet or []))


def by_group(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in status["workerGroups"]}


def test_an_autoscaled_group_reports_its_bounds_and_target_a_fixed_one_does_not() -> None:
    spec = autoscaled({"auto": 2}, auto=(0, 4), fixed=(1, 1))
    status = compute_status(spec, [], info(), {}, 1, T0, scaling=scaling({"auto": 2}))
    groups = by_group(status)
    assert groups["auto"]["desiredReplicas"] == 2
    assert (
        groups["auto"]["minReplicas"],
        groups["auto"]["maxReplicas"],
        groups["auto"]["idleTimeoutSeconds"],
    ) == (0, 4, 90.0)
    assert "lastScale" not in groups["auto"]  # nothing changed
    assert groups["fixed"]["desiredReplicas"] == 1
    assert not {"minReplicas", "maxReplicas", "idleTimeoutSeconds", "lastScale"} & set(
        groups["fixed"]
    )
    assert "lastScalingDecision" not in status


def test_a_change_of_target_is_recorded_with_its_reason() -> None:
    spec = autoscaled({"auto": 3}, auto=(0, 4))
    why = "5 waiting task(s) fit auto (GPU=1, process=1 per pod)"
    status = compute_status(
        spec, [], info(), {}, 1, T1, scaling=scaling({"auto": 0}, {"auto": why})
    )
    last = {"time": T1, "from": 0, "to": 3, "reason": why}
    assert by_group(status)["auto"]["lastScale"] == last
    assert status["lastScalingDecision"] == {"group": "auto", **last}
    assert status["workers"] == "0/3"


def test_the_last_scale_is_kept_until_the_next_change() -> None:
    spec = autoscaled({"auto": 3}, auto=(0, 4))
    first = compute_status(
        spec, [], info(), {}, 1, T0, scaling=scaling({"auto": 0}, {"auto": "up"})
    )
    # Same target, no reason: kept as it was.
    kept = compute_status(spec, [], info(), first, 1, T1, scaling=scaling({"auto": 3}))
    assert by_group(kept)["auto"]["lastScale"] == {"time": T0, "from": 0, "to": 3, "reason": "up"}
    assert kept["lastScalingDecision"]["time"] == T0
    # Scheduler unreachable: no decision this round, the last one stays.
    unreachable = compute_status(spec, [], None, kept, 1, T1)
    assert by_group(unreachable)["auto"]["lastScale"]["time"] == T0
    # A new change replaces it.
    down = autoscaled({"auto": 1}, auto=(0, 4))
    later = "2 idled"
    changed = compute_status(
        down, [], info(), kept, 1, T1, scaling=scaling({"auto": 3}, {"auto": later})
    )
    assert by_group(changed)["auto"]["lastScale"] == {
        "time": T1,
        "from": 3,
        "to": 1,
        "reason": later,
    }


def test_a_reason_without_a_change_of_target_is_not_recorded() -> None:
    # E.g. the scheduler kept every worker the planner chose to retire: the target stays.
    spec = autoscaled({"auto": 2}, auto=(0, 4))
    status = compute_status(
        spec, [], info(), {}, 1, T0, scaling=scaling({"auto": 2}, {"auto": "idled"})
    )
    assert "lastScale" not in by_group(status)["auto"]
    assert "lastScalingDecision" not in status


def test_the_cluster_reports_the_most_recent_decision_of_any_group() -> None:
    spec = autoscaled({"a": 2, "b": 1}, a=(0, 4), b=(0, 4))
    previous = {
        "workerGroups": [
            {"name": "a", "lastScale": {"time": T0, "from": 0, "to": 2, "reason": "old"}},
            {"name": "b", "lastScale": {"time": T0, "from": 0, "to": 3, "reason": "older"}},
        ]
    }
    status = compute_status(
        spec, [], info(), previous, 1, T1, scaling=scaling({"a": 2, "b": 3}, {"b": "idled"})
    )
    assert status["lastScalingDecision"] == {
        "group": "b",
        "time": T1,
        "from": 3,
        "to": 1,
        "reason": "idled",
    }
    assert by_group(status)["a"]["lastScale"]["reason"] == "old"


def test_the_last_scaling_decision_outlives_a_group_made_fixed() -> None:
    last = {"group": "a", "time": T0, "from": 0, "to": 2, "reason": "up"}
    spec = autoscaled({}, a=(2, 2))
    status = compute_status(spec, [], info(), {"lastScalingDecision": last}, 1, T1)
    assert status["lastScalingDecision"] == last


def test_unmet_demand_comes_from_the_planner_when_it_ran() -> None:
    spec = autoscaled({"auto": 1}, auto=(0, 4))
    waiting = [{"resources": {"GPU": 8}, "tasks": 2, "why": "scheduler's words"}]
    unmet = [{"resources": {"GPU": 8}, "tasks": 2, "why": "no worker group can ever run it"}]
    status = compute_status(
        spec, [], info(no_worker=waiting), {}, 1, T0, scaling=scaling({"auto": 1}, unmet=unmet)
    )
    assert status["unmetDemand"] == unmet
    # Demand a worker is being started for is not unmet, whatever the scheduler says.
    status = compute_status(
        spec, [], info(no_worker=waiting), {}, 1, T0, scaling=scaling({"auto": 1})
    )
    assert status["unmetDemand"] == []


# Each row: previous phase, auto's target, auto's pods (index, connected, stuck), fixed
# group connected, expected phase.
SCALING_PHASES = [
    ("Running", 3, [(0, True, False), (1, False, False), (2, False, False)], True, "Scaling"),
    ("Running", 3, [(0, True, False)], True, "Scaling"),  # pods not created yet
    ("Degraded", 2, [(0, True, False), (1, False, False)], True, "Scaling"),
    ("Scaling", 2, [(0, True, False), (1, False, False)], True, "Scaling"),
    ("Scaling", 2, [(0, True, False), (1, True, False)], True, "Running"),
    ("Running", 1, [(0, True, False), (1, True, False)], True, "Scaling"),  # scaling down
    ("Running", 0, [(0, True, False)], True, "Scaling"),
    # Short of a fixed group's worker too: something is wrong.
    ("Running", 2, [(0, True, False), (1, False, False)], False, "Degraded"),
    ("Running", 2, [(0, True, False), (1, True, False)], False, "Degraded"),
    # Pods Kubernetes cannot place: what fits works (the Unschedulable condition says the
    # rest); nothing was lost.
    ("Running", 2, [(0, True, False), (1, False, True)], True, "Running"),
    # Never ran yet: still pending.
    (None, 2, [(0, True, False), (1, False, False)], True, "Pending"),
    ("Pending", 2, [(0, True, False), (1, False, False)], True, "Pending"),
]


@pytest.mark.parametrize(("previous", "target", "auto_pods", "fixed_up", "phase"), SCALING_PHASES)
def test_phase_scaling_when_only_autoscaled_groups_are_short_of_placeable_workers(
    previous: str | None,
    target: int,
    auto_pods: list[tuple[int, bool, bool]],
    fixed_up: bool,
    phase: str,
) -> None:
    spec = autoscaled({"auto": target}, auto=(0, 4), fixed=(1, 1))
    pods = [pod("fixed", 0, ready=fixed_up)]
    pods += [
        pod("auto", i, ready=up, stuck=NO_GPU if stuck else None) for i, up, stuck in auto_pods
    ]
    names = [f"c-auto-{i}" for i, up, _ in auto_pods if up] + (["c-fixed-0"] if fixed_up else [])
    prior = {"phase": previous} if previous else {}
    status = compute_status(spec, pods, info(*names), prior, 1, T1, scaling=scaling({"auto": 1}))
    assert status["phase"] == phase
    ready = condition(status, "Ready")
    unplaced = any(stuck for _, _, stuck in auto_pods)
    assert ready["status"] == ("True" if phase == "Running" and not unplaced else "False")
    assert condition(status, "Unschedulable")["status"] == str(unplaced)


def test_an_unreachable_scheduler_is_degraded_not_scaling() -> None:
    spec = autoscaled({"auto": 2}, auto=(0, 4))
    pods = [pod("auto", 0, ready=True), pod("auto", 1)]
    status = compute_status(spec, pods, None, {"phase": "Running"}, 1, T1)
    assert status["phase"] == "Degraded"


# --------------------------------------------------------------------------- unplaceable pods


def test_workers_that_fit_work_and_the_rest_is_an_unschedulable_condition() -> None:
    """Ten GPU workers wanted, room for four: Running 4/10, not Pending, and it says why."""
    spec = cluster(gpu=10)
    pods = [pod("gpu", i, ready=i < 4, stuck=None if i < 4 else NO_GPU) for i in range(10)]
    for previous in ({}, {"phase": "Pending"}, {"phase": "Running"}, {"phase": "Degraded"}):
        status = compute_status(
            spec, pods, info(*[f"c-gpu-{i}" for i in range(4)]), previous, 1, T1
        )
        assert status["phase"] == "Running"
        assert status["workers"] == "4/10"
        unplaced = condition(status, "Unschedulable")
        assert (unplaced["status"], unplaced["reason"]) == ("True", "PodsUnschedulable")
        assert unplaced["message"] == f"group gpu: 6 of 10 pods cannot be placed (4 are): {NO_GPU}"
        assert status["workerGroups"][0]["unschedulableReplicas"] == 6
        assert condition(status, "Ready")["status"] == "False"  # not all it asked for


def test_nothing_placed_and_nothing_connected_is_still_pending() -> None:
    spec = cluster(gpu=2)
    pods = [pod("gpu", i, stuck=NO_GPU) for i in range(2)]
    status = compute_status(spec, pods, info(), {}, 1, T1)
    assert status["phase"] == "Pending"
    assert condition(status, "Unschedulable")["status"] == "True"


def test_a_lost_worker_beside_unplaceable_pods_is_degraded() -> None:
    """Unplaceable pods explain only as many missing workers as there are of them."""
    spec = cluster(gpu=4)
    pods = [pod("gpu", i, ready=i < 2, stuck=NO_GPU if i == 3 else None) for i in range(4)]
    status = compute_status(spec, pods, info("c-gpu-0", "c-gpu-1"), {"phase": "Running"}, 1, T1)
    assert status["phase"] == "Degraded"


def test_every_pod_placed_is_a_false_unschedulable_condition() -> None:
    spec = cluster(a=1)
    status = compute_status(spec, [pod("a", 0, ready=True)], info("c-a-0"), {}, 1, T1)
    placed = condition(status, "Unschedulable")
    assert (placed["status"], placed["reason"]) == ("False", "AllPlaced")
    assert "unschedulableReplicas" not in status["workerGroups"][0]


def test_an_autoscaled_group_limited_by_the_nodes_says_so_until_it_grows() -> None:
    spec = autoscaled({"auto": 3}, auto=(0, 10))
    pods = [pod("auto", i, ready=i < 2, stuck=NO_GPU if i == 2 else None) for i in range(3)]
    limited = scaling({"auto": 10})
    limited.decision.limited["auto"] = 2
    limited.decision.reasons["auto"] = "the nodes place 2 pod(s) of auto now"
    first = compute_status(spec, pods, info("c-auto-0", "c-auto-1"), {}, 1, T1, scaling=limited)
    said = {"placedReplicas": 2, "reason": "the nodes place 2 pod(s) of auto now"}
    assert first["workerGroups"][0]["limitedByNodes"] == said
    again = compute_status(spec, pods, info("c-auto-0", "c-auto-1"), first, 1, T1)
    assert again["workerGroups"][0]["limitedByNodes"] == said
    grown = autoscaled({"auto": 5}, auto=(0, 10))
    later = compute_status(grown, pods, info("c-auto-0", "c-auto-1"), again, 1, T1)
    assert "limitedByNodes" not in later["workerGroups"][0]


# --------------------------------------------------------------------------- resources, suspend


def test_resources_total_what_connected_workers_advertise_and_used_what_tasks_hold() -> None:
    spec = cluster(gpu=2)
    pods = [pod("gpu", 0, ready=True), pod("gpu", 1, ready=True)]
    status = compute_status(spec, pods, info(("c-gpu-0", {"GPU": 1}), "c-gpu-1"), {}, 1, T0)
    assert status["resources"] == {
        "total": {"GPU": 2, "process": 2},
        "used": {"GPU": 1},
    }
    assert status["resourcesSummary"] == "GPU 1/2, process 0/2"


def test_resources_of_a_cluster_without_workers_show_what_it_declares_at_zero() -> None:
    status = compute_status(cluster(gpu=1), [], None, {}, 1, T0)
    assert status["resources"] == {"total": {"GPU": 0, "process": 0}, "used": {}}
    assert status["resourcesSummary"] == "GPU 0/0, process 0/0"


def test_a_suspended_cluster_runs_nothing_and_says_why() -> None:
    status = suspended_status(cluster(gpu=2), {"image": "apportion:old"}, 3, T0)
    assert status["phase"] == "Suspended"
    assert status["workers"] == "0/0"
    assert status["image"] == "apportion:old"
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Suspended")
