"""Pods really run as containers of the apportion image built from these sources: their root
file system, user, environment (Secrets too), service-account token and resource limits are
the container's, not the test machine's; and so are the operator's, the scheduler's and the
workers' when the chart and a ResourceCluster make them."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from .controlplane import Cluster
from .deployment import deploy_operator
from .kubelet.serviceaccount import MOUNT_PATH
from .test_harness import apply, container_pid, pod_manifest, podman

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(400)]

FACTS = textwrap.dedent(
    f"""
    import json, os, sys, time
    import apportion
    from apportion import build_info

    def read(path):
        try:
            return open(path).read().strip()
        except OSError as err:
            return type(err).__name__

    def writable(path):
        try:
            open(path, "w").close()
            return True
        except OSError as err:
            return err.strerror

    facts = {{
        "uid": os.getuid(),
        "gid": os.getgid(),
        "apportion": apportion.__file__,
        "compiled": build_info.scheduler_compiled(),
        "python": sys.version_info[:2],
        "token": read("{MOUNT_PATH}/token"),
        "secret": os.environ.get("APPORTION_TOKEN"),
        "memory_limit": read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        if os.path.exists("/sys/fs/cgroup/memory") else read("/sys/fs/cgroup/memory.max"),
        "root_writable": writable("/home/apportion/probe"),
        "tmp_writable": writable("/tmp/probe"),
    }}
    print(json.dumps(facts), flush=True)
    time.sleep(3600)
    """
)


def image_id(cluster: Cluster) -> str:
    return podman("image", "inspect", "--format", "{{.Id}}", cluster.image)


def host_view(pid: int) -> dict[str, Any]:
    """What the host sees of a process: its UID and whether its root is the host's."""
    uid_line = next(
        line
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("Uid:")
    )
    root, host_root = os.stat(f"/proc/{pid}/root"), os.stat("/")
    return {
        "uid": int(uid_line.split()[1]),
        "own_root": (root.st_dev, root.st_ino) != (host_root.st_dev, host_root.st_ino),
        "passwd": Path(f"/proc/{pid}/root/etc/passwd").read_text(),
    }


@pytest.fixture
def containers_only(k8s_cluster: Cluster) -> Cluster:
    if k8s_cluster.pods != "containers":
        pytest.skip("pods run as local processes (APPORTION_K8S_PODS=processes)")
    return k8s_cluster


def test_a_pod_runs_in_a_container_of_the_built_image(
    containers_only: Cluster, k8s_namespace: str
) -> None:
    cluster, ns = containers_only, k8s_namespace
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "auth"},
        "stringData": {"token": "s3cret-token"},
    }
    pod = pod_manifest(
        "facts",
        FACTS,
        restartPolicy="Never",
        # As the Helm chart runs the operator.
        securityContext={"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001},
        volumes=[{"name": "tmp", "emptyDir": {}}],
        container={
            "env": [
                {
                    "name": "APPORTION_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "auth", "key": "token"}},
                }
            ],
            "securityContext": {
                "readOnlyRootFilesystem": True,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        },
    )
    apply(cluster, ns, secret, pod)
    log_path = cluster.pod_log_path("facts", ns)
    cluster.wait_for(
        lambda: log_path.exists() and log_path.read_text().strip(), "the pod's facts", 120
    )
    facts = json.loads(log_path.read_text())
    # The image's installation (compiled with mypyc), not this test's environment.
    installed = facts.pop("apportion")
    assert installed.startswith("/usr/local/lib/python3.11/"), installed
    assert not Path(installed).exists()  # not a path of the test machine
    token = (log_path.parent / "serviceaccount" / "token").read_text()
    assert facts == {
        "uid": 10001,
        "gid": 10001,
        "compiled": True,
        "python": [3, 11],
        "token": token,
        "secret": "s3cret-token",
        "memory_limit": str(256 * 2**20),
        "root_writable": "Read-only file system",
        "tmp_writable": True,
    }

    running = cluster.get_pod("facts", ns)
    assert running is not None
    status = running["status"]["containerStatuses"][0]
    assert status["imageID"] == image_id(cluster)
    container_id = status["containerID"].removeprefix("podman://")
    assert podman("inspect", "--format", "{{.Image}}", container_id) == image_id(cluster)
    seen = host_view(container_pid(cluster, "facts", ns))
    assert seen["uid"] == 10001 and seen["own_root"]
    assert "apportion:x:10001:10001" in seen["passwd"]


def test_a_container_podman_cannot_run_waits_and_is_retried(
    containers_only: Cluster, k8s_namespace: str
) -> None:
    """As the kubelet's RunContainerError: no exit code, no restart counted, the pod stays
    Pending (restartPolicy Never does not make it Failed)."""
    ns = k8s_namespace
    bad = pod_manifest(
        "uncreatable",
        "print('never')",
        container={"securityContext": {"capabilities": {"add": ["NOT_A_CAPABILITY"]}}},
    )
    apply(containers_only, ns, bad)
    waiting = containers_only.wait_pod(
        "uncreatable",
        lambda p: (
            p["status"]
            .get("containerStatuses", [{}])[0]
            .get("state", {})
            .get("waiting", {})
            .get("reason")
            == "RunContainerError"
        ),
        "waiting with RunContainerError",
        ns,
    )
    assert waiting["status"]["phase"] == "Pending"
    assert waiting["status"]["containerStatuses"][0]["restartCount"] == 0


def test_operator_scheduler_and_workers_run_in_containers_of_the_built_image(
    containers_only: Cluster,
) -> None:
    cluster = containers_only
    wanted = image_id(cluster)
    resource_cluster = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": "boxed"},
        "spec": {
            # This build's own tag (the CRD's default, apportion:<version>, is the same image
            # unless another checkout built since).
            "image": cluster.image,
            "workerGroups": [{"name": "cpu", "replicas": 1, "resources": {"slot": 1}}],
        },
    }
    with deploy_operator(cluster) as deployment:
        cluster.apply(resource_cluster, namespace=deployment.namespace)
        deployment.wait_running("boxed", {"cpu": 1})
        pods = [
            (namespace, pod)
            for namespace in (deployment.system, deployment.namespace)
            for pod in json.loads(
                cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout
            )["items"]
            if not pod["metadata"].get("deletionTimestamp")
        ]
        commands = sorted(
            " ".join(
                (p["spec"]["containers"][0]["command"] + p["spec"]["containers"][0]["args"])[:2]
            )
            for _, p in pods
        )
        assert commands == ["apportion operator", "apportion scheduler", "apportion worker"]
        for namespace, pod in pods:
            name = pod["metadata"]["name"]
            status = pod["status"]["containerStatuses"][0]
            assert status["imageID"] == wanted, name
            seen = host_view(container_pid(cluster, name, namespace))
            assert seen["uid"] == 10001 and seen["own_root"], name
