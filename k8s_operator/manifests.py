"""Every child object of a ResourceCluster, built by pure functions of its spec.

Children: a Secret with the cluster's token, the scheduler Deployment and Service,
and one Pod per worker. All carry an ownerReference to the ResourceCluster (deleting
it deletes them) and ``app.kubernetes.io/*`` + ``apportion.dev/*`` labels. Pod
commands are explicit ``apportion ...`` invocations, never an image's entrypoint.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from apportion.operator import tls
from apportion.operator.spec import ClusterSpec, GroupSpec

GROUP = "apportion.dev"
VERSION = "v1alpha1"
KIND = "ResourceCluster"
PLURAL = "resourceclusters"
LABEL_CLUSTER = "apportion.dev/cluster"
LABEL_GROUP = "apportion.dev/group"
LABEL_TLS = "apportion.dev/tls"
HASH_ANNOTATION = "apportion.dev/spec-hash"
TOKEN_KEY = "token"

Manifest = dict[str, Any]

# What every pod the operator makes starts from; a template's own values win, key by key.
# A non-root user (the image's), no privilege escalation, no capabilities, the runtime's
# seccomp profile and a read-only root filesystem with a writable /tmp: what a hardened
# cluster (Pod Security "restricted", kube-score) asks of a pod. fsGroup lets that user read
# the mounted Secrets (the token, the TLS certificate).
IMAGE_USER = 10001  # the image's USER (Dockerfile)
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": IMAGE_USER,
    "runAsGroup": IMAGE_USER,
    "fsGroup": IMAGE_USER,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": IMAGE_USER,
    "runAsGroup": IMAGE_USER,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}
# Requests so that the Kubernetes scheduler places pods by what they use; the scheduler's
# memory limit bounds a runaway (its books are small: about 1 KiB per task). No CPU limit:
# a throttled event loop answers heartbeats late. Workers get no memory or disk limit of
# ours: what they hold is the user's data (declare MEMORY, or set limits in the template).
SCHEDULER_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "250m", "memory": "256Mi", "ephemeral-storage": "256Mi"},
    "limits": {"memory": "2Gi", "ephemeral-storage": "1Gi"},
}
WORKER_REQUESTS = {"memory": "512Mi", "ephemeral-storage": "256Mi"}  # cpu: one per thread


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(spec: ClusterSpec, component: str, group: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "apportion",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "apportion-operator",
        LABEL_CLUSTER: spec.name,
    }
    if group is not None:
        out[LABEL_GROUP] = group
    return out


def selector(spec: ClusterSpec, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": spec.name, "app.kubernetes.io/component": component}


def _metadata(
    spec: ClusterSpec, name: str, owner: Mapping[str, Any], component: str, group: str | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": spec.namespace,
        "labels": labels(spec, component, group),
        "ownerReferences": [owner_reference(owner)],
    }


def secret_name(spec: ClusterSpec) -> str:
    return f"{spec.name}-token"


def token_secret(spec: ClusterSpec, owner: Mapping[str, Any], token: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, secret_name(spec), owner, "auth"),
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def tls_secret(spec: ClusterSpec, owner: Mapping[str, Any], pem: Mapping[str, str]) -> Manifest:
    """The cluster's CA and certificate (``tls.make_certificates``), as cert-manager
    would write them."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, tls.tls_secret_name(spec), owner, "tls"),
        "type": "kubernetes.io/tls",
        "stringData": dict(pem),
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _auth_env(spec: ClusterSpec) -> list[dict[str, Any]]:
    if not spec.auth:
        return []
    ref = {"name": secret_name(spec), "key": TOKEN_KEY}
    return [{"name": "APPORTION_TOKEN", "valueFrom": {"secretKeyRef": ref}}]


def _merge_pod(
    template: Mapping[str, Any],
    generated: Manifest,
    container_name: str,
    defaults: Mapping[str, Any] | None = None,
    pod_defaults: Mapping[str, Any] | None = None,
) -> Manifest:
    """Lay our pod over the user's template: their extras stay, our essentials win, and
    ``defaults`` (container fields: resources, securityContext, probes) fill in what
    neither says. The pod's securityContext defaults to POD_SECURITY, field by field."""
    template = _with_defaults(template, container_name, defaults or {}, pod_defaults or {})
    merged = copy.deepcopy(generated)
    meta = template.get("metadata") or {}
    merged["metadata"].setdefault("labels", {})
    merged["metadata"]["labels"] = {**(meta.get("labels") or {}), **merged["metadata"]["labels"]}
    if meta.get("annotations"):
        merged["metadata"]["annotations"] = {
            **meta["annotations"],
            **merged["metadata"].get("annotations", {}),
        }
    theirs = copy.deepcopy(dict(template.get("spec") or {}))
    their_containers = theirs.pop("containers", []) or []
    ours = merged["spec"]["containers"][0]
    mine = next(
        (c for c in their_containers if c.get("name") == container_name),
        their_containers[0] if their_containers else {},
    )
    container = {**mine, **{k: v for k, v in ours.items() if k not in ("env", "resources")}}
    container["name"] = container_name
    container["env"] = ours.get("env", []) + [
        e for e in mine.get("env", []) if e["name"] not in {x["name"] for x in ours["env"]}
    ]
    resources = copy.deepcopy(mine.get("resources") or {})
    for kind in ("requests", "limits"):
        wanted = (ours.get("resources") or {}).get(kind) or {}
        if wanted:
            resources[kind] = {**resources.get(kind, {}), **wanted}
    if resources:
        container["resources"] = resources
    if "volumeMounts" in ours:
        container["volumeMounts"] = _by_name(mine.get("volumeMounts"), ours["volumeMounts"])
    sidecars = [c for c in their_containers if c is not mine]
    merged["spec"] = {**theirs, **merged["spec"], "containers": [container, *sidecars]}
    if "volumes" in generated["spec"]:
        merged["spec"]["volumes"] = _by_name(theirs.get("volumes"), generated["spec"]["volumes"])
    return merged


def _with_defaults(
    template: Mapping[str, Any],
    container_name: str,
    defaults: Mapping[str, Any],
    pod_defaults: Mapping[str, Any],
) -> dict[str, Any]:
    """The template with our defaults under its own values (maps merged one level down:
    a template setting only ``resources.limits.cpu`` keeps the default requests)."""
    merged = copy.deepcopy(dict(template))
    pod = {**pod_defaults, **(merged.get("spec") or {})}
    pod["securityContext"] = {**POD_SECURITY, **(pod.get("securityContext") or {})}
    containers = [dict(c) for c in pod.get("containers") or []]
    index = next(
        (i for i, c in enumerate(containers) if c.get("name") == container_name),
        0 if containers else None,
    )
    if index is None:
        containers.append({})
        index = 0
    mine = containers[index]
    for key, value in defaults.items():
        if isinstance(value, Mapping) and key in ("resources", "securityContext"):
            theirs = mine.get(key) or {}
            if key == "resources":
                # A resource the template limits gets no default request: Kubernetes
                # takes the limit for it (a default above the limit would be refused).
                limited = set(theirs.get("limits") or {})
                requests = {k: v for k, v in value.get("requests", {}).items() if k not in limited}
                mine[key] = {
                    kind: {**defaults_of_kind, **(theirs.get(kind) or {})}
                    for kind, defaults_of_kind in (
                        ("requests", requests),
                        ("limits", dict(value.get("limits", {}))),
                    )
                    if defaults_of_kind or theirs.get(kind)
                }
            else:
                mine[key] = {**value, **theirs}
        else:
            mine.setdefault(key, copy.deepcopy(value))
    containers[index] = mine
    pod["containers"] = containers
    merged["spec"] = pod
    return merged


def _pod_defaults(spec: ClusterSpec) -> dict[str, Any]:
    """Pod fields the operator's settings give pods whose template says nothing of them."""
    return {"priorityClassName": spec.priority_class_name} if spec.priority_class_name else {}


def _writable_tmp(pod: Manifest, container: dict[str, Any]) -> None:
    """A writable /tmp under the read-only root filesystem (spilled results, sockets)."""
    pod["spec"]["volumes"] = [*pod["spec"].get("volumes", []), dict(TMP_VOLUME)]
    container["volumeMounts"] = [*container.get("volumeMounts", []), dict(TMP_MOUNT)]


TENANTS_PATH = "/etc/apportion/tenants"


def _with_tenants(spec: ClusterSpec, pod: Manifest, container: dict[str, Any]) -> None:
    """Each tenant's token Secret mounted into the scheduler, and its settings
    (``scheduler.tenants.<name>.*``) pointing at it."""
    for tenant in spec.tenants:
        volume = f"tenant-{tenant.name.lower().replace('_', '-')}"
        pod["spec"]["volumes"].append(
            {
                "name": volume,
                "secret": {
                    "secretName": tenant.secret_name,
                    "items": [{"key": tenant.secret_key, "path": "token"}],
                    "defaultMode": 0o400,
                },
            }
        )
        container["volumeMounts"].append(
            {"name": volume, "mountPath": f"{TENANTS_PATH}/{tenant.name}", "readOnly": True}
        )
        prefix = f"APPORTION_SCHEDULER__TENANTS__{tenant.name}__"
        container["env"] += [
            {"name": f"{prefix}TOKEN_FILE", "value": f"{TENANTS_PATH}/{tenant.name}/token"},
            {"name": f"{prefix}WEIGHT", "value": f"{tenant.weight:g}"},
            *(
                {"name": f"{prefix}QUOTA__{resource}", "value": f"{amount:g}"}
                for resource, amount in tenant.quota
            ),
        ]


def _by_name(theirs: list[dict[str, Any]] | None, ours: list[dict[str, Any]]) -> list[Any]:
    """Their entries (volumes, mounts) and ours; ours replace theirs of the same name."""
    names = {entry["name"] for entry in ours}
    return [e for e in theirs or [] if e.get("name") not in names] + copy.deepcopy(ours)


def _pull_secrets(spec: ClusterSpec) -> dict[str, Any]:
    if not spec.image_pull_secrets:
        return {}
    return {"imagePullSecrets": [{"name": name} for name in spec.image_pull_secrets]}


def _with_tls(
    spec: ClusterSpec, pod: Manifest, container: dict[str, Any], check_hostname: bool
) -> None:
    """Mount the cluster's certificate into the pod's container and point the engine's
    comm.tls.* settings at it (every connection, the HTTP API included, is then mutual TLS)."""
    if not spec.tls:
        return
    pod["spec"]["volumes"] = [tls.volume(spec)]
    container["volumeMounts"] = [dict(tls.MOUNT)]
    container["env"] += tls.env(check_hostname)
    if spec.tls_digest:
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations[tls.DIGEST_ANNOTATION] = spec.tls_digest


# Ready means connected to the scheduler: the worker answers GET /ready itself
# (worker/readiness.py) on its pod IP. An httpGet probe is made by the kubelet, so a check
# starts no process in the pod: an exec probe would, through the container runtime, every
# period for every worker of the node (a Python start each, when it asked the scheduler).
WORKER_READINESS_PORT = 8788
WORKER_READINESS = {
    "httpGet": {"path": "/ready", "port": "readiness"},
    "periodSeconds": 5,
    # Not the default 1 s: a busy node answers late, and a pod that flaps out of Ready
    # says a connected worker is not.
    "timeoutSeconds": 5,
}


def scheduler_deployment(spec: ClusterSpec, owner: Mapping[str, Any]) -> Manifest:
    args = [
        "scheduler",
        "--host",
        "0.0.0.0",
        "--port",
        str(spec.port),
        "--http-port",
        str(spec.http_port),
    ]
    if not spec.auth:
        args.append("--no-auth")
    container = {
        "name": "scheduler",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["apportion"],
        "args": args,
        "env": [_field_env("APPORTION_CONTACT_HOST", "status.podIP"), *_auth_env(spec)],
        "ports": [
            {"name": "comm", "containerPort": spec.port},
            {"name": "http-status", "containerPort": spec.http_port},
        ],
        # Over mutual TLS the kubelet, which has no client certificate, can only see the
        # port open.
        "readinessProbe": {
            **(
                {"tcpSocket": {"port": spec.http_port}}
                if spec.tls
                else {"httpGet": {"path": "/health", "port": spec.http_port}}
            ),
            "periodSeconds": 2,
            # Not the default 1 s: a busy node (many clusters starting at once) answers late,
            # and an unready scheduler drops out of its Service, so no worker can reach it.
            "timeoutSeconds": 5,
        },
    }
    pod_labels = labels(spec, "scheduler")
    if spec.tls:
        pod_labels[LABEL_TLS] = "true"  # Prometheus scrapes it over https (the chart)
    pod = {
        "metadata": {"labels": pod_labels},
        "spec": {"containers": [container], **_pull_secrets(spec)},
    }
    _with_tls(spec, pod, container, check_hostname=True)
    _writable_tmp(pod, container)
    _with_tenants(spec, pod, container)
    liveness = {
        **(
            {"tcpSocket": {"port": spec.http_port}}
            if spec.tls
            else {"httpGet": {"path": "/health", "port": spec.http_port}}
        ),
        # A minute of silence, not a slow answer, restarts it: workers and clients
        # reconnect to the new one and it rebuilds its books from them.
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 6,
    }
    defaults = {
        "resources": SCHEDULER_RESOURCES,
        "securityContext": CONTAINER_SECURITY,
        "livenessProbe": liveness,
    }
    pod = _merge_pod(spec.scheduler_template, pod, "scheduler", defaults, _pod_defaults(spec))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(spec, spec.scheduler_service, owner, "scheduler"),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two schedulers for one cluster
            "selector": {"matchLabels": selector(spec, "scheduler")},
            "template": pod,
        },
    }


def scheduler_service(spec: ClusterSpec, owner: Mapping[str, Any]) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, spec.scheduler_service, owner, "scheduler"),
        "spec": {
            "type": spec.service_type,
            "selector": selector(spec, "scheduler"),
            "ports": [
                {"name": "comm", "port": spec.port, "targetPort": spec.port},
                {"name": "http-status", "port": spec.http_port, "targetPort": spec.http_port},
            ],
        },
    }


def group_hash(spec: ClusterSpec, group: GroupSpec) -> str:
    """Changes whenever a group's pods must be replaced (resources, threads, image, template)."""
    relevant = {
        "image": spec.image,
        "policy": spec.image_pull_policy,
        "auth": spec.auth,
        "address": spec.scheduler_address,
        "nthreads": group.nthreads,
        "advertised": group.advertised,
        "limits": group.limits,
        "template": group.template,
    }
    if spec.image_pull_secrets:  # only when set: existing pods keep their hash otherwise
        relevant["pullSecrets"] = list(spec.image_pull_secrets)
    if spec.tls:
        relevant["tlsSecret"] = tls.tls_secret_name(spec)
        relevant["tlsDigest"] = spec.tls_digest
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def worker_pod_name(spec: ClusterSpec, group: GroupSpec, index: int) -> str:
    return f"{spec.name}-{group.name}-{index}"


def worker_command(spec: ClusterSpec, group: GroupSpec) -> list[str]:
    resources = ",".join(f"{k}={v!r}" for k, v in sorted(group.advertised.items()))
    command = [
        "apportion",
        "worker",
        spec.scheduler_address,
        "--name",
        "$(POD_NAME)",
        "--nthreads",
        str(group.nthreads),
        "--host",
        "0.0.0.0",
        "--contact-host",
        "$(POD_IP)",
    ]
    if resources:
        command += ["--resources", resources]
    if not spec.auth:
        command.append("--no-auth")
    return command


def worker_pod(
    spec: ClusterSpec, group: GroupSpec, index: int, owner: Mapping[str, Any]
) -> Manifest:
    command = worker_command(spec, group)
    container: dict[str, Any] = {
        "name": "worker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": command[:1],
        "args": command[1:],
        "env": [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_IP", "status.podIP"),
            {"name": "APPORTION_WORKER__READINESS_PORT", "value": str(WORKER_READINESS_PORT)},
            *_auth_env(spec),
        ],
        "ports": [{"name": "readiness", "containerPort": WORKER_READINESS_PORT}],
        "readinessProbe": WORKER_READINESS,
    }
    if group.limits:
        # Extended resources (GPUs) need requests == limits; memory gets both for a
        # guaranteed amount.
        container["resources"] = {"requests": dict(group.limits), "limits": dict(group.limits)}
    generated = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **_metadata(spec, worker_pod_name(spec, group, index), owner, "worker", group.name),
            "annotations": {HASH_ANNOTATION: group_hash(spec, group)},
        },
        "spec": {"restartPolicy": "Always", "containers": [container], **_pull_secrets(spec)},
    }
    _with_tls(spec, generated, container, check_hostname=False)  # peers are reached by IP
    _writable_tmp(generated, container)
    defaults = {
        "resources": {"requests": {"cpu": str(group.nthreads), **WORKER_REQUESTS}},
        "securityContext": CONTAINER_SECURITY,
    }
    return _merge_pod(group.template, generated, "worker", defaults, _pod_defaults(spec))


WORKER_GROUP_KIND, WORKER_GROUP_PLURAL = "ResourceWorkerGroup", "resourceworkergroups"
# The cluster generation a ResourceWorkerGroup's replicas were last taken from.
SYNCED_ANNOTATION = "apportion.dev/cluster-generation"


def worker_group_name(spec: ClusterSpec, group: GroupSpec) -> str:
    return f"{spec.name}-{group.name}"


def group_selector(spec: ClusterSpec, group: GroupSpec) -> str:
    """Label selector of a group's worker pods, as a string (a scale subresource's)."""
    return f"{LABEL_CLUSTER}={spec.name},{LABEL_GROUP}={group.name}"


def worker_group_object(
    spec: ClusterSpec, group: GroupSpec, owner: Mapping[str, Any], generation: int
) -> Manifest:
    """The ResourceWorkerGroup of a group: its replicas as the cluster's spec says at
    ``generation``."""
    metadata = _metadata(spec, worker_group_name(spec, group), owner, "worker-group", group.name)
    metadata["annotations"] = {SYNCED_ANNOTATION: str(generation)}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": WORKER_GROUP_KIND,
        "metadata": metadata,
        "spec": {"cluster": spec.name, "group": group.name, "replicas": group.replicas},
    }
