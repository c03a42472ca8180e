"""The chart's settings reach the clusters, on the real control plane: the image, its pull
policy and pull secrets are the default of every ResourceCluster that names none."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from .controlplane import REPO_ROOT, Cluster
from .deployment import Deployment, deploy_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

CHART = REPO_ROOT / "charts" / "apportion"


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        yield deployment


def test_the_charts_image_is_the_default_for_clusters(deployed: Deployment) -> None:
    release = "op-" + deployed.system.rsplit("-", 1)[-1]  # as deploy_operator names it
    deployed.k8s.helm(
        "upgrade",
        release,
        str(CHART),
        "-n",
        deployed.system,
        "--reuse-values",
        "--set",
        "image.repository=registry.example/team/apportion",
        "--set",
        "image.tag=9.9.9",
        "--set",
        "image.pullPolicy=Always",
        "--set",
        "imagePullSecrets[0].name=regcred",
        "--wait",
        "--timeout",
        "3m",
    )
    cluster = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": "branded"},
        "spec": {
            "scheduler": {"port": 11386, "httpPort": 11387},
            "workerGroups": [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}],
        },
    }
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(cluster))
    deployed.wait_running("branded", {"cpu": 1})
    assert "image" not in deployed.rc("branded")["spec"], "no schema default hides the chart's"
    pods = deployed.pods("app.kubernetes.io/instance=branded")
    assert len(pods) == 2
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["image"] == "registry.example/team/apportion:9.9.9"
        assert container["imagePullPolicy"] == "Always"
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    deployed.kubectl("delete", "resourcecluster", "branded", "--wait=true")
