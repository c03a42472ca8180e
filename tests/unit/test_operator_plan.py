"""apportion.operator.plan: what to create, delete and scale down, as a pure function.

Pods are plain dicts shaped like the API server's (metadata name, labels, annotations with
the spec hash, optional deletionTimestamp).
"""

from __future__ import annotations

from typing import Any

import pytest
from apportion.operator.manifests import (
    HASH_ANNOTATION,
    LABEL_CLUSTER,
    LABEL_GROUP,
    group_hash,
    worker_pod,
)
from apportion.operator.plan import GroupScaleDown, Plan, plan
from apportion.operator.spec import ClusterSpec, parse

OWNER = {"metadata": {"name": "c", "uid": "u"}}


def cluster(**replicas: int) -> ClusterSpec:
    """A cluster ``c`` with one group per keyword: ``cluster(a=2, b=0)``."""
    groups = [
        {"name": name, "replicas": n, "resources": {"GPU": 1}} for name, n in replicas.items()
    ]
    return parse("c", "ns", {"workerGroups": groups})


def pod(
    spec: ClusterSpec,
    group: str,
    index: int,
    *,
    outdated: bool = False,
    deleting: bool = False,
    hash_: str | None = None,
) -> dict[str, Any]:
    found = spec.group(group)
    wanted = group_hash(spec, found) if found is not None else "0" * 16
    meta: dict[str, Any] = {
        "name": f"c-{group}-{index}",
        "labels": {LABEL_CLUSTER: "c", LABEL_GROUP: group},
        "annotations": {HASH_ANNOTATION: "stale" if outdated else (hash_ or wanted)},
    }
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"metadata": meta}


def names(*indices: int, group: str = "a") -> list[str]:
    return [f"c-{group}-{i}" for i in indices]


# Each row: replicas of group a; existing pods as (index, outdated, deleting, connected);
# expected create indices, deletes (indices), scale-down (candidate indices, count) or None.
ROWS = [
    ("nothing-yet", 2, [], [0, 1], [], None),
    ("steady", 2, [(0, 0, 0, 1), (1, 0, 0, 1)], [], [], None),
    ("steady-unconnected", 2, [(0, 0, 0, 0), (1, 0, 0, 0)], [], [], None),
    ("scale-up", 3, [(0, 0, 0, 1)], [1, 2], [], None),
    ("fills-gap", 3, [(0, 0, 0, 1), (2, 0, 0, 1)], [1], [], None),
    (
        "surplus-with-gaps",
        2,
        [(1, 0, 0, 1), (3, 0, 0, 1), (4, 0, 0, 1)],
        [],
        [],
        ([1, 3, 4], 1),
    ),
    ("lowest-free", 4, [(1, 0, 0, 1), (3, 0, 0, 1)], [0, 2], [], None),
    ("skips-terminating-name", 1, [(0, 0, 1, 1)], [1], [], None),
    ("terminating-not-counted", 2, [(0, 0, 0, 1), (1, 0, 1, 1)], [2], [], None),
    ("outdated-replaced", 2, [(0, 1, 0, 1), (1, 1, 0, 1)], [2, 3], [0, 1], None),
    ("outdated-one", 2, [(0, 0, 0, 1), (1, 1, 0, 1)], [2], [1], None),
    ("outdated-terminating-ignored", 1, [(0, 1, 1, 1)], [1], [], None),
    ("surplus-unconnected", 2, [(0, 0, 0, 1), (1, 0, 0, 1), (2, 0, 0, 0)], [], [2], None),
    (
        "surplus-highest-unconnected-first",
        2,
        [(0, 0, 0, 0), (1, 0, 0, 1), (2, 0, 0, 0), (3, 0, 0, 0)],
        [],
        [3, 2],
        None,
    ),
    (
        "surplus-connected-asks-scheduler",
        1,
        [(0, 0, 0, 1), (1, 0, 0, 1), (2, 0, 0, 1)],
        [],
        [],
        ([0, 1, 2], 2),
    ),
    ("surplus-mixed", 1, [(0, 0, 0, 1), (1, 0, 0, 1), (2, 0, 0, 0)], [], [2], ([0, 1], 1)),
    ("to-zero-unconnected", 0, [(0, 0, 0, 0), (1, 0, 0, 0)], [], [1, 0], None),
    ("to-zero-connected", 0, [(0, 0, 0, 1), (1, 0, 0, 1)], [], [], ([0, 1], 2)),
    ("zero-and-none", 0, [], [], [], None),
    ("outdated-plus-surplus", 1, [(0, 1, 0, 1), (1, 0, 0, 1), (2, 0, 0, 1)], [], [0], ([1, 2], 1)),
    ("terminating-surplus-ignored", 1, [(0, 0, 0, 1), (1, 0, 1, 1)], [], [], None),
]


@pytest.mark.parametrize(
    ("replicas", "existing", "create", "delete", "scale_down"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_plan_for_one_group(
    replicas: int,
    existing: list[tuple[int, int, int, int]],
    create: list[int],
    delete: list[int],
    scale_down: tuple[list[int], int] | None,
) -> None:
    spec = cluster(a=replicas)
    pods = [pod(spec, "a", i, outdated=bool(o), deleting=bool(d)) for i, o, d, _ in existing]
    connected = {f"c-a-{i}" for i, _, _, c in existing if c}
    result = plan(spec, pods, connected)
    assert result.create == [("a", i) for i in create]
    assert result.delete == names(*delete)
    expected = (
        [] if scale_down is None else [GroupScaleDown("a", names(*scale_down[0]), scale_down[1])]
    )
    assert result.scale_down == expected
    assert result.empty is (not create and not delete and scale_down is None)


def test_unconnected_surplus_is_ordered_by_numeric_index_not_by_name() -> None:
    spec = cluster(a=1)
    pods = [pod(spec, "a", i) for i in (0, 2, 9, 10)]
    result = plan(spec, pods, {"c-a-0"})
    assert result.delete == names(10, 9, 2)


def test_pods_of_removed_groups_are_deleted() -> None:
    spec = cluster(a=1)
    old = parse("c", "ns", {"workerGroups": [{"name": "gone", "replicas": 2}]})
    pods = [pod(spec, "a", 0), pod(old, "gone", 0), pod(old, "gone", 1)]
    result = plan(spec, pods, {"c-a-0", "c-gone-0", "c-gone-1"})
    assert result.delete == ["c-gone-0", "c-gone-1"]
    assert result.create == []
    assert result.scale_down == []


def test_pods_of_removed_groups_already_terminating_are_left_alone() -> None:
    spec = cluster(a=0)
    old = parse("c", "ns", {"workerGroups": [{"name": "gone"}]})
    assert plan(spec, [pod(old, "gone", 0, deleting=True)], set()).empty


def test_a_pod_without_a_group_label_is_deleted() -> None:
    spec = cluster(a=0)
    stray = {"metadata": {"name": "c-stray", "labels": {LABEL_CLUSTER: "c"}}}
    no_labels = {"metadata": {"name": "c-bare"}}
    assert plan(spec, [stray, no_labels], set()).delete == ["c-stray", "c-bare"]


def test_a_pod_without_a_hash_annotation_is_outdated() -> None:
    spec = cluster(a=1)
    bare = {"metadata": {"name": "c-a-0", "labels": {LABEL_GROUP: "a"}}}
    result = plan(spec, [bare], {"c-a-0"})
    assert result.delete == ["c-a-0"]
    assert result.create == [("a", 1)]


def test_a_changed_group_spec_outdates_its_pods_only() -> None:
    before = cluster(a=1, b=1)
    after = parse(
        "c",
        "ns",
        {
            "workerGroups": [
                {"name": "a", "replicas": 1, "resources": {"GPU": 2}},
                {"name": "b", "replicas": 1, "resources": {"GPU": 1}},
            ]
        },
    )
    pods = [pod(before, "a", 0), pod(before, "b", 0)]
    result = plan(after, pods, {"c-a-0", "c-b-0"})
    assert result.delete == ["c-a-0"]
    assert result.create == [("a", 1)]


def test_pods_built_by_worker_pod_are_current() -> None:
    spec = cluster(a=2, b=1)
    pods = [worker_pod(spec, g, i, OWNER) for g in spec.groups for i in range(g.replicas)]
    assert plan(spec, pods, set()).empty


def test_groups_are_planned_independently() -> None:
    spec = cluster(a=2, b=1, z=0)
    pods = [pod(spec, "b", 0), pod(spec, "b", 1), pod(spec, "b", 2), pod(spec, "z", 0)]
    result = plan(spec, pods, {"c-b-0", "c-b-1"})
    assert result.create == [("a", 0), ("a", 1)]
    assert result.delete == ["c-b-2", "c-z-0"]
    assert result.scale_down == [GroupScaleDown("b", ["c-b-0", "c-b-1"], 1)]


def test_scale_down_candidates_are_only_connected_workers_of_that_group() -> None:
    spec = cluster(a=1, b=1)
    pods = [pod(spec, g, i) for g in ("a", "b") for i in (0, 1, 2)]
    connected = {f"c-{g}-{i}" for g in ("a", "b") for i in (0, 1, 2)}
    result = plan(spec, pods, connected)
    assert result.scale_down == [
        GroupScaleDown("a", names(0, 1, 2), 2),
        GroupScaleDown("b", names(0, 1, 2, group="b"), 2),
    ]


def test_connected_names_of_other_clusters_do_not_matter() -> None:
    spec = cluster(a=1)
    assert plan(spec, [pod(spec, "a", 0)], {"elsewhere-a-0", "c-a-7"}).empty


def test_plan_does_not_mutate_its_inputs() -> None:
    spec = cluster(a=1)
    pods = [pod(spec, "a", 0, outdated=True), pod(spec, "a", 1, deleting=True)]
    snapshot = repr(pods)
    connected = {"c-a-0"}
    plan(spec, pods, connected)
    assert repr(pods) == snapshot
    assert connected == {"c-a-0"}


def test_an_empty_plan_is_empty() -> None:
    assert Plan().empty
    assert not Plan(create=[("a", 0)]).empty
    assert not Plan(delete=["x"]).empty
    assert not Plan(scale_down=[GroupScaleDown("a", ["x"], 1)]).empty


def test_following_a_plan_converges() -> None:
    """Applying the plan (creating, deleting) gives a state for which the plan is empty."""
    old = cluster(a=3, gone=1)
    spec = parse(
        "c",
        "ns",
        {"workerGroups": [{"name": "a", "replicas": 2, "resources": {"GPU": 2}}, {"name": "new"}]},
    )
    pods = [pod(old, "a", i) for i in range(3)] + [pod(old, "gone", 0)]
    result = plan(spec, pods, set())
    remaining = [p for p in pods if p["metadata"]["name"] not in result.delete]
    remaining += [worker_pod(spec, spec.group(g), i, OWNER) for g, i in result.create]  # type: ignore[arg-type]
    assert plan(spec, remaining, set()).empty
    assert sorted(p["metadata"]["name"] for p in remaining) == ["c-a-3", "c-a-4", "c-new-0"]
