"""What a pod's status says, read the same way by the status and the autoscaler."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """Why Kubernetes cannot place a pod (e.g. '0/3 nodes ... Insufficient nvidia.com/gpu')."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message") or "unschedulable")
    return None
