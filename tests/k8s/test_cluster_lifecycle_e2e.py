"""A ResourceCluster's lifetime on the real control plane: an idle cluster deleted, another
scaled to zero (and kept while a client is connected), suspend and resume, and the
resources column of ``kubectl get``.

Each cluster's scheduler listens on ports of its own (pods share the host's network).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from apportion import Client
from apportion.kubernetes import KubeCluster

from .controlplane import Cluster
from .deployment import Deployment, deploy_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        yield deployment


def resource_cluster(name: str, port: int, replicas: int = 1, **spec: Any) -> Obj:
    return {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": name},
        "spec": {
            "scheduler": {"port": port, "httpPort": port + 1},
            "workerGroups": [{"name": "cpu", "replicas": replicas, "resources": {"slot": 2}}],
            **spec,
        },
    }


def create(deployed: Deployment, body: Obj) -> None:
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def cluster_pods(deployed: Deployment, name: str) -> list[Obj]:
    return deployed.pods(f"apportion.dev/cluster={name}")


def test_an_idle_cluster_deletes_itself_after_its_timeout(deployed: Deployment) -> None:
    create(deployed, resource_cluster("idle-del", 12486, idleTimeoutSeconds=20))
    status = deployed.wait_running("idle-del", {"cpu": 1})
    uid = deployed.rc("idle-del")["metadata"]["uid"]
    # The status says when it will go (also in kubectl get -o wide).
    status = deployed.wait(
        lambda: (s := deployed.status("idle-del")).get("idleDeadline") and s, "idleDeadline"
    )
    assert status["idleSince"] <= status["idleDeadline"]
    wide = deployed.kubectl("get", "rcluster", "idle-del", "-o", "wide").stdout
    assert "IDLE-DEADLINE" in wide.splitlines()[0]
    deployed.wait(lambda: deployed.rc("idle-del") is None, "idle-del deleted", 120)
    deployed.wait(lambda: not cluster_pods(deployed, "idle-del"), "its pods gone", 120)
    events = json.loads(
        deployed.kubectl(
            "get", "events", "--field-selector", f"involvedObject.uid={uid}", "-o", "json"
        ).stdout
    )["items"]
    idle = [e["message"] for e in events if e["reason"] == "IdleTimeout"]
    assert idle and "deleting the cluster: no client connected and no task" in idle[0]


def test_an_idle_cluster_scales_to_zero_but_not_while_a_client_is_connected(
    deployed: Deployment,
) -> None:
    create(
        deployed,
        resource_cluster("idle-zero", 12586, idleTimeoutSeconds=25, idlePolicy="scaleToZero"),
    )
    deployed.wait_running("idle-zero", {"cpu": 1})
    deployed.wait(lambda: deployed.status("idle-zero").get("idleSince"), "idleSince set")
    cluster = KubeCluster.from_name(
        "idle-zero", deployed.namespace, kubeconfig=str(deployed.k8s.kubeconfig), timeout=120
    )
    with Client(cluster) as client:
        deployed.wait(
            lambda: "idleSince" not in deployed.status("idle-zero"),
            "idleSince cleared while a client is connected",
        )
        assert client.submit(sum, [1, 2]).result(timeout=60) == 3
        # Well past the timeout with the client still there: nothing is scaled.
        first = deployed.reconciles()
        deployed.wait(lambda: deployed.reconciles() >= first + 3, "three more timer rounds", 120)
        assert deployed.rc("idle-zero")["spec"]["workerGroups"][0]["replicas"] == 1
        assert "idleSince" not in deployed.status("idle-zero")
    deployed.wait(
        lambda: deployed.rc("idle-zero")["spec"]["workerGroups"][0]["replicas"] == 0,
        "idle-zero scaled to zero after the client left",
        180,
    )
    deployed.wait(
        lambda: not deployed.pods("apportion.dev/cluster=idle-zero,apportion.dev/group=cpu"),
        "its worker pods gone",
    )
    # The scheduler stays, for a client that comes back.
    assert deployed.pods("apportion.dev/cluster=idle-zero,app.kubernetes.io/component=scheduler")
    assert deployed.events("IdleTimeout")
    deployed.kubectl("delete", "rcluster", "idle-zero", "--wait=true", timeout=120)


def test_a_suspended_cluster_runs_no_pod_and_resumes(deployed: Deployment) -> None:
    create(deployed, resource_cluster("napper", 12686, replicas=2))
    deployed.wait_running("napper", {"cpu": 2})
    printed = deployed.kubectl("get", "rcluster", "napper").stdout
    assert "RESOURCES" in printed.splitlines()[0] and "slot 0/4" in printed
    spec_before = deployed.rc("napper")["spec"]

    deployed.kubectl(
        "patch", "rcluster", "napper", "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    deployed.wait(lambda: deployed.status("napper").get("phase") == "Suspended", "Suspended")
    deployed.wait(lambda: not cluster_pods(deployed, "napper"), "every pod of napper gone", 120)
    kept = deployed.rc("napper")
    assert kept["spec"] == {**spec_before, "suspend": True}
    assert deployed.events("Suspended")

    deployed.kubectl(
        "patch", "rcluster", "napper", "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    deployed.wait_running("napper", {"cpu": 2})
    assert deployed.events("Resumed")
    deployed.kubectl("delete", "rcluster", "napper", "--wait=true", timeout=120)
