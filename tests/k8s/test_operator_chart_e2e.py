"""The chart's settings reach the clusters, on the real control plane: the image, its pull
policy and pull secrets are the default of every ResourceCluster that names none."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator

import pytest
import yaml

from .controlplane import REPO_ROOT, Cluster
from .deployment import Deployment, deploy_operator
from .paths import pods_mode
from .test_harness import podman
from .test_operator_failures_e2e import wait_reconciled_after

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

CHART = REPO_ROOT / "charts" / "apportion"
BRANDED = "registry.example/team/apportion:9.9.9"


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        yield deployment


def cpu_cluster(name: str, port: int) -> dict:
    """A cluster of one one-worker group, with scheduler ports of its own."""
    return {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": name},
        "spec": {
            "scheduler": {"port": port, "httpPort": port + 1},
            "workerGroups": [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}],
        },
    }


def upgrade_image(deployed: Deployment, release: str, image: str, *settings: str) -> None:
    """``helm upgrade`` the release to ``image``, with more ``--set`` settings, keeping its
    other values."""
    repository, _, tag = image.rpartition(":")
    options = [f"image.repository={repository}", f"image.tag={tag}", *settings]
    deployed.k8s.helm(
        "upgrade", release, str(CHART), "-n", deployed.system, "--reuse-values",
        *(arg for option in options for arg in ("--set", option)),
        "--wait", "--timeout", "3m",
    )  # fmt: skip


def test_the_charts_image_is_the_default_for_clusters(deployed: Deployment) -> None:
    release = "op-" + deployed.system.rsplit("-", 1)[-1]  # as deploy_operator names it
    if pods_mode() == "containers":
        # No registry here: the image "pulled" under the chart's new name is this build's.
        podman("tag", deployed.k8s.image, BRANDED)
    try:
        _check_the_charts_image_reaches_clusters(deployed, release)
    finally:  # the operator's own image too: back to this build's, for the next test
        upgrade_image(
            deployed, release, deployed.k8s.image, "image.pullPolicy=IfNotPresent",
            "imagePullSecrets=null",
        )  # fmt: skip


def _check_the_charts_image_reaches_clusters(deployed: Deployment, release: str) -> None:
    upgrade_image(
        deployed, release, BRANDED, "image.pullPolicy=Always", "imagePullSecrets[0].name=regcred"
    )
    cluster = cpu_cluster("branded", 11386)
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(cluster))
    deployed.wait_running("branded", {"cpu": 1})
    assert "image" not in deployed.rc("branded")["spec"], "no schema default hides the chart's"
    pods = deployed.pods("app.kubernetes.io/instance=branded")
    assert len(pods) == 2
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["image"] == BRANDED
        assert container["imagePullPolicy"] == "Always"
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    deployed.kubectl("delete", "resourcecluster", "branded", "--wait=true")


def operator_pods(deployed: Deployment) -> list[dict]:
    out = deployed.k8s.kubectl("get", "pods", "-n", deployed.system, "-o", "json")
    return [
        p
        for p in json.loads(out.stdout)["items"]
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def lease_holder(deployed: Deployment, release: str) -> str | None:
    """The operator replica (pod name) holding the leader-election Lease, if any."""
    found = deployed.k8s.kubectl(
        "get", "lease", f"{release}-apportion-leader", "-n", deployed.system, "-o", "json",
        check=False,
    )  # fmt: skip
    if found.returncode:
        return None
    return json.loads(found.stdout)["spec"].get("holderIdentity")


def freeze(deployed: Deployment, pod: dict, frozen: bool) -> None:
    """Pauses (or resumes) every process of an operator pod, as a stalled node would."""
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    if deployed.k8s.pods == "containers":
        restarts = pod["status"]["containerStatuses"][0]["restartCount"]
        container = f"k8s_operator_{name}_{deployed.system}_{uid[:8]}_{restarts}"
        podman("unpause" if not frozen else "pause", container)
    else:
        pid_file = deployed.k8s.pods_dir / deployed.system / name / uid / "operator.pid"
        os.killpg(int(pid_file.read_text()), signal.SIGSTOP if frozen else signal.SIGCONT)


def test_two_replicas_one_acts_and_a_frozen_one_never_acts_again(deployed: Deployment) -> None:
    release = "op-" + deployed.system.rsplit("-", 1)[-1]
    deployed.k8s.helm(
        "upgrade", release, str(CHART), "-n", deployed.system, "--reuse-values",
        "--set", "operator.replicas=2", "--wait", "--timeout", "3m",
    )  # fmt: skip

    def one_holding() -> tuple[dict, dict] | None:
        pods = operator_pods(deployed)
        holder = lease_holder(deployed, release)
        active = [p for p in pods if p["metadata"]["name"] == holder]
        others = [p for p in pods if p["metadata"]["name"] != holder]
        return (active[0], others[0]) if len(pods) == 2 and len(active) == 1 else None

    active, standby = deployed.wait(one_holding, "two operators, one holding the Lease")
    cluster = cpu_cluster("relay", 11586)
    cluster["spec"]["workerGroups"][0]["replicas"] = 2
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(cluster))
    deployed.wait_running("relay", {"cpu": 2})
    standby_log = deployed.k8s.pod_log(standby["metadata"]["name"], deployed.system)
    assert "holds Lease" not in standby_log, "the replica standing by took the lead"

    # The acting replica freezes; the group is scaled 2 -> 1 meanwhile. The other replica
    # takes over and retires exactly one worker: never both, never from a stale view.
    freeze(deployed, active, True)
    try:
        deployed.kubectl("scale", "rworkergroup", "relay-cpu", "--replicas=1")
        fewest = [2]

        def scaled_down_by_the_other() -> bool:
            connected = deployed.group("relay", "cpu").get("connectedWorkers", 0)
            fewest[0] = min(fewest[0], connected)
            holder = lease_holder(deployed, release)
            return (
                holder == standby["metadata"]["name"]
                and connected == 1
                and (
                    len(deployed.pods("app.kubernetes.io/instance=relay,apportion.dev/group=cpu"))
                    == 1
                )
            )

        deployed.wait(scaled_down_by_the_other, "the standby took over and scaled to 1", 180)
    finally:
        freeze(deployed, active, False)

    # Woken, the frozen replica finds the Lease taken and exits rather than act.
    def restarted() -> bool:
        pods = {p["metadata"]["uid"]: p for p in operator_pods(deployed)}
        mine = pods.get(active["metadata"]["uid"])
        return mine is not None and mine["status"]["containerStatuses"][0]["restartCount"] > 0

    deployed.wait(restarted, "the woken replica restarted", timeout=120)
    wait_reconciled_after(deployed, "relay")
    assert fewest[0] >= 1, "the group went to 0 workers"
    assert deployed.group("relay", "cpu")["connectedWorkers"] == 1
    assert lease_holder(deployed, release) == standby["metadata"]["name"]
    deployed.kubectl("delete", "resourcecluster", "relay", "--wait=true")
