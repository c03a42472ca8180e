"""The seed's GPU pipeline on Kubernetes, end to end, on the real control plane.

helm installs the chart; the operator runs as a pod of it (with its ServiceAccount and
RBAC); `kubectl apply` of the example ResourceCluster makes the real kube-scheduler bind
GPU workers to the fake GPU nodes; a Client runs the pipeline against the in-cluster
scheduler; scaling, an invalid spec and deletion are exercised through kubectl and
KubeCluster.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
import yaml

from apportion import Client, get_worker
from apportion.kubernetes import KubeCluster

from .controlplane import REPO_ROOT, Cluster
from .deployment import Deployment, deploy_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

# Worker pods do not import the test tree: ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

EXAMPLE = REPO_ROOT / "examples" / "seed-cluster.yaml"
GPU_NODES = {"gpu-node-1", "gpu-node-2"}


def load(i: int) -> list[float]:
    return [float(i + k) for k in range(10)]


def process(data: list[float]) -> tuple[float, str]:
    return sum(x * x for x in data), get_worker().name


def aggregate(parts: list[tuple[float, str]]) -> tuple[float, list[str], str]:
    return sum(v for v, _ in parts), [w for _, w in parts], get_worker().name


def hold(seconds: float) -> str:
    time.sleep(seconds)  # the workload: occupy a GPU for a while
    return get_worker().name


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def pipeline(deployed: Deployment) -> Deployment:
    deployed.kubectl("apply", "-f", str(EXAMPLE))
    deployed.wait_running("pipeline", {"gpu": 2, "highmem": 1})
    return deployed


def test_operator_runs_as_a_pod_of_the_chart(deployed: Deployment) -> None:
    pods = json.loads(deployed.k8s.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    operators = [
        p
        for p in pods
        if p["spec"]["containers"][0].get("command") == ["apportion", "operator"]
        and deployed.namespace in p["spec"]["containers"][0].get("args", [])
    ]
    assert len(operators) == 1
    assert operators[0]["status"]["phase"] == "Running"
    assert operators[0]["spec"]["serviceAccountName"].startswith("op-")


def test_example_cluster_reaches_running_with_gpu_workers_on_gpu_nodes(
    pipeline: Deployment,
) -> None:
    status = pipeline.status("pipeline")
    assert status["workers"] == "3/3"
    assert status["schedulerAddress"] == (f"tcp://pipeline-scheduler.{pipeline.namespace}.svc:8786")
    gpu = pipeline.pods("apportion.dev/group=gpu")
    assert {p["spec"]["nodeName"] for p in gpu} <= GPU_NODES
    assert all(
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2" for p in gpu
    )
    (highmem,) = pipeline.pods("apportion.dev/group=highmem")
    assert highmem["spec"]["nodeName"] == "highmem-node"
    # Ready means connected (the worker answers the readiness probe): it follows shortly.
    pipeline.wait(
        lambda: all(
            g["readyReplicas"] == g["desiredReplicas"]
            for g in pipeline.status("pipeline")["workerGroups"]
        ),
        "every worker pod Ready",
    )
    printed = pipeline.kubectl("get", "rcluster", "pipeline").stdout
    assert "Running" in printed and "3/3" in printed


@pytest.mark.filterwarnings("ignore::apportion.NoWorkerWarning")  # the GPU=8 task, on purpose
def test_client_runs_the_seed_pipeline_on_the_right_pods(pipeline: Deployment) -> None:
    cluster = KubeCluster.from_name(
        "pipeline", pipeline.namespace, kubeconfig=str(pipeline.k8s.kubeconfig), timeout=120
    )
    with Client(cluster) as client:
        data = [client.submit(load, i) for i in range(60)]
        processed = [
            client.submit(process, d, resources={"GPU": 2 if i % 10 == 0 else 1})
            for i, d in enumerate(data)
        ]
        final = client.submit(aggregate, processed, resources={"MEMORY": 70e9})
        total, gpu_workers, aggregated_on = final.result(timeout=120)
        assert total == sum(sum(float(i + k) ** 2 for k in range(10)) for i in range(60))
        assert {w.rsplit("-", 1)[0] for w in gpu_workers} == {"pipeline-gpu"}
        assert aggregated_on == "pipeline-highmem-0"

        # While GPU tasks run, the status shows the GPUs in use.
        busy = client.map(hold, [4.0] * 4, resources={"GPU": 1}, pure=False)
        pipeline.wait(
            lambda: pipeline.group("pipeline", "gpu").get("usedResources", {}).get("GPU", 0) >= 2,
            "GPUs in use shown in status",
        )
        client.gather(busy)

        # A demand no group can meet shows in status and as an Event, once.
        impossible = client.submit(hold, 0, resources={"GPU": 8}, pure=False)
        unmet = pipeline.wait(
            lambda: pipeline.status("pipeline").get("unmetDemand"), "unmetDemand in status"
        )
        assert unmet[0]["resources"] == {"GPU": 8} and unmet[0]["tasks"] == 1
        pipeline.wait(
            lambda: any("GPU" in m for m in pipeline.events("UnmetDemand")), "UnmetDemand event"
        )
        impossible.cancel()
        pipeline.wait(
            lambda: pipeline.status("pipeline").get("unmetDemand") == [], "unmetDemand cleared"
        )


def test_scaling_with_kubectl_patch_and_kubecluster_touches_only_that_group(
    pipeline: Deployment,
) -> None:
    highmem_uid = pipeline.pods("apportion.dev/group=highmem")[0]["metadata"]["uid"]
    pipeline.kubectl(
        "patch",
        "resourcecluster",
        "pipeline",
        "--type=json",
        "-p",
        json.dumps([{"op": "replace", "path": "/spec/workerGroups/0/replicas", "value": 1}]),
    )
    pipeline.wait_running("pipeline", {"gpu": 1, "highmem": 1})
    pipeline.wait(lambda: len(pipeline.pods("apportion.dev/group=gpu")) == 1, "one GPU pod")
    cluster = KubeCluster.from_name(
        "pipeline", pipeline.namespace, kubeconfig=str(pipeline.k8s.kubeconfig), timeout=120
    )
    cluster.scale(2, group="gpu")
    assert pipeline.group("pipeline", "gpu")["connectedWorkers"] == 2
    assert pipeline.pods("apportion.dev/group=highmem")[0]["metadata"]["uid"] == highmem_uid


def test_an_impossible_scale_up_says_why_pods_cannot_be_placed(pipeline: Deployment) -> None:
    cluster = KubeCluster.from_name(
        "pipeline", pipeline.namespace, kubeconfig=str(pipeline.k8s.kubeconfig), timeout=120
    )
    cluster.timeout = 20
    with pytest.raises(TimeoutError, match=r"Insufficient nvidia\.com/gpu"):
        cluster.scale(3, group="gpu")  # only four GPUs exist: a third GPU=2 pod cannot fit
    cluster.timeout = 120
    cluster.scale(2, group="gpu")


def test_a_contradictory_cluster_becomes_invalid_and_creates_nothing(deployed: Deployment) -> None:
    contradictory = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": "liar"},
        "spec": {
            "workerGroups": [
                {
                    "name": "gpu",
                    "replicas": 1,
                    "resources": {"GPU": 2},
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                            ]
                        }
                    },
                }
            ]
        },
    }
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(contradictory))
    status = deployed.wait(
        lambda: deployed.status("liar").get("phase") == "Invalid" and deployed.status("liar"),
        "liar Invalid",
    )
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert "declares GPU=2" in valid["message"] and "nvidia.com/gpu=1" in valid["message"]
    deployed.wait(
        lambda: any("declares GPU=2" in m for m in deployed.events("InvalidSpec")),
        "InvalidSpec event",
    )
    assert deployed.pods("app.kubernetes.io/instance=liar") == []
    deployed.kubectl("delete", "resourcecluster", "liar")


def test_kubecluster_creates_and_deleting_removes_every_child(deployed: Deployment) -> None:
    cluster = KubeCluster(
        "adhoc",
        deployed.namespace,
        kubeconfig=str(deployed.k8s.kubeconfig),
        timeout=180,
        worker_groups=[{"name": "cpu", "replicas": 1, "resources": {"process": 1}}],
        # Test pods share one network namespace: each cluster needs its own ports here.
        scheduler={"port": 9786, "httpPort": 9787},
    )
    with Client(cluster) as client:
        assert client.submit(hold, 0, resources={"process": 1}).result(timeout=60) == (
            "adhoc-cpu-0"
        )
    cluster.close()
    selector = "app.kubernetes.io/instance=adhoc"

    def gone() -> bool:
        kinds = "pods,services,deployments,secrets"
        out = deployed.kubectl("get", kinds, "-l", selector, "-o", "json")
        left = [f"{o['kind']}/{o['metadata']['name']}" for o in json.loads(out.stdout)["items"]]
        owner = deployed.rc("adhoc")
        if owner is not None:
            meta = owner["metadata"]
            left.append(
                f"ResourceCluster/adhoc (deletionTimestamp "
                f"{meta.get('deletionTimestamp')}, finalizers {meta.get('finalizers')})"
            )
        if left:
            raise AssertionError(f"still there: {left}")  # the wait's timeout shows this
        return True

    deployed.wait(gone, "every child of adhoc deleted", timeout=180)


def _uids(deployment: Deployment, selector: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in deployment.pods(selector)}


def test_groups_added_changed_and_removed_are_reconciled(pipeline: Deployment) -> None:
    def set_groups(change: Any) -> None:
        groups = pipeline.rc("pipeline")["spec"]["workerGroups"]
        change(groups)
        pipeline.kubectl(
            "patch",
            "resourcecluster",
            "pipeline",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"workerGroups": groups}}),
        )

    set_groups(lambda gs: gs.append({"name": "cpu", "replicas": 1, "resources": {"process": 1}}))
    pipeline.wait_running("pipeline", {"gpu": 2, "highmem": 1, "cpu": 1})
    gpu_before = _uids(pipeline, "apportion.dev/group=gpu")

    set_groups(lambda gs: next(g for g in gs if g["name"] == "highmem").update(nthreads=3))
    cluster = KubeCluster.from_name(
        "pipeline", pipeline.namespace, kubeconfig=str(pipeline.k8s.kubeconfig), timeout=120
    )
    with Client(cluster) as client:

        def highmem_threads() -> list[int]:
            workers = client.scheduler_info()["workers"].values()
            return [w["nthreads"] for w in workers if w["name"].startswith("pipeline-highmem-")]

        # The pod is replaced (the new one takes the next free name while the old goes).
        pipeline.wait(lambda: highmem_threads() == [3], "highmem worker replaced with 3 threads")
    pipeline.wait_running("pipeline", {"gpu": 2, "highmem": 1, "cpu": 1})

    set_groups(lambda gs: gs.remove(next(g for g in gs if g["name"] == "cpu")))
    pipeline.wait(lambda: pipeline.pods("apportion.dev/group=cpu") == [], "cpu pods deleted")
    pipeline.wait_running("pipeline", {"gpu": 2, "highmem": 1})
    assert [g["name"] for g in pipeline.status("pipeline")["workerGroups"]] == ["gpu", "highmem"]
    assert _uids(pipeline, "apportion.dev/group=gpu") == gpu_before, "other groups untouched"


def test_a_restarted_operator_resumes_without_duplicating_children(pipeline: Deployment) -> None:
    before = _uids(pipeline, "app.kubernetes.io/instance=pipeline")
    selector = "app.kubernetes.io/name=apportion,app.kubernetes.io/component=operator"
    pods = json.loads(
        pipeline.k8s.kubectl("get", "pods", "-n", pipeline.system, "-o", "json").stdout
    )["items"]
    (old,) = [
        p for p in pods if p["spec"]["containers"][0].get("command") == ["apportion", "operator"]
    ]
    pipeline.k8s.kubectl("delete", "pod", old["metadata"]["name"], "-n", pipeline.system)
    del selector

    def new_operator_reconciled() -> bool:
        fresh = [
            p
            for p in json.loads(
                pipeline.k8s.kubectl("get", "pods", "-n", pipeline.system, "-o", "json").stdout
            )["items"]
            if p["metadata"]["uid"] != old["metadata"]["uid"]
            and p["status"].get("phase") == "Running"
        ]
        return bool(fresh) and "Timer 'on_timer' succeeded" in pipeline.k8s.pod_log(
            fresh[0]["metadata"]["name"], pipeline.system
        )

    pipeline.wait(new_operator_reconciled, "a new operator pod reconciling")
    assert _uids(pipeline, "app.kubernetes.io/instance=pipeline") == before
    assert pipeline.status("pipeline")["phase"] == "Running"


def test_pods_refused_by_a_quota_show_as_a_condition_and_event(deployed: Deployment) -> None:
    existing = len(deployed.pods(""))
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "few-pods"},
        "spec": {"hard": {"pods": str(existing + 2)}},
    }
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(quota))
    deployed.wait(
        lambda: (
            json.loads(deployed.kubectl("get", "resourcequota", "few-pods", "-o", "json").stdout)
            .get("status", {})
            .get("used")
        ),
        "quota usage computed",
    )
    capped = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": "capped"},
        "spec": {
            "scheduler": {"port": 9886, "httpPort": 9887},
            "workerGroups": [{"name": "cpu", "replicas": 3}],
        },
    }
    try:
        deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(capped))

        def refused() -> str | None:
            for condition in deployed.status("capped").get("conditions", []):
                if condition["type"] == "ChildrenCreated" and condition["status"] == "False":
                    return str(condition["message"])
            return None

        message = deployed.wait(refused, "ChildrenCreated=False")
        assert "exceeded quota" in message and "cannot create worker pod" in message
        deployed.wait(
            lambda: any("exceeded quota" in m for m in deployed.events("CreateFailed")),
            "CreateFailed event",
        )
    finally:
        deployed.kubectl("delete", "resourcecluster", "capped", "--wait=true", check=False)
        deployed.kubectl("delete", "resourcequota", "few-pods", check=False)
