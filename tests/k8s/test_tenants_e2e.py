"""Teams sharing one cluster on Kubernetes, on the real control plane: spec.tenants names
each team's token Secret; a client presenting that token belongs to the team, its quota
holds, and the ResourceCluster's status shows what each team holds."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import cloudpickle
import pytest

from apportion import Client
from apportion.kubernetes import KubeCluster

from .controlplane import Cluster
from .deployment import Deployment, deploy_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

VISION_TOKEN = "vision-team-token-0123456789abcdef"


def held_until(path: str) -> int:
    """Runs until ``path`` exists (the test says when its runs may end)."""
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.05)
    return 1


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        yield deployment


def test_a_tenant_token_makes_a_client_the_tenant_within_its_quota(deployed: Deployment) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "vision-token"},
        "stringData": {"token": VISION_TOKEN},
    }
    deployed.kubectl("apply", "-f", "-", input=json.dumps(secret))
    cluster = KubeCluster(
        "shared",
        deployed.namespace,
        kubeconfig=str(deployed.k8s.kubeconfig),
        timeout=240,
        worker_groups=[{"name": "a", "replicas": 1, "nthreads": 3, "resources": {"A": 3}}],
        scheduler={"port": 11786, "httpPort": 11787},
        tenants=[{"name": "vision", "secretName": "vision-token", "quota": {"A": 1}}],
    )
    gate = "/tmp/vision-may-finish"  # in the worker's container (made by a task)
    try:
        with Client(cluster.scheduler_address, token=VISION_TOKEN) as vision:
            assert vision.tenant == "vision"
            runs = [
                vision.submit(held_until, gate, resources={"A": 1}, pure=False) for _ in range(2)
            ]
            deployed.wait(
                lambda: (
                    (deployed.status("shared").get("tenants") or {})
                    .get("vision", {})
                    .get("over_quota")
                ),
                "the status showing vision's second task waiting over its quota",
            )
            about = vision.scheduler_info()["tenants"]["vision"]
            assert about["used"] == {"A": 1} and about["quota"] == {"A": 1}
            with Client(cluster) as default:  # the cluster's own token: the default tenant
                assert default.tenant == "default"
                default.submit(touch, gate, pure=False).result(timeout=120)
            assert vision.gather(runs) == [1, 1]
    finally:
        cluster.close()
        deployed.kubectl("delete", "resourcecluster", "shared", "--ignore-not-found", "--wait=true")


def touch(path: str) -> None:
    open(path, "w").close()
