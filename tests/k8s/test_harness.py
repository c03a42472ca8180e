"""Self-tests of the local Kubernetes control plane and the test kubelet. Pods run the
apportion image (it has python and sh) as containers, or as local processes with
APPORTION_K8S_PODS=processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import paths, procs
from .api import Client, Credentials
from .controlplane import Cluster
from .kubelet.__main__ import Kubelet
from .kubelet.runner import PodRunner
from .kubelet.runtime import POD_DIR_LABEL, podman_env

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

GPU_NODES = {"gpu-node-1", "gpu-node-2"}
POD_TIMEOUT = 120.0
# What pods of these tests name as their image; apply() puts the cluster's apportion image
# (the build of these sources) in its place.
APPORTION_IMAGE = "apportion-under-test"
# A path no test machine has: as processes, a workingDir that does not exist means the pod's
# own folder.
SHARED_WORKDIR = "/apportion-test-pod-work"


def pod_manifest(name: str, script: str, **spec: Any) -> dict[str, Any]:
    """A single-container pod of the apportion image running a Python script."""
    container = {"name": "main", "image": APPORTION_IMAGE, "command": ["python", "-c", script]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def with_image(obj: dict[str, Any], image: str) -> dict[str, Any]:
    """obj with APPORTION_IMAGE replaced by image, where it is a Pod or a Deployment."""
    if obj["kind"] not in ("Pod", "Deployment"):
        return obj
    pod_spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
        if container.get("image") == APPORTION_IMAGE:
            container["image"] = image
    return obj


def with_shared_workdir(pod: dict[str, Any]) -> dict[str, Any]:
    """pod with an emptyDir as every container's working directory: what one container (or
    an earlier run of it) writes there, the others (and the next run) see. As processes,
    where SHARED_WORKDIR does not exist, every container works in the pod's folder instead."""
    pod["spec"]["volumes"] = [{"name": "work", "emptyDir": {}}]
    for container in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        container["workingDir"] = SHARED_WORKDIR
        container["volumeMounts"] = [{"name": "work", "mountPath": SHARED_WORKDIR}]
    return pod


def apply(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    cluster.apply(*(with_image(o, cluster.image) for o in objects), namespace=namespace)


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in pod["status"].get("conditions", []) if c["type"] == kind), {})


def test_nodes_are_ready_with_the_seed_cluster_shape(k8s_cluster: Cluster) -> None:
    nodes = json.loads(k8s_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert set(by_name) == {"gpu-node-1", "gpu-node-2", "highmem-node"}
    for node in nodes:
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"
    for name in GPU_NODES:
        assert by_name[name]["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert by_name["highmem-node"]["status"]["capacity"]["memory"] == "100Gi"
    assert "nvidia.com/gpu" not in by_name["highmem-node"]["status"]["capacity"]


def test_server_and_clients_report_the_built_version(k8s_cluster: Cluster) -> None:
    wanted = paths.versions()["KUBE_VERSION"]
    assert k8s_cluster.client.get("/version")["gitVersion"] == wanted
    versions = json.loads(k8s_cluster.kubectl("version", "-o", "json").stdout)
    assert versions["clientVersion"]["gitVersion"] == wanted
    assert versions["serverVersion"]["gitVersion"] == wanted
    helm = k8s_cluster.helm("version", "--short").stdout
    assert helm.startswith(paths.versions()["HELM_VERSION"])


def test_pod_runs_to_succeeded_with_downward_api_env(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    script = "import os; print('hello', os.environ['MY_NAME'], os.environ['MY_IP'])"
    pod = pod_manifest(
        "hello",
        script,
        container={
            "env": [
                {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            ]
        },
    )
    apply(k8s_cluster, k8s_namespace, pod)
    done = k8s_cluster.wait_pod_phase("hello", ("Succeeded", "Failed"), k8s_namespace)
    assert done["status"]["phase"] == "Succeeded"
    pod_ip = done["status"]["podIP"]
    assert pod_ip.startswith("127.") and pod_ip != "127.0.0.1"
    state = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 0
    assert k8s_cluster.pod_log("hello", k8s_namespace) == f"hello hello {pod_ip}\n"
    served = k8s_cluster.kubectl("logs", "-n", k8s_namespace, "hello").stdout
    assert served == f"hello hello {pod_ip}\n"


def test_kubectl_logs_follows_a_pod_until_it_exits(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    script = "import time\nfor i in range(5):\n    print('tick', i)\n    time.sleep(0.3)"
    apply(k8s_cluster, k8s_namespace, pod_manifest("ticker", script))
    k8s_cluster.wait_pod_phase("ticker", ("Running", "Succeeded"), k8s_namespace)
    followed = k8s_cluster.kubectl("logs", "-f", "-n", k8s_namespace, "ticker").stdout
    assert followed.splitlines() == [f"tick {i}" for i in range(5)]


def test_failing_pod_is_failed_with_its_exit_code(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    apply(
        k8s_cluster, k8s_namespace, pod_manifest("fails", "import sys; print('bye'); sys.exit(3)")
    )
    done = k8s_cluster.wait_pod_phase("fails", ("Succeeded", "Failed"), k8s_namespace)
    assert done["status"]["phase"] == "Failed"
    state = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 3
    assert k8s_cluster.pod_log("fails", k8s_namespace) == "bye\n"
    # What a timed-out wait prints: the pod, its phase and node, its last log lines, and
    # what the kubelet said about it.
    diagnosis = k8s_cluster.diagnosis(k8s_namespace)
    assert f"pod fails: Failed on {done['spec']['nodeName']}" in diagnosis
    assert "main | bye" in diagnosis
    assert "kubelet | " in diagnosis and f"{k8s_namespace}/fails" in diagnosis


def test_deployment_pods_run_and_are_garbage_collected(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "sleeper"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "sleeper"}},
            "template": {
                "metadata": {"labels": {"app": "sleeper"}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": APPORTION_IMAGE,
                            "command": ["python", "-c", "import time; time.sleep(3600)"],
                        }
                    ]
                },
            },
        },
    }
    apply(k8s_cluster, k8s_namespace, deployment)
    path = f"/apis/apps/v1/namespaces/{k8s_namespace}/deployments/sleeper"
    k8s_cluster.wait_for(
        lambda: k8s_cluster.client.get(path).get("status", {}).get("readyReplicas") == 2,
        "2 ready replicas",
        timeout=POD_TIMEOUT,
    )
    pods = k8s_cluster.client.get(f"/api/v1/namespaces/{k8s_namespace}/pods")["items"]
    assert len(pods) == 2
    pid_files = [
        k8s_cluster.pod_log_path(p["metadata"]["name"], k8s_namespace).with_suffix(".pid")
        for p in pods
    ]
    assert all(f.exists() for f in pid_files)

    k8s_cluster.kubectl("delete", "-n", k8s_namespace, "deployment", "sleeper", "--wait=false")
    k8s_cluster.wait_for(
        lambda: not k8s_cluster.client.get(f"/api/v1/namespaces/{k8s_namespace}/pods")["items"],
        "the Deployment's pods to be garbage-collected",
        timeout=POD_TIMEOUT,
    )
    # The kubelet removes a pid file once it has reaped that process.
    assert not any(f.exists() for f in pid_files)


def test_gpu_pod_is_bound_only_to_a_gpu_node(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    names = [f"gpu-{i}" for i in range(3)]
    for name in names:
        apply(
            k8s_cluster,
            k8s_namespace,
            pod_manifest(
                name,
                "print('ok')",
                container={"resources": {"limits": {"nvidia.com/gpu": 1}}},
            ),
        )
    for name in names:
        k8s_cluster.wait_pod_phase(name, "Succeeded", k8s_namespace)
        assert k8s_cluster.pod_node(name, k8s_namespace) in GPU_NODES


def test_pod_asking_for_three_gpus_stays_pending_unschedulable(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    apply(
        k8s_cluster,
        k8s_namespace,
        pod_manifest(
            "greedy",
            "print('never')",
            container={"resources": {"limits": {"nvidia.com/gpu": 3}}},
        ),
    )
    pod = k8s_cluster.wait_pod(
        "greedy",
        lambda p: condition(p, "PodScheduled").get("reason") == "Unschedulable",
        "Unschedulable",
        k8s_namespace,
    )
    assert pod["status"]["phase"] == "Pending"
    assert "nvidia.com/gpu" in condition(pod, "PodScheduled")["message"]
    assert not pod["spec"].get("nodeName")


def test_two_pods_talk_through_a_service_name(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    ns = k8s_namespace
    server = pod_manifest(
        "echo-server",
        "",
        restartPolicy="Always",
        container={
            "command": ["python", "-m", "http.server", "8080", "--bind", "$(POD_IP)"],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        },
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "echo"},
        "spec": {"selector": {"app": "echo-server"}, "ports": [{"port": 8080, "targetPort": 8080}]},
    }
    client_script = textwrap.dedent(f"""
        import urllib.request
        for host in ("echo", "echo.{ns}", "echo.{ns}.svc", "echo.{ns}.svc.cluster.local"):
            with urllib.request.urlopen(f"http://{{host}}:8080/", timeout=10) as r:
                print(host, r.status)
    """)
    apply(k8s_cluster, ns, server, service)
    k8s_cluster.wait_pod(
        "echo-server", lambda p: condition(p, "Ready").get("status") == "True", "Ready", ns
    )
    apply(k8s_cluster, ns, pod_manifest("echo-client", client_script))
    done = k8s_cluster.wait_pod_phase("echo-client", ("Succeeded", "Failed"), ns)
    log = k8s_cluster.pod_log("echo-client", ns)
    assert done["status"]["phase"] == "Succeeded", log
    assert log.split() == [
        "echo",
        "200",
        f"echo.{ns}",
        "200",
        f"echo.{ns}.svc",
        "200",
        f"echo.{ns}.svc.cluster.local",
        "200",
    ]


def test_service_name_resolves_once_a_backing_pod_is_ready(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    # As a worker started before its scheduler: the name must appear in the running pod.
    ns = k8s_namespace
    client_script = textwrap.dedent(f"""
        import socket, time
        first = True
        while True:
            try:
                ip = socket.gethostbyname("late.{ns}.svc")
                break
            except socket.gaierror:
                if first:
                    print("unresolved", flush=True)
                    first = False
                time.sleep(0.2)
        with socket.create_connection((ip, 9100), timeout=10) as conn:
            print("got", conn.recv(100).decode())
    """)
    apply(k8s_cluster, ns, pod_manifest("late-client", client_script))
    log_path = k8s_cluster.pod_log_path("late-client", ns)
    k8s_cluster.wait_for(
        lambda: log_path.exists() and "unresolved" in log_path.read_text(),
        "the client's failed lookup",
        POD_TIMEOUT,
    )
    server_script = textwrap.dedent("""
        import os, socket
        server = socket.create_server((os.environ["POD_IP"], 9100))
        while True:
            conn, _ = server.accept()
            conn.sendall(b"hello")
            conn.close()
    """)
    server = pod_manifest(
        "late-server",
        server_script,
        restartPolicy="Always",
        container={
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "readinessProbe": {"tcpSocket": {"port": 9100}, "periodSeconds": 1},
        },
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "late"},
        "spec": {"selector": {"app": "late-server"}, "ports": [{"port": 9100}]},
    }
    apply(k8s_cluster, ns, server, service)
    done = k8s_cluster.wait_pod_phase("late-client", ("Succeeded", "Failed"), ns)
    assert done["status"]["phase"] == "Succeeded", log_path.read_text()
    assert log_path.read_text() == "unresolved\ngot hello\n"


def test_on_failure_pods_restart_until_they_succeed(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    # The pod's emptyDir (its working directory) survives restarts: count attempts there.
    script = textwrap.dedent("""
        import pathlib, sys
        counter = pathlib.Path("attempts")
        n = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(n))
        print("attempt", n)
        sys.exit(0 if n == 3 else 1)
    """)
    pod = with_shared_workdir(pod_manifest("retry", script, restartPolicy="OnFailure"))
    apply(k8s_cluster, k8s_namespace, pod)
    done = k8s_cluster.wait_pod_phase("retry", ("Succeeded", "Failed"), k8s_namespace)
    status = done["status"]["containerStatuses"][0]
    assert (done["status"]["phase"], status["restartCount"]) == ("Succeeded", 2)
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert k8s_cluster.pod_log("retry", k8s_namespace).split("\n")[:3] == [
        "attempt 1",
        "attempt 2",
        "attempt 3",
    ]


def test_init_containers_run_first_in_order(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    def step(name: str, text: str) -> dict[str, Any]:
        code = f"open('steps', 'a').write({text!r})"
        return {"name": name, "image": APPORTION_IMAGE, "command": ["python", "-c", code]}

    pod = pod_manifest("initialised", "print(open('steps').read())")
    pod["spec"]["initContainers"] = [step("one", "1"), step("two", "2")]
    apply(k8s_cluster, k8s_namespace, with_shared_workdir(pod))
    done = k8s_cluster.wait_pod_phase("initialised", ("Succeeded", "Failed"), k8s_namespace)
    assert done["status"]["phase"] == "Succeeded"
    assert [
        s["state"]["terminated"]["exitCode"] for s in done["status"]["initContainerStatuses"]
    ] == [0, 0]
    assert k8s_cluster.pod_log("initialised", k8s_namespace) == "12\n"


def test_a_failed_init_container_fails_the_pod(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    pod = pod_manifest("bad-init", "print('main ran')")
    container = pod["spec"]["containers"][0]
    pod["spec"]["initContainers"] = [
        {**container, "name": "breaks", "command": ["python", "-c", "raise SystemExit(4)"]},
        {**container, "name": "never", "command": ["python", "-c", "print('second ran')"]},
    ]
    apply(k8s_cluster, k8s_namespace, pod)
    done = k8s_cluster.wait_pod_phase("bad-init", ("Succeeded", "Failed"), k8s_namespace)
    assert done["status"]["phase"] == "Failed"
    first, second = done["status"]["initContainerStatuses"]
    assert first["state"]["terminated"]["exitCode"] == 4
    assert "terminated" not in second["state"]
    assert "terminated" not in done["status"]["containerStatuses"][0]["state"]


def test_crashing_always_pods_keep_running_phase_and_count_restarts(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    apply(
        k8s_cluster,
        k8s_namespace,
        pod_manifest("crasher", "raise SystemExit(2)", restartPolicy="Always"),
    )
    pod = k8s_cluster.wait_pod(
        "crasher",
        lambda p: p["status"].get("containerStatuses", [{}])[0].get("restartCount", 0) >= 2,
        "restarted twice",
        k8s_namespace,
    )
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 2


def test_exec_and_tcp_readiness_probes_gate_readiness(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    script = textwrap.dedent("""
        import os, pathlib, socket
        pathlib.Path("ready-flag").write_text("yes")
        s = socket.create_server((os.environ["POD_IP"], 9000))
        while True:
            s.accept()[0].close()
    """)
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    probes = {
        "exec-probe": {"exec": {"command": ["test", "-f", "ready-flag"]}, "periodSeconds": 1},
        "tcp-probe": {"tcpSocket": {"port": 9000}, "periodSeconds": 1},
    }
    for name, probe in probes.items():
        apply(
            k8s_cluster,
            k8s_namespace,
            pod_manifest(name, script, container={"env": env, "readinessProbe": probe}),
        )
    for name in probes:
        pod = k8s_cluster.wait_pod(
            name, lambda p: condition(p, "Ready").get("status") == "True", "Ready", k8s_namespace
        )
        assert pod["status"]["containerStatuses"][0]["ready"] is True


def test_a_failing_liveness_probe_restarts_the_container(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    # Healthy while the "healthy" file exists; each run deletes it after starting.
    script = textwrap.dedent("""
        import pathlib, time
        pathlib.Path("healthy").write_text("")
        print("started", flush=True)
        pathlib.Path("healthy").unlink()
        time.sleep(3600)
    """)
    probe = {
        "exec": {"command": ["test", "-f", "healthy"]},
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    apply(
        k8s_cluster,
        k8s_namespace,
        pod_manifest(
            "unhealthy", script, restartPolicy="Always", container={"livenessProbe": probe}
        ),
    )
    pod = k8s_cluster.wait_pod(
        "unhealthy",
        lambda p: p["status"].get("containerStatuses", [{}])[0].get("restartCount", 0) >= 1,
        "restarted by its liveness probe",
        k8s_namespace,
    )
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 137  # SIGKILL


def test_deleting_a_pod_sends_sigterm_then_finalises_it(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    script = textwrap.dedent("""
        import signal, sys, time
        def bye(*_):
            print("got SIGTERM", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("waiting", flush=True)
        while True:
            time.sleep(1)
    """)
    apply(k8s_cluster, k8s_namespace, pod_manifest("graceful", script))
    k8s_cluster.wait_pod_phase("graceful", "Running", k8s_namespace)
    log_path = k8s_cluster.pod_log_path("graceful", k8s_namespace)
    k8s_cluster.wait_for(
        lambda: "waiting" in log_path.read_text(), "the pod's first line", timeout=POD_TIMEOUT
    )
    k8s_cluster.kubectl("delete", "pod", "-n", k8s_namespace, "graceful", "--timeout=120s")
    assert k8s_cluster.get_pod("graceful", k8s_namespace) is None
    assert log_path.read_text() == "waiting\ngot SIGTERM\n"


def test_helm_installs_a_tiny_chart(
    k8s_cluster: Cluster, k8s_namespace: str, tmp_path: Path
) -> None:
    chart = tmp_path / "tiny"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "configmap.yaml").write_text(
        textwrap.dedent("""
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: {{ .Release.Name }}-config
        data:
          greeting: {{ .Values.greeting | quote }}
    """)
    )
    k8s_cluster.helm(
        "install",
        "tiny",
        str(chart),
        "-n",
        k8s_namespace,
        "--set",
        "greeting=hi",
        "--wait",
        "--timeout",
        "120s",
    )
    data = json.loads(
        k8s_cluster.kubectl(
            "get", "configmap", "-n", k8s_namespace, "tiny-config", "-o", "json"
        ).stdout
    )["data"]
    assert data == {"greeting": "hi"}
    releases = json.loads(k8s_cluster.helm("list", "-n", k8s_namespace, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [("tiny", "deployed")]
    k8s_cluster.helm("uninstall", "tiny", "-n", k8s_namespace, "--wait")


def test_kubectl_applies_a_crd_and_an_object_of_it(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    group, plural = "harness.apportion.dev", "widgets"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer"}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    k8s_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(crd))
    try:
        k8s_cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.{group}", "--timeout=120s"
        )
        widget = {
            "apiVersion": f"{group}/v1",
            "kind": "Widget",
            "metadata": {"name": "w1"},
            "spec": {"size": 3},
        }
        apply(k8s_cluster, k8s_namespace, widget)
        got = json.loads(
            k8s_cluster.kubectl(
                "get", "-n", k8s_namespace, f"widgets.{group}", "w1", "-o", "json"
            ).stdout
        )
        assert got["spec"] == {"size": 3}
    finally:
        k8s_cluster.kubectl("delete", "crd", f"{plural}.{group}", "--wait=false")


def test_stop_kills_every_process_even_the_pods_of_a_dead_kubelet(tmp_path: Path) -> None:
    missing = paths.missing_binaries_message()
    if missing:
        pytest.fail(missing, pytrace=False)
    cluster = Cluster.start(tmp_path)
    try:
        apply(
            cluster,
            "default",
            pod_manifest(
                "forker",
                "",
                restartPolicy="Always",
                container={"command": ["sh", "-c", "sleep 1000 & sleep 1001"]},
            ),
        )
        cluster.wait_pod_phase("forker", "Running")
        pod_pid = int(cluster.pod_log_path("forker").with_suffix(".pid").read_text())

        def sh_and_both_sleeps() -> list[int] | None:
            # As processes they share the pod's process group; in a container they are the
            # container's process tree (and the pid file holds the `podman run` client).
            members = procs.group_members(pod_pid)
            if cluster.pods == "containers":
                members += procs.tree(container_pid(cluster, "forker"))
            return members if len(members) >= 3 else None

        pod_pids = cluster.wait_for(sh_and_both_sleeps, "the pod's processes", 60)
        component_pids = {f.name: int(f.read_text()) for f in (tmp_path / "pids").iterdir()}
        # A kubelet killed outright cannot stop its pods; stop() must still find them.
        os.kill(component_pids["kubelet"], signal.SIGKILL)
    finally:
        cluster.stop()
    assert [name for name, pid in component_pids.items() if procs.running(pid)] == []
    assert [pid for pid in pod_pids if procs.running(pid)] == []
    if cluster.pods == "containers":
        assert podman("ps", "-aq", "--filter", f"label={POD_DIR_LABEL}={cluster.pods_dir}") == ""


def podman(*args: str) -> str:
    done = subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def container_pid(cluster: Cluster, pod: str, namespace: str = "default") -> int:
    """The host PID of the pod's first container's main process."""
    found = cluster.get_pod(pod, namespace)
    assert found is not None, f"no pod {namespace}/{pod}"
    container_id = found["status"]["containerStatuses"][0]["containerID"]
    assert container_id.startswith("podman://"), container_id
    return int(podman("inspect", "--format", "{{.State.Pid}}", container_id.split("//")[1]))


class _FlakyDeletes(Client):
    """The API client of a kubelet whose first pod deletions time out, as they do on a
    loaded machine (the API server answers after the client has given up)."""

    def __init__(self, creds: Credentials, failures: int) -> None:
        super().__init__(creds)
        self.failures = failures

    def delete(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any] | None:
        if "/pods/" in path and self.failures > 0:
            self.failures -= 1
            raise TimeoutError("timed out")
        return super().delete(path, body)


def test_a_deleted_pod_is_removed_even_when_the_api_server_times_out(
    k8s_cluster: Cluster, k8s_namespace: str, tmp_path: Path
) -> None:
    # A pod bound to a node the cluster's own kubelet does not keep, run by a runner of a
    # kubelet made here (pods as processes), whose API client times out twice on delete.
    client = _FlakyDeletes(Credentials.from_kubeconfig(k8s_cluster.kubeconfig), failures=2)
    kubelet = Kubelet(client, tmp_path, api_port=1, ip_octet=250, ca=tmp_path, containers=False)
    pod = pod_manifest("slow-api", "import time; time.sleep(600)")
    pod["spec"].update(nodeName="a-node-of-this-test", automountServiceAccountToken=False)
    created = k8s_cluster.client.create(f"/api/v1/namespaces/{k8s_namespace}/pods", pod)
    runner = PodRunner(kubelet, created, "127.250.0.2")
    runner.start()
    procs.wait_for(lambda: runner.running_pids, POD_TIMEOUT, "the pod's process")
    k8s_cluster.kubectl("delete", "pod", "-n", k8s_namespace, "slow-api", "--wait=false")
    runner.update(k8s_cluster.client.get(f"/api/v1/namespaces/{k8s_namespace}/pods/slow-api"))
    runner.join(timeout=POD_TIMEOUT)
    assert not runner.is_alive()
    assert client.failures == 0
    assert k8s_cluster.get_pod("slow-api", k8s_namespace) is None


def test_a_taken_port_is_named_with_its_holder_before_anything_starts() -> None:
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"port {port} is held by pid {os.getpid()} "):
            procs.require_free_ports([port], "pods listen there", patience=0.5)
    procs.require_free_ports([port], "pods listen there")  # free again: no error
