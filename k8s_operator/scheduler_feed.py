"""Tell a cluster's scheduler what the operator knows of it (phase, worker groups,
replicas, the autoscaler's last decision), for the scheduler's dashboard: the scheduler
pod has no access to the Kubernetes API itself."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from apportion.operator.scheduler_http import SchedulerHttp

logger = logging.getLogger("apportion.operator")

# The parts of a ResourceCluster's status the dashboard shows.
FIELDS = ("phase", "workers", "workerGroups", "lastScalingDecision", "unmetDemand")


def cluster_summary(name: str, namespace: str, status: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, **{k: status[k] for k in FIELDS if k in status}}


def send_status(scheduler: SchedulerHttp, summary: Mapping[str, Any], timeout: float = 2.0) -> bool:
    """POST the summary to the scheduler's ``/api/v1/cluster-status``; False (logged at
    debug level) when the scheduler cannot take it: the dashboard is a courtesy, never a
    reason for a reconcile to fail."""
    try:
        scheduler.call("/api/v1/cluster-status", dict(summary), timeout=timeout)
        return True
    except (OSError, ValueError) as exc:
        logger.debug("scheduler at %s did not take the cluster status: %s", scheduler.base, exc)
        return False
