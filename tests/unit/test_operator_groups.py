"""apportion.operator.groups: ResourceWorkerGroups and their cluster kept in step."""

from __future__ import annotations

from typing import Any

from apportion.operator.groups import sync
from apportion.operator.manifests import SYNCED_ANNOTATION, worker_group_object
from apportion.operator.spec import parse

OWNER = {"metadata": {"name": "c", "uid": "u-1"}}


def spec(**replicas: int) -> Any:
    groups = [{"name": g, "replicas": n} for g, n in replicas.items()]
    return parse("c", "ns", {"workerGroups": groups})


def handle(group: str, replicas: int, generation: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"c-{group}", "annotations": {SYNCED_ANNOTATION: str(generation)}},
        "spec": {"cluster": "c", "group": group, "replicas": replicas},
    }


def test_missing_handles_are_written() -> None:
    assert sync(spec(a=1, b=2), 1, {}).write == ["a", "b"]


def test_a_handle_in_step_needs_nothing() -> None:
    todo = sync(spec(a=2), 3, {"a": handle("a", 2, 3)})
    assert (todo.write, todo.scaled, todo.remove) == ([], {}, [])


def test_a_scaled_handle_resizes_the_cluster_group() -> None:
    assert sync(spec(a=2), 3, {"a": handle("a", 5, 3)}).scaled == {"a": 5}


def test_a_cluster_edited_since_wins_over_its_handle() -> None:
    todo = sync(spec(a=4), 4, {"a": handle("a", 2, 3)})
    assert (todo.write, todo.scaled) == (["a"], {})


def test_handles_of_removed_groups_go() -> None:
    assert sync(spec(a=1), 2, {"a": handle("a", 1, 2), "old": handle("old", 1, 1)}).remove == [
        "old"
    ]


def test_the_handle_carries_the_groups_replicas_and_the_generation() -> None:
    cluster = spec(gpu=3)
    made = worker_group_object(cluster, cluster.groups[0], OWNER, 7)
    assert made["kind"] == "ResourceWorkerGroup" and made["metadata"]["name"] == "c-gpu"
    assert made["spec"] == {"cluster": "c", "group": "gpu", "replicas": 3}
    assert made["metadata"]["annotations"] == {SYNCED_ANNOTATION: "7"}
    assert made["metadata"]["ownerReferences"][0]["uid"] == "u-1"
