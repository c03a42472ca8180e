"""A ResourceCluster's status, computed purely from what was observed.

Inputs: the parsed spec (or the reason it is invalid), the worker pods that exist, the
scheduler's ``/api/v1/info`` answer (None when unreachable) and the previous status
(for phase history and condition transition times).
"""

from __future__ import annotations

__all__ = [
    "compute_status",
    "condition",
    "invalid_status",
    "pod_ready",
    "resource_totals",
    "suspended_status",
    "unschedulable",
]

from collections.abc import Mapping, Sequence
from typing import Any

from apportion.operator.autoscale import Scaling
from apportion.operator.manifests import HASH_ANNOTATION, LABEL_GROUP, group_hash
from apportion.operator.pod_state import pod_ready, unschedulable
from apportion.operator.spec import ClusterSpec, GroupSpec

from apportion.resources import format_usage


def condition(
    previous: Mapping[str, Any], kind: str, ok: bool, reason: str, message: str, now: str
) -> dict[str, Any]:
    old: Mapping[str, Any] = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == kind), {}
    )
    status = "True" if ok else "False"
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
    }


def with_condition(status: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``status`` with ``new`` in place of its condition of the same type."""
    others = [c for c in status.get("conditions") or [] if c.get("type") != new["type"]]
    return {**status, "conditions": [*others, dict(new)]}


def _sum(amounts: list[Mapping[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for amount in amounts:
        for name, value in amount.items():
            total[name] = total.get(name, 0) + value
    return total


def invalid_status(
    problem: str, previous: Mapping[str, Any], generation: int | None, now: str
) -> dict[str, Any]:
    return {
        "phase": "Invalid",
        "observedGeneration": generation,
        "conditions": [
            condition(previous, "Valid", False, "InvalidSpec", problem, now),
            condition(previous, "Ready", False, "InvalidSpec", "fix the spec", now),
        ],
    }


def suspended_status(
    spec: ClusterSpec, previous: Mapping[str, Any], generation: int | None, now: str
) -> dict[str, Any]:
    """A suspended cluster: no pod runs, the spec is kept; setting suspend back resumes it."""
    why = "spec.suspend is true: every pod is removed until it is set back to false"
    return {
        "phase": "Suspended",
        "observedGeneration": generation,
        "schedulerAddress": spec.scheduler_address,
        "image": previous.get("image") or spec.image,
        "workers": "0/0",
        **resource_totals([]),
        "conditions": [
            condition(previous, "Valid", True, "SpecAccepted", "the spec is valid", now),
            condition(previous, "Ready", False, "Suspended", why, now),
        ],
    }


def resource_totals(groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the connected workers advertise in all and what tasks hold of it, per resource
    (``resources.total``/``resources.used``), and the two in one line for ``kubectl get``
    (``resourcesSummary``: ``"GPU 2/4, MEMORY 50e9/100e9"``)."""
    total = _sum(
        [{k: v * g["connectedWorkers"] for k, v in g["resources"].items()} for g in groups]
    )
    used = _sum([g["usedResources"] for g in groups])
    return {
        "resources": {"total": total, "used": used},
        "resourcesSummary": format_usage(used, total),
    }


def compute_status(
    spec: ClusterSpec,
    pods: list[Mapping[str, Any]],
    info: Mapping[str, Any] | None,
    previous: Mapping[str, Any],
    generation: int | None,
    now: str,
    failures: list[str] | None = None,
    scaling: Scaling | None = None,
    invalid: str | None = None,
) -> dict[str, Any]:
    """``failures``: what the API server refused this round (e.g. pods over a quota);
    ``scaling``: this round's autoscaling (None when the scheduler was not reachable);
    ``invalid``: why the current spec was refused (``spec`` is then the last valid one)."""
    workers = list((info or {}).get("workers", {}).values())
    by_name = {w["name"]: w for w in workers}
    groups: list[dict[str, Any]] = []
    desired, connected_total, all_settled = 0, 0, True
    only_scaling = True  # every group short of its target is autoscaled and can be placed
    only_unplaced = True  # every missing worker is one whose pod Kubernetes cannot place
    unplaced: list[str] = []  # per group: how many pods cannot be placed, and why
    for group in spec.groups:
        mine = [
            p
            for p in pods
            if (p["metadata"].get("labels") or {}).get(LABEL_GROUP) == group.name
            and not p["metadata"].get("deletionTimestamp")
        ]
        connected = [
            by_name[p["metadata"]["name"]] for p in mine if p["metadata"]["name"] in by_name
        ]
        # Pods built from the current spec: until all are, the group is still changing.
        wanted = group_hash(spec, group)
        updated = [
            p
            for p in mine
            if (p["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) == wanted
        ]
        updated_connected = sum(p["metadata"]["name"] in by_name for p in updated)
        groups.append(
            {
                "name": group.name,
                "desiredReplicas": group.replicas,
                "currentReplicas": len(mine),
                "updatedReplicas": len(updated),
                "readyReplicas": sum(pod_ready(p) for p in mine),
                "connectedWorkers": len(connected),
                "resources": group.advertised,
                "usedResources": _sum([w.get("used_resources", {}) for w in connected]),
            }
        )
        if group.autoscaled:
            groups[-1].update(_autoscaling_status(group, previous, scaling, now))
        reasons = [why for why in map(unschedulable, mine) if why]
        stuck = sorted(set(reasons))
        if stuck:
            groups[-1]["unschedulable"] = stuck
            groups[-1]["unschedulableReplicas"] = len(reasons)
            unplaced.append(
                f"group {group.name}: {len(reasons)} of {group.replicas} pods cannot be placed "
                f"({len(mine) - len(reasons)} are): {'; '.join(stuck)}"
            )
        desired += group.replicas
        settled = len(mine) == len(updated) == group.replicas
        connected_total += min(updated_connected, group.replicas)
        all_settled = all_settled and settled
        # Workers missing only because Kubernetes cannot place their pods: nothing was
        # lost, the cluster runs with what fits.
        missing = group.replicas - min(updated_connected, group.replicas)
        only_unplaced = only_unplaced and missing <= len(reasons)
        if not settled or updated_connected < group.replicas:
            # A size being changed on purpose (by the autoscaler, or by a new replicas
            # still being carried out) is Scaling; workers lost otherwise are Degraded.
            before: Mapping[str, Any] = next(
                (g for g in previous.get("workerGroups") or [] if g.get("name") == group.name),
                {},
            )
            resizing = (
                group.autoscaled
                or before.get("desiredReplicas", group.replicas) != group.replicas
                or len(mine) > group.replicas
                or previous.get("phase") == "Scaling"
            )
            only_scaling = only_scaling and resizing and not stuck
    reachable = info is not None
    complete = reachable and connected_total == desired and all_settled
    was_running = previous.get("phase") in ("Running", "Degraded", "Scaling")
    if complete or (reachable and unplaced and only_unplaced and connected_total > 0):
        phase = "Running"  # with Unschedulable=True when not everything fits
    elif was_running and reachable and only_scaling:
        phase = "Scaling"  # the autoscaler is adding or removing workers: nothing is wrong
    elif was_running:
        phase = "Degraded"
    else:
        phase = "Pending"
    if not reachable:
        reason, message = "SchedulerUnreachable", "the scheduler is not answering yet"
    elif complete:
        reason, message = "AllWorkersConnected", f"{connected_total} workers connected"
    else:
        reason = "WorkersMissing"
        message = f"{connected_total} of {desired} workers connected"
        stuck = [
            f"group {g['name']}: {'; '.join(g['unschedulable'])}"
            for g in groups
            if g.get("unschedulable")
        ]
        if stuck:
            reason = "Unschedulable"
            message += "; pods cannot be placed: " + " | ".join(stuck)
    return {
        "phase": phase,
        "observedGeneration": generation,
        "schedulerAddress": spec.scheduler_address,
        "image": spec.image,  # what the pods run: kept by a cluster that names none
        "workers": f"{connected_total}/{desired}",
        "workerGroups": groups,
        **resource_totals(groups),
        **tenant_usage(info),
        "unmetDemand": _unmet(info, scaling),
        **_last_decision(groups, previous),
        "conditions": [
            condition(previous, "Valid", True, "SpecAccepted", "the spec is valid", now)
            if invalid is None
            else condition(previous, "Valid", False, "KeptLastValidSpec", invalid, now),
            condition(previous, "Ready", complete, reason, message, now),
            condition(
                previous,
                "Unschedulable",
                bool(unplaced),
                "PodsUnschedulable" if unplaced else "AllPlaced",
                " | ".join(unplaced) or "every pod is placed",
                now,
            ),
            condition(
                previous,
                "ChildrenCreated",
                not failures,
                "CreateFailed" if failures else "AllCreated",
                "; ".join(failures or []) or "every child object exists",
                now,
            ),
        ],
    }


def tenant_usage(info: Mapping[str, Any] | None) -> dict[str, Any]:
    """What each tenant (spec.tenants) holds and waits for, from the scheduler; nothing
    where none is declared."""
    tenants = (info or {}).get("tenants")
    if not tenants:
        return {}
    fields = ("used", "share", "waiting", "over_quota")
    return {
        "tenants": {
            name: {field: about[field] for field in fields if field in about}
            for name, about in tenants.items()
        }
    }


def _unmet(info: Mapping[str, Any] | None, scaling: Scaling | None) -> list[dict[str, Any]]:
    if scaling is not None:
        return scaling.unmet
    return [
        {"resources": d["resources"], "tasks": d["tasks"], "why": d.get("why")}
        for d in (info or {}).get("no_worker", [])
    ]


def _autoscaling_status(
    group: GroupSpec, previous: Mapping[str, Any], scaling: Scaling | None, now: str
) -> dict[str, Any]:
    """Bounds and the last scaling decision of an autoscaled group (kept until the next)."""
    old: Mapping[str, Any] = next(
        (g for g in previous.get("workerGroups") or [] if g.get("name") == group.name), {}
    )
    fields: dict[str, Any] = {
        "minReplicas": group.min_replicas,
        "maxReplicas": group.max_replicas,
        "idleTimeoutSeconds": group.idle_timeout,
    }
    if scaling is not None and group.name in scaling.decision.limited:
        # What the nodes hold now bounds the group, not the demand: said until it grows.
        fields["limitedByNodes"] = {
            "placedReplicas": scaling.decision.limited[group.name],
            "reason": scaling.decision.reasons.get(group.name, ""),
        }
    elif "limitedByNodes" in old and group.replicas <= old["limitedByNodes"]["placedReplicas"] + 1:
        fields["limitedByNodes"] = old["limitedByNodes"]
    last = old.get("lastScale")
    if scaling is not None:
        before = scaling.before.get(group.name, group.replicas)
        reason = scaling.decision.reasons.get(group.name)
        if reason and before != group.replicas:
            last = {"time": now, "from": before, "to": group.replicas, "reason": reason}
    if last:
        fields["lastScale"] = last
    return fields


def _last_decision(groups: list[dict[str, Any]], previous: Mapping[str, Any]) -> dict[str, Any]:
    """The most recent scaling decision of any group, for ``kubectl get -o yaml`` readers."""
    decisions = [{"group": g["name"], **g["lastScale"]} for g in groups if g.get("lastScale")]
    if not decisions:
        last = previous.get("lastScalingDecision")
        return {"lastScalingDecision": last} if last else {}
    return {"lastScalingDecision": max(decisions, key=lambda d: (d["time"], d["group"]))}
