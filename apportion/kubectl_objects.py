"""What ``kubectl apportion`` reads and writes, as pure functions: the ``--group`` syntax,
the ResourceCluster, ResourceJob and working-directory ConfigMap it creates, the rows it
prints and the story of why something failed. The commands (``kubectl_plugin.py``) do the
talking to Kubernetes."""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.resources import format_usage, parse_spec

GROUP, VERSION = "apportion.dev", "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CLUSTERS, JOBS = "resourceclusters", "resourcejobs"
KINDS = {CLUSTERS: "ResourceCluster", JOBS: "ResourceJob"}
JOB_LABEL, COMPONENT_LABEL = "apportion.dev/job", "apportion.dev/component"
CLUSTER_LABEL = "apportion.dev/cluster"
POD_COMPONENT = "app.kubernetes.io/component"  # scheduler | worker, on a cluster's pods
# A ConfigMap holds at most 1 MiB in all (etcd's object limit, less room for metadata).
WORKDIR_LIMIT = 1_000_000
# Skipped when a working directory is uploaded: caches and version control, never the code.
WORKDIR_SKIPPED = {"__pycache__", ".git", ".hg", ".svn", ".venv", ".mypy_cache", ".pytest_cache"}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

GROUP_SYNTAX = (
    "NAME:REPLICAS[:RESOURCES], e.g. gpu:2:GPU=2 or highmem:1:MEMORY=100e9,process=1; "
    "REPLICAS may be MIN-MAX (e.g. 0-4) to let the operator scale the group"
)


def parse_group(text: str) -> dict[str, Any]:
    """One ``--group`` value as a worker group of a ResourceCluster spec.

    ``gpu:2:GPU=2`` is two workers advertising GPU=2; ``cpu:0-4`` a group the operator
    scales between 0 and 4 workers. Raises ValueError saying what is wrong, with the
    syntax."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"{text!r} is not a worker group: expected {GROUP_SYNTAX}")
    name, size = parts[0].strip(), parts[1].strip()
    if not _NAME.match(name) or len(name) > 40:
        raise ValueError(
            f"{text!r}: the group name {name!r} must be lowercase letters, digits and '-' "
            "(at most 40), starting and ending with a letter or digit"
        )
    group: dict[str, Any] = {"name": name}
    low, dash, high = size.partition("-")
    try:
        if dash:
            bounds = int(low), int(high)
        else:
            replicas = int(size)
    except ValueError:
        raise ValueError(
            f"{text!r}: the replicas {size!r} must be a whole number or MIN-MAX (e.g. 2 or 0-4)"
        ) from None
    if dash:
        if not 0 <= bounds[0] <= bounds[1]:
            raise ValueError(f"{text!r}: MIN-MAX needs 0 <= MIN <= MAX, not {size!r}")
        group["minReplicas"], group["maxReplicas"] = bounds
    else:
        if replicas < 0:
            raise ValueError(f"{text!r}: replicas must be 0 or more, not {replicas}")
        group["replicas"] = replicas
    if len(parts) == 3:
        try:
            resources = parse_spec(parts[2])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        if resources:
            group["resources"] = resources
    return group


def groups_of(texts: Sequence[str]) -> list[dict[str, Any]]:
    """Every ``--group``, checked together (a name given twice is an error)."""
    groups = [parse_group(t) for t in texts]
    names = [g["name"] for g in groups]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"each --group needs a name of its own; repeated: {', '.join(repeated)}")
    return groups


def cluster_object(name: str, namespace: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": dict(spec),
    }


def cluster_spec(
    groups: list[dict[str, Any]],
    image: str | None = None,
    idle_timeout: int | None = None,
    idle_policy: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"workerGroups": groups}
    if image:
        spec["image"] = image
    if idle_timeout is not None:
        spec["idleTimeoutSeconds"] = idle_timeout
    if idle_policy:
        spec["idlePolicy"] = idle_policy
    return spec


def spec_from_file(loaded: Any, source: str) -> dict[str, Any]:
    """A ResourceCluster spec from a YAML document: a whole ResourceCluster (its spec is
    taken) or the spec alone."""
    if not isinstance(loaded, Mapping):
        raise ValueError(f"{source} must hold a ResourceCluster or its spec (a mapping)")
    if loaded.get("kind") == "ResourceCluster" or "apiVersion" in loaded:
        if loaded.get("kind") != "ResourceCluster":
            raise ValueError(f"{source} holds a {loaded.get('kind')}, not a ResourceCluster")
        loaded = loaded.get("spec") or {}
    return dict(loaded)


@dataclass(frozen=True)
class JobRequest:
    """What ``job submit`` was asked: everything but the working directory's files."""

    name: str
    namespace: str
    entrypoint: list[str]
    cluster: dict[str, Any] | None = None  # a spec: the job makes its own cluster
    cluster_name: str | None = None  # or a running cluster to submit to
    workdir_configmap: str | None = None
    backoff_limit: int | None = None
    active_deadline: int | None = None
    ttl_after_finished: int | None = None
    shutdown_after_finish: bool | None = None
    suspend: bool = False
    labels: Mapping[str, str] | None = None


def job_object(request: JobRequest) -> dict[str, Any]:
    """The ResourceJob ``job submit`` creates."""
    if not request.entrypoint:
        raise ValueError("give the entrypoint after '--', e.g. -- python script.py")
    if (request.cluster is None) == (request.cluster_name is None):
        raise ValueError(
            "give either --cluster-spec FILE (a cluster for the job) or --cluster NAME"
        )
    spec: dict[str, Any] = {"entrypoint": list(request.entrypoint)}
    if request.cluster is not None:
        spec["cluster"] = request.cluster
    else:
        spec["clusterSelector"] = {"name": request.cluster_name}
    if request.workdir_configmap:
        spec["workingDir"] = {"configMap": request.workdir_configmap}
    optional = {
        "backoffLimit": request.backoff_limit,
        "activeDeadlineSeconds": request.active_deadline,
        "ttlSecondsAfterFinished": request.ttl_after_finished,
        "shutdownAfterFinish": request.shutdown_after_finish,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    if request.suspend:
        spec["suspend"] = True
    metadata: dict[str, Any] = {"name": request.name, "namespace": request.namespace}
    if request.labels:
        metadata["labels"] = dict(request.labels)
    return {"apiVersion": API_VERSION, "kind": "ResourceJob", "metadata": metadata, "spec": spec}


def workdir_name(job: str) -> str:
    return f"{job}-workdir"


def workdir_files(folder: Path) -> dict[str, bytes]:
    """The files of a working directory, by name, for a ConfigMap (which holds flat files:
    a sub-folder other than caches and version control is an error, as is more than
    WORKDIR_LIMIT bytes in all)."""
    if not folder.is_dir():
        raise ValueError(f"--working-dir {folder}: not a directory")
    files: dict[str, bytes] = {}
    for entry in sorted(folder.iterdir()):
        if entry.name in WORKDIR_SKIPPED:
            continue
        if entry.is_dir():
            raise ValueError(
                f"--working-dir {folder}: {entry.name}/ is a sub-folder; a working directory is "
                "uploaded as one ConfigMap of flat files (package code into a wheel or image)"
            )
        if not entry.is_file():
            continue
        if not _CONFIGMAP_KEY.match(entry.name):
            raise ValueError(
                f"--working-dir {folder}: the file name {entry.name!r} cannot be a ConfigMap key "
                "(use letters, digits, '-', '_' and '.')"
            )
        files[entry.name] = entry.read_bytes()
    size = sum(len(v) for v in files.values())
    if size > WORKDIR_LIMIT:
        raise ValueError(
            f"--working-dir {folder}: {size} bytes; a ConfigMap holds at most about "
            f"{WORKDIR_LIMIT} (ship large files in the image or fetch them from storage)"
        )
    return files


def workdir_configmap(job: str, namespace: str, files: Mapping[str, bytes]) -> dict[str, Any]:
    """The ConfigMap of a job's working directory: text files as data, others as
    binaryData (base64, as the API wants it)."""
    import base64

    data, binary = {}, {}
    for name, content in files.items():
        try:
            data[name] = content.decode()
        except UnicodeDecodeError:
            binary[name] = base64.b64encode(content).decode()
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": workdir_name(job),
            "namespace": namespace,
            "labels": {JOB_LABEL: job},
        },
        "data": data,
    }
    if binary:
        body["binaryData"] = binary
    return body


def owned_by(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to ``obj``, so that Kubernetes deletes what it owns with it."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
    }


def scaled_groups(spec: Mapping[str, Any], group: str, replicas: int) -> list[dict[str, Any]]:
    """The spec's worker groups with ``group`` fixed at ``replicas`` (its autoscaling, if
    any, off). Raises ValueError naming the groups there are."""
    if replicas < 0:
        raise ValueError(f"replicas must be 0 or more, not {replicas}")
    groups = [dict(g) for g in spec.get("workerGroups") or []]
    names = [str(g.get("name")) for g in groups]
    if group not in names:
        raise ValueError(f"no worker group {group!r}; the groups are {', '.join(names) or 'none'}")
    chosen = groups[names.index(group)]
    for key in ("minReplicas", "maxReplicas", "idleTimeoutSeconds"):
        chosen.pop(key, None)
    chosen["replicas"] = replicas
    return groups


# ----- reading ------------------------------------------------------------------------


def age(stamp: str | None, now: datetime.datetime) -> str:
    """``kubectl``'s short age: 45s, 3m, 2h, 5d."""
    if not stamp:
        return "-"
    then = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc
    )
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= size):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def cluster_resources(status: Mapping[str, Any]) -> str:
    """Used/total of each resource, as the operator summarises it (or from its parts)."""
    if status.get("resourcesSummary"):
        return str(status["resourcesSummary"])
    resources = status.get("resources") or {}
    if not resources:
        return "-"
    return format_usage(resources.get("used") or {}, resources.get("total") or {})


CLUSTER_COLUMNS = ("NAME", "PHASE", "WORKERS", "RESOURCES (used/total)", "AGE")
JOB_COLUMNS = ("NAME", "PHASE", "CLUSTER", "ATTEMPTS", "EXIT", "RESOURCES (used/total)", "AGE")


def cluster_row(obj: Mapping[str, Any], now: datetime.datetime) -> tuple[str, ...]:
    status = obj.get("status") or {}
    return (
        obj["metadata"]["name"],
        str(status.get("phase") or "-"),
        str(status.get("workers") or "-"),
        cluster_resources(status),
        age(obj["metadata"].get("creationTimestamp"), now),
    )


def job_row(
    obj: Mapping[str, Any], clusters: Mapping[str, Mapping[str, Any]], now: datetime.datetime
) -> tuple[str, ...]:
    """A job's row; its cluster's resources when that cluster is among ``clusters``."""
    status = obj.get("status") or {}
    cluster = status.get("clusterName") or (obj.get("spec") or {}).get("clusterSelector", {}).get(
        "name"
    )
    exit_code = status.get("exitCode")
    return (
        obj["metadata"]["name"],
        str(status.get("phase") or "Pending"),
        str(cluster or "-"),
        str(status.get("attempts", 0)),
        "-" if exit_code is None else str(exit_code),
        cluster_resources((clusters.get(cluster or "") or {}).get("status") or {}),
        age(obj["metadata"].get("creationTimestamp"), now),
    )


def _bad(condition: Mapping[str, Any]) -> bool:
    """A condition that says something is wrong (Unschedulable says so when True)."""
    if condition.get("type") == "Unschedulable":
        return condition.get("status") == "True"
    return condition.get("status") == "False"


def failure_story(obj: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> list[str]:
    """Why ``obj`` (a ResourceCluster or ResourceJob) is not well, newest cause last: its
    phase, a job's reason, exit code and last log lines, the conditions that say something
    is wrong, and its Warning events."""
    kind, status = obj.get("kind", "object"), obj.get("status") or {}
    name = obj["metadata"]["name"]
    lines = [f"{kind} {name}: phase {status.get('phase') or 'unknown (no status yet)'}"]
    if status.get("reason") or status.get("message"):
        lines.append(
            f"reason: {status.get('reason') or '-'}"
            + (f": {status['message']}" if status.get("message") else "")
        )
    if status.get("exitCode") is not None:
        lines.append(f"entrypoint exit code: {status['exitCode']}")
    for condition in status.get("conditions") or []:
        if _bad(condition):
            lines.append(
                f"condition {condition.get('type')}={condition.get('status')} "
                f"({condition.get('reason')}): {condition.get('message')}"
            )
    warnings = [e for e in events if e.get("type") == "Warning"]
    for event in sorted(warnings, key=_event_time)[-10:]:
        count = f" (x{event['count']})" if (event.get("count") or 1) > 1 else ""
        lines.append(f"event {event.get('reason')}{count}: {event.get('message')}")
    if len(lines) == 1 + ("exitCode" in status and status["exitCode"] is not None):
        lines.append("no failure recorded: no condition says anything is wrong, no warning")
    if status.get("logTail"):
        lines.append("last lines of the entrypoint's log:")
        lines += [f"  {line}" for line in str(status["logTail"]).splitlines()]
    return lines


def _event_time(event: Mapping[str, Any]) -> str:
    return str(
        event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or ""
    )
