"""kopf handlers: level-based reconciliation of ResourceClusters.

Every reconcile reads the spec, builds the children with pure functions, applies them
(server-side apply: idempotent, safe after an operator restart), observes the pods (from a
watch-fed index, never a listing) and the scheduler, and writes the status. It runs on
create, update and resume, and on a short timer so status and scaling follow what happens
in the cluster; one at a time per cluster.

A spec is checked before anything is built from it: parsed, its children built, and those
sent to the API server as a dry run. A spec that fails keeps the cluster on its last valid
spec (``status.appliedSpec``) with ``Valid=False`` saying why; a failure of any other kind
ends in ``Reconciled=False``; each announces itself with one Event.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import random
import ssl
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import kopf
from apportion.operator import kube, metrics, tls
from apportion.operator.autoscale import Scaling, decide, observe, unmet_demand
from apportion.operator.groups import sync
from apportion.operator.manifests import (
    GROUP,
    LABEL_CLUSTER,
    PLURAL,
    SYNCED_ANNOTATION,
    TOKEN_KEY,
    VERSION,
    WORKER_GROUP_KIND,
    WORKER_GROUP_PLURAL,
    group_selector,
    scheduler_deployment,
    scheduler_service,
    secret_name,
    tls_secret,
    token_secret,
    worker_group_object,
    worker_pod,
)
from apportion.operator.plan import Plan, plan
from apportion.operator.scheduler_feed import cluster_summary, send_status
from apportion.operator.scheduler_http import SchedulerHttp
from apportion.operator.spec import DEFAULT_IMAGE, ClusterSpec, Defaults, InvalidSpec, parse
from apportion.operator.status import (
    compute_status,
    condition,
    invalid_status,
    pod_ready,
    with_condition,
)

from apportion.auth import generate_token

logger = logging.getLogger("apportion.operator")

RECONCILE_INTERVAL = float(os.environ.get("APPORTION_OPERATOR_INTERVAL", "2"))
# The status is rewritten at least this often (its lastObserved), even when nothing changed:
# a status older than that says no operator is looking.
HEARTBEAT_SECONDS = 30.0
MANAGED = {"app.kubernetes.io/managed-by": "apportion-operator"}

# One reconcile at a time per cluster (by uid): the timer and a spec change never overlap.
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
# What was last applied per (cluster uid, kind): a hash of the manifest. A child is applied
# again only when its manifest changed or it is gone (not every 2 s per cluster).
_applied: dict[tuple[str, str], str] = {}
# Each cluster's token, read (or created) once per operator process.
_tokens: dict[str, str | None] = {}
# Each TLS cluster's context for the operator's calls, by (uid, digest of the Secret).
_tls_contexts: dict[tuple[str, str], ssl.SSLContext] = {}
# Each TLS cluster's Secret as last read: (uid, Secret name) -> (monotonic time, keys).
_tls_reads: dict[tuple[str, str], tuple[float, dict[str, str] | None]] = {}
TLS_REREAD = 30.0
# The last problem announced per (cluster uid, Event reason): a reconcile that started from
# an older body (the timer's, queued behind a change) must not announce it again.
_announced: dict[tuple[str, str], str] = {}


def _announce_once(
    owner: Mapping[str, Any], previous: Mapping[str, Any], kind: str, reason: str, message: str
) -> None:
    """One warning Event per problem: not when the status's ``kind`` condition already
    says it (announced before a restart), nor when this process announced it already."""
    old: Mapping[str, Any] = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == kind), {}
    )
    key = (owner["metadata"]["uid"], reason)
    if (old.get("status") == "False" and old.get("message") == message) or _announced.get(
        key
    ) == message:
        return
    _announced[key] = message
    _warn(owner, reason=reason, message=message)


def _lock(uid: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(uid, threading.Lock())


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Our own events are explicit (kopf.event/warn); handler log lines stay in the log.
    # (This level also silences kopf.info, hence kopf.event(type="Normal") below.)
    settings.posting.level = logging.WARNING
    # Only to remove it from clusters an older operator marked (see _no_finalizers below).
    settings.persistence.finalizer = "apportion.dev/operator"
    # Reconciles are synchronous and may wait on a scheduler's retire call: many clusters
    # need more threads than the default (CPUs + 4).
    settings.execution.max_workers = int(os.environ.get("APPORTION_OPERATOR_THREADS", "32"))
    peering = os.environ.get("APPORTION_OPERATOR_PEERING")
    if peering:
        # Several replicas: the one of highest priority acts, the others pause until its
        # peering record expires (it renews it every lifetime - 5..10 s while alive).
        # Random priorities: kopf pauses every replica when two priorities are equal.
        settings.peering.standalone = False
        settings.peering.mandatory = True
        settings.peering.name = peering
        settings.peering.priority = random.randint(1, 2**30)
        settings.peering.lifetime = int(os.environ.get("APPORTION_OPERATOR_PEERING_LIFETIME", "20"))
        # kopf starts every peering replica paused and logs only changes of that state
        # ("Resuming operations", "Pausing operations"): one that starts beside a live replica
        # of higher priority stands by without a word. Say so at start.
        logger.info(
            "peering %r: standing by until no live replica of higher priority than %d is "
            "listed in it",
            peering,
            settings.peering.priority,
        )


@kopf.index("pods", labels=MANAGED)
def cluster_pods(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str | None], kopf.Body]:
    """Every pod the operator made, by (namespace, cluster): a cache fed by one watch."""
    return {(namespace, labels.get(LABEL_CLUSTER)): body}


def _child(
    namespace: str | None, name: str, labels: Mapping[str, str], body: kopf.Body
) -> dict[tuple[str | None, str | None], str]:
    return {(namespace, labels.get(LABEL_CLUSTER)): f"{body['kind']}/{name}"}


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
def scheduler_deployments(
    namespace: str | None, name: str, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str | None], str]:
    """Which scheduler Deployments exist, by (namespace, cluster)."""
    return _child(namespace, name, labels, body)


@kopf.index("services", labels=MANAGED)
def scheduler_services(
    namespace: str | None, name: str, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str | None], str]:
    """Which scheduler Services exist, by (namespace, cluster)."""
    return _child(namespace, name, labels, body)


@kopf.index(GROUP, VERSION, WORKER_GROUP_PLURAL, labels=MANAGED)
def worker_groups(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str | None], kopf.Body]:
    """Every ResourceWorkerGroup, by (namespace, cluster)."""
    return {(namespace, labels.get(LABEL_CLUSTER)): body}


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_change(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
    with metrics.reconciling():
        reconcile(body, patch, kwargs)


def _deleted(type: str | None, **_: Any) -> bool:
    return type == "DELETED"


# Only DELETED events call it: kopf logs every handler it calls, and a status patch is an
# event too.
@kopf.on.event(GROUP, VERSION, PLURAL, when=_deleted)
def on_event(type: str | None, uid: str | None, **_: Any) -> None:
    """A cluster's watch event: kopf calls these without a finalizer, so a deleted cluster
    is seen here (there is no delete handler, on purpose: see _no_finalizers)."""
    if type == "DELETED" and uid:
        forget(uid)


def forget(uid: str) -> None:
    """Drop everything this process kept for a cluster that is gone (else each cluster
    ever created would stay in these caches for the operator's lifetime)."""
    with _locks_guard:
        _locks.pop(uid, None)
    _tokens.pop(uid, None)
    caches: list[dict[Any, Any]] = [_applied, _tls_contexts, _tls_reads, _announced]
    for cache in caches:
        for key in list(cache):  # a snapshot: reconciles of other clusters run meanwhile
            if key[0] == uid:
                cache.pop(key, None)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RECONCILE_INTERVAL)
def on_timer(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
    with metrics.reconciling():
        reconcile(body, patch, kwargs, wait=False)


def _no_finalizers() -> None:
    """kopf puts a finalizer on every object a timer watches, so that it can stop the timer
    before the object goes; without a running operator that blocks deletion (and
    ``helm uninstall``) forever. Our timer needs no goodbye: the children go with their
    owner (ownerReferences), and kopf stops a timer when its object is deleted anyway. kopf
    then also removes the finalizer an older operator added."""
    spawning = kopf.get_default_registry()._spawning
    spawning._handlers = [
        dataclasses.replace(h, requires_finalizer=False) for h in spawning._handlers
    ]


_no_finalizers()


def _event(owner: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
    kopf.event(cast(kopf.Body, owner), type=type, reason=reason, message=message)


def _warn(owner: Mapping[str, Any], *, reason: str, message: str) -> None:
    kopf.warn(cast(kopf.Body, owner), reason=reason, message=message)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _defaults() -> Defaults:
    """The chart's image, pull policy and pull secrets, for clusters that name none."""
    secrets = os.environ.get("APPORTION_OPERATOR_IMAGE_PULL_SECRETS", "")
    return Defaults(
        image=os.environ.get("APPORTION_OPERATOR_IMAGE", DEFAULT_IMAGE),
        image_pull_policy=os.environ.get("APPORTION_OPERATOR_IMAGE_PULL_POLICY") or "IfNotPresent",
        image_pull_secrets=tuple(s.strip() for s in secrets.split(",") if s.strip()),
    )


def reconcile(
    body: Mapping[str, Any],
    patch: kopf.Patch,
    indexes: Mapping[str, Any],
    wait: bool = True,
) -> None:
    """One reconcile of one cluster. ``indexes``: kopf's (cluster_pods,
    scheduler_deployments, scheduler_services, worker_groups); ``wait``: False for the
    timer, which skips a round while another reconcile of the same cluster runs."""
    meta, previous = body["metadata"], dict(body.get("status") or {})
    if meta.get("deletionTimestamp"):
        # Going away: its children go with it (ownerReferences); re-applying them now
        # would only race the garbage collector.
        return
    lock = _lock(meta["uid"])
    if not lock.acquire(blocking=wait):
        return
    try:
        _reconcile(body, patch, indexes, previous)
    except Exception as exc:  # every failure ends in a condition and an Event, never silence
        logger.exception("reconcile of %s/%s failed", meta["namespace"], meta["name"])
        _report_failure(body, patch, previous, _explain(exc))
    finally:
        lock.release()


def _explain(exc: Exception) -> str:
    if isinstance(exc, kube.ApiException):
        return f"the API server answered {exc.status}: {kube.reason(exc)}"
    return f"{type(exc).__name__}: {exc}"


def _report_failure(
    owner: Mapping[str, Any], patch: kopf.Patch, previous: Mapping[str, Any], message: str
) -> None:
    _announce_once(owner, previous, "Reconciled", "ReconcileFailed", message)
    status = with_condition(
        previous,
        condition(previous, "Reconciled", False, "ReconcileFailed", message, _now()),
    )
    status.setdefault("phase", "Pending")
    _write_status(patch, previous, status)


def _checked(
    name: str, namespace: str, raw: Mapping[str, Any], owner: Mapping[str, Any], dry_run: bool
) -> ClusterSpec:
    """The spec parsed and every child built from it (and, with ``dry_run``, accepted by
    the API server without being stored); InvalidSpec says why not."""
    spec = parse(name, namespace, raw, _defaults())
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


def _reconcile(
    body: Mapping[str, Any],
    patch: kopf.Patch,
    indexes: Mapping[str, Any],
    previous: dict[str, Any],
) -> None:
    index: Mapping[Any, Iterable[Any]] = indexes["cluster_pods"]
    handles_index: Mapping[Any, Iterable[Any]] = indexes["worker_groups"]
    meta = body["metadata"]
    name, namespace, generation = meta["name"], meta["namespace"], meta.get("generation")
    wanted = dict(body.get("spec") or {})
    applied = previous.get("appliedSpec")
    problem = None
    try:
        spec = _checked(name, namespace, wanted, body, dry_run=wanted != applied)
        applied = wanted
        _forget(body, "InvalidSpec")
    except InvalidSpec as exc:
        metrics.invalid()
        problem = str(exc)
        _announce_once(body, previous, "Valid", "InvalidSpec", problem)
        if applied is None:  # never valid: nothing was built, nothing is
            status = invalid_status(problem, previous, generation, _now())
            _write_status(patch, previous, status)
            return
        # Keep running what the last valid spec said; build nothing from this one.
        spec = parse(name, namespace, applied, _defaults())
    handles = {
        h["spec"]["group"]: h for h in handles_index.get((namespace, name), ()) if h.get("spec")
    }
    if problem is None and _sync_worker_groups(spec, body, generation or 0, handles):
        return  # the cluster's spec changed: its update reconciles it next
    token = _ensure_token(spec, body)
    tls_context, tls_problems, tls_digest = _ensure_tls(spec, body)
    spec = dataclasses.replace(spec, tls_digest=tls_digest)
    existing = set(indexes["scheduler_deployments"].get((namespace, name), ())) | set(
        indexes["scheduler_services"].get((namespace, name), ())
    )
    for child in (scheduler_deployment(spec, body), scheduler_service(spec, body)):
        _apply_if_changed(meta["uid"], child, existing)
    mine = list(index.get((namespace, name), ()))
    scheduler_ip = _scheduler_ip(
        [
            p
            for p in mine
            if p["metadata"]["labels"].get("app.kubernetes.io/component") == "scheduler"
        ]
    )
    scheduler = (
        SchedulerHttp(scheduler_ip, spec.http_port, token, tls_context) if scheduler_ip else None
    )
    info = kube.scheduler_info(scheduler) if scheduler else None
    pods = [
        p for p in mine if p["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    ]
    connected = {w["name"] for w in (info or {}).get("workers", {}).values()}
    taken = {
        p["metadata"]["name"] for key, found in index.items() if key[0] == namespace for p in found
    }
    before = {
        g["name"]: int(g["desiredReplicas"])
        for g in previous.get("workerGroups") or []
        if "desiredReplicas" in g
    }
    scaling = None
    if info is None or problem is not None:
        # Idleness and demand are unknown without the scheduler, and an invalid spec
        # freezes the sizes: keep every target.
        views, _ = observe(spec, pods, {}, before, time.time())
        spec = _sized(spec, {v.name: v.desired for v in views})
    else:
        spec, scaling, removed = _autoscale(spec, body, pods, info, before, scheduler)
        pods = [p for p in pods if p["metadata"]["name"] not in removed]
    todo = plan(spec, pods, connected, taken)
    if problem is not None:
        # Create nothing while the spec is invalid, and let go of pods not placed yet:
        # they hold nothing now, but would take resources another cluster may wait for.
        todo.create = []
        todo.delete += [
            p["metadata"]["name"]
            for p in pods
            if not p["spec"].get("nodeName") and p["metadata"]["name"] not in todo.delete
        ]
    failures = _carry_out(spec, body, todo, scheduler)
    status = compute_status(
        spec, pods, info, previous, generation, _now(), failures, scaling, invalid=problem
    )
    status = with_condition(
        status,
        condition(previous, "Reconciled", True, "ReconcileSucceeded", "reconciled", _now()),
    )
    if spec.tls:
        ok = not tls_problems
        why = "; ".join(tls_problems) or f"certificate from Secret {tls.tls_secret_name(spec)}"
        reason = "CertificateReady" if ok else "CertificateUnusable"
        status = with_condition(status, condition(previous, "TLSReady", ok, reason, why, _now()))
        if ok:
            _forget(body, "CertificateUnusable")
        else:
            _announce_once(body, previous, "TLSReady", "CertificateUnusable", why)
    status["appliedSpec"] = applied
    _forget(body, "ReconcileFailed")
    _report_worker_groups(spec, handles, status)
    _announce_failures(body, previous, failures)
    _announce_unmet_demand(body, previous, status)
    _write_status(patch, previous, status)
    if scheduler:  # for the scheduler's dashboard
        send_status(scheduler, cluster_summary(name, namespace, status))


def _apply_if_changed(uid: str, manifest: Mapping[str, Any], existing: set[str]) -> None:
    """Server-side apply ``manifest`` unless this process applied the same one already and
    the object still exists (``existing``: names of the cluster's children in the index)."""
    key = (uid, manifest["kind"])
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    if (
        _applied.get(key) == digest
        and f"{manifest['kind']}/{manifest['metadata']['name']}" in existing
    ):
        return
    kube.apply(manifest)
    _applied[key] = digest


def _sync_worker_groups(
    spec: ClusterSpec,
    owner: Mapping[str, Any],
    generation: int,
    handles: Mapping[str, Mapping[str, Any]],
) -> bool:
    """Keep each group's ResourceWorkerGroup and the cluster in step (see groups.py).
    True when a scaled handle was written into the cluster's spec."""
    todo = sync(spec, generation, handles)
    for group_name in todo.write:
        group = spec.group(group_name)
        assert group is not None
        kube.apply(worker_group_object(spec, group, owner, generation))
    for group_name in todo.remove:
        kube.delete(
            f"{GROUP}/{VERSION}",
            WORKER_GROUP_KIND,
            spec.namespace,
            handles[group_name]["metadata"]["name"],
        )
    if not todo.scaled:
        return False
    groups = [dict(g) for g in owner["spec"].get("workerGroups") or []]
    for raw in groups:
        if raw["name"] in todo.scaled:
            for key in ("minReplicas", "maxReplicas", "idleTimeoutSeconds"):
                raw.pop(key, None)
            raw["replicas"] = todo.scaled[raw["name"]]
    try:
        stored = kube.patch(
            f"{GROUP}/{VERSION}",
            "ResourceCluster",
            spec.namespace,
            spec.name,
            {
                "metadata": {"resourceVersion": owner["metadata"]["resourceVersion"]},
                "spec": {"workerGroups": groups},
            },
        )
    except kube.ApiException as exc:
        if exc.status == 409:  # the cluster changed since this body was read: next round
            return True
        raise
    for group_name, replicas in sorted(todo.scaled.items()):
        handle = handles[group_name]["metadata"]["name"]
        kube.patch(
            f"{GROUP}/{VERSION}",
            WORKER_GROUP_KIND,
            spec.namespace,
            handle,
            {"metadata": {"annotations": {SYNCED_ANNOTATION: str(stored.metadata.generation)}}},
        )
        _event(
            owner,
            type="Normal",
            reason="Scaled",
            message=f"group {group_name}: {replicas} worker(s), from {WORKER_GROUP_KIND} {handle}",
        )
    return True


def _report_worker_groups(
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


def _autoscale(
    spec: ClusterSpec,
    owner: Mapping[str, Any],
    pods: list[dict[str, Any]],
    info: Mapping[str, Any],
    before: Mapping[str, int],
    scheduler: SchedulerHttp | None,
) -> tuple[ClusterSpec, Scaling, set[str]]:
    """Decide each autoscaled group's size, remove the workers chosen to go, and return
    the spec with those sizes, what was decided, and the pods removed. ``before``: each
    group's target from the last status."""
    views, demand = observe(spec, pods, info, before, time.time())
    decision = decide(views, demand)
    connected = {w["name"] for w in info.get("workers", {}).values()}
    removed: set[str] = set()
    for group, names in decision.remove.items():
        gone = _remove_workers(owner, spec, names, connected, scheduler)
        removed |= gone
        decision.targets[group] += len(names) - len(gone)  # kept workers stay counted
    desired = {v.name: v.desired for v in views}
    for group, reason in decision.reasons.items():
        if decision.targets[group] != desired[group]:
            verb = "ScaledUp" if decision.targets[group] > desired[group] else "ScaledDown"
            metrics.scaled(spec.name, group, desired[group], decision.targets[group])
            _event(
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
    scheduler: SchedulerHttp | None,
) -> set[str]:
    """Delete pods that never connected; retire connected workers through the scheduler
    (it moves their data off first) and delete those it let go. Returns the deleted."""
    gone = {n for n in names if n not in connected}
    workers = [n for n in names if n in connected]
    if workers and scheduler is not None:
        gone |= set(_retire(owner, scheduler, workers, len(workers)))
    for pod_name in sorted(gone):
        kube.delete_pod(spec.namespace, pod_name)
    return gone


def _retire(
    owner: Mapping[str, Any], scheduler: SchedulerHttp, names: list[str], count: int
) -> list[str]:
    """Retire workers through the scheduler (their data is copied off first); returns
    those safe to stop and announces any it kept, with its reason."""
    retired, kept = kube.retire(scheduler, names, count)
    for name, why in sorted(kept.items()):
        _warn(owner, reason="RetireDeferred", message=f"worker {name} kept: {why}")
    return retired


def _ensure_token(spec: ClusterSpec, owner: Mapping[str, Any]) -> str | None:
    """The cluster's token: read once per operator process, the Secret created only when
    it does not exist (never re-posted with a token thrown away)."""
    if not spec.auth:
        return None
    uid = owner["metadata"]["uid"]
    if _tokens.get(uid) is None:
        token = kube.read_token(spec.namespace, secret_name(spec), TOKEN_KEY)
        if token is None:
            kube.create_if_absent(token_secret(spec, owner, generate_token()))
            token = kube.read_token(spec.namespace, secret_name(spec), TOKEN_KEY)
        _tokens[uid] = token
    return _tokens[uid]


def _ensure_tls(
    spec: ClusterSpec, owner: Mapping[str, Any]
) -> tuple[ssl.SSLContext | None, list[str], str]:
    """For a TLS cluster: the operator's own TLS context for the scheduler's HTTP API (the
    cluster's certificate), why workers could not connect with the Secret's certificate
    (empty when they can), and the certificate's digest. Makes the Secret (a new CA and
    certificate) once, unless the spec names one."""
    if not spec.tls:
        return None, [], ""
    name = tls.tls_secret_name(spec)
    data = _read_tls_secret(spec, owner["metadata"]["uid"])
    if data is None and spec.tls_secret_name is None:
        pem = tls.make_certificates(spec, datetime.datetime.now(datetime.timezone.utc))
        kube.create_if_absent(tls_secret(spec, owner, pem))
        data = _read_tls_secret(spec, owner["metadata"]["uid"])
    if data is None:
        missing = (
            f"TLS Secret {spec.namespace}/{name} not found: create it (e.g. a cert-manager "
            f"Certificate with secretName {name}) or remove spec.tls.secretName"
        )
        return None, [missing], ""
    found = tls.problems(spec, data, datetime.datetime.now(datetime.timezone.utc))
    context = None if found else _tls_context(owner["metadata"]["uid"], data)
    return context, found, tls.digest(data)


def _read_tls_secret(spec: ClusterSpec, uid: str) -> dict[str, str] | None:
    """The cluster's TLS Secret, read again at most every TLS_REREAD seconds once found
    (soon enough to roll the pods onto a renewed certificate, without a GET per
    reconcile)."""
    name = tls.tls_secret_name(spec)
    read_at, data = _tls_reads.get((uid, name), (0.0, None))
    if data is None or time.monotonic() - read_at > TLS_REREAD:
        data = kube.read_secret(spec.namespace, name)
        _tls_reads[(uid, name)] = (time.monotonic(), data)
    return data


def _tls_context(uid: str, data: Mapping[str, str]) -> ssl.SSLContext:
    """An SSL context presenting the cluster's certificate, kept per cluster until the
    Secret's content changes (ssl loads certificates only from files)."""
    key = (uid, hashlib.sha256(json.dumps(dict(data), sort_keys=True).encode()).hexdigest())
    if key not in _tls_contexts:
        for stale in [k for k in list(_tls_contexts) if k[0] == uid]:
            _tls_contexts.pop(stale, None)  # a renewed certificate replaces the old context
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=data[tls.CA_KEY])
        context.check_hostname = False  # the scheduler pod is reached by its IP
        with tempfile.TemporaryDirectory() as folder:
            cert, private = Path(folder, "tls.crt"), Path(folder, "tls.key")
            cert.write_text(data[tls.CERT_KEY])
            private.touch(mode=0o600)
            private.write_text(data[tls.KEY_KEY])
            context.load_cert_chain(cert, private)
        _tls_contexts[key] = context
    return _tls_contexts[key]


def _scheduler_ip(scheduler_pods: list[dict[str, Any]]) -> str | None:
    for pod in scheduler_pods:
        ip = (pod.get("status") or {}).get("podIP")
        if ip and pod_ready(pod) and not pod["metadata"].get("deletionTimestamp"):
            return str(ip)
    return None


def _carry_out(
    spec: ClusterSpec,
    owner: Mapping[str, Any],
    todo: Plan,
    scheduler: SchedulerHttp | None,
) -> list[str]:
    """Apply a plan; returns what the API server refused (quota, admission), said plainly.
    Announces what was actually done (a pod another reconcile made already is no news)."""
    failures: list[str] = []
    done = Plan()
    for pod_name in todo.delete:
        if kube.delete_pod(spec.namespace, pod_name):
            done.delete.append(pod_name)
    for group_name, index in todo.create:
        group = spec.group(group_name)
        assert group is not None
        try:
            if kube.create_if_absent(worker_pod(spec, group, index, owner)):
                done.create.append((group_name, index))
        except kube.ApiException as exc:
            failures.append(f"cannot create worker pod {group_name}-{index}: {kube.reason(exc)}")
    for down in todo.scale_down:
        if scheduler is None:
            continue  # without the scheduler we cannot tell idle workers; try next round
        retired = _retire(owner, scheduler, down.candidates, down.count)
        for pod_name in retired:
            kube.delete_pod(spec.namespace, pod_name)
        if retired:
            done.scale_down.append(dataclasses.replace(down, count=len(retired)))
    if not done.empty:
        _event(owner, type="Normal", reason="Reconciled", message=_describe(done))
    return failures


def _announce_failures(
    owner: Mapping[str, Any], previous: Mapping[str, Any], failures: list[str]
) -> None:
    if failures:
        _announce_once(owner, previous, "ChildrenCreated", "CreateFailed", "; ".join(failures))
    else:
        _forget(owner, "CreateFailed")


def _forget(owner: Mapping[str, Any], reason: str) -> None:
    """The problem announced under ``reason`` is over: announce it again if it comes back."""
    _announced.pop((owner["metadata"]["uid"], reason), None)


def _describe(todo: Plan) -> str:
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
            _warn(
                owner,
                reason="UnmetDemand",
                message=f"{demand['tasks']} task(s) wait for {demand['resources']}: "
                f"{demand.get('why') or 'no worker group has these resources'}",
            )


def _shape(demand: Mapping[str, Any]) -> tuple:
    return tuple(sorted((demand.get("resources") or {}).items()))


def _write_status(patch: kopf.Patch, previous: Mapping[str, Any], status: dict[str, Any]) -> None:
    """Patch what changed; ``lastObserved`` only every HEARTBEAT_SECONDS when nothing else
    did, so that an idle cluster costs few writes and a stale status shows its age."""
    last = previous.get("lastObserved")
    changed = {k for k in set(previous) | set(status) if k != "lastObserved"}
    changed = {k for k in changed if previous.get(k) != status.get(k)}
    if not changed and last and _age(last) < HEARTBEAT_SECONDS:
        return
    status["lastObserved"] = _now()
    for key in changed | {"lastObserved"}:
        patch.status[key] = status.get(key)


def _age(stamp: str) -> float:
    try:
        then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return float("inf")
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    return (now - then).total_seconds()
