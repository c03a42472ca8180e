"""Self-tests: pods talk to the API server with their ServiceAccount's token, as in-cluster
clients expect (token files, KUBERNETES_SERVICE_HOST/PORT, https://kubernetes.default.svc)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from typing import Any

import pytest

from .controlplane import Cluster
from .kubelet.serviceaccount import MOUNT_PATH
from .test_harness import pod_manifest

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

# Reads the mounted token files and GETs its own pod with urllib only, through the env vars
# and through https://kubernetes.default.svc; prints "<via> <status> <name or message>".
WHOAMI = textwrap.dedent(
    f"""
    import json, os, ssl, urllib.error, urllib.request
    folder = {MOUNT_PATH!r}
    token = open(folder + "/token").read()
    namespace = open(folder + "/namespace").read()
    context = ssl.create_default_context(cafile=folder + "/ca.crt")

    def get(base):
        url = f"{{base}}/api/v1/namespaces/{{namespace}}/pods/{{os.environ['HOSTNAME']}}"
        request = urllib.request.Request(url, headers={{"Authorization": "Bearer " + token}})
        try:
            with urllib.request.urlopen(request, context=context, timeout=20) as response:
                return f"{{response.status}} {{json.load(response)['metadata']['name']}}"
        except urllib.error.HTTPError as err:
            return f"{{err.code}} {{json.load(err)['message']}}"

    env = os.environ
    print("env", get(f"https://{{env['KUBERNETES_SERVICE_HOST']}}:{{env['KUBERNETES_SERVICE_PORT']}}"))
    print("svc", get("https://kubernetes.default.svc"))
    """
)


def service_account(name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}, **fields}


def pod_reader_rbac(account: str) -> list[dict[str, Any]]:
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": {"name": f"{account}-reads-pods"},
            "roleRef": {"apiGroup": rbac.split("/")[0], "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": account}],
        },
    ]


def run_to_completion(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    cluster.apply(pod, namespace=namespace)
    return cluster.wait_pod_phase(pod["metadata"]["name"], ("Succeeded", "Failed"), namespace)


def forwarder_up(cluster: Cluster) -> bool:
    """Whether the kubelet serves https://kubernetes.default.svc (port 443; needs root)."""
    log = (cluster.log_dir / "kubelet.log").read_text()
    return "kubernetes.default.svc: 127.0.0.1" not in log


def token_dir(cluster: Cluster, name: str, namespace: str) -> Path:
    return cluster.pod_log_path(name, namespace).parent / "serviceaccount"


def test_pod_reads_itself_with_its_service_account(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    k8s_cluster.apply(service_account("reader"), *pod_reader_rbac("reader"), namespace=ns)
    pod = pod_manifest("whoami", WHOAMI, serviceAccountName="reader")
    done = run_to_completion(k8s_cluster, ns, pod)
    log = k8s_cluster.pod_log("whoami", ns)
    assert done["status"]["phase"] == "Succeeded", log
    lines = log.splitlines()
    assert lines[0] == "env 200 whoami", log
    if forwarder_up(k8s_cluster):
        assert lines[1] == "svc 200 whoami", log
    # The kubelet's copy: token, CA and namespace; the host's mount point stays empty.
    folder = token_dir(k8s_cluster, "whoami", ns)
    assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "namespace", "token"]
    assert (folder / "namespace").read_text() == ns
    assert (folder / "ca.crt").read_text() == (k8s_cluster.workdir / "pki" / "ca.crt").read_text()
    # Deleting the pod removes its token folder (the bound token dies with the pod).
    k8s_cluster.kubectl("delete", "pod", "-n", ns, "whoami", "--wait=true")
    k8s_cluster.wait_for(lambda: not folder.exists(), "the token folder removed", timeout=30)


def test_without_a_role_the_service_account_is_forbidden(
    k8s_cluster: Cluster, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    k8s_cluster.apply(service_account("nobody"), namespace=ns)
    done = run_to_completion(
        k8s_cluster, ns, pod_manifest("whoami", WHOAMI, serviceAccountName="nobody")
    )
    log = k8s_cluster.pod_log("whoami", ns)
    assert done["status"]["phase"] == "Succeeded", log
    first = log.splitlines()[0]
    # RBAC is enforced with the ServiceAccount's identity.
    assert first.startswith("env 403 "), log
    assert f'"system:serviceaccount:{ns}:nobody" cannot get resource "pods"' in first, log


@pytest.mark.parametrize(
    ("pod_automount", "account_automount", "mounted"),
    [(False, None, False), (None, False, False), (True, False, True)],
    ids=["pod-false", "serviceaccount-false", "pod-true-overrides-serviceaccount"],
)
def test_automount_service_account_token(
    k8s_cluster: Cluster,
    k8s_namespace: str,
    pod_automount: bool | None,
    account_automount: bool | None,
    mounted: bool,
) -> None:
    ns = k8s_namespace
    account = service_account("robot")
    if account_automount is not None:
        account["automountServiceAccountToken"] = account_automount
    k8s_cluster.apply(account, namespace=ns)
    spec: dict[str, Any] = {"serviceAccountName": "robot"}
    if pod_automount is not None:
        spec["automountServiceAccountToken"] = pod_automount
    script = f"import os; print(sorted(os.listdir({MOUNT_PATH!r})))"
    done = run_to_completion(k8s_cluster, ns, pod_manifest("probe", script, **spec))
    log = k8s_cluster.pod_log("probe", ns)
    assert done["status"]["phase"] == "Succeeded", log
    expected = ["ca.crt", "namespace", "token"] if mounted else []
    assert log == f"{expected}\n"
    assert token_dir(k8s_cluster, "probe", ns).exists() == mounted


@pytest.mark.skipif(
    importlib.util.find_spec("kubernetes") is None, reason="the kubernetes package is absent"
)
def test_official_client_in_cluster_config(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    ns = k8s_namespace
    k8s_cluster.apply(service_account("reader"), *pod_reader_rbac("reader"), namespace=ns)
    script = textwrap.dedent(
        """
        import os
        from kubernetes import client, config
        config.load_incluster_config()
        namespace = open(
            "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
        ).read()
        pod = client.CoreV1Api().read_namespaced_pod(os.environ["HOSTNAME"], namespace)
        print("client", pod.metadata.name, pod.spec.service_account_name)
        """
    )
    pod = pod_manifest("official", script, serviceAccountName="reader")
    done = run_to_completion(k8s_cluster, ns, pod)
    log = k8s_cluster.pod_log("official", ns)
    assert done["status"]["phase"] == "Succeeded", log
    assert log == "client official reader\n"
