"""Keeping each worker group's ResourceWorkerGroup and its ResourceCluster in step: a pure
decision.

The cluster is the source of truth; its ResourceWorkerGroups are handles for ``kubectl
scale``, HPA and KEDA. Each remembers the cluster generation its replicas were taken
from (an annotation). When the cluster's spec moved on since then, the cluster wins and
the handle is rewritten; otherwise a handle whose replicas differ was scaled, and its
replicas are written into the cluster's group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apportion.operator.manifests import SYNCED_ANNOTATION
from apportion.operator.spec import ClusterSpec


@dataclass
class GroupSync:
    write: list[str] = field(default_factory=list)  # groups whose handle is (re)written
    scaled: dict[str, int] = field(default_factory=dict)  # group -> replicas from its handle
    remove: list[str] = field(default_factory=list)  # handles of groups that are gone


def sync(spec: ClusterSpec, generation: int, handles: Mapping[str, Mapping[str, Any]]) -> GroupSync:
    """``handles``: the cluster's ResourceWorkerGroups by group name."""
    out = GroupSync()
    for group in spec.groups:
        handle = handles.get(group.name)
        if handle is None:
            out.write.append(group.name)
            continue
        synced = (handle["metadata"].get("annotations") or {}).get(SYNCED_ANNOTATION)
        replicas = (handle.get("spec") or {}).get("replicas")
        if synced != str(generation):
            out.write.append(group.name)
        elif replicas is not None and replicas != group.replicas:
            # Scaled through the handle (an autoscaled group's shows its minReplicas): the
            # group gets that fixed size.
            out.scaled[group.name] = int(replicas)
    names = {g.name for g in spec.groups}
    out.remove = sorted(name for name in handles if name not in names)
    return out
