"""apportion.operator.status: a ResourceCluster's status from observed pods and scheduler info."""

from __future__ import annotations

from typing import Any

import pytest
from apportion.operator.manifests import HASH_ANNOTATION, LABEL_CLUSTER, LABEL_GROUP, group_hash
from apportion.operator.spec import ClusterSpec, parse
from apportion.operator.status import compute_status, invalid_status, pod_ready, unschedulable

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
