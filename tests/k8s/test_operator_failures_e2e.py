"""Past the happy path, on the real control plane: invalid edits, specs the API server
refuses, readiness, Events, phases, KubeCluster's errors and address, and deletion without
an operator.

Pods of every test share the host's network namespace: each cluster here has scheduler
ports of its own.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
import yaml

from apportion import Client, get_worker
from apportion.kubernetes import KubeCluster, KubeClusterError

from .controlplane import Cluster
from .deployment import CHART, Deployment, deploy_operator
from .kubelet.runtime import podman_env

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

Obj = dict[str, Any]


def whoami() -> str:
    return get_worker().name


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        yield deployment


def resource_cluster(name: str, port: int, groups: list[Obj], **spec: Any) -> Obj:
    return {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": name},
        "spec": {
            "scheduler": {"port": port, "httpPort": port + 1, **spec.pop("scheduler", {})},
            "workerGroups": groups,
            **spec,
        },
    }


def apply(deployed: Deployment, obj: Obj) -> None:
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))


def patch_groups(deployed: Deployment, name: str, groups: list[Obj]) -> None:
    deployed.kubectl(
        "patch",
        "resourcecluster",
        name,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"workerGroups": groups}}),
    )


def condition(deployed: Deployment, name: str, kind: str) -> Obj:
    conditions = deployed.status(name).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def refusal(deployed: Deployment, name: str) -> Obj:
    """The cluster's Valid condition, once it is False."""
    return deployed.wait(
        lambda: (
            condition(deployed, name, "Valid").get("status") == "False"
            and condition(deployed, name, "Valid")
        ),
        f"{name} Valid=False",
    )


def events_about(deployed: Deployment, name: str, reason: str) -> list[Obj]:
    out = deployed.kubectl("get", "events", "--field-selector", f"reason={reason}", "-o", "json")
    return [
        e
        for e in json.loads(out.stdout)["items"]
        if e["involvedObject"].get("name") == name
        and e["involvedObject"].get("kind") == "ResourceCluster"
    ]


def times_posted(events: list[Obj]) -> int:
    return sum(int(e.get("count") or 1) for e in events)


def wait_reconciled_after(deployed: Deployment, name: str) -> None:
    """Wait until the operator has looked at the cluster again, several timer rounds later
    (lastObserved moves on at least every 30 s; the timer runs every 2 s)."""
    before = deployed.reconciles()
    deployed.wait(lambda: deployed.reconciles() >= before + 6, f"six more reconciles of {name}")


# ----- defect 1: an invalid edit -----------------------------------------------------------


def test_an_invalid_edit_keeps_the_last_valid_spec_running(deployed: Deployment) -> None:
    good = [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}]
    apply(deployed, resource_cluster("keeper", 10786, good))
    deployed.wait_running("keeper", {"cpu": 1})
    before = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in deployed.pods("app.kubernetes.io/instance=keeper")
    }
    assert len(before) == 2  # the scheduler and one worker

    # GPU=1.5 cannot be allocated (whole units only); the new group must never appear.
    bad = [*good, {"name": "gpu", "replicas": 1, "resources": {"GPU": 1.5}}]
    patch_groups(deployed, "keeper", bad)
    refused = refusal(deployed, "keeper")
    assert "whole units" in refused["message"] and "GPU=1.5" in refused["message"]
    wait_reconciled_after(deployed, "keeper")
    status = deployed.status("keeper")
    assert status["phase"] == "Running" and status["workers"] == "1/1"
    assert [g["name"] for g in status["workerGroups"]] == ["cpu"]
    assert status["appliedSpec"]["workerGroups"][0]["name"] == "cpu"
    assert status["observedGeneration"] == deployed.rc("keeper")["metadata"]["generation"]
    now = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in deployed.pods("app.kubernetes.io/instance=keeper")
    }
    assert now == before, "the running scheduler and worker stay, nothing new is created"
    assert deployed.pods("apportion.dev/group=gpu") == []
    (event,) = events_about(deployed, "keeper", "InvalidSpec")
    assert times_posted([event]) == 1 and "whole units" in event["message"]
    printed = deployed.kubectl("get", "rcluster", "keeper").stdout
    assert "False" in printed.splitlines()[1], printed  # the Valid column

    # Fixed: the new spec applies.
    patch_groups(deployed, "keeper", [{**good[0], "replicas": 2}])
    deployed.wait_running("keeper", {"cpu": 2})
    assert condition(deployed, "keeper", "Valid")["status"] == "True"
    deployed.kubectl("delete", "resourcecluster", "keeper", "--wait=true")


def test_an_invalid_edit_lets_go_of_pods_not_placed_yet(deployed: Deployment) -> None:
    # Three GPU=2 workers on two nodes of two GPUs: one cannot be placed and waits.
    gpu = {"name": "gpu", "replicas": 3, "resources": {"GPU": 2}}
    apply(deployed, resource_cluster("greedy", 10836, [gpu]))
    workers = "apportion.dev/cluster=greedy,apportion.dev/group=gpu"
    pods = deployed.wait(
        lambda: (
            (found := deployed.pods(workers))
            and len(found) == 3
            and sum(bool(p["spec"].get("nodeName")) for p in found) == 2
            and found
        ),
        "two GPU workers placed, the third waiting for a node",
    )
    placed = {p["metadata"]["uid"] for p in pods if p["spec"].get("nodeName")}
    patch_groups(deployed, "greedy", [{**gpu, "resources": {"GPU": 1.5}}])
    refusal(deployed, "greedy")
    # The waiting pod would take the GPUs another cluster needs once they are free.
    deployed.wait(
        lambda: {p["metadata"]["uid"] for p in deployed.pods(workers)} == placed,
        "only the placed workers left",
    )
    wait_reconciled_after(deployed, "greedy")
    assert {p["metadata"]["uid"] for p in deployed.pods(workers)} == placed, "none made again"
    deployed.kubectl("delete", "resourcecluster", "greedy", "--wait=true")


# ----- defect 2: specs the API server refuses --------------------------------------------


def test_a_spec_the_api_server_refuses_builds_nothing_and_says_why_once(
    deployed: Deployment,
) -> None:
    # Valid to the CRD's schema (a string), refused when a pod is made of it.
    template = {"spec": {"dnsPolicy": "Sometimes"}}
    groups = [{"name": "cpu", "replicas": 1, "resources": {"process": 1}, "template": template}]
    apply(deployed, resource_cluster("refused", 10886, groups))
    valid = refusal(deployed, "refused")
    assert "dnsPolicy" in valid["message"] and "Sometimes" in valid["message"]
    assert deployed.status("refused")["phase"] == "Invalid"
    wait_reconciled_after(deployed, "refused")
    out = deployed.kubectl(
        "get",
        "pods,services,deployments,secrets",
        "-l",
        "app.kubernetes.io/instance=refused",
        "-o",
        "json",
    )
    assert json.loads(out.stdout)["items"] == [], "nothing half-built"
    (event,) = events_about(deployed, "refused", "InvalidSpec")
    assert times_posted([event]) == 1 and "dnsPolicy" in event["message"]
    deployed.kubectl("delete", "resourcecluster", "refused", "--wait=true")


def test_a_bad_quantity_in_the_scheduler_template_is_invalid_and_builds_nothing(
    deployed: Deployment,
) -> None:
    # A string the CRD's schema lets through; the operator names it, as for worker templates.
    limits = {"limits": {"memory": "lots"}}
    template = {"spec": {"containers": [{"name": "scheduler", "resources": limits}]}}
    groups = [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}]
    apply(deployed, resource_cluster("lots", 10896, groups, scheduler={"template": template}))
    valid = refusal(deployed, "lots")
    assert valid["reason"] == "InvalidSpec", valid
    assert "scheduler.template" in valid["message"], valid
    assert "'lots' is not a Kubernetes quantity" in valid["message"], valid
    assert deployed.status("lots")["phase"] == "Invalid"
    out = deployed.kubectl(
        "get", "pods,services,deployments", "-l", "app.kubernetes.io/instance=lots", "-o", "json"
    )
    assert json.loads(out.stdout)["items"] == [], "nothing half-built"
    deployed.kubectl("delete", "resourcecluster", "lots", "--wait=true")


def _operator_role(deployed: Deployment) -> Obj:
    roles = json.loads(deployed.kubectl("get", "roles", "-o", "json").stdout)["items"]
    (role,) = [r for r in roles if any("deployments" in rule["resources"] for rule in r["rules"])]
    return role


def test_an_unexpected_refusal_is_a_condition_and_one_event_until_it_passes(
    deployed: Deployment,
) -> None:
    # The operator's Role loses the right to write Deployments: the API server refuses
    # the scheduler's (403), a failure no spec check foresees.
    role = _operator_role(deployed)
    index = next(i for i, r in enumerate(role["rules"]) if "deployments" in r["resources"])
    rule = role["rules"][index]
    narrowed = [v for v in rule["verbs"] if v not in ("create", "patch", "update")]
    change = [{"op": "replace", "path": f"/rules/{index}/verbs", "value": narrowed}]
    name = role["metadata"]["name"]
    deployed.kubectl("patch", "role", name, "--type=json", "-p", json.dumps(change))
    try:
        groups = [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}]
        apply(deployed, resource_cluster("forbidden", 10936, groups))
        failed = deployed.wait(
            lambda: (
                condition(deployed, "forbidden", "Reconciled").get("status") == "False"
                and condition(deployed, "forbidden", "Reconciled")
            ),
            "Reconciled=False",
        )
        assert failed["reason"] == "ReconcileFailed"
        assert "403" in failed["message"] and "deployments" in failed["message"], failed
        wait_reconciled_after(deployed, "forbidden")  # retried, and still said once
        (event,) = events_about(deployed, "forbidden", "ReconcileFailed")
        assert times_posted([event]) == 1 and "403" in event["message"]
    finally:
        restore = [{"op": "replace", "path": f"/rules/{index}/verbs", "value": rule["verbs"]}]
        deployed.kubectl("patch", "role", name, "--type=json", "-p", json.dumps(restore))
    deployed.wait_running("forbidden", {"cpu": 1})
    assert condition(deployed, "forbidden", "Reconciled")["status"] == "True"
    deployed.kubectl("delete", "resourcecluster", "forbidden", "--wait=true")


# ----- defect 5: readiness means connected ------------------------------------------------


def _running_for(pod: Obj) -> float:
    for state in (pod.get("status") or {}).get("containerStatuses") or []:
        started = (state.get("state") or {}).get("running", {}).get("startedAt")
        if started:
            then = datetime.datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ")
            now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            return (now - then).total_seconds()
    return 0.0


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _scheduler_template(deployed: Deployment, name: str, template: Obj | None) -> None:
    op = {"op": "add", "path": "/spec/scheduler/template", "value": template}
    if template is None:
        op = {"op": "remove", "path": "/spec/scheduler/template"}
    deployed.kubectl("patch", "resourcecluster", name, "--type=json", "-p", json.dumps([op]))


def test_a_worker_pod_is_ready_only_while_connected(deployed: Deployment) -> None:
    # The scheduler cannot be placed (no such node): its workers run but cannot connect.
    nowhere = {"spec": {"nodeSelector": {"apportion.dev/node-type": "nowhere"}}}
    groups = [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}]
    apply(deployed, resource_cluster("lonely", 10986, groups, scheduler={"template": nowhere}))
    workers = "apportion.dev/cluster=lonely,apportion.dev/group=cpu"
    worker = deployed.wait(
        lambda: next((p for p in deployed.pods(workers) if _running_for(p) > 15), None),
        "the worker running for 15 s",
    )
    assert not _ready(worker), "not connected, so not Ready"
    # The worker answers the kubelet itself: no process is started per check.
    probe = worker["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"] == {"path": "/ready", "port": "readiness", "scheme": "HTTP"}

    _scheduler_template(deployed, "lonely", None)
    deployed.wait_running("lonely", {"cpu": 1})
    deployed.wait(
        lambda: all(_ready(p) for p in deployed.pods("apportion.dev/cluster=lonely")),
        "worker Ready once connected",
    )

    # The scheduler goes away (its pod stopped, the new one cannot be placed): the worker
    # keeps running, dialling again, and its pod is no longer Ready.
    _scheduler_template(deployed, "lonely", nowhere)
    (unready,) = deployed.wait(
        lambda: [p for p in deployed.pods(workers) if not _ready(p)], "worker no longer Ready"
    )
    assert unready["metadata"]["uid"] == worker["metadata"]["uid"], "the same pod, not replaced"
    (state,) = unready["status"]["containerStatuses"]
    assert "running" in state["state"] and not state["ready"], state
    deployed.kubectl("delete", "resourcecluster", "lonely", "--wait=true")


# ----- defect 7: one Event per change, Scaling, KubeCluster -------------------------------


def test_creation_is_announced_once_and_a_scale_down_is_scaling(deployed: Deployment) -> None:
    groups = [{"name": "cpu", "replicas": 2, "resources": {"process": 1}}]
    apply(deployed, resource_cluster("steady", 11086, groups))
    deployed.wait_running("steady", {"cpu": 2})
    wait_reconciled_after(deployed, "steady")
    created = [
        e for e in events_about(deployed, "steady", "Reconciled") if "creating" in e["message"]
    ]
    assert times_posted(created) == 1, created

    watch = subprocess.Popen(
        [
            "kubectl",
            "get",
            "resourcecluster",
            "steady",
            "-n",
            deployed.namespace,
            "-w",
            "-o",
            'jsonpath={.status.phase}{"\\n"}',
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=deployed.k8s.env(),
    )
    try:
        patch_groups(deployed, "steady", [{**groups[0], "replicas": 1}])
        deployed.wait(
            lambda: (
                deployed.group("steady", "cpu").get("currentReplicas") == 1
                and deployed.status("steady").get("phase") == "Running"
            ),
            "scaled down to one worker",
        )
        wait_reconciled_after(deployed, "steady")
    finally:
        watch.terminate()
    phases = [line for line in watch.communicate(timeout=30)[0].splitlines() if line]
    assert "Scaling" in phases and "Degraded" not in phases, phases
    deployed.kubectl("delete", "resourcecluster", "steady", "--wait=true")


def test_kubecluster_errors_are_plain_and_it_follows_a_restarted_scheduler(
    deployed: Deployment,
) -> None:
    kubeconfig = str(deployed.k8s.kubeconfig)
    with pytest.raises(KubeClusterError, match=r"workerGroups\[0\]\.name") as refused:
        KubeCluster(
            "badname",
            deployed.namespace,
            kubeconfig=kubeconfig,
            worker_groups=[{"name": "Bad_Name", "replicas": 1}],
        )
    assert "HTTP response headers" not in str(refused.value) and refused.value.status == 422

    # Accepted by the API server, invalid to the operator: the call fails, and leaves
    # nothing behind, so the same call made again fails for the same reason.
    memory = {"limits": {"memory": "lots"}}
    template = {"spec": {"containers": [{"name": "scheduler", "resources": memory}]}}
    for _attempt in range(2):
        with pytest.raises(ValueError, match="not a Kubernetes quantity"):
            KubeCluster(
                "badlimit",
                deployed.namespace,
                kubeconfig=kubeconfig,
                timeout=120,
                worker_groups=[{"name": "cpu", "replicas": 1, "resources": {"process": 1}}],
                scheduler={"port": 11196, "httpPort": 11197, "template": template},
            )
        deployed.wait(lambda: deployed.rc("badlimit") is None, "badlimit deleted")

    cluster = KubeCluster(
        "mover",
        deployed.namespace,
        kubeconfig=kubeconfig,
        timeout=180,
        worker_groups=[{"name": "cpu", "replicas": 1, "resources": {"process": 1}}],
        scheduler={"port": 11186, "httpPort": 11187},
    )
    with pytest.raises(KubeClusterError, match="already exists: attach to it with") as twice:
        KubeCluster("mover", deployed.namespace, kubeconfig=kubeconfig, worker_groups=[])
    assert "HTTP response headers" not in str(twice.value)

    with Client(cluster) as client:
        assert client.submit(whoami, pure=False).result(timeout=60) == "mover-cpu-0"
    first = cluster.scheduler_address
    (old,) = deployed.pods("app.kubernetes.io/instance=mover,app.kubernetes.io/component=scheduler")
    deployed.kubectl("delete", "pod", old["metadata"]["name"])

    def new_scheduler_serving() -> bool:
        pods = deployed.pods(
            "app.kubernetes.io/instance=mover,app.kubernetes.io/component=scheduler"
        )
        fresh = [p for p in pods if p["metadata"]["uid"] != old["metadata"]["uid"] and _ready(p)]
        return bool(fresh) and deployed.group("mover", "cpu").get("connectedWorkers") == 1

    deployed.wait(new_scheduler_serving, "a new scheduler pod with its worker back", timeout=180)
    (new,) = deployed.pods("app.kubernetes.io/instance=mover,app.kubernetes.io/component=scheduler")
    assert cluster.scheduler_address == f"tcp://{new['status']['podIP']}:11186" != first
    with Client(cluster) as client:
        assert client.submit(whoami, pure=False).result(timeout=60) == "mover-cpu-0"
    cluster.close()


# ----- defect 6: deletion without an operator ---------------------------------------------


def test_deleting_a_cluster_works_while_no_operator_runs(deployed: Deployment) -> None:
    groups = [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}]
    apply(deployed, resource_cluster("orphan", 11286, groups))
    deployed.wait_running("orphan", {"cpu": 1})
    assert not deployed.rc("orphan")["metadata"].get("finalizers")
    operator = ["deployment", "-n", deployed.system, "-l", "app.kubernetes.io/component=operator"]
    deployed.k8s.kubectl("scale", *operator, "--replicas=0")
    try:
        deployed.wait(
            lambda: (
                not json.loads(
                    deployed.k8s.kubectl("get", "pods", "-n", deployed.system, "-o", "json").stdout
                )["items"]
            ),
            "no operator pod",
        )
        deployed.kubectl("delete", "resourcecluster", "orphan", "--wait=true", timeout=60)
        deployed.wait(
            lambda: deployed.pods("app.kubernetes.io/instance=orphan") == [],
            "the cluster's pods garbage-collected",
        )
    finally:
        deployed.k8s.kubectl("scale", *operator, "--replicas=1")
        deployed.wait(
            lambda: any(
                _ready(p)
                for p in json.loads(
                    deployed.k8s.kubectl("get", "pods", "-n", deployed.system, "-o", "json").stdout
                )["items"]
            ),
            "the operator back",
        )


# ----- kubectl scale per worker group -----------------------------------------------------


def test_kubectl_scale_sizes_one_worker_group(deployed: Deployment) -> None:
    groups = [
        {"name": "cpu", "replicas": 1, "resources": {"process": 1}},
        {"name": "mem", "replicas": 1, "resources": {"MEMORY": 1e9}},
    ]
    apply(deployed, resource_cluster("scaled", 11486, groups))
    deployed.wait_running("scaled", {"cpu": 1, "mem": 1})

    def handle(name: str) -> Obj | None:
        found = deployed.kubectl("get", "rworkergroup", name, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else None

    deployed.wait(lambda: handle("scaled-cpu") and handle("scaled-mem"), "one handle per group")
    mem_uid = deployed.pods("apportion.dev/cluster=scaled,apportion.dev/group=mem")[0]["metadata"][
        "uid"
    ]
    deployed.kubectl("scale", "rworkergroup", "scaled-cpu", "--replicas=2")
    deployed.wait_running("scaled", {"cpu": 2, "mem": 1})
    cpu = next(g for g in deployed.rc("scaled")["spec"]["workerGroups"] if g["name"] == "cpu")
    assert cpu["replicas"] == 2
    deployed.wait(
        lambda: (
            (handle("scaled-cpu") or {}).get("status")
            == {"replicas": 2, "selector": "apportion.dev/cluster=scaled,apportion.dev/group=cpu"}
        ),
        "the handle's status: two connected workers",
    )
    pods = deployed.pods("apportion.dev/cluster=scaled,apportion.dev/group=mem")
    assert [p["metadata"]["uid"] for p in pods] == [mem_uid], "the other group untouched"

    # An edit of the cluster's group shows on its handle.
    patch_groups(deployed, "scaled", [{**groups[0], "replicas": 1}, groups[1]])
    deployed.wait(
        lambda: (handle("scaled-cpu") or {}).get("spec", {}).get("replicas") == 1,
        "the handle follows the cluster",
    )
    deployed.wait_running("scaled", {"cpu": 1, "mem": 1})
    deployed.kubectl("delete", "resourcecluster", "scaled", "--wait=true")


# ----- pods the nodes cannot place ----------------------------------------------------------


def occupy_a_gpu_pair() -> str:
    """Holds its worker's two GPUs until the cluster goes (the work of a long training)."""
    import threading

    threading.Event().wait(600)
    return get_worker().name


def test_workers_that_fit_run_and_the_rest_is_an_unschedulable_condition(
    deployed: Deployment,
) -> None:
    # Three GPU=2 workers on nodes with four GPUs in all: two fit.
    groups = [{"name": "gpu", "replicas": 3, "resources": {"GPU": 2}}]
    apply(deployed, resource_cluster("toobig", 11306, groups))

    def running_with_what_fits() -> Obj | None:
        status = deployed.status("toobig")
        unplaced = condition(deployed, "toobig", "Unschedulable")
        ok = (
            status.get("phase") == "Running"
            and status.get("workers") == "2/3"
            and unplaced.get("status") == "True"
        )
        return unplaced if ok else None

    unplaced = deployed.wait(running_with_what_fits, "toobig Running 2/3, Unschedulable")
    assert unplaced["reason"] == "PodsUnschedulable"
    assert unplaced["message"].startswith("group gpu: 1 of 3 pods cannot be placed (2 are): ")
    assert "nvidia.com/gpu" in unplaced["message"]
    assert condition(deployed, "toobig", "Ready")["status"] == "False"
    deployed.kubectl("delete", "resourcecluster", "toobig", "--wait=true")


def test_the_autoscaler_stops_at_what_the_nodes_can_place(deployed: Deployment) -> None:
    groups = [
        {
            "name": "gpu",
            "minReplicas": 0,
            "maxReplicas": 4,
            "idleTimeoutSeconds": 120,
            "resources": {"GPU": 2},
        },
        {"name": "cpu", "replicas": 1, "resources": {"process": 1}},
    ]
    apply(deployed, resource_cluster("capped", 11316, groups))
    deployed.wait_running("capped", {"cpu": 1})
    cluster = KubeCluster.from_name(
        "capped", deployed.namespace, kubeconfig=str(deployed.k8s.kubeconfig), timeout=180
    )
    selector = "app.kubernetes.io/instance=capped,apportion.dev/group=gpu"
    with Client(cluster) as client:
        work = [
            client.submit(occupy_a_gpu_pair, resources={"GPU": 2}, pure=False) for _ in range(8)
        ]

        def limited() -> Obj | None:
            found = deployed.group("capped", "gpu").get("limitedByNodes")
            return found if found and len(deployed.pods(selector)) == 3 else None

        said = deployed.wait(limited, "gpu limited by the nodes, 3 pods", timeout=180)
        assert said["placedReplicas"] == 2
        assert said["reason"].startswith("the nodes place 2 pod(s) of gpu now: ")
        # It stays there: two placed and one pending, never the four the demand asks for.
        wait_reconciled_after(deployed, "capped")
        assert len(deployed.pods(selector)) == 3
        assert deployed.group("capped", "gpu")["desiredReplicas"] == 3
        assert not any(f.done() for f in work)
    deployed.kubectl("delete", "resourcecluster", "capped", "--wait=true")


# ----- an operator upgrade ------------------------------------------------------------------


def _pod_uids(deployed: Deployment, cluster: str) -> set[str]:
    return {p["metadata"]["uid"] for p in deployed.pods(f"app.kubernetes.io/instance={cluster}")}


def _images(deployed: Deployment, cluster: str) -> set[str]:
    return {
        c["image"]
        for p in deployed.pods(f"app.kubernetes.io/instance={cluster}")
        for c in p["spec"]["containers"]
    }


def test_an_operator_upgrade_restarts_no_running_cluster_unless_it_follows(
    deployed: Deployment,
) -> None:
    """Last in this module: the operator runs a new default image afterwards."""
    groups = [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}]
    apply(deployed, resource_cluster("steady", 11326, groups))
    apply(deployed, resource_cluster("follower", 11336, groups, imageUpdatePolicy="FollowOperator"))
    deployed.wait_running("steady", {"cpu": 1})
    deployed.wait_running("follower", {"cpu": 1})
    old_image = deployed.k8s.image
    before = _pod_uids(deployed, "steady")
    assert deployed.status("steady")["image"] == old_image
    # A new default image: the same build under another tag (in processes mode pods ignore
    # images, so only the names are compared).
    repository, _, tag = old_image.rpartition(":")
    new_image = f"{repository}:{tag}-next"
    if deployed.k8s.pods == "containers":
        subprocess.run(
            ["podman", "tag", old_image, new_image], env=podman_env(), check=True, timeout=120
        )
    deployed.k8s.helm(
        "upgrade",
        deployed.release,
        str(CHART),
        "-n",
        deployed.system,
        "--reuse-values",
        "--set",
        f"image.tag={tag}-next",
        "--wait",
        "--timeout",
        "3m",
    )

    def operator_upgraded() -> bool:
        pods = json.loads(
            deployed.k8s.kubectl("get", "pods", "-n", deployed.system, "-o", "json").stdout
        )["items"]
        return bool(pods) and all(
            p["spec"]["containers"][0]["image"] == new_image and _ready(p)
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
        )

    deployed.wait(operator_upgraded, "the operator running the new image")
    apply(deployed, resource_cluster("fresh", 11346, groups))
    deployed.wait_running("fresh", {"cpu": 1})
    assert _images(deployed, "fresh") == {new_image}  # new clusters: the new default at once
    deployed.wait(lambda: _images(deployed, "follower") == {new_image}, "follower on the new image")
    deployed.wait_running("follower", {"cpu": 1})
    wait_reconciled_after(deployed, "steady")  # the new operator has looked at it, many times
    assert _pod_uids(deployed, "steady") == before, "a running cluster was restarted"
    assert _images(deployed, "steady") == {old_image}
    assert deployed.status("steady")["image"] == old_image
    for name in ("steady", "follower", "fresh"):
        deployed.kubectl("delete", "resourcecluster", name, "--wait=true")
