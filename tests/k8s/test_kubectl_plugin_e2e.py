"""``kubectl apportion`` as a user runs it: real kubectl finds the ``kubectl-apportion``
console script on PATH and runs it against the test control plane and a helm-installed
operator (clusters: create, get, scale, logs, dashboard, status, delete), and against a
namespace no operator watches (jobs: submit with a working directory, --wait, get, logs
and --follow, status, delete; the ResourceJob CRD from crds/, with statuses written as
the operator would).

Errors as a user meets them: an unknown cluster, a user without RBAC (a ServiceAccount's
token with no Role), a ResourceJob CRD that is not installed (when it is not).
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .controlplane import Cluster
from .deployment import CRD_FILE, JOB_CRD_FILE, Deployment, deploy_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]


def plugin_environment(k8s: Cluster, env: dict[str, str] | None = None) -> dict[str, str]:
    """The control plane's kubeconfig, and this interpreter's scripts first on PATH (where
    kubectl finds ``kubectl-apportion``)."""
    environment = {**k8s.env(), **(env or {})}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    return environment


def plugin_started(k8s: Cluster, *args: str) -> subprocess.Popen[str]:
    """``kubectl apportion ARGS`` left running (for --wait and --follow)."""
    return subprocess.Popen(
        [str(k8s.bin_dir / "kubectl"), "apportion", *args],
        env=plugin_environment(k8s),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def plugin(
    k8s: Cluster, *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``kubectl apportion ARGS``, kubectl finding the plugin on PATH (this venv's bin)."""
    result = subprocess.run(
        [str(k8s.bin_dir / "kubectl"), "apportion", *args],
        env=plugin_environment(k8s, env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"kubectl apportion {' '.join(args)} exited {result.returncode}:\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def made(deployed: Deployment) -> Deployment:
    """A cluster made by the plugin, waited for until every worker is connected."""
    out = plugin(
        deployed.k8s,
        "create", "cluster", "plug", "-n", deployed.namespace,
        "--group", "cpu:2:slot=2", "--group", "extra:0:slot=1",
        "--wait", "--timeout", "240",
    )  # fmt: skip
    assert "resourcecluster.apportion.dev/plug created" in out.stdout
    return deployed


def test_get_shows_phase_workers_and_resources(made: Deployment) -> None:
    out = plugin(made.k8s, "get", "clusters", "-n", made.namespace).stdout
    header, row = out.splitlines()[:2]
    assert header.split()[:3] == ["NAME", "PHASE", "WORKERS"] and "RESOURCES" in header
    assert row.split()[:3] == ["plug", "Running", "2/2"]
    assert "slot 0/4" in row
    listed = json.loads(
        plugin(made.k8s, "get", "clusters", "-n", made.namespace, "-o", "json").stdout
    )
    assert [o["metadata"]["name"] for o in listed["items"]] == ["plug"]
    one = yaml.safe_load(
        plugin(made.k8s, "get", "cluster", "plug", "-n", made.namespace, "-o", "yaml").stdout
    )
    cpu = one["spec"]["workerGroups"][0]
    assert (cpu["name"], cpu["replicas"], cpu["resources"]) == ("cpu", 2, {"slot": 2})


def test_scale_changes_a_group_and_the_operator_follows(made: Deployment) -> None:
    out = plugin(made.k8s, "scale", "plug", "extra", "1", "-n", made.namespace)
    assert "group extra to 1" in out.stdout
    made.wait_running("plug", {"cpu": 2, "extra": 1})
    bad = plugin(made.k8s, "scale", "plug", "gpu", "1", "-n", made.namespace, check=False)
    assert bad.returncode == 1
    assert "no worker group 'gpu'; the groups are cpu, extra" in bad.stderr


def test_logs_of_the_scheduler_and_the_workers(made: Deployment) -> None:
    scheduler = plugin(made.k8s, "logs", "plug", "-n", made.namespace).stdout
    assert "scheduler" in scheduler.lower()
    workers = plugin(made.k8s, "logs", "plug", "--workers", "--tail", "5", "-n", made.namespace)
    assert "[plug-cpu-0]" in workers.stdout and "[plug-cpu-1]" in workers.stdout


def test_status_of_a_running_cluster_and_an_unknown_one(made: Deployment) -> None:
    out = plugin(made.k8s, "status", "plug", "-n", made.namespace).stdout
    assert out.splitlines()[0] == "ResourceCluster plug: phase Running"
    missing = plugin(made.k8s, "status", "nope", "-n", made.namespace, check=False)
    assert missing.returncode == 1
    assert f"no ResourceCluster 'nope' in namespace {made.namespace}" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_dashboard_is_forwarded_signed_in(made: Deployment) -> None:
    environment = made.k8s.env()
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    process = subprocess.Popen(
        [str(made.k8s.bin_dir / "kubectl"), "apportion", "dashboard", "plug", "--no-browser",
         "-n", made.namespace],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the first line is the link
        assert line.startswith("dashboard of plug: http://127.0.0.1:"), line
        link = line.split(": ", 1)[1].strip()
        assert "/dashboard?token=" in link
        # The link signs in with a cookie, then shows the page.
        browser = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        with browser.open(link, timeout=30) as reply:
            assert reply.status == 200
            assert b"<html" in reply.read().lower()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()
        if process.stdout is not None:
            process.stdout.close()


def test_completion_lists_cluster_names(made: Deployment) -> None:
    environment = {
        **made.k8s.env(),
        "_KUBECTL_APPORTION_COMPLETE": "bash_complete",
        "COMP_WORDS": f"kubectl-apportion status -n {made.namespace} pl",
        "COMP_CWORD": "4",
    }
    script = Path(sys.executable).parent / "kubectl-apportion"
    out = subprocess.run([str(script)], env=environment, capture_output=True, text=True, timeout=60)
    assert "plain,plug" in out.stdout.splitlines(), out  # bash completion: TYPE,VALUE lines


def test_a_user_without_rbac_is_told_so(made: Deployment, tmp_path: Path) -> None:
    k8s = made.k8s
    k8s.kubectl("create", "serviceaccount", "nobody", "-n", made.namespace)
    token = k8s.kubectl("create", "token", "nobody", "-n", made.namespace).stdout.strip()
    config = yaml.safe_load(Path(k8s.kubeconfig).read_text())
    config["users"] = [{"name": "nobody", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "nobody"
    kubeconfig = tmp_path / "nobody.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    out = plugin(
        k8s,
        "get",
        "clusters",
        "-n",
        made.namespace,
        env={"KUBECONFIG": str(kubeconfig)},
        check=False,
    )
    assert out.returncode == 1
    assert "no access: the API server refused to list resourceclusters" in out.stderr
    assert "ask for a Role" in out.stderr and "Traceback" not in out.stderr


def test_delete_removes_the_cluster(made: Deployment) -> None:
    out = plugin(made.k8s, "delete", "cluster/plug", "--wait", "-n", made.namespace)
    assert "resourcecluster.apportion.dev/plug deleted" in out.stdout
    assert made.rc("plug") is None
    again = plugin(made.k8s, "delete", "plug", "-n", made.namespace, check=False)
    assert again.returncode == 1 and "no ResourceCluster 'plug'" in again.stderr


# ----- jobs (no operator watches this namespace: the plugin's side of the contract) -----


@pytest.fixture
def job_crd(k8s_cluster: Cluster, k8s_namespace: str) -> str:
    installed = k8s_cluster.kubectl("get", "crd", "resourcejobs.apportion.dev", check=False)
    if installed.returncode != 0:
        missing = plugin(k8s_cluster, "get", "jobs", "-n", k8s_namespace, check=False)
        assert missing.returncode == 1
        assert "the ResourceJob custom resource is not installed" in missing.stderr
        k8s_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(JOB_CRD_FILE))
        k8s_cluster.wait_crd_established("resourcejobs.apportion.dev")
    # Jobs name clusters: the plugin checks a named one exists (whichever test ran first).
    k8s_cluster.kubectl("apply", "-f", str(CRD_FILE))
    k8s_cluster.wait_crd_established("resourceclusters.apportion.dev")
    return k8s_namespace


def test_job_submit_uploads_the_working_dir_and_creates_the_job(
    k8s_cluster: Cluster, job_crd: str, tmp_path: Path
) -> None:
    namespace = job_crd
    (tmp_path / "script.py").write_text("print('the entrypoint ran')\n")
    (tmp_path / "cluster.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apportion.dev/v1alpha1",
                "kind": "ResourceCluster",
                "metadata": {"name": "ignored"},
                "spec": {"workerGroups": [{"name": "cpu", "replicas": 1}]},
            }
        )
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "script.py").write_text((tmp_path / "script.py").read_text())
    out = plugin(
        k8s_cluster,
        "job", "submit", "--name", "train", "-n", namespace,
        "--cluster-spec", str(tmp_path / "cluster.yaml"), "--working-dir", str(workdir),
        "--backoff-limit", "2", "--", "python", "script.py", "--epochs", "3",
    )  # fmt: skip
    assert "resourcejob.apportion.dev/train created" in out.stdout
    job = json.loads(
        k8s_cluster.kubectl("get", "resourcejob", "train", "-n", namespace, "-o", "json").stdout
    )
    assert job["spec"]["entrypoint"] == ["python", "script.py", "--epochs", "3"]
    # The cluster spec as given (the CRD's schema fills in its defaults beside it).
    (group,) = job["spec"]["cluster"]["workerGroups"]
    assert (group["name"], group["replicas"]) == ("cpu", 1)
    defaulted = {"workerGroups", "auth", "tls", "scheduler", "resourceMap"}
    assert set(job["spec"]["cluster"]) <= defaulted
    assert job["spec"]["workingDir"] == {"configMap": "train-workdir"}
    assert job["spec"]["backoffLimit"] == 2
    configmap = json.loads(
        k8s_cluster.kubectl(
            "get", "configmap", "train-workdir", "-n", namespace, "-o", "json"
        ).stdout
    )
    assert configmap["data"] == {"script.py": "print('the entrypoint ran')\n"}
    (owner,) = configmap["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("ResourceJob", job["metadata"]["uid"])

    unknown = plugin(
        k8s_cluster, "job", "submit", "-n", namespace, "--cluster", "nope", "--", "python", "x.py",
        check=False,
    )  # fmt: skip
    assert (
        unknown.returncode == 1
        and f"no ResourceCluster 'nope' in namespace {namespace}" in unknown.stderr
    )

    # What a controller would write, then what the plugin shows of it.
    status = {
        "phase": "Failed",
        "attempts": 3,
        "exitCode": 2,
        "clusterName": "train-cluster",
        "reason": "BackoffLimitExceeded",
        "message": "the entrypoint exited 2 on each of 3 attempts",
        "logTail": "Traceback (most recent call last):\nValueError: bad input\n",
    }
    k8s_cluster.kubectl(
        "patch", "resourcejob", "train", "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": status}),
    )  # fmt: skip
    listed = plugin(k8s_cluster, "get", "jobs", "-n", namespace).stdout.splitlines()
    assert listed[0].split()[:5] == ["NAME", "PHASE", "CLUSTER", "ATTEMPTS", "EXIT"]
    assert listed[1].split()[:5] == ["train", "Failed", "train-cluster", "3", "2"]
    story = plugin(k8s_cluster, "status", "job/train", "-n", namespace).stdout
    assert "reason: BackoffLimitExceeded: the entrypoint exited 2 on each of 3 attempts" in story
    assert "  ValueError: bad input" in story
    kept = plugin(k8s_cluster, "logs", "job/train", "-n", namespace)
    assert kept.stdout.splitlines()[-1] == "ValueError: bad input"
    assert "the submitter pod is gone" in kept.stderr


def job_with_submitter(
    k8s_cluster: Cluster,
    namespace: str,
    name: str,
    command: list[str],
    env: list[dict] | None = None,
) -> None:
    """A ResourceJob and the submitter pod the operator would make for it, running
    ``command`` in the image (no operator watches these tests' namespace)."""
    container = {
        "name": "submitter",
        "image": k8s_cluster.image,
        "imagePullPolicy": "Never",
        "command": command,
        "env": env or [],
    }
    labels = {"apportion.dev/job": name, "apportion.dev/component": "submitter"}
    k8s_cluster.apply(
        {
            "apiVersion": "apportion.dev/v1alpha1",
            "kind": "ResourceJob",
            "metadata": {"name": name},
            "spec": {"entrypoint": ["python", "-c", "x"], "clusterSelector": {"name": "x"}},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-submitter", "labels": labels},
            "spec": {"restartPolicy": "Never", "containers": [container]},
        },
        namespace=namespace,
    )


def test_job_logs_come_from_the_submitter_pod(
    k8s_cluster: Cluster, job_crd: str, tmp_path: Path
) -> None:
    namespace = job_crd
    job_with_submitter(
        k8s_cluster, namespace, "echo", ["python", "-c", "print('hello from the entrypoint')"]
    )
    k8s_cluster.wait_pod_phase("echo-submitter", ("Succeeded",), namespace)
    out = plugin(k8s_cluster, "logs", "job/echo", "-n", namespace).stdout
    assert "hello from the entrypoint" in out
    gone = plugin(k8s_cluster, "delete", "job/echo", "-n", namespace)
    assert "resourcejob.apportion.dev/echo deleted" in gone.stdout


def _set_job_status(k8s_cluster: Cluster, namespace: str, name: str, status: dict) -> None:
    """What the operator would write."""
    k8s_cluster.kubectl(
        "patch", "resourcejob", name, "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": status}),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("phase", "exit_code"), [("Succeeded", 0), ("Failed", 1)], ids=["succeeded", "failed"]
)
def test_job_submit_wait_returns_when_the_job_finishes_with_its_outcome(
    k8s_cluster: Cluster, job_crd: str, tmp_path: Path, phase: str, exit_code: int
) -> None:
    namespace, name = job_crd, f"waited-{phase.lower()}"
    spec = {"spec": {"workerGroups": [{"name": "cpu", "replicas": 1}]}}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(spec))
    waiting = plugin_started(
        k8s_cluster,
        "job", "submit", "--name", name, "-n", namespace,
        "--cluster-spec", str(tmp_path / "cluster.yaml"),
        "--wait", "--timeout", "240", "--", "python", "-c", "print(1)",
    )  # fmt: skip
    try:
        k8s_cluster.wait_for(
            lambda: (
                k8s_cluster.kubectl(
                    "get", "resourcejob", name, "-n", namespace, check=False
                ).returncode
                == 0
            ),
            f"{name} created",
            120,
        )
        _set_job_status(k8s_cluster, namespace, name, {"phase": "Running", "attempts": 1})
        assert waiting.poll() is None  # still waiting while it runs
        finished: dict = {"phase": phase, "attempts": 1}
        if phase == "Failed":
            finished.update(
                exitCode=3, reason="BackoffLimitExceeded", message="the entrypoint exited 3"
            )
        _set_job_status(k8s_cluster, namespace, name, finished)
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == exit_code, err
    assert f"resourcejob.apportion.dev/{name} created" in out
    assert f"resourcejob.apportion.dev/{name} {phase}" in err
    if phase == "Failed":
        assert "BackoffLimitExceeded: the entrypoint exited 3" in err


def test_job_logs_follow_streams_the_entrypoint_until_it_ends(
    k8s_cluster: Cluster, job_crd: str, tmp_path: Path
) -> None:
    namespace = job_crd
    # The entrypoint prints a line, then waits for the test to connect to it (after the
    # plugin has shown that line), then prints another and ends.
    script = (
        "import os, socket\n"
        "server = socket.create_server((os.environ['POD_IP'], 9000))\n"
        "print('first line', flush=True)\n"
        "server.accept()[0].close()\n"
        "print('second line', flush=True)\n"
    )
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    job_with_submitter(k8s_cluster, namespace, "follow", ["python", "-c", script], env)
    k8s_cluster.wait_pod_phase("follow-submitter", ("Running",), namespace)
    following = plugin_started(k8s_cluster, "logs", "job/follow", "-n", namespace, "-f")
    try:
        assert following.stdout is not None
        assert following.stdout.readline().strip() == "first line"
        assert following.poll() is None  # it follows: the pod is still running
        pod = json.loads(
            k8s_cluster.kubectl(
                "get", "pod", "follow-submitter", "-n", namespace, "-o", "json"
            ).stdout
        )
        socket.create_connection((pod["status"]["podIP"], 9000), timeout=30).close()
        rest, err = following.communicate(timeout=120)
    finally:
        if following.poll() is None:
            following.kill()
    assert following.returncode == 0, err
    assert rest.strip().splitlines() == ["second line"]
