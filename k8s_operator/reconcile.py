"""One reconcile of one ResourceCluster, as a list of small steps.

Each step reads and fills one ``Round`` and returns whether the round goes on::

    pin_image -> check_spec -> sync_worker_groups -> ensure_credentials
    -> suspend_if_asked -> apply_scheduler                                      (the spec)
    -> observe -> idle_out -> decide_sizes -> retire_surplus -> decide_pods
    -> carry_out                                                                (the pods)
    -> write_status

``observe`` reads the indexes and the scheduler; ``decide_*`` are pure (``autoscale``,
``plan``); ``retire_surplus``, ``carry_out`` and the first four do the I/O; the status is
computed apart, from what the round saw and did, and written only onto the version of the
cluster the round read (a round that read an older one writes nothing: the next round
writes). Before every step the round stops if the cluster was deleted meanwhile, or if this
replica may no longer act (``leadership.py``: with several replicas, only the holder of a
freshly renewed Lease acts).

A spec is checked before anything is built from it: parsed, its children built, and those
sent to the API server as a dry run. A spec that fails keeps the cluster on its last valid
spec (``status.appliedSpec``) with ``Valid=False`` saying why; a failure of any other kind
ends in ``Reconciled=False``; each announces itself with one Event.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import hashlib
import json
import logging
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from apportion.operator import kube, leadership, metrics, tls
from apportion.operator.autoscale import (
    Demand,
    GroupView,
    ScaleDecision,
    Scaling,
    decide,
    unmet_demand,
)
from apportion.operator.autoscale import observe as observe_groups
from apportion.operator.credentials import ensure_tls, ensure_token
from apportion.operator.events import announce_once, event, over, warn
from apportion.operator.groups import sync
from apportion.operator.idle import Idleness, idleness, parse_stamp, scaled_to_zero
from apportion.operator.manifests import (
    GROUP,
    SYNCED_ANNOTATION,
    VERSION,
    WORKER_GROUP_KIND,
    group_selector,
    scheduler_deployment,
    scheduler_service,
    worker_group_object,
    worker_pod,
)
from apportion.operator.memo import ClusterMemo
from apportion.operator.plan import Plan, plan
from apportion.operator.scheduler_feed import cluster_summary, send_status
from apportion.operator.scheduler_http import SchedulerHttp
from apportion.operator.spec import ClusterSpec, Defaults, InvalidSpec, parse, pinned_defaults
from apportion.operator.status import (
    compute_status,
    condition,
    invalid_status,
    pod_ready,
    suspended_status,
    with_condition,
)

logger = logging.getLogger("apportion.operator")

# The status is rewritten at least this often (its lastObserved), even when nothing changed:
# a status older than that says no operator is looking.
HEARTBEAT_SECONDS = 30.0
COMPONENT = "app.kubernetes.io/component"


@dataclass
class Round:
    """One reconcile: what it read (``body``: a copy, taken once), then what each step
    found, decided and did."""

    body: dict[str, Any]
    memo: ClusterMemo
    indexes: Mapping[str, Any]  # kopf's: cluster_pods, scheduler_*, worker_groups
    defaults: Defaults
    previous: dict[str, Any]  # the status as read
    # check_spec
    spec: ClusterSpec | None = None
    applied: dict[str, Any] | None = None  # the spec in force: the status's appliedSpec
    problem: str | None = None  # why the wanted spec was refused
    # sync_worker_groups
    handles: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    # ensure_credentials
    token: str | None = None
    tls_context: ssl.SSLContext | None = None
    tls_problems: list[str] = field(default_factory=list)
    # observe
    scheduler: SchedulerHttp | None = None
    info: dict[str, Any] | None = None
    pods: list[Mapping[str, Any]] = field(default_factory=list)  # the cluster's worker pods
    connected: set[str] = field(default_factory=set)
    taken: set[str] = field(default_factory=set)  # pod names in use in the namespace
    targets_before: dict[str, int] = field(default_factory=dict)
    # idle_out
    idleness: Idleness | None = None
    # decide_sizes, retire_surplus
    views: list[GroupView] = field(default_factory=list)
    demand: list[Demand] = field(default_factory=list)
    decision: ScaleDecision | None = None
    scaling: Scaling | None = None
    # decide_pods, carry_out
    todo: Plan | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def meta(self) -> Mapping[str, Any]:
        return self.body["metadata"]

    @property
    def key(self) -> tuple[str, str]:
        return (self.meta["namespace"], self.meta["name"])

    def the_spec(self) -> ClusterSpec:
        assert self.spec is not None, "check_spec comes first"
        return self.spec


Step = Callable[[Round], bool]


def snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the cluster as one round sees it. kopf's body follows the watch while a
    round runs; the metadata (its resourceVersion) is copied first, so that a spec or
    status newer than it is written onto nothing (the write needs that version)."""
    meta = copy.deepcopy(dict(body["metadata"]))
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": meta,
        "spec": copy.deepcopy(dict(body.get("spec") or {})),
        "status": copy.deepcopy(dict(body.get("status") or {})),
    }


# ----- the spec ---------------------------------------------------------------------------


def pin_image(r: Round) -> bool:
    """The image this cluster keeps when it names none (see spec.pinned_defaults): the one
    its status says its pods run, or, for a cluster that predates that, its pods' own."""
    running = None
    if not (r.previous.get("appliedSpec") or {}).get("image"):  # it ran the default until now
        pods = r.indexes["cluster_pods"].get(r.key, ())
        running = r.previous.get("image") or running_image(pods)
    r.defaults = pinned_defaults(r.body["spec"], r.defaults, running)
    return True


def running_image(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The image of the cluster's scheduler or worker container, if any pod runs yet."""
    for pod in pods:
        component = (pod["metadata"].get("labels") or {}).get(COMPONENT)
        for container in (pod.get("spec") or {}).get("containers") or []:
            if container.get("name") == component and container.get("image"):
                return str(container["image"])
    return None


def check_spec(r: Round) -> bool:
    name, namespace = r.meta["name"], r.meta["namespace"]
    wanted = r.body["spec"]
    r.applied = r.previous.get("appliedSpec")
    try:
        r.spec = checked(name, namespace, wanted, r.body, r.defaults, dry_run=wanted != r.applied)
        r.applied = wanted
        over(r.memo, "InvalidSpec")
        return True
    except InvalidSpec as exc:
        metrics.invalid()
        r.problem = str(exc)
    announce_once(r.memo, r.body, r.previous, "Valid", "InvalidSpec", r.problem)
    if r.applied is None:  # never valid: nothing was built, nothing is
        status = invalid_status(r.problem, r.previous, r.meta.get("generation"), now())
        write_cluster_status(r, status)
        return False
    # Keep running what the last valid spec said; build nothing from this one.
    r.spec = parse(name, namespace, r.applied, r.defaults)
    return True


def checked(
    name: str,
    namespace: str,
    raw: Mapping[str, Any],
    owner: Mapping[str, Any],
    defaults: Defaults,
    dry_run: bool,
) -> ClusterSpec:
    """The spec parsed and every child built from it (and, with ``dry_run``, accepted by
    the API server without being stored); InvalidSpec says why not."""
    spec = parse(name, namespace, raw, defaults)
    try:
        children = [scheduler_deployment(spec, owner), scheduler_service(spec, owner)]
        children += [worker_pod(spec, g, 0, owner) for g in spec.groups]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise InvalidSpec(f"cannot build the cluster's pods from this spec: {exc!r}") from exc
    if dry_run:
        for child in children:
            refusal = kube.refused(child)
            if refusal:
                what = f"{child['kind']} {child['metadata']['name']}"
                raise InvalidSpec(f"the API server refuses the {what}: {refusal}")
    return spec


def sync_worker_groups(r: Round) -> bool:
    """Keep each group's ResourceWorkerGroup and the cluster in step (see groups.py). The
    round ends when a scaled handle was written into the cluster's spec: its update
    reconciles it next."""
    spec = r.the_spec()
    r.handles = {
        h["spec"]["group"]: h for h in r.indexes["worker_groups"].get(r.key, ()) if h.get("spec")
    }
    if r.problem is not None:
        return True
    generation = r.meta.get("generation") or 0
    todo = sync(spec, generation, r.handles)
    for group_name in todo.write:
        group = spec.group(group_name)
        assert group is not None
        kube.apply(worker_group_object(spec, group, r.body, generation))
    for group_name in todo.remove:
        kube.delete(
            f"{GROUP}/{VERSION}",
            WORKER_GROUP_KIND,
            spec.namespace,
            r.handles[group_name]["metadata"]["name"],
        )
    if not todo.scaled:
        return True
    groups = [dict(g) for g in r.body["spec"].get("workerGroups") or []]
    for raw in groups:
        if raw["name"] in todo.scaled:
            for key in ("minReplicas", "maxReplicas", "idleTimeoutSeconds"):
                raw.pop(key, None)
            raw["replicas"] = todo.scaled[raw["name"]]
    stored = _patch_worker_groups(r, spec, groups)
    if stored is None:
        return False
    for group_name, replicas in sorted(todo.scaled.items()):
        handle = r.handles[group_name]["metadata"]["name"]
        kube.patch(
            f"{GROUP}/{VERSION}",
            WORKER_GROUP_KIND,
            spec.namespace,
            handle,
            {"metadata": {"annotations": {SYNCED_ANNOTATION: str(stored.metadata.generation)}}},
        )
        event(
            r.body,
            type="Normal",
            reason="Scaled",
            message=f"group {group_name}: {replicas} worker(s), from {WORKER_GROUP_KIND} {handle}",
        )
    return False


def ensure_credentials(r: Round) -> bool:
    spec = r.the_spec()
    r.token = ensure_token(r.memo, spec, r.body)
    r.tls_context, r.tls_problems, digest = ensure_tls(r.memo, spec, r.body)
    r.spec = dataclasses.replace(spec, tls_digest=digest)
    return True


def suspend_if_asked(r: Round) -> bool:
    """A suspended cluster keeps its spec, Service and Secrets and runs no pod: the
    scheduler's Deployment at zero replicas, every worker pod deleted. The round ends here;
    setting suspend back to false lets the next round build the cluster again."""
    spec, previous_phase = r.the_spec(), r.previous.get("phase")
    if not spec.suspend:
        if previous_phase == "Suspended":
            event(r.body, type="Normal", reason="Resumed", message="spec.suspend is false")
        return True
    existing = set(r.indexes["scheduler_deployments"].get(r.key, ()))
    deployment = scheduler_deployment(spec, r.body)
    deployment["spec"]["replicas"] = 0
    apply_if_changed(r.memo, deployment, existing)
    workers = [
        p
        for p in r.indexes["cluster_pods"].get(r.key, ())
        if p["metadata"]["labels"].get(COMPONENT) == "worker"
        and not p["metadata"].get("deletionTimestamp")
    ]
    deleted = [
        p["metadata"]["name"]
        for p in workers
        if kube.delete_pod(spec.namespace, p["metadata"]["name"])
    ]
    if previous_phase != "Suspended":
        event(
            r.body,
            type="Normal",
            reason="Suspended",
            message=f"spec.suspend is true: the scheduler and {len(deleted)} worker pod(s) removed",
        )
    status = suspended_status(spec, r.previous, r.meta.get("generation"), now())
    status["appliedSpec"] = r.applied
    write_cluster_status(r, status)
    return False


def apply_scheduler(r: Round) -> bool:
    """The scheduler's Deployment and Service, applied when changed or missing."""
    spec = r.the_spec()
    existing = set(r.indexes["scheduler_deployments"].get(r.key, ())) | set(
        r.indexes["scheduler_services"].get(r.key, ())
    )
    for child in (scheduler_deployment(spec, r.body), scheduler_service(spec, r.body)):
        apply_if_changed(r.memo, child, existing)
    return True


def apply_if_changed(memo: ClusterMemo, manifest: Mapping[str, Any], existing: set[str]) -> None:
    """Server-side apply ``manifest`` unless this process applied the same one already and
    the object still exists (``existing``: names of the cluster's children in the index)."""
    kind = manifest["kind"]
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    if memo.applied.get(kind) == digest and f"{kind}/{manifest['metadata']['name']}" in existing:
        return
    kube.apply(manifest)
    memo.applied[kind] = digest


# ----- the pods ---------------------------------------------------------------------------


def observe(r: Round) -> bool:
    """The cluster's pods (from the watch-fed index) and what its scheduler says."""
    spec = r.the_spec()
    index: Mapping[Any, Iterable[Any]] = r.indexes["cluster_pods"]
    mine = list(index.get(r.key, ()))
    ip = scheduler_ip([p for p in mine if p["metadata"]["labels"].get(COMPONENT) == "scheduler"])
    if ip:
        r.scheduler = SchedulerHttp(ip, spec.http_port, r.token, r.tls_context)
        r.info = kube.scheduler_info(r.scheduler)
    r.pods = [p for p in mine if p["metadata"]["labels"].get(COMPONENT) == "worker"]
    r.connected = {w["name"] for w in (r.info or {}).get("workers", {}).values()}
    r.taken = {
        p["metadata"]["name"] for key, found in index.items() if key[0] == r.key[0] for p in found
    }
    r.targets_before = {
        g["name"]: int(g["desiredReplicas"])
        for g in r.previous.get("workerGroups") or []
        if "desiredReplicas" in g
    }
    return True


def scheduler_ip(scheduler_pods: list[Mapping[str, Any]]) -> str | None:
    for pod in scheduler_pods:
        ip = (pod.get("status") or {}).get("podIP")
        if ip and pod_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
            return str(ip)
    return None


def _patch_worker_groups(r: Round, spec: ClusterSpec, groups: list[dict[str, Any]]) -> Any:
    """Write the cluster's ``spec.workerGroups`` on the version this round read; the stored
    object, or None when the cluster changed since (it is looked at again next round)."""
    try:
        return kube.patch(
            f"{GROUP}/{VERSION}",
            "ResourceCluster",
            spec.namespace,
            spec.name,
            {
                "metadata": {"resourceVersion": r.meta["resourceVersion"]},
                "spec": {"workerGroups": groups},
            },
        )
    except kube.ApiException as exc:
        if exc.status == 409:
            return None
        raise


def idle_out(r: Round) -> bool:
    """End a cluster nobody used for ``idleTimeoutSeconds`` (see idle.py): delete it, or
    scale every worker group to zero. Nothing is done while the spec is refused."""
    spec = r.the_spec()
    since = parse_stamp(r.previous.get("idleSince"))
    r.idleness = idleness(spec.idle_timeout, r.info, since, time.time())
    if not r.idleness.due or r.problem is not None:
        return True
    if spec.idle_policy == "delete":
        event(
            r.body,
            type="Normal",
            reason="IdleTimeout",
            message=f"deleting the cluster: {r.idleness.why}",
        )
        kube.delete(f"{GROUP}/{VERSION}", "ResourceCluster", spec.namespace, spec.name)
        r.memo.gone.set()
        return False
    groups = scaled_to_zero(r.body["spec"].get("workerGroups") or [])
    if groups is None:
        return True  # at zero already: stays so until someone sizes it again
    if _patch_worker_groups(r, spec, groups) is None:
        return False  # (a client may be back)
    event(
        r.body,
        type="Normal",
        reason="IdleTimeout",
        message=f"every worker group scaled to zero: {r.idleness.why}",
    )
    return False


def decide_sizes(r: Round) -> bool:
    """Each autoscaled group's size. Idleness and demand are unknown without the
    scheduler, and an invalid spec freezes the sizes: then every target is kept."""
    spec = r.the_spec()
    frozen = r.info is None or r.problem is not None
    r.views, r.demand = observe_groups(
        spec, r.pods, {} if frozen else r.info or {}, r.targets_before, time.time()
    )
    if frozen:
        r.spec = sized(spec, {v.name: v.desired for v in r.views})
    else:
        r.decision = decide(r.views, r.demand)
    return True


def retire_surplus(r: Round) -> bool:
    """Remove the workers the decision chose to go, then size the spec to the targets
    (a worker kept stays counted) and announce each change of size."""
    decision, spec = r.decision, r.the_spec()
    if decision is None:
        return True
    removed: set[str] = set()
    for group, names in decision.remove.items():
        gone = remove_workers(r, names)
        removed |= gone
        decision.targets[group] += len(names) - len(gone)
    desired = {v.name: v.desired for v in r.views}
    for group, reason in decision.reasons.items():
        if decision.targets[group] != desired[group]:
            verb = "ScaledUp" if decision.targets[group] > desired[group] else "ScaledDown"
            metrics.scaled(spec.name, group, desired[group], decision.targets[group])
            event(
                r.body,
                type="Normal",
                reason=verb,
                message=f"group {group}: {desired[group]} -> {decision.targets[group]} "
                f"worker(s): {reason}",
            )
    r.spec = sized(spec, decision.targets)
    r.scaling = Scaling(decision, desired, unmet_demand(decision, r.views, r.info or {}))
    r.pods = [p for p in r.pods if p["metadata"]["name"] not in removed]
    return True


def sized(spec: ClusterSpec, targets: Mapping[str, int]) -> ClusterSpec:
    """The spec with autoscaled groups at their targets (fixed groups keep ``replicas``)."""
    return dataclasses.replace(
        spec,
        groups=[
            dataclasses.replace(g, replicas=targets.get(g.name, g.replicas)) if g.autoscaled else g
            for g in spec.groups
        ],
    )


def remove_workers(r: Round, names: list[str]) -> set[str]:
    """Delete pods that never connected; retire connected workers through the scheduler
    (it moves their data off first) and delete those it let go. Returns the deleted."""
    gone = {n for n in names if n not in r.connected}
    workers = [n for n in names if n in r.connected]
    if workers and r.scheduler is not None:
        gone |= set(retire(r, workers, len(workers)))
    for pod_name in sorted(gone):
        kube.delete_pod(r.the_spec().namespace, pod_name)
    return gone


def retire(r: Round, names: list[str], count: int) -> list[str]:
    """Retire workers through the scheduler (their data is copied off first); returns
    those safe to stop and announces any it kept, with its reason."""
    assert r.scheduler is not None
    retired, kept = kube.retire(r.scheduler, names, count)
    for name, why in sorted(kept.items()):
        warn(r.body, reason="RetireDeferred", message=f"worker {name} kept: {why}")
    return retired


def decide_pods(r: Round) -> bool:
    todo = plan(r.the_spec(), r.pods, r.connected, r.taken)
    if r.problem is not None:
        # Create nothing while the spec is invalid, and let go of pods not placed yet:
        # they hold nothing now, but would take resources another cluster may wait for.
        todo.create = []
        todo.delete += [
            p["metadata"]["name"]
            for p in r.pods
            if not p["spec"].get("nodeName") and p["metadata"]["name"] not in todo.delete
        ]
    r.todo = todo
    return True


def carry_out(r: Round) -> bool:
    """Apply the plan; what the API server refused (quota, admission) is kept, said
    plainly, for the status. Announces what was actually done (a pod another reconcile
    made already is no news)."""
    spec, todo = r.the_spec(), r.todo
    assert todo is not None
    done = Plan()
    for pod_name in todo.delete:
        if kube.delete_pod(spec.namespace, pod_name):
            done.delete.append(pod_name)
    for group_name, index in todo.create:
        if r.memo.gone.is_set():
            break  # deleted meanwhile: create nothing more of it
        group = spec.group(group_name)
        assert group is not None
        try:
            if kube.create_if_absent(worker_pod(spec, group, index, r.body)):
                done.create.append((group_name, index))
        except kube.ApiException as exc:
            r.failures.append(f"cannot create worker pod {group_name}-{index}: {kube.reason(exc)}")
    for down in todo.scale_down:
        if r.scheduler is None:
            continue  # without the scheduler we cannot tell idle workers; try next round
        retired = retire(r, down.candidates, down.count)
        for pod_name in retired:
            kube.delete_pod(spec.namespace, pod_name)
        if retired:
            done.scale_down.append(dataclasses.replace(down, count=len(retired)))
    if not done.empty:
        event(r.body, type="Normal", reason="Reconciled", message=describe(done))
    return True


def describe(todo: Plan) -> str:
    parts = []
    if todo.create:
        parts.append(f"creating {len(todo.create)} worker pod(s)")
    if todo.delete:
        parts.append(f"deleting {', '.join(todo.delete)}")
    for down in todo.scale_down:
        parts.append(f"retiring {down.count} idle worker(s) of group {down.group}")
    return "; ".join(parts)


# ----- the status -------------------------------------------------------------------------


def write_status(r: Round) -> bool:
    """The status computed from what this round saw and did; the worker groups' handles,
    the announcements and the scheduler's dashboard follow from it."""
    spec, previous = r.the_spec(), r.previous
    status = compute_status(
        spec,
        r.pods,
        r.info,
        previous,
        r.meta.get("generation"),
        now(),
        r.failures,
        r.scaling,
        invalid=r.problem,
    )
    status = with_condition(
        status,
        condition(previous, "Reconciled", True, "ReconcileSucceeded", "reconciled", now()),
    )
    if spec.tls:
        ok = not r.tls_problems
        why = "; ".join(r.tls_problems) or f"certificate from Secret {tls.tls_secret_name(spec)}"
        reason = "CertificateReady" if ok else "CertificateUnusable"
        status = with_condition(status, condition(previous, "TLSReady", ok, reason, why, now()))
        if ok:
            over(r.memo, "CertificateUnusable")
        else:
            announce_once(r.memo, r.body, previous, "TLSReady", "CertificateUnusable", why)
    status["appliedSpec"] = r.applied
    status.update((r.idleness or Idleness()).status())
    over(r.memo, "ReconcileFailed")
    report_worker_groups(spec, r.handles, status)
    if r.failures:
        message = "; ".join(r.failures)
        announce_once(r.memo, r.body, previous, "ChildrenCreated", "CreateFailed", message)
    else:
        over(r.memo, "CreateFailed")
    announce_unmet_demand(r.body, previous, status)
    write_cluster_status(r, status)
    if r.scheduler:  # for the scheduler's dashboard
        send_status(r.scheduler, cluster_summary(spec.name, spec.namespace, status))
    return True


def report_worker_groups(
    spec: ClusterSpec, handles: Mapping[str, Mapping[str, Any]], status: Mapping[str, Any]
) -> None:
    """Each handle's status: the group's connected workers and its pods' selector."""
    connected = {g["name"]: g["connectedWorkers"] for g in status.get("workerGroups") or []}
    for group in spec.groups:
        handle = handles.get(group.name)
        if handle is None:
            continue
        wanted = {"replicas": connected.get(group.name, 0), "selector": group_selector(spec, group)}
        if dict(handle.get("status") or {}) != wanted:
            kube.patch_status(
                f"{GROUP}/{VERSION}",
                WORKER_GROUP_KIND,
                spec.namespace,
                handle["metadata"]["name"],
                wanted,
            )


def announce_unmet_demand(
    owner: Mapping[str, Any], previous: Mapping[str, Any], status: Mapping[str, Any]
) -> None:
    seen = {_shape(d) for d in previous.get("unmetDemand") or []}
    for demand in status.get("unmetDemand") or []:
        if _shape(demand) not in seen:
            warn(
                owner,
                reason="UnmetDemand",
                message=f"{demand['tasks']} task(s) wait for {demand['resources']}: "
                f"{demand.get('why') or 'no worker group has these resources'}",
            )


def _shape(demand: Mapping[str, Any]) -> tuple:
    return tuple(sorted((demand.get("resources") or {}).items()))


def status_patch(previous: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """What to write of ``status``: the keys that changed (None removes one), and
    ``lastObserved``; nothing when only HEARTBEAT_SECONDS have not passed since the last
    write, so that an idle cluster costs few writes and a stale status shows its age."""
    last = previous.get("lastObserved")
    changed = {k for k in set(previous) | set(status) if k != "lastObserved"}
    changed = {k for k in changed if previous.get(k) != status.get(k)}
    if not changed and last and _age(last) < HEARTBEAT_SECONDS:
        return {}
    status["lastObserved"] = now()
    return {key: status.get(key) for key in changed | {"lastObserved"}}


def write_cluster_status(r: Round, status: dict[str, Any]) -> None:
    """Write the status onto the version of the cluster this round read: if the cluster
    changed since (a new spec, another round's status), this round's view is old and the
    next round writes instead; if it is gone, nothing is written."""
    patch = status_patch(r.previous, status)
    if not patch or r.memo.gone.is_set():
        return
    try:
        kube.patch_status(
            f"{GROUP}/{VERSION}",
            "ResourceCluster",
            r.meta["namespace"],
            r.meta["name"],
            patch,
            resource_version=r.meta["resourceVersion"],
        )
    except kube.ApiException as exc:
        if exc.status not in (404, 409):
            raise
        logger.debug(
            "status of %s/%s not written: %s", *r.key, "gone" if exc.status == 404 else "changed"
        )


def report_failure(r: Round, message: str) -> None:
    announce_once(r.memo, r.body, r.previous, "Reconciled", "ReconcileFailed", message)
    status = with_condition(
        r.previous,
        condition(r.previous, "Reconciled", False, "ReconcileFailed", message, now()),
    )
    status.setdefault("phase", "Pending")
    write_cluster_status(r, status)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age(stamp: str) -> float:
    try:
        then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return float("inf")
    current = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    return (current - then).total_seconds()


# ----- the round --------------------------------------------------------------------------

STEPS: tuple[Step, ...] = (
    pin_image,
    check_spec,
    sync_worker_groups,
    ensure_credentials,
    suspend_if_asked,
    apply_scheduler,
    observe,
    idle_out,
    decide_sizes,
    retire_surplus,
    decide_pods,
    carry_out,
    write_status,
)


def reconcile(
    body: Mapping[str, Any],
    memo: ClusterMemo,
    indexes: Mapping[str, Any],
    defaults: Defaults,
    wait: bool = True,
    steps: tuple[Step, ...] = STEPS,
) -> None:
    """One reconcile of one cluster, one at a time per cluster. ``wait``: False for the
    timer, which skips a round while another reconcile of the same cluster runs."""
    if memo.gone.is_set():
        return
    if body["metadata"].get("deletionTimestamp"):
        # Going away: its children go with it (ownerReferences); re-applying them now
        # would only race the garbage collector.
        return
    if not leadership.may_act():
        return  # another replica holds the Lease, or this one may have lost it unawares
    if not memo.lock.acquire(blocking=wait):
        return
    try:
        with metrics.reconciling():
            taken = snapshot(body)
            r = Round(taken, memo, indexes, defaults, dict(taken["status"]))
            run(r, steps)
    finally:
        memo.lock.release()


def run(r: Round, steps: tuple[Step, ...]) -> None:
    """The steps in order, until one ends the round or the cluster is deleted; a failure
    ends in a condition and an Event, never in silence."""
    try:
        for step in steps:
            if r.memo.gone.is_set() or not leadership.may_act() or not step(r):
                return
    except Exception as exc:
        logger.exception("reconcile of %s/%s failed", *r.key)
        if not r.memo.gone.is_set():
            report_failure(r, explain(exc))


def explain(exc: Exception) -> str:
    if isinstance(exc, kube.ApiException):
        return f"the API server answered {exc.status}: {kube.reason(exc)}"
    return f"{type(exc).__name__}: {exc}"
