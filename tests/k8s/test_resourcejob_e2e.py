"""ResourceJobs on the real control plane, with the chart's operator: the seed pipeline from
a script to Succeeded (its cluster removed after), a failing entrypoint retried then
Failed, one past its deadline stopped, and one deleted mid-run leaving nothing behind.

Pods of every test share the host's network namespace: each cluster here has scheduler
ports of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from . import procs
from .controlplane import Cluster
from .deployment import Deployment, deploy_job_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]

Obj = dict[str, Any]

# The seed pipeline of the resources guide, as a user's script: load, process on GPUs
# (every tenth item needs both GPUs of a worker), aggregate on the 100 GB worker.
PIPELINE = """\
from apportion import Client, get_worker


def load(i):
    return [float(i + k) for k in range(100)]


def process(data):
    return sum(x * x for x in data), get_worker().name


def aggregate(parts):
    return sum(v for v, _ in parts), sorted({w for _, w in parts}), get_worker().name


with Client() as client:
    data = [client.submit(load, i) for i in range(40)]
    processed = [
        client.submit(process, d, resources={"GPU": 2 if i % 10 == 0 else 1})
        for i, d in enumerate(data)
    ]
    total, gpu_workers, where = client.submit(
        aggregate, processed, resources={"MEMORY": 70e9}
    ).result()
    print("processed on", gpu_workers)
    print("aggregate", total, "on", where)
"""


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_job_operator(k8s_cluster) as deployment:
        yield deployment


def job(deployed: Deployment, name: str) -> Obj | None:
    found = deployed.kubectl("get", "resourcejob", name, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def job_status(deployed: Deployment, name: str) -> Obj:
    return (job(deployed, name) or {}).get("status") or {}


def wait_phase(deployed: Deployment, name: str, *phases: str, timeout: float = 300) -> Obj:
    """The job's status once its phase is one of ``phases``; a timeout says the last seen."""
    last: list[Obj] = [{}]

    def reached() -> Obj | None:
        last[0] = job_status(deployed, name)
        return last[0] if last[0].get("phase") in phases else None

    try:
        return deployed.wait(reached, f"job {name} {' or '.join(phases)}", timeout)
    except procs.Timeout as err:
        raise procs.Timeout(f"{err}\nlast status of {name}: {last[0]}") from None


def submit(deployed: Deployment, manifest: Obj) -> None:
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))


def made_cluster(name: str, port: int, groups: list[Obj]) -> Obj:
    return {"scheduler": {"port": port, "httpPort": port + 1}, "workerGroups": groups}


def rjob(name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def leftovers(deployed: Deployment, name: str) -> list[str]:
    """Everything of job ``name`` (and the cluster made for it) not on its way out."""
    found = []
    for selector in (f"apportion.dev/job={name}", f"apportion.dev/cluster={name}"):
        out = deployed.kubectl(
            "get", "pods,resourceclusters,deployments,services", "-l", selector, "-o", "json"
        )
        found += [
            f"{o['kind']}/{o['metadata']['name']}"
            for o in json.loads(out.stdout)["items"]
            if not o["metadata"].get("deletionTimestamp")
        ]
    return found


def job_events(deployed: Deployment, name: str) -> list[str]:
    uid = (job(deployed, name) or {})["metadata"]["uid"]
    out = deployed.kubectl(
        "get", "events", "--field-selector", f"involvedObject.uid={uid}", "-o", "json"
    )
    items = sorted(
        json.loads(out.stdout)["items"], key=lambda e: e["metadata"]["creationTimestamp"]
    )
    return [e["reason"] for e in items]


def test_kubectl_explain_documents_every_field(deployed: Deployment) -> None:
    text = deployed.k8s.kubectl("explain", "resourcejob.spec").stdout
    for name in (
        "cluster",
        "clusterSelector",
        "entrypoint",
        "workingDir",
        "template",
        "activeDeadlineSeconds",
        "backoffLimit",
        "ttlSecondsAfterFinished",
        "shutdownAfterFinish",
        "suspend",
    ):
        assert f"\n  {name}\t" in text, name
    assert "<empty>" not in text
    status = deployed.k8s.kubectl("explain", "resourcejob.status").stdout
    assert "<empty>" not in status and "logTail" in status


def test_a_job_runs_the_seed_pipeline_and_its_cluster_goes_after(deployed: Deployment) -> None:
    deployed.kubectl(
        "create", "configmap", "pipeline-code", f"--from-literal=pipeline.py={PIPELINE}"
    )
    groups = [
        {"name": "gpu", "replicas": 2, "nthreads": 2, "resources": {"GPU": 2}},
        {"name": "highmem", "replicas": 1, "nthreads": 2, "resources": {"MEMORY": 100e9}},
    ]
    spec = {
        "cluster": made_cluster("seed", 12586, groups),
        "entrypoint": ["python", "pipeline.py"],
        "workingDir": {"configMap": "pipeline-code"},
    }
    submit(deployed, rjob("seed", spec))
    # A short pipeline may end between two looks of the operator: Running is not waited for.
    status = wait_phase(deployed, "seed", "Succeeded", "Failed", timeout=420)
    assert status["phase"] == "Succeeded", status
    assert status["clusterName"] == "seed"
    assert status["dashboard"] == f"http://seed-scheduler.{deployed.namespace}.svc:12587"
    assert status["exitCode"] == 0
    assert status["attempts"] == 1
    assert status["reason"] == "Completed"
    assert status["startTime"] <= status["completionTime"]
    assert "aggregate" in status["logTail"] and "seed-highmem-0" in status["logTail"]
    assert "seed-gpu-0" in status["logTail"] and "seed-gpu-1" in status["logTail"]
    # The cluster made for it is removed; the submitter pod stays for kubectl logs.
    deployed.wait(lambda: deployed.rc("seed") is None, "the job's cluster deleted", 120)
    deployed.wait(
        lambda: not deployed.pods("apportion.dev/cluster=seed"), "the cluster's pods gone", 120
    )
    logs = deployed.kubectl("logs", "seed-1").stdout
    assert "aggregate" in logs
    # Every transition one Event, in order.
    reasons = job_events(deployed, "seed")
    assert reasons[0] == "ClusterStarting" and reasons[-1] == "Completed", reasons
    assert reasons.count("Running") <= 1 and reasons.count("Completed") == 1, reasons
    assert len(reasons) == len(set(reasons)), reasons  # no transition announced twice
    printed = deployed.kubectl("get", "rjob", "seed").stdout
    assert "Succeeded" in printed.splitlines()[1], printed
    deployed.kubectl("delete", "rjob", "seed", "--wait=true", timeout=60)
    deployed.wait(lambda: not leftovers(deployed, "seed"), "nothing of seed left", 120)


def test_a_failing_entrypoint_is_retried_then_fails(deployed: Deployment) -> None:
    groups = [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}]
    spec = {
        "cluster": made_cluster("flaky", 12686, groups),
        "entrypoint": [
            "python",
            "-c",
            "import sys; from apportion import Client; Client().close(); "
            "print('bad input: no rows'); sys.exit(3)",
        ],
        "backoffLimit": 1,
    }
    submit(deployed, rjob("flaky", spec))
    status = wait_phase(deployed, "flaky", "Failed", timeout=420)
    assert status["reason"] == "BackoffLimitExceeded"
    assert status["exitCode"] == 3
    assert status["attempts"] == 2
    assert status["message"] == "the entrypoint failed with exit code 3 after 2 attempts"
    assert "bad input: no rows" in status["logTail"]
    # Both attempts' pods are kept (their logs), each ran against its own cluster.
    pods = {p["metadata"]["name"] for p in deployed.pods("apportion.dev/job=flaky")}
    assert pods >= {"flaky-1", "flaky-2"}
    assert job_events(deployed, "flaky").count("Retrying") == 1
    deployed.wait(lambda: deployed.rc("flaky") is None, "the job's cluster deleted", 120)


def test_a_job_past_its_deadline_is_stopped_then_deleted_after_its_ttl(
    deployed: Deployment,
) -> None:
    groups = [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}]
    shared = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": "shared"},
        "spec": made_cluster("shared", 12786, groups),
    }
    submit(deployed, shared)
    deployed.wait_running("shared", {"cpu": 1})
    spec = {
        "clusterSelector": {"name": "shared"},
        "entrypoint": [
            "python",
            "-c",
            "import time; print('working', flush=True); time.sleep(600)",
        ],
        "activeDeadlineSeconds": 25,
        "ttlSecondsAfterFinished": 15,
    }
    submit(deployed, rjob("slow", spec))
    wait_phase(deployed, "slow", "Running", timeout=120)
    status = wait_phase(deployed, "slow", "Failed", timeout=120)
    assert status["reason"] == "DeadlineExceeded"
    deployed.wait(
        lambda: all(
            (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            for p in deployed.pods("apportion.dev/job=slow")
        ),
        "the entrypoint stopped",
        120,
    )
    # Its TTL deletes the finished job, and its submitter pod with it.
    deployed.wait(lambda: job(deployed, "slow") is None, "slow deleted after its TTL", 120)
    deployed.wait(lambda: not leftovers(deployed, "slow"), "nothing of slow left", 120)
    # A selected cluster is not the job's: it keeps running.
    assert deployed.status("shared")["phase"] == "Running"
    deployed.kubectl("delete", "resourcecluster", "shared", "--wait=true", timeout=60)


def connected_for_long(name: str, port: int, workers: int) -> Obj:
    """A job whose entrypoint connects to its cluster, then waits ten minutes."""
    groups = [{"name": "cpu", "replicas": workers, "resources": {"process": 1}}]
    return {
        "cluster": made_cluster(name, port, groups),
        "entrypoint": [
            "python",
            "-c",
            "import time; from apportion import Client; c = Client(); "
            "print('connected', flush=True); time.sleep(600)",
        ],
    }


def test_a_job_deleted_mid_run_leaves_nothing(deployed: Deployment) -> None:
    submit(deployed, rjob("doomed", connected_for_long("doomed", 12886, 2)))
    wait_phase(deployed, "doomed", "Running", timeout=300)
    assert deployed.rc("doomed") is not None
    deployed.kubectl("delete", "rjob", "doomed", "--wait=true", timeout=120)
    deployed.wait(lambda: not leftovers(deployed, "doomed"), "nothing of doomed left", 180)

    def pods_named_doomed() -> list[str]:
        out = deployed.kubectl("get", "pods", "-o", "json").stdout
        return [
            p["metadata"]["name"]
            for p in json.loads(out)["items"]
            if p["metadata"]["name"].startswith("doomed-")
        ]

    deployed.wait(lambda: not pods_named_doomed(), "every pod of doomed removed", 180)


def test_suspending_a_job_frees_every_pod_and_resuming_runs_it_again(
    deployed: Deployment,
) -> None:
    submit(deployed, rjob("paused", connected_for_long("paused", 12986, 1)))
    wait_phase(deployed, "paused", "Running", timeout=300)
    deployed.kubectl("patch", "rjob", "paused", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    status = wait_phase(deployed, "paused", "Suspended", timeout=120)
    assert status["attempts"] == 1
    deployed.wait(lambda: not leftovers(deployed, "paused"), "every pod of paused freed", 180)
    deployed.kubectl("patch", "rjob", "paused", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    status = wait_phase(deployed, "paused", "Running", timeout=300)
    assert status["attempts"] == 1  # a suspended run is not a failed attempt
    deployed.kubectl("delete", "rjob", "paused", "--wait=true", timeout=120)
    deployed.wait(lambda: not leftovers(deployed, "paused"), "nothing of paused left", 180)
