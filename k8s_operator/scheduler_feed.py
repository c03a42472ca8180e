"""Tell a cluster's scheduler what the operator knows of it (phase, worker groups,
replicas, the autoscaler's last decision), for the scheduler's dashboard: the scheduler
pod has no access to the Kubernetes API itself."""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("apportion.operator")

# The parts of a ResourceCluster's status the dashboard shows.
FIELDS = ("phase", "workers", "workerGroups", "lastScalingDecision", "unmetDemand")


def cluster_summary(name: str, namespace: str, status: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, **{k: status[k] for k in FIELDS if k in status}}


def send_status(
    host: str, port: int, token: str | None, summary: Mapping[str, Any], timeout: float = 2.0
) -> bool:
    """POST the summary to the scheduler's ``/api/v1/cluster-status``; False (logged at
    debug level) when the scheduler cannot take it: the dashboard is a courtesy, never a
    reason for a reconcile to fail."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"http://{host}:{port}/api/v1/cluster-status",
        json.dumps(summary).encode(),
        headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return True
    except (OSError, ValueError) as exc:
        logger.debug("scheduler at %s:%s did not take the cluster status: %s", host, port, exc)
        return False
