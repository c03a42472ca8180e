"""kopf handlers of ResourceJobs: observe, ``jobs.decide``, write the status, act.

A round per change of the job and per timer tick: it reads the job's cluster and submitter
pods from watch-fed indexes, the entrypoint's last lines from the pod's log (at most every
LOG_EVERY seconds while it runs, once when it ended), and for a job with a Kueue queue
label its Workload and the ResourceFlavors it was admitted with. The new status is written
onto the version of the job the round read; only when that succeeded are the decided
actions carried out (a round that read an old version acts on nothing: the next round
decides again). What the job made is owned by it (ownerReferences): a deleted job takes
its cluster and submitter pods with it, through the garbage collector.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from apportion.operator import job_manifests, jobs, kube, leadership
from apportion.operator.events import event
from apportion.operator.manifests import GROUP, PLURAL, VERSION
from apportion.operator.settings import OperatorSettings
from kubernetes import client
from kubernetes.dynamic.exceptions import ResourceNotFoundError

logger = logging.getLogger("apportion.operator")

SETTINGS = OperatorSettings.from_config()
MEMO_KEY = "apportion_job"
LOG_EVERY = 10.0  # seconds between reads of a running entrypoint's log
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
# Jobs told that Kueue is missing (once per job and operator process).
_told_kueue_missing: set[str] = set()


@dataclass(eq=False)
class JobMemo:
    lock: threading.Lock = field(default_factory=threading.Lock)
    gone: threading.Event = field(default_factory=threading.Event)
    # The log tail last read, of which pod, when, and whether the pod had ended by then.
    log_pod: str = ""
    log_at: float = 0.0
    log_final: bool = False
    log_tail: str | None = None


def job_memo(memo: MutableMapping[str, Any]) -> JobMemo:
    found = memo.get(MEMO_KEY)
    if found is None:
        found = memo.setdefault(MEMO_KEY, JobMemo())
    assert isinstance(found, JobMemo)
    return found


@kopf.index("pods", labels={jobs.LABEL_COMPONENT: jobs.SUBMITTER})
def submitter_pods(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str | None], kopf.Body]:
    """Every submitter pod, by (namespace, job)."""
    return {(namespace, labels.get(jobs.LABEL_JOB)): body}


@kopf.index(GROUP, VERSION, PLURAL)
def clusters_by_name(
    namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], kopf.Body]:
    """Every ResourceCluster, by (namespace, name): the one a job runs on."""
    return {(namespace, name): body}


@kopf.on.create(GROUP, VERSION, jobs.JOB_PLURAL)
@kopf.on.update(GROUP, VERSION, jobs.JOB_PLURAL)
@kopf.on.resume(GROUP, VERSION, jobs.JOB_PLURAL)
def on_job_change(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    reconcile_job(body, job_memo(memo), kwargs)


def _job_alive(memo: MutableMapping[str, Any], **_: Any) -> bool:
    found = memo.get(MEMO_KEY)
    return not (isinstance(found, JobMemo) and found.gone.is_set())


@kopf.timer(GROUP, VERSION, jobs.JOB_PLURAL, interval=SETTINGS.interval, when=_job_alive)
def on_job_timer(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    reconcile_job(body, job_memo(memo), kwargs, wait=False)


def _deleted(type: str | None, **_: Any) -> bool:
    return type == "DELETED"


@kopf.on.event(GROUP, VERSION, jobs.JOB_PLURAL, when=_deleted)
def on_job_deleted(memo: MutableMapping[str, Any], **_: Any) -> None:
    """A deleted job is never acted on again; what it made goes with it (ownerReferences)."""
    job_memo(memo).gone.set()


# ----- one round ----------------------------------------------------------------------------


def reconcile_job(
    body: Mapping[str, Any], memo: JobMemo, indexes: Mapping[str, Any], wait: bool = True
) -> None:
    if memo.gone.is_set() or body["metadata"].get("deletionTimestamp"):
        return
    if not leadership.may_act() or not memo.lock.acquire(blocking=wait):
        return
    try:
        taken = copy.deepcopy(
            {
                "apiVersion": body.get("apiVersion"),
                "kind": body.get("kind"),
                "metadata": dict(body["metadata"]),
                "spec": dict(body.get("spec") or {}),
                "status": dict(body.get("status") or {}),
            }
        )
        job = jobs.Job.of(taken)
        seen = observe(job, memo, indexes)
        decision = jobs.decide(job, seen, time.time())
        if memo.gone.is_set() or not leadership.may_act():
            return
        if not write_status(taken, decision.status):
            return
        for action in decision.actions:
            if memo.gone.is_set():
                return
            carry_out(taken, job, seen, action)
    except Exception:
        logger.exception("reconcile of job %s/%s failed", *_key(body))
    finally:
        memo.lock.release()


def _key(body: Mapping[str, Any]) -> tuple[str, str]:
    return body["metadata"].get("namespace", ""), body["metadata"].get("name", "")


def observe(job: jobs.Job, memo: JobMemo, indexes: Mapping[str, Any]) -> jobs.Seen:
    cluster = next(
        iter(indexes["clusters_by_name"].get((job.namespace, job.cluster_name), ())), None
    )
    pods = tuple(indexes["submitter_pods"].get((job.namespace, job.name), ()))
    workload = flavors = None
    if job.queue:
        workload = _get_workload(job)
        if workload is not None and jobs.admitted(workload):
            flavors = job_manifests.admitted_details(workload, _flavors_of(workload))
    return jobs.Seen(
        cluster=cluster,
        pods=pods,
        log_tail=_log_tail(job, memo, pods),
        workload=workload,
        admitted_pod_sets=flavors,
    )


def _log_tail(job: jobs.Job, memo: JobMemo, pods: tuple[Mapping[str, Any], ...]) -> str | None:
    """The current submitter's last lines: every LOG_EVERY s while it runs, once at its end."""
    attempt = int(job.status.get("attempts") or 0)
    name = jobs.submitter_name(job, attempt)
    pod = next((p for p in pods if p["metadata"]["name"] == name), None)
    if pod is None:
        return None
    phase = (pod.get("status") or {}).get("phase")
    if phase not in ("Running", "Succeeded", "Failed"):
        return None
    ended = phase != "Running"
    same = memo.log_pod == name
    if same and (memo.log_final or (not ended and time.monotonic() - memo.log_at < LOG_EVERY)):
        return memo.log_tail
    try:
        text = client.CoreV1Api(kube.api_client()).read_namespaced_pod_log(
            name, job.namespace, container=jobs.SUBMITTER, tail_lines=jobs.LOG_TAIL_LINES
        )
    except kube.ApiException as exc:
        logger.debug("log of %s/%s not read: %s", job.namespace, name, exc.reason)
        return memo.log_tail if same else None
    memo.log_pod, memo.log_at, memo.log_final = name, time.monotonic(), ended
    memo.log_tail = jobs.tail(str(text or ""))
    return memo.log_tail


def _get_workload(job: jobs.Job) -> dict[str, Any] | None:
    try:
        found = (
            kube.dynamic()
            .resources.get(api_version=f"{KUEUE_GROUP}/{KUEUE_VERSION}", kind="Workload")
            .get(name=jobs.workload_name(job), namespace=job.namespace)
        )
    except ResourceNotFoundError:
        return None  # Kueue is not installed: the job stays Queued (CreateWorkload says so)
    except kube.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(found.to_dict())


def _flavors_of(workload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    admission = (workload.get("status") or {}).get("admission") or {}
    names = {
        name
        for assignment in admission.get("podSetAssignments") or []
        for name in (assignment.get("flavors") or {}).values()
    }
    resource = kube.dynamic().resources.get(
        api_version=f"{KUEUE_GROUP}/{KUEUE_VERSION}", kind="ResourceFlavor"
    )
    out: dict[str, Mapping[str, Any]] = {}
    for name in sorted(names):
        try:
            out[name] = dict(resource.get(name=name).to_dict().get("spec") or {})
        except kube.ApiException as exc:
            if exc.status != 404:
                raise
    return out


def write_status(taken: Mapping[str, Any], status: dict[str, Any]) -> bool:
    """Write what changed of the status onto the version read; False when the job changed
    since (or is gone): then this round does nothing."""
    previous = taken["status"]
    changed = {
        k: status.get(k) for k in set(previous) | set(status) if previous.get(k) != status.get(k)
    }
    if not changed:
        return True
    meta = taken["metadata"]
    try:
        kube.patch_status(
            f"{GROUP}/{VERSION}",
            jobs.JOB_KIND,
            meta["namespace"],
            meta["name"],
            changed,
            resource_version=meta["resourceVersion"],
        )
    except kube.ApiException as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


def carry_out(
    taken: Mapping[str, Any], job: jobs.Job, seen: jobs.Seen, action: jobs.Action
) -> None:
    namespace = job.namespace
    if isinstance(action, jobs.Event):
        event(taken, type=action.type, reason=action.reason, message=action.message)
    elif isinstance(action, jobs.CreateCluster):
        kube.create_if_absent(job_manifests.cluster_manifest(job, action.attempt))
    elif isinstance(action, jobs.DeleteCluster):
        kube.delete(f"{GROUP}/{VERSION}", "ResourceCluster", namespace, action.name)
    elif isinstance(action, jobs.CreateSubmitter):
        assert seen.cluster is not None
        pod = job_manifests.submitter_pod(job, seen.cluster, action.attempt, SETTINGS.defaults)
        kube.create_if_absent(pod)
    elif isinstance(action, jobs.DeletePod):
        kube.delete_pod(namespace, action.name)
    elif isinstance(action, jobs.DeleteJob):
        kube.delete(f"{GROUP}/{VERSION}", jobs.JOB_KIND, namespace, job.name)
    elif isinstance(action, jobs.CreateWorkload):
        try:
            kube.create_if_absent(job_manifests.workload_manifest(job, SETTINGS.defaults))
        except ResourceNotFoundError:
            if job.uid in _told_kueue_missing:
                return
            _told_kueue_missing.add(job.uid)
            event(
                taken,
                type="Warning",
                reason="KueueMissing",
                message=f"label {jobs.QUEUE_LABEL} names a Kueue queue, but this cluster "
                f"serves no {KUEUE_GROUP}/{KUEUE_VERSION} Workload: install Kueue",
            )
    elif isinstance(action, jobs.SetSuspend):
        annotation = json.dumps(action.pod_sets, sort_keys=True) if not action.suspend else None
        kube.patch(
            f"{GROUP}/{VERSION}",
            jobs.JOB_KIND,
            namespace,
            job.name,
            {
                "metadata": {"annotations": {jobs.ADMITTED_ANNOTATION: annotation}},
                "spec": {"suspend": action.suspend},
            },
        )
    elif isinstance(action, jobs.FinishWorkload):
        _workload_conditions(
            seen.workload, [("Finished", "True", action.reason or "Finished", action.message)]
        )
    elif isinstance(action, jobs.ReleaseWorkload):
        _workload_conditions(
            seen.workload,
            [
                ("QuotaReserved", "False", "Pending", action.message),
                ("Admitted", "False", "NoReservation", "the job was stopped"),
            ],
            release=True,
        )


def _workload_conditions(
    workload: Mapping[str, Any] | None,
    conditions: list[tuple[str, str, str, str]],
    release: bool = False,
) -> None:
    """Set conditions on the Workload's status (and with ``release`` drop its admission):
    the parts of Kueue's job-integration contract a framework's controller writes."""
    if workload is None:
        return
    meta = workload["metadata"]
    stamp = jobs.stamp(time.time())
    kinds = {kind for kind, *_ in conditions}
    kept = [
        c for c in (workload.get("status") or {}).get("conditions") or [] if c["type"] not in kinds
    ]
    new = [
        {
            "type": kind,
            "status": state,
            "reason": reason,
            "message": message or reason,
            "lastTransitionTime": stamp,
            "observedGeneration": meta.get("generation") or 1,
        }
        for kind, state, reason, message in conditions
    ]
    status: dict[str, Any] = {"conditions": [*kept, *new]}
    if release:
        status["admission"] = None
    try:
        kube.patch_status(
            f"{KUEUE_GROUP}/{KUEUE_VERSION}", "Workload", meta["namespace"], meta["name"], status
        )
    except kube.ApiException as exc:
        if exc.status != 404:
            raise
