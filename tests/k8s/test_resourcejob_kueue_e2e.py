"""ResourceJobs queued under a GPU quota by a real Kueue (built from the Go module proxy by
build.sh), on the real control plane with the chart's operator.

A ClusterQueue holds 4 nvidia.com/gpu of one ResourceFlavor (the GPU nodes' label); three
jobs that each need 2 GPUs are submitted at once: two run, the third waits Queued with
Kueue's reason in its status. The clusters made after admission carry the flavor's node
selector, as Kueue's own integrations inject it. One running job is then evicted (its
Workload deactivated): every pod of it goes, its quota is released and the third job runs in
its place; reactivated, it runs again once quota frees, and all three end Succeeded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from .controlplane import Cluster
from .deployment import Deployment, deploy_job_operator
from .kueue import running_kueue

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]

Obj = dict[str, Any]
NODE_TYPE = "apportion.dev/node-type"


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    # Kueue's CRDs first: the operator finds the Workload kind when it starts.
    with running_kueue(k8s_cluster):
        try:
            with deploy_job_operator(k8s_cluster, delete_timeout=180) as deployment:
                yield deployment
        finally:
            for kind in ("clusterqueue/gpus", "resourceflavor/gpu"):
                k8s_cluster.kubectl("delete", kind, "--wait=false", check=False)


def queue_objects(namespace: str) -> list[Obj]:
    api = "kueue.x-k8s.io/v1beta2"
    return [
        {
            "apiVersion": api,
            "kind": "ResourceFlavor",
            "metadata": {"name": "gpu"},
            "spec": {"nodeLabels": {NODE_TYPE: "gpu"}},
        },
        {
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": "gpus"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "gpu",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": 64},
                                    {"name": "memory", "nominalQuota": "256Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": 4},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": api,
            "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": namespace},
            "spec": {"clusterQueue": "gpus"},
        },
    ]


def gpu_job(name: str, port: int, seconds: int) -> Obj:
    return {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceJob",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "team"}},
        "spec": {
            "suspend": True,
            "cluster": {
                "scheduler": {"port": port, "httpPort": port + 1},
                "workerGroups": [
                    {"name": "gpu", "replicas": 1, "nthreads": 1, "resources": {"GPU": 2}}
                ],
            },
            "entrypoint": [
                "python",
                "-c",
                "import time; from apportion import Client; c = Client(); "
                f"print('connected', flush=True); time.sleep({seconds}); c.close()",
            ],
        },
    }


def leftovers(deployed: Deployment, name: str) -> list[str]:
    """Pods of job ``name`` and of the cluster made for it, not on their way out."""
    found = []
    for selector in (f"apportion.dev/job={name}", f"apportion.dev/cluster={name}"):
        found += [p["metadata"]["name"] for p in deployed.pods(selector)]
    return found


def set_active(deployed: Deployment, job: str, active: bool) -> None:
    """Deactivate (Kueue evicts it) or reactivate the Workload of ``job``."""
    patch = json.dumps({"spec": {"active": active}})
    deployed.kubectl("patch", "workload", f"resourcejob-{job}", "--type=merge", "-p", patch)


def statuses(deployed: Deployment) -> dict[str, Obj]:
    out = deployed.kubectl("get", "resourcejobs", "-o", "json").stdout
    return {j["metadata"]["name"]: j.get("status") or {} for j in json.loads(out)["items"]}


def test_gpu_jobs_queue_under_a_quota_and_an_evicted_one_frees_its_pods(
    deployed: Deployment,
) -> None:
    deployed.k8s.apply(*queue_objects(deployed.namespace))
    jobs = [gpu_job(f"train-{i}", 13086 + 10 * i, 60) for i in range(3)]
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(jobs))

    def two_admitted_one_queued() -> dict[str, Obj] | None:
        """Two jobs admitted (starting or running), the third Queued with Kueue's reason."""
        found = statuses(deployed)
        admitted = [n for n, s in found.items() if s.get("phase") in ("Starting", "Running")]
        queued = [
            n
            for n, s in found.items()
            if s.get("phase") == "Queued" and "insufficient" in s.get("message", "")
        ]
        return found if len(admitted) == 2 and len(queued) == 1 else None

    found = deployed.wait(
        two_admitted_one_queued, f"two admitted, one Queued (now {statuses(deployed)})", 300
    )
    (waiting,) = [n for n, s in found.items() if s["phase"] == "Queued"]
    why = found[waiting]["message"]
    assert "insufficient" in why and "nvidia.com/gpu" in why, why  # Kueue's own words
    # Nothing of the waiting job exists.
    assert deployed.rc(waiting) is None
    assert not deployed.pods(f"apportion.dev/job={waiting}")
    # The admitted jobs' clusters were placed by the flavor's node labels.
    for name in found:
        if name == waiting:
            continue
        workers = deployed.wait(
            lambda name=name: deployed.pods(
                f"apportion.dev/cluster={name},apportion.dev/group=gpu"
            ),
            f"{name}'s GPU worker pod",
            180,
        )
        for pod in workers:
            assert pod["spec"].get("nodeSelector", {}).get(NODE_TYPE) == "gpu", pod["metadata"]
    # Kueue evicts one of the two (its Workload deactivated): every pod of it goes, its
    # quota is released, and the waiting job is admitted in its place.
    evicted = next(n for n in found if n != waiting)
    set_active(deployed, evicted, False)
    deployed.wait(
        lambda: statuses(deployed)[evicted].get("phase") == "Queued",
        f"{evicted} Queued again once evicted",
        120,
    )
    deployed.wait(lambda: not leftovers(deployed, evicted), f"every pod of {evicted} freed", 180)
    deployed.wait(
        lambda: statuses(deployed)[waiting].get("phase") in ("Starting", "Running", "Succeeded"),
        f"{waiting} admitted in the evicted job's place",
        180,
    )
    # Active again, the evicted job waits for quota, then runs from the beginning.
    set_active(deployed, evicted, True)
    finished = deployed.wait(
        lambda: (
            all(s.get("phase") == "Succeeded" for s in statuses(deployed).values())
            and statuses(deployed)
        ),
        "all three Succeeded",
        480,
    )
    assert len(finished) == 3
    workload = json.loads(
        deployed.kubectl("get", "workloads", f"resourcejob-{waiting}", "-o", "json").stdout
    )
    conditions = {c["type"]: c["status"] for c in workload["status"]["conditions"]}
    assert conditions.get("Finished") == "True"
