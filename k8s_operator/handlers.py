"""kopf handlers: level-based reconciliation of ResourceClusters.

Every reconcile reads the spec, builds the children with pure functions, applies them
(server-side apply: idempotent, safe after an operator restart), observes the pods and
the scheduler, and writes the status. It runs on create, update and resume, and on a
short timer so status and scaling follow what happens in the cluster.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import kopf
from apportion.operator import kube, metrics
from apportion.operator.autoscale import Scaling, decide, observe, unmet_demand
from apportion.operator.manifests import (
    GROUP,
    LABEL_CLUSTER,
    PLURAL,
    TOKEN_KEY,
    VERSION,
    scheduler_deployment,
    scheduler_service,
    secret_name,
    selector,
    token_secret,
    worker_pod,
)
from apportion.operator.plan import plan
from apportion.operator.scheduler_feed import cluster_summary, send_status
from apportion.operator.spec import DEFAULT_IMAGE, ClusterSpec, InvalidSpec, parse
from apportion.operator.status import compute_status, invalid_status, pod_ready

from apportion.auth import generate_token

RECONCILE_INTERVAL = float(os.environ.get("APPORTION_OPERATOR_INTERVAL", "2"))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Our own events are explicit (kopf.event/warn); handler log lines stay in the log.
    # (This level also silences kopf.info, hence kopf.event(type="Normal") below.)
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = "apportion.dev/operator"


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_change(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    with metrics.reconciling():
        reconcile(body, patch)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RECONCILE_INTERVAL)
def on_timer(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    with metrics.reconciling():
        reconcile(body, patch)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def reconcile(body: Mapping[str, Any], patch: kopf.Patch) -> None:
    meta, previous = body["metadata"], dict(body.get("status") or {})
    if meta.get("deletionTimestamp"):
        # Going away: its children go with it (ownerReferences); re-applying them now
        # would only race the garbage collector.
        return
    name, namespace, generation = meta["name"], meta["namespace"], meta.get("generation")
    default_image = os.environ.get("APPORTION_OPERATOR_IMAGE", DEFAULT_IMAGE)
    try:
        spec = parse(name, namespace, body.get("spec") or {}, default_image)
    except InvalidSpec as problem:
        metrics.invalid()
        if previous.get("phase") != "Invalid" or previous.get("observedGeneration") != generation:
            kopf.warn(body, reason="InvalidSpec", message=str(problem))
        _write_status(patch, previous, invalid_status(str(problem), previous, generation, _now()))
        return
    token = _ensure_token(spec, body)
    kube.apply(scheduler_deployment(spec, body))
    kube.apply(scheduler_service(spec, body))
    # One listing serves the scheduler lookup, this cluster's workers and the names in use.
    everything = kube.list_pods(namespace, {})
    scheduler_ip = _scheduler_ip(_matching(everything, selector(spec, "scheduler")))
    info = kube.scheduler_info(scheduler_ip, spec.http_port, token) if scheduler_ip else None
    pods = _matching(everything, {LABEL_CLUSTER: name, "app.kubernetes.io/component": "worker"})
    connected = {w["name"] for w in (info or {}).get("workers", {}).values()}
    taken = {p["metadata"]["name"] for p in everything}
    before = {
        g["name"]: int(g["desiredReplicas"])
        for g in previous.get("workerGroups") or []
        if "desiredReplicas" in g
    }
    scaling = None
    if info is None:
        # Idleness and demand are unknown without the scheduler: keep every target.
        views, _ = observe(spec, pods, {}, before, time.time())
        spec = _sized(spec, {v.name: v.desired for v in views})
    else:
        spec, scaling, removed = _autoscale(spec, body, pods, info, before, scheduler_ip, token)
        pods = [p for p in pods if p["metadata"]["name"] not in removed]
    failures = _carry_out(spec, body, plan(spec, pods, connected, taken), scheduler_ip, token)
    status = compute_status(spec, pods, info, previous, generation, _now(), failures, scaling)
    _announce_failures(body, previous, failures)
    _announce_unmet_demand(body, previous, status)
    _write_status(patch, previous, status)
    if scheduler_ip:  # for the scheduler's dashboard
        send_status(scheduler_ip, spec.http_port, token, cluster_summary(name, namespace, status))


def _autoscale(
    spec: ClusterSpec,
    owner: Mapping[str, Any],
    pods: list[dict[str, Any]],
    info: Mapping[str, Any],
    before: Mapping[str, int],
    scheduler_ip: str | None,
    token: str | None,
) -> tuple[ClusterSpec, Scaling, set[str]]:
    """Decide each autoscaled group's size, remove the workers chosen to go, and return
    the spec with those sizes, what was decided, and the pods removed. ``before``: each
    group's target from the last status."""
    views, demand = observe(spec, pods, info, before, time.time())
    decision = decide(views, demand)
    connected = {w["name"] for w in info.get("workers", {}).values()}
    removed: set[str] = set()
    for group, names in decision.remove.items():
        gone = _remove_workers(owner, spec, names, connected, scheduler_ip, token)
        removed |= gone
        decision.targets[group] += len(names) - len(gone)  # kept workers stay counted
    desired = {v.name: v.desired for v in views}
    for group, reason in decision.reasons.items():
        if decision.targets[group] != desired[group]:
            verb = "ScaledUp" if decision.targets[group] > desired[group] else "ScaledDown"
            metrics.scaled(spec.name, group, desired[group], decision.targets[group])
            kopf.event(
                owner,
                type="Normal",
                reason=verb,
                message=f"group {group}: {desired[group]} -> {decision.targets[group]} "
                f"worker(s): {reason}",
            )
    sized = _sized(spec, decision.targets)
    return sized, Scaling(decision, desired, unmet_demand(decision, views, info)), removed


def _sized(spec: ClusterSpec, targets: Mapping[str, int]) -> ClusterSpec:
    """The spec with autoscaled groups at their targets (fixed groups keep ``replicas``)."""
    return dataclasses.replace(
        spec,
        groups=[
            dataclasses.replace(g, replicas=targets.get(g.name, g.replicas)) if g.autoscaled else g
            for g in spec.groups
        ],
    )


def _remove_workers(
    owner: Mapping[str, Any],
    spec: ClusterSpec,
    names: list[str],
    connected: set[str],
    scheduler_ip: str | None,
    token: str | None,
) -> set[str]:
    """Delete pods that never connected; retire connected workers through the scheduler
    (it moves their data off first) and delete those it let go. Returns the deleted."""
    gone = {n for n in names if n not in connected}
    workers = [n for n in names if n in connected]
    if workers and scheduler_ip is not None:
        gone |= set(_retire(owner, spec, scheduler_ip, token, workers, len(workers)))
    for pod_name in sorted(gone):
        kube.delete_pod(spec.namespace, pod_name)
    return gone


def _retire(
    owner: Mapping[str, Any],
    spec: ClusterSpec,
    scheduler_ip: str,
    token: str | None,
    names: list[str],
    count: int,
) -> list[str]:
    """Retire workers through the scheduler (their data is copied off first); returns
    those safe to stop and announces any it kept, with its reason."""
    retired, kept = kube.retire(scheduler_ip, spec.http_port, token, names, count)
    for name, why in sorted(kept.items()):
        kopf.warn(owner, reason="RetireDeferred", message=f"worker {name} kept: {why}")
    return retired


def _ensure_token(spec: ClusterSpec, owner: Mapping[str, Any]) -> str | None:
    if not spec.auth:
        return None
    kube.create_if_absent(token_secret(spec, owner, generate_token()))
    return kube.read_token(spec.namespace, secret_name(spec), TOKEN_KEY)


def _matching(pods: list[dict[str, Any]], labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The pods carrying all of ``labels`` (a label selector, applied locally)."""
    return [
        p
        for p in pods
        if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())
    ]


def _scheduler_ip(scheduler_pods: list[dict[str, Any]]) -> str | None:
    for pod in scheduler_pods:
        ip = (pod.get("status") or {}).get("podIP")
        if ip and pod_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
            return str(ip)
    return None


def _carry_out(
    spec: ClusterSpec,
    owner: Mapping[str, Any],
    todo: Any,
    scheduler_ip: str | None,
    token: str | None,
) -> list[str]:
    """Apply a plan; returns what the API server refused (quota, admission), said plainly."""
    failures: list[str] = []
    for pod_name in todo.delete:
        kube.delete_pod(spec.namespace, pod_name)
    for group_name, index in todo.create:
        group = spec.group(group_name)
        assert group is not None
        try:
            kube.create_if_absent(worker_pod(spec, group, index, owner))
        except kube.ApiException as exc:
            failures.append(f"cannot create worker pod {group_name}-{index}: {kube.reason(exc)}")
    for down in todo.scale_down:
        if scheduler_ip is None:
            continue  # without the scheduler we cannot tell idle workers; try next round
        retired = _retire(owner, spec, scheduler_ip, token, down.candidates, down.count)
        for pod_name in retired:
            kube.delete_pod(spec.namespace, pod_name)
    if not todo.empty:
        kopf.event(owner, type="Normal", reason="Reconciled", message=_describe(todo))
    return failures


def _announce_failures(
    owner: Mapping[str, Any], previous: Mapping[str, Any], failures: list[str]
) -> None:
    before = next(
        (
            c.get("message")
            for c in previous.get("conditions") or []
            if c.get("type") == "ChildrenCreated"
        ),
        None,
    )
    if failures and "; ".join(failures) != before:
        kopf.warn(owner, reason="CreateFailed", message="; ".join(failures))


def _describe(todo: Any) -> str:
    parts = []
    if todo.create:
        parts.append(f"creating {len(todo.create)} worker pod(s)")
    if todo.delete:
        parts.append(f"deleting {', '.join(todo.delete)}")
    for down in todo.scale_down:
        parts.append(f"retiring {down.count} idle worker(s) of group {down.group}")
    return "; ".join(parts)


def _announce_unmet_demand(
    owner: Mapping[str, Any], previous: Mapping[str, Any], status: Mapping[str, Any]
) -> None:
    seen = {_shape(d) for d in previous.get("unmetDemand") or []}
    for demand in status.get("unmetDemand") or []:
        if _shape(demand) not in seen:
            kopf.warn(
                owner,
                reason="UnmetDemand",
                message=f"{demand['tasks']} task(s) wait for {demand['resources']}: "
                f"{demand.get('why') or 'no worker group has these resources'}",
            )


def _shape(demand: Mapping[str, Any]) -> tuple:
    return tuple(sorted((demand.get("resources") or {}).items()))


def _write_status(
    patch: kopf.Patch, previous: Mapping[str, Any], status: Mapping[str, Any]
) -> None:
    for key in set(previous) | set(status):
        if previous.get(key) != status.get(key):
            patch.status[key] = status.get(key)
