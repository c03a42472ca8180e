"""A deleted ResourceCluster stays deleted, and a status never goes back to an older spec:
on the real control plane, with the chart's operator.

Pods of every test share the host's network namespace: each cluster here has scheduler
ports of its own.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from apportion.kubernetes import KubeCluster

from .controlplane import Cluster
from .deployment import Deployment, deploy_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

Obj = dict[str, Any]
CHILD_KINDS = "pods,services,deployments,secrets,resourceworkergroups"
# Long enough for several of the operator's timer rounds (every 2 s by default): a cluster
# rebuilt after its deletion came back within 2-8 s.
WATCH_SECONDS = 12.0


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        yield deployment


def resource_cluster(name: str, port: int, groups: list[Obj]) -> Obj:
    return {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": name},
        "spec": {"scheduler": {"port": port, "httpPort": port + 1}, "workerGroups": groups},
    }


def children(deployed: Deployment, name: str) -> dict[str, str]:
    """Every object made for cluster ``name`` that is not being deleted: uid -> what."""
    out = deployed.kubectl(
        "get", CHILD_KINDS, "-l", f"app.kubernetes.io/instance={name}", "-o", "json"
    )
    return {
        o["metadata"]["uid"]: f"{o['kind']}/{o['metadata']['name']}"
        for o in json.loads(out.stdout)["items"]
        if not o["metadata"].get("deletionTimestamp")
    }


def events_of(deployed: Deployment, uid: str) -> set[tuple[str, int]]:
    """The Events about the object of ``uid``, each as (name, times posted)."""
    out = deployed.kubectl(
        "get", "events", "--field-selector", f"involvedObject.uid={uid}", "-o", "json"
    )
    return {
        (e["metadata"]["name"], int(e.get("count") or 1)) for e in json.loads(out.stdout)["items"]
    }


def operator_log(deployed: Deployment) -> list[str]:
    pods = json.loads(
        deployed.k8s.kubectl("get", "pods", "-n", deployed.system, "-o", "json").stdout
    )["items"]
    return [
        line
        for pod in pods
        for line in deployed.k8s.pod_log(pod["metadata"]["name"], deployed.system).splitlines()
    ]


def assert_stays_deleted(deployed: Deployment, name: str, uid: str, before: dict[str, str]) -> None:
    """After the cluster ``name`` (``uid``) was deleted: nothing of it is made again, no
    Event is posted about it, and the operator forgot it and stopped reconciling it."""
    events = events_of(deployed, uid)
    made_again: dict[str, str] = {}
    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        made_again.update({u: w for u, w in children(deployed, name).items() if u not in before})
        time.sleep(0.5)
    assert made_again == {}, f"made again after the deletion: {sorted(made_again.values())}"
    assert events_of(deployed, uid) == events, "Events posted about a deleted cluster"
    where = f"{deployed.namespace}/{name}"
    log = operator_log(deployed)
    forgotten = [i for i, line in enumerate(log) if f"cluster {where} deleted: forgotten" in line]
    assert forgotten, f"the operator did not forget {where}"
    later = [
        line
        for line in log[forgotten[-1] :]
        if "Timer 'on_timer' succeeded" in line and f"[{where}]" in line
    ]
    # The timer's round under way when the deletion came may still finish; none after it.
    assert len(later) <= 1, f"the timer still runs for {where}: {later}"
    deployed.wait(lambda: not children(deployed, name), f"every child of {name} gone", 120)


# Five times in a row: the rebuilding it guards against came back only now and then.
@pytest.mark.parametrize("attempt", range(5))
def test_a_deleted_cluster_stays_deleted(deployed: Deployment, attempt: int) -> None:
    groups = [{"name": "cpu", "replicas": 2, "resources": {"process": 1}}]
    cluster = resource_cluster("doomed", 12286, groups)
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(cluster))
    deployed.wait_running("doomed", {"cpu": 2})
    uid = deployed.rc("doomed")["metadata"]["uid"]
    before = children(deployed, "doomed")
    assert len(before) >= 5  # Secret, Deployment, Service, worker group handle, pods
    deployed.kubectl("delete", "resourcecluster", "doomed", "--wait=true", timeout=60)
    assert_stays_deleted(deployed, "doomed", uid, before)


def test_a_cluster_closed_by_kubecluster_stays_deleted(deployed: Deployment) -> None:
    cluster = KubeCluster(
        "closed",
        deployed.namespace,
        kubeconfig=str(deployed.k8s.kubeconfig),
        timeout=180,
        worker_groups=[{"name": "cpu", "replicas": 1, "resources": {"process": 1}}],
        scheduler={"port": 12386, "httpPort": 12387},
    )
    deployed.wait_running("closed", {"cpu": 1})
    uid = deployed.rc("closed")["metadata"]["uid"]
    before = children(deployed, "closed")
    cluster.close()
    deployed.wait(lambda: deployed.rc("closed") is None, "closed deleted", 60)
    assert_stays_deleted(deployed, "closed", uid, before)


def test_a_status_never_goes_back_to_an_older_spec(deployed: Deployment) -> None:
    """A group added, then removed while the cluster runs, several times: every status seen
    (sampled all along) lists the groups of the spec it says it observed, and none is
    followed by one of an older generation; the last lists only the groups left."""
    base = {"name": "base", "replicas": 1, "resources": {"process": 1}}
    extra = {"name": "extra", "replicas": 1, "resources": {"process": 1}}
    deployed.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump(resource_cluster("shifting", 12486, [base]))
    )
    deployed.wait_running("shifting", {"base": 1})
    groups_at = {deployed.rc("shifting")["metadata"]["generation"]: ["base"]}
    seen: list[tuple[int, list[str], str]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            status = deployed.status("shifting")
            if "observedGeneration" in status:
                names = [g["name"] for g in status.get("workerGroups") or []]
                seen.append((status["observedGeneration"], names, status.get("phase", "")))

    def edit(groups: list[Obj]) -> None:
        out = deployed.kubectl(
            "patch",
            "resourcecluster",
            "shifting",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"workerGroups": groups}}),
            "-o",
            "json",
        )
        groups_at[json.loads(out.stdout)["metadata"]["generation"]] = [g["name"] for g in groups]

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for _ in range(3):
            edit([base, extra])
            deployed.wait_running("shifting", {"base": 1, "extra": 1})
            edit([base])
            deployed.wait(
                lambda: deployed.pods("apportion.dev/group=extra") == [], "extra pods deleted"
            )
            deployed.wait_running("shifting", {"base": 1})
        time.sleep(4)  # two more timer rounds
    finally:
        sampling.set()
        sampler.join(timeout=30)
    for generation, names, phase in seen:
        assert names == groups_at[generation], (generation, names, phase, groups_at)
    generations = [g for g, _, _ in seen]
    assert generations == sorted(generations), f"a status went back: {generations}"
    assert [g["name"] for g in deployed.status("shifting")["workerGroups"]] == ["base"]
    deployed.kubectl("delete", "resourcecluster", "shifting", "--wait=true", timeout=60)
