"""What a ResourceJob makes, built by pure functions: the ResourceCluster made for it, the
submitter pod and, for Kueue, the Workload with one pod set per worker group, the
scheduler and the submitter.

The submitter pod gets the cluster's address, token and (for a TLS cluster) certificate
through the engine's own settings (``APPORTION_CLIENT__SCHEDULER_ADDRESS``,
``APPORTION_TOKEN``, ``APPORTION_COMM__TLS__*``), so that ``Client()`` inside it connects
with no arguments.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from apportion.operator import tls
from apportion.operator.jobs import (
    ADMITTED_ANNOTATION,
    GROUP,
    JOB_KIND,
    LABEL_ATTEMPT,
    LABEL_COMPONENT,
    LABEL_JOB,
    QUEUE_LABEL,
    SUBMITTER,
    VERSION,
    Job,
    submitter_name,
    workload_name,
)
from apportion.operator.manifests import (
    CONTAINER_SECURITY,
    KIND,
    POD_SECURITY,
    TOKEN_KEY,
    _merge_pod,
    _writable_tmp,
    scheduler_deployment,
    secret_name,
    worker_pod,
)
from apportion.operator.spec import ClusterSpec, Defaults, parse

Manifest = dict[str, Any]

WORKDIR = "/workdir"
SCHEDULER_POD_SET = "scheduler"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
SUBMITTER_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}}


def owner_reference(job: Job) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": JOB_KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def job_labels(job: Job, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "apportion",
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/component": component,
        LABEL_JOB: job.name,
        LABEL_COMPONENT: component,
    }


def admitted_pod_sets(job: Job) -> dict[str, Any]:
    """The pod sets Kueue admitted the job with (the annotation written on admission)."""
    text = job.annotations.get(ADMITTED_ANNOTATION)
    if not text:
        return {}
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _inject(template: Mapping[str, Any] | None, pod_set: Mapping[str, Any] | None) -> Any:
    """A pod template with a pod set's node selector and tolerations added."""
    out = copy.deepcopy(dict(template or {}))
    if not pod_set:
        return out
    spec = out.setdefault("spec", {})
    if pod_set.get("nodeSelector"):
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **pod_set["nodeSelector"]}
    if pod_set.get("tolerations"):
        spec["tolerations"] = [*(spec.get("tolerations") or []), *pod_set["tolerations"]]
    return out


def cluster_manifest(job: Job, attempt: int) -> Manifest:
    """The ResourceCluster made for one attempt of the job: owned by the job, labelled with
    the attempt, its pods placed where Kueue admitted them (when it did)."""
    spec = copy.deepcopy(job.spec["cluster"])
    pod_sets = admitted_pod_sets(job)
    if pod_sets:
        scheduler = spec.setdefault("scheduler", {})
        scheduler["template"] = _inject(scheduler.get("template"), pod_sets.get(SCHEDULER_POD_SET))
        for group in spec.get("workerGroups") or []:
            group["template"] = _inject(group.get("template"), pod_sets.get(group["name"]))
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": job.name,
            "namespace": job.namespace,
            "labels": {**job_labels(job, "cluster"), LABEL_ATTEMPT: str(attempt)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def _cluster_spec(cluster: Mapping[str, Any], defaults: Defaults) -> ClusterSpec:
    meta = cluster["metadata"]
    return parse(meta["name"], meta["namespace"], cluster.get("spec") or {}, defaults)


def submitter_pod(
    job: Job, cluster: Mapping[str, Any], attempt: int, defaults: Defaults
) -> Manifest:
    """The pod running the entrypoint of one attempt against ``cluster``."""
    spec = _cluster_spec(cluster, defaults)
    image = (cluster.get("status") or {}).get("image") or spec.image
    env: list[dict[str, Any]] = [
        {"name": "APPORTION_CLIENT__SCHEDULER_ADDRESS", "value": spec.scheduler_address},
        {"name": "APPORTION_JOB_NAME", "value": job.name},
        {"name": "APPORTION_JOB_ATTEMPT", "value": str(attempt)},
    ]
    if spec.auth:
        ref = {"name": secret_name(spec), "key": TOKEN_KEY}
        env.append({"name": "APPORTION_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    container: dict[str, Any] = {
        "name": SUBMITTER,
        "image": image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(job.spec["entrypoint"]),
        "env": env,
    }
    pod: Manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": submitter_name(job, attempt),
            "namespace": job.namespace,
            "labels": {**job_labels(job, SUBMITTER), LABEL_ATTEMPT: str(attempt)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [container],
            "volumes": [],
            **(
                {"imagePullSecrets": [{"name": s} for s in spec.image_pull_secrets]}
                if spec.image_pull_secrets
                else {}
            ),
        },
    }
    container["volumeMounts"] = []
    if spec.tls:
        pod["spec"]["volumes"].append(tls.volume(spec))
        container["volumeMounts"].append(dict(tls.MOUNT))
        container["env"] += tls.env(check_hostname=True)
    folder = (job.spec.get("workingDir") or {}).get("configMap")
    if folder:
        pod["spec"]["volumes"].append({"name": "workdir", "configMap": {"name": folder}})
        container["volumeMounts"].append({"name": "workdir", "mountPath": WORKDIR})
        container["workingDir"] = WORKDIR
    _writable_tmp(pod, container)
    template = _inject(job.spec.get("template"), admitted_pod_sets(job).get(SUBMITTER))
    defaults_of_container = {
        "resources": SUBMITTER_RESOURCES,
        "securityContext": CONTAINER_SECURITY,
    }
    merged = _merge_pod(template, pod, SUBMITTER, defaults_of_container)
    their_image = next(
        (
            c.get("image")
            for c in (template.get("spec") or {}).get("containers") or []
            if c.get("name") in (SUBMITTER, None) and c.get("image")
        ),
        None,
    )
    if their_image:  # the template's image wins over the cluster's
        merged["spec"]["containers"][0]["image"] = their_image
    merged["spec"].setdefault("securityContext", dict(POD_SECURITY))
    return merged


# ----- Kueue --------------------------------------------------------------------------------


def _pod_set(name: str, count: int, pod: Mapping[str, Any]) -> dict[str, Any]:
    """A Workload pod set from one of the pods it stands for (what it requests counts)."""
    template = {
        "metadata": {"labels": dict(pod["metadata"].get("labels") or {})},
        "spec": copy.deepcopy(dict(pod["spec"])),
    }
    return {"name": name, "count": count, "template": template}


def pod_sets(job: Job, defaults: Defaults) -> list[dict[str, Any]]:
    """One pod set per worker group (at its largest size), the scheduler and the
    submitter: what Kueue counts against the queue's quota."""
    found: list[dict[str, Any]] = []
    placeholder = {"metadata": {"name": job.name, "uid": job.uid or "0"}}
    if job.makes_cluster:
        cluster = {
            "metadata": {"name": job.name, "namespace": job.namespace},
            "spec": job.spec["cluster"],
        }
        spec = _cluster_spec(cluster, defaults)
        scheduler = scheduler_deployment(spec, placeholder)["spec"]["template"]
        found.append(_pod_set(SCHEDULER_POD_SET, 1, scheduler))
        for group in spec.groups:
            size = max(group.replicas, group.max_replicas)
            if size > 0:
                found.append(_pod_set(group.name, size, worker_pod(spec, group, 0, placeholder)))
        submitter_cluster = cluster
    else:
        name = (job.spec.get("clusterSelector") or {}).get("name") or job.name
        submitter_cluster = {"metadata": {"name": name, "namespace": job.namespace}, "spec": {}}
    submitter = submitter_pod(job, submitter_cluster, 1, defaults)
    found.append(_pod_set(SUBMITTER, 1, submitter))
    return found


def workload_manifest(job: Job, defaults: Defaults) -> Manifest:
    """The Kueue Workload standing for the job, owned by it (Kueue's external-framework
    contract: the framework's controller makes the Workload, Kueue admits it)."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job),
            "namespace": job.namespace,
            "labels": {
                QUEUE_LABEL: job.queue or "",
                LABEL_JOB: job.name,
            },
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {"queueName": job.queue or "", "podSets": pod_sets(job, defaults)},
    }


def admitted_details(
    workload: Mapping[str, Any], flavors: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """Per pod set, the node selector and tolerations of the ResourceFlavors the Workload
    was admitted with (``flavors``: flavor name -> its spec), as Kueue's own job
    integrations inject them."""
    out: dict[str, Any] = {}
    admission = (workload.get("status") or {}).get("admission") or {}
    for assignment in admission.get("podSetAssignments") or []:
        selector: dict[str, str] = {}
        tolerations: list[Any] = []
        for flavor_name in sorted(set((assignment.get("flavors") or {}).values())):
            flavor = flavors.get(flavor_name) or {}
            selector.update(flavor.get("nodeLabels") or {})
            tolerations += [t for t in flavor.get("tolerations") or [] if t not in tolerations]
        entry: dict[str, Any] = {}
        if selector:
            entry["nodeSelector"] = selector
        if tolerations:
            entry["tolerations"] = tolerations
        out[assignment["name"]] = entry
    return out
