"""A helm-installed operator watching a namespace of its own, for end-to-end tests.

Each test module deploys its own (``deploy_operator``), so modules do not share clusters,
and removes everything it made afterwards.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import procs
from .controlplane import REPO_ROOT, Cluster

CRD_FILE = REPO_ROOT / "crds" / "resourceclusters.apportion.dev.yaml"
JOB_CRD_FILE = REPO_ROOT / "crds" / "resourcejobs.apportion.dev.yaml"
CHART = REPO_ROOT / "charts" / "apportion"
DEFAULT_SCHEDULER_PORTS = (8786, 8787)  # a ResourceCluster's scheduler.port and httpPort

Obj = dict[str, Any]


class Deployment:
    """A helm-installed operator watching one namespace, and helpers on that namespace."""

    def __init__(self, cluster: Cluster, namespace: str, system: str, release: str = "") -> None:
        self.k8s = cluster
        self.namespace = namespace
        self.system = system  # where the operator runs
        self.release = release  # its Helm release

    def kubectl(self, *args: str, **kwargs: Any) -> Any:
        return self.k8s.kubectl(*args, "-n", self.namespace, **kwargs)

    def rc(self, name: str) -> Obj | None:
        found = self.kubectl("get", "resourceclusters", name, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else None

    def status(self, name: str) -> Obj:
        return (self.rc(name) or {}).get("status") or {}

    def group(self, name: str, group: str) -> Obj:
        return next(
            (g for g in self.status(name).get("workerGroups", []) if g["name"] == group), {}
        )

    def pods(self, selector: str) -> list[Obj]:
        out = self.kubectl("get", "pods", "-l", selector, "-o", "json")
        return [
            p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")
        ]

    def events(self, reason: str) -> list[str]:
        out = self.kubectl("get", "events", "--field-selector", f"reason={reason}", "-o", "json")
        return [e.get("message", "") for e in json.loads(out.stdout)["items"]]

    def reconciles(self) -> int:
        """Timer reconciles the operator has finished so far (from its pod's log)."""
        out = self.k8s.kubectl("get", "pods", "-n", self.system, "-o", "json")
        pods = json.loads(out.stdout)["items"]
        return sum(
            "on_timer" in line and "succeeded" in line
            for pod in pods
            for line in self.k8s.pod_log(pod["metadata"]["name"], self.system).splitlines()
        )

    def wait(self, condition: Any, what: str, timeout: float = 120) -> Any:
        """Waits for condition; a timeout says what the namespace's pods, Events and the
        kubelet were doing, not only that it timed out."""
        try:
            return self.k8s.wait_for(condition, what, timeout=timeout)
        except procs.Timeout as err:
            raise procs.Timeout(f"{err}\n{self.k8s.diagnosis(self.namespace)}") from None

    def wait_running(self, name: str, groups: dict[str, int]) -> Obj:
        def ready() -> Obj | None:
            status = self.status(name)
            found = {g["name"]: g for g in status.get("workerGroups", [])}
            ok = status.get("phase") == "Running" and all(
                found.get(g, {}).get("connectedWorkers") == n
                and found.get(g, {}).get("currentReplicas") == n
                for g, n in groups.items()
            )
            return status if ok else None

        return self.wait(ready, f"{name} Running with {groups}", timeout=180)


@contextmanager
def deploy_operator(k8s_cluster: Cluster) -> Iterator[Deployment]:
    # Scheduler pods listen on the host's addresses (0.0.0.0), on the chart's default ports
    # unless a test names its own.
    procs.require_free_ports(
        DEFAULT_SCHEDULER_PORTS, "the operator tests' scheduler pods listen there"
    )
    suffix = uuid.uuid4().hex[:5]
    system, target, release = f"apportion-system-{suffix}", f"pipelines-{suffix}", f"op-{suffix}"
    for namespace in (system, target):
        k8s_cluster.kubectl("create", "namespace", namespace)
        account = f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
        k8s_cluster.wait_for(
            functools.partial(k8s_cluster.client.get_or_none, account), f"{namespace} ready", 60
        )
    k8s_cluster.kubectl("apply", "-f", str(CRD_FILE))
    repository, _, tag = k8s_cluster.image.rpartition(":")
    k8s_cluster.helm(
        "install",
        release,
        str(CHART),
        "-n",
        system,
        "--set",
        f"watch.namespaces={{{target}}}",
        # The image of these sources, for the operator and (its default) every cluster's pods.
        "--set",
        f"image.repository={repository}",
        "--set",
        f"image.tag={tag}",
        "--wait",
        "--timeout",
        "3m",
    )
    try:
        yield Deployment(k8s_cluster, target, system, release)
    finally:
        k8s_cluster.kubectl(
            "delete",
            "resourceclusters",
            "--all",
            "-n",
            target,
            "--wait=true",
            check=False,
            timeout=120,
        )
        k8s_cluster.helm("uninstall", release, "-n", system, check=False)
        for namespace in (target, system):
            k8s_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@contextmanager
def deploy_job_operator(k8s_cluster: Cluster, delete_timeout: float = 120) -> Iterator[Deployment]:
    """``deploy_operator`` with the ResourceJob CRD, and every ResourceJob deleted (and
    waited for: their clusters go first) before the operator is removed."""
    # helm installs the chart's CRDs when absent; applied here too so that a control plane
    # that had an older copy gets this one (server-side: it is larger than an annotation).
    k8s_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(JOB_CRD_FILE))
    with deploy_operator(k8s_cluster) as deployment:
        try:
            yield deployment
        finally:
            deployment.kubectl(
                "delete",
                "resourcejobs",
                "--all",
                "--wait=true",
                check=False,
                timeout=delete_timeout,
            )
