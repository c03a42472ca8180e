"""The chart's settings reach the clusters, on the real control plane: the image, its pull
policy and pull secrets are the default of every ResourceCluster that names none."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from .controlplane import REPO_ROOT, Cluster
from .deployment import Deployment, deploy_operator
from .paths import pods_mode
from .test_harness import podman

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


def acting(deployed: Deployment, pod: dict) -> bool:
    """Whether the operator in ``pod`` acts, from the peering lines of its log: a replica
    starts paused and logs only changes (a replica that starts beside a live one of higher
    priority stands by without a line of kopf's)."""
    log = deployed.k8s.pod_log(pod["metadata"]["name"], deployed.system)
    return log.rfind("Resuming operations") > log.rfind("Pausing operations")


def timer_runs(deployed: Deployment, pod: dict) -> int:
    log = deployed.k8s.pod_log(pod["metadata"]["name"], deployed.system)
    return sum("on_timer" in line and "succeeded" in line for line in log.splitlines())


def peers(deployed: Deployment, release: str) -> dict[str, int]:
    """The replicas listed in the release's KopfPeering object: pod name -> priority."""
    found = deployed.kubectl(
        "get", "kopfpeering", f"{release}-apportion", "-o", "json", check=False
    )
    if found.returncode:
        return {}
    status = json.loads(found.stdout).get("status") or {}
    return {name: peer["priority"] for name, peer in status.items()}


def test_two_replicas_one_acts_and_the_other_takes_over_mid_scale(deployed: Deployment) -> None:
    release = "op-" + deployed.system.rsplit("-", 1)[-1]
    deployed.k8s.helm(
        "upgrade", release, str(CHART), "-n", deployed.system, "--reuse-values",
        "--set", "operator.replicas=2", "--wait", "--timeout", "3m",
    )  # fmt: skip

    def one_acting() -> tuple[dict, dict] | None:
        pods = operator_pods(deployed)
        listed = peers(deployed, release)
        if len(pods) != 2 or not {p["metadata"]["name"] for p in pods} <= listed.keys():
            return None
        active = [p for p in pods if acting(deployed, p)]
        standing_by = [p for p in pods if not acting(deployed, p)]
        return (active[0], standing_by[0]) if len(active) == 1 else None

    active, standby = deployed.wait(one_acting, "two operators listed, one of them acting")
    listed = peers(deployed, release)
    assert listed[active["metadata"]["name"]] > listed[standby["metadata"]["name"]], listed
    cluster = cpu_cluster("relay", 11586)
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(cluster))
    deployed.wait_running("relay", {"cpu": 1})
    assert timer_runs(deployed, active) > 0
    assert timer_runs(deployed, standby) == 0, "the replica standing by reconciled"

    cluster["spec"]["workerGroups"][0]["replicas"] = 3
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(cluster))
    deployed.k8s.kubectl(
        "delete", "pod", active["metadata"]["name"], "-n", deployed.system, "--grace-period=0",
        "--force", "--wait=false",
    )  # fmt: skip
    deployed.wait_running("relay", {"cpu": 3})
    # The one acting now: the standby (resumed once the dead one's record expired) or the
    # replacement pod, when its random priority is higher; never both.
    live = operator_pods(deployed)
    assert active["metadata"]["uid"] not in {p["metadata"]["uid"] for p in live}
    deployed.wait(
        lambda: (
            sum(acting(deployed, p) for p in operator_pods(deployed)) == 1
            and len(operator_pods(deployed)) == 2
        ),
        "exactly one of the two operators acting",
    )
    deployed.kubectl("delete", "resourcecluster", "relay", "--wait=true")
