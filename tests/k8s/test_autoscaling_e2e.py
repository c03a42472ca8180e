"""Autoscaling per worker group, end to end, on the real control plane.

A GPU group at 0 replicas grows when GPU tasks wait (its pods land on the fake GPU
nodes), runs them, and shrinks back to 0 once its workers idle past the timeout, their
results moved to another worker first; the fixed highmem group is never touched.
Bursts of work closer together than the timeout cause no further scale events.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
import yaml

from apportion import Client, get_worker
from apportion.kubernetes import KubeCluster

from .controlplane import Cluster
from .deployment import Deployment, deploy_operator

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.timeout(600),
    # GPU tasks wait for a group at 0 replicas: the client says so, as it should.
    pytest.mark.filterwarnings("ignore::apportion.NoWorkerWarning"),
]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

GPU_NODES = {"gpu-node-1", "gpu-node-2"}
IDLE_TIMEOUT = 6  # seconds; reconciles run every 2 s

ELASTIC = {
    "apiVersion": "apportion.dev/v1alpha1",
    "kind": "ResourceCluster",
    "metadata": {"name": "elastic"},
    "spec": {
        # Test pods share one network namespace: this cluster needs ports of its own.
        "scheduler": {"port": 9886, "httpPort": 9887},
        "workerGroups": [
            {
                "name": "gpu",
                "nthreads": 2,
                "resources": {"GPU": 2},
                "minReplicas": 0,
                "maxReplicas": 2,
                "idleTimeoutSeconds": IDLE_TIMEOUT,
            },
            {"name": "highmem", "replicas": 1, "resources": {"MEMORY": 100e9}},
        ],
    },
}


def where(_: Any = None) -> str:
    return get_worker().name


def payload(tag: str) -> bytes:
    # Larger than an inline result: it stays on the worker until someone fetches it.
    return tag.encode() + bytes(256 * 1024)


def tag_of(data: bytes) -> tuple[str, str]:
    return data[:32].decode(), get_worker().name


@pytest.fixture(scope="module")
def elastic(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        deployment.kubectl("apply", "-f", "-", input=yaml.safe_dump(ELASTIC))
        deployment.wait_running("elastic", {"gpu": 0, "highmem": 1})
        yield deployment


def gpu_pods(deployment: Deployment) -> list[dict[str, Any]]:
    return deployment.pods("app.kubernetes.io/instance=elastic,apportion.dev/group=gpu")


def scale_events(deployment: Deployment) -> dict[str, str]:
    """Scaling Events by name (each decision is an Event of its own) -> message."""
    found = {}
    for reason in ("ScaledUp", "ScaledDown"):
        out = deployment.kubectl(
            "get", "events", "--field-selector", f"reason={reason}", "-o", "json"
        )
        for event in json.loads(out.stdout)["items"]:
            found[event["metadata"]["name"]] = event.get("message", "")
    return found


def test_gpu_group_scales_from_zero_and_back_leaving_highmem_alone(elastic: Deployment) -> None:
    (highmem,) = elastic.pods("app.kubernetes.io/instance=elastic,apportion.dev/group=highmem")
    status = elastic.status("elastic")
    gpu = elastic.group("elastic", "gpu")
    assert (gpu["desiredReplicas"], gpu["minReplicas"], gpu["maxReplicas"]) == (0, 0, 2)
    assert status["unmetDemand"] == []  # GPU tasks would fit a group: not unmet

    cluster = KubeCluster.from_name(
        "elastic", elastic.namespace, kubeconfig=str(elastic.k8s.kubeconfig), timeout=120
    )
    with Client(cluster) as client:
        ran_on = client.map(where, range(8), resources={"GPU": 1}, pure=False)
        kept = client.submit(payload, uuid.uuid4().hex, resources={"GPU": 1})
        # 9 waiting GPU=1 tasks, 2 per pod: more than maxReplicas pods would take, so 2.
        names = {f.result(timeout=180) for f in ran_on}
        assert names <= {"elastic-gpu-0", "elastic-gpu-1"}
        expected_tag = kept.result(timeout=60)[:32].decode()
        pods = gpu_pods(elastic)
        assert {p["spec"]["nodeName"] for p in pods} <= GPU_NODES and pods
        up = elastic.group("elastic", "gpu")["lastScale"]
        assert (up["from"], up["to"]) == (0, 2) and "waiting task" in up["reason"]
        del ran_on

        # Idle past the timeout with no GPU task waiting: back to 0, data moved off first.
        elastic.wait(
            lambda: (
                elastic.group("elastic", "gpu").get("desiredReplicas") == 0
                and not gpu_pods(elastic)
            ),
            "gpu group back to 0",
            timeout=120,
        )
        down = elastic.status("elastic")["lastScalingDecision"]
        assert down["group"] == "gpu" and down["to"] == 0 and "idle" in down["reason"]
        ups = len(elastic.events("ScaledUp"))
        # The result computed on a GPU pod survived its pod: read on highmem, no recompute
        # (a recompute would need a GPU pod again).
        tag, on = client.submit(tag_of, kept, resources={"MEMORY": 1}).result(timeout=60)
        assert (tag, on) == (expected_tag, "elastic-highmem-0")
        assert len(elastic.events("ScaledUp")) == ups
        assert elastic.group("elastic", "gpu")["desiredReplicas"] == 0

    messages = list(scale_events(elastic).values())
    assert any(m.startswith("group gpu: 0 -> 2 worker(s)") for m in messages), messages
    assert any(m.startswith("group gpu: 2 -> 0") or "-> 0" in m for m in messages), messages
    (still,) = elastic.pods("app.kubernetes.io/instance=elastic,apportion.dev/group=highmem")
    assert still["metadata"]["uid"] == highmem["metadata"]["uid"]
    assert not any("highmem" in m for m in scale_events(elastic).values())


def test_bursts_closer_than_the_timeout_scale_once_each_way(elastic: Deployment) -> None:
    before = scale_events(elastic)
    cluster = KubeCluster.from_name(
        "elastic", elastic.namespace, kubeconfig=str(elastic.k8s.kubeconfig), timeout=120
    )
    with Client(cluster) as client:
        for burst in range(5):
            tasks = client.map(where, range(4), resources={"GPU": 1}, pure=False)
            assert all(f.result(timeout=180).startswith("elastic-gpu-") for f in tasks), burst
            del tasks
    elastic.wait(lambda: not gpu_pods(elastic), "gpu group back to 0", timeout=120)
    events = [m for name, m in scale_events(elastic).items() if name not in before]
    # Up to 2 pods (one or two decisions) and down (one or two): never per burst.
    assert 2 <= len(events) <= 4, events


def test_demand_no_group_can_meet_is_reported_once_and_not_scaled_for(
    elastic: Deployment,
) -> None:
    cluster = KubeCluster.from_name(
        "elastic", elastic.namespace, kubeconfig=str(elastic.k8s.kubeconfig), timeout=120
    )
    with Client(cluster) as client:
        impossible = client.submit(where, resources={"GPU": 8}, pure=False)
        unmet = elastic.wait(
            lambda: elastic.status("elastic").get("unmetDemand"), "unmetDemand in status"
        )
        assert unmet == [
            {
                "resources": {"GPU": 8},
                "tasks": 1,
                "why": "no worker group can ever run it: GPU=8 needed, "
                "the most a group offers is 2 (gpu)",
            }
        ]
        elastic.wait(
            lambda: [m for m in elastic.events("UnmetDemand") if "GPU=8" in m],
            "UnmetDemand event",
        )
        # Three reconciles later: still one Event, and no GPU pod was started for it.
        seen = elastic.reconciles()
        elastic.wait(lambda: elastic.reconciles() >= seen + 3, "three more reconciles")
        assert len([m for m in elastic.events("UnmetDemand") if "GPU=8" in m]) == 1
        assert elastic.group("elastic", "gpu")["desiredReplicas"] == 0 and not gpu_pods(elastic)
        impossible.cancel()
        elastic.wait(
            lambda: elastic.status("elastic").get("unmetDemand") == [], "unmetDemand cleared"
        )
