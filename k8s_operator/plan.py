"""What to change about worker pods to match the spec: a pure plan.

Pods of removed groups and pods built from an outdated group spec (their
``spec-hash`` annotation differs) are deleted; missing pods are created at the lowest
free indices; surplus pods are removed, those that never connected first, the rest
chosen by the scheduler among the group's connected workers (idle ones first).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apportion.operator.manifests import HASH_ANNOTATION, LABEL_GROUP, group_hash, worker_pod_name
from apportion.operator.spec import ClusterSpec


@dataclass
class GroupScaleDown:
    group: str
    # Connected workers of the group the scheduler chooses among, and how many to remove.
    candidates: list[str]
    count: int


@dataclass
class Plan:
    create: list[tuple[str, int]] = field(default_factory=list)  # (group, index)
    delete: list[str] = field(default_factory=list)
    scale_down: list[GroupScaleDown] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.create or self.delete or self.scale_down)


def _name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def plan(
    spec: ClusterSpec,
    pods: list[Mapping[str, Any]],
    connected: set[str],
    taken: set[str] | None = None,
) -> Plan:
    """``pods``: this cluster's worker pods; ``connected``: worker names the scheduler knows;
    ``taken``: every pod name in the namespace (another cluster's pod may hold a name such
    as ``c-y-x-0`` that cluster ``c`` group ``y-x`` would otherwise pick)."""
    result = Plan()
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    taken = {_name(p) for p in pods} | set(taken or ())  # terminating pods hold names too
    for pod in live:
        group = (pod["metadata"].get("labels") or {}).get(LABEL_GROUP)
        if spec.group(group or "") is None:
            result.delete.append(_name(pod))
    for group in spec.groups:
        wanted_hash = group_hash(spec, group)
        mine = [
            p for p in live if (p["metadata"].get("labels") or {}).get(LABEL_GROUP) == group.name
        ]
        current: list[Mapping[str, Any]] = []
        outdated: list[Mapping[str, Any]] = []
        for pod in mine:
            annotation = (pod["metadata"].get("annotations") or {}).get(HASH_ANNOTATION)
            (current if annotation == wanted_hash else outdated).append(pod)
        result.delete += [_name(p) for p in outdated]
        missing = group.replicas - len(current)
        index = 0
        while missing > 0:
            name = worker_pod_name(spec, group, index)
            if name not in taken:
                result.create.append((group.name, index))
                taken.add(name)
                missing -= 1
            index += 1
        surplus = len(current) - group.replicas
        if surplus > 0:
            # Pods that never connected go first: removing them loses nothing.
            unconnected = sorted(
                (_name(p) for p in current if _name(p) not in connected), key=_index, reverse=True
            )
            first = unconnected[:surplus]
            result.delete += first
            left = surplus - len(first)
            if left:
                candidates = sorted(_name(p) for p in current if _name(p) in connected)
                result.scale_down.append(GroupScaleDown(group.name, candidates, left))
    return result


def _index(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1
