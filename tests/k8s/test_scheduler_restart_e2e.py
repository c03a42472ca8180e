"""A scheduler pod deleted while a Client outside the pod network runs the seed pipeline:
the Deployment starts a new pod (with a new IP), the workers and the same Client come
back to it, and the Client finishes the pipeline with the right result."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import cloudpickle
import pytest

from apportion import Client, get_worker
from apportion.kubernetes import KubeCluster

from .controlplane import REPO_ROOT, Cluster
from .deployment import Deployment, deploy_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

# Worker pods do not import the test tree: ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

EXAMPLE = REPO_ROOT / "examples" / "seed-cluster.yaml"
SCHEDULER = "app.kubernetes.io/instance=pipeline,app.kubernetes.io/component=scheduler"
N = 200


def load(i: int) -> list[float]:
    return [float(i + k) for k in range(10)]


def process(data: list[float]) -> tuple[float, str]:
    time.sleep(0.05)  # stands in for a kernel on the GPU
    return sum(x * x for x in data), get_worker().name


def aggregate(parts: list[tuple[float, str]]) -> float:
    return sum(v for v, _ in parts)


@pytest.fixture(scope="module")
def pipeline(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        deployment.kubectl("apply", "-f", str(EXAMPLE))
        deployment.wait_running("pipeline", {"gpu": 2, "highmem": 1})
        yield deployment


def test_the_same_client_finishes_the_pipeline_after_the_scheduler_pod_is_deleted(
    pipeline: Deployment,
) -> None:
    cluster = KubeCluster.from_name(
        "pipeline", pipeline.namespace, kubeconfig=str(pipeline.k8s.kubeconfig), timeout=120
    )
    with Client(cluster) as client:
        first = client.scheduler_address
        data = [client.submit(load, i) for i in range(N)]
        processed = [
            client.submit(process, d, resources={"GPU": 2 if i % 10 == 0 else 1})
            for i, d in enumerate(data)
        ]
        final = client.submit(aggregate, processed, resources={"MEMORY": 70e9})
        pipeline.wait(lambda: sum(p.done() for p in processed) >= N // 5, "a fifth processed")
        (old,) = pipeline.pods(SCHEDULER)
        pipeline.kubectl("delete", "pod", old["metadata"]["name"], "--wait=false")

        assert final.result(timeout=300) == sum(
            sum(float(i + k) ** 2 for k in range(10)) for i in range(N)
        )
        assert client.scheduler_address != first  # the new pod, found by asking again
        assert client.check_invariants() == []
