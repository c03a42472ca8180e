"""Self-tests: pods talk to the API server with their ServiceAccount's token, as in-cluster
clients expect (token files, KUBERNETES_SERVICE_HOST/PORT, https://kubernetes.default.svc)."""

from __future__ import annotations

import datetime
import importlib.util
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from .api import ApiError
from .controlplane import Cluster
from .kubelet.serviceaccount import MOUNT_PATH, TokenVolume
from .test_harness import apply, pod_manifest

pytestmark = pytest.mark.timeout(300)
k8s = pytest.mark.k8s

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
    apply(cluster, namespace, pod)
    return cluster.wait_pod_phase(pod["metadata"]["name"], ("Succeeded", "Failed"), namespace)


def forwarder_up(cluster: Cluster) -> bool:
    """Whether the kubelet serves https://kubernetes.default.svc (port 443; needs root)."""
    log = (cluster.log_dir / "kubelet.log").read_text()
    return "kubernetes.default.svc: 127.0.0.1" not in log


def token_dir(cluster: Cluster, name: str, namespace: str) -> Path:
    return cluster.pod_log_path(name, namespace).parent / "serviceaccount"


@k8s
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


@k8s
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


@k8s
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
    # No token: in a container the folder does not exist, as a process it is the empty
    # mount point of the host.
    script = f"import os; p = {MOUNT_PATH!r}; print(os.path.isdir(p) and sorted(os.listdir(p)))"
    done = run_to_completion(k8s_cluster, ns, pod_manifest("probe", script, **spec))
    log = k8s_cluster.pod_log("probe", ns)
    assert done["status"]["phase"] == "Succeeded", log
    expected = (
        ["ca.crt", "namespace", "token"]
        if mounted
        else {"containers": False, "processes": []}[k8s_cluster.pods]
    )
    assert log == f"{expected}\n"
    assert token_dir(k8s_cluster, "probe", ns).exists() == mounted


@k8s
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


@k8s
@pytest.mark.skipif(importlib.util.find_spec("kopf") is None, reason="kopf is absent")
def test_kopf_service_account_logins(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    """kopf's own service-account login (https://kubernetes.default.svc, port 443) and its
    login through the official client (KUBERNETES_SERVICE_HOST/PORT) both reach the API."""
    ns = k8s_namespace
    if not forwarder_up(k8s_cluster):
        pytest.skip("no forwarder on port 443 for https://kubernetes.default.svc (not root)")
    k8s_cluster.apply(service_account("reader"), *pod_reader_rbac("reader"), namespace=ns)
    script = textwrap.dedent(
        """
        import json, logging, os, ssl, urllib.request
        import kopf
        from kopf._core.intents import piggybacking
        settings, logger = kopf.OperatorSettings(), logging.getLogger()
        namespace = os.environ["NAMESPACE"]
        logins = [piggybacking.login_with_service_account(settings=settings)]
        if piggybacking.has_client():
            logins.append(piggybacking.login_via_client(settings=settings, logger=logger))
        for info in logins:
            context = ssl.create_default_context(cafile=info.ca_path)
            url = f"{info.server}/api/v1/namespaces/{namespace}/pods/"
            request = urllib.request.Request(
                url + os.environ["HOSTNAME"], headers={"Authorization": "Bearer " + info.token}
            )
            with urllib.request.urlopen(request, context=context, timeout=20) as response:
                print(info.server.startswith("https://"), json.load(response)["metadata"]["name"])
        """
    )
    namespace_env = {"name": "NAMESPACE", "value": ns}
    pod = pod_manifest(
        "kopfish", script, serviceAccountName="reader", container={"env": [namespace_env]}
    )
    done = run_to_completion(k8s_cluster, ns, pod)
    log = k8s_cluster.pod_log("kopfish", ns)
    assert done["status"]["phase"] == "Succeeded", log
    assert log.splitlines()[0] == "True kopfish", log
    assert set(log.splitlines()) == {"True kopfish"}, log


class FakeTokenApi:
    """create() answers TokenRequests with token-1, token-2, ... or raises ApiError."""

    def __init__(self, lifetime_s: int) -> None:
        self.lifetime_s = lifetime_s
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.failing = False

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.failing:
            raise ApiError(503, "unavailable", "POST", path)
        self.requests.append((path, body))
        expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
            seconds=self.lifetime_s
        )
        return {
            "status": {
                "token": f"token-{len(self.requests)}",
                "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        }


def test_token_volume_renews_its_token_at_80_percent(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("CA")
    api = FakeTokenApi(lifetime_s=3600)
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
        "spec": {"serviceAccountName": "robot"},
    }
    volume = TokenVolume(api, pod, tmp_path / "sa", ca)  # type: ignore[arg-type]
    assert volume.ensure()
    folder = volume.folder
    assert (folder / "token").read_text() == "token-1"
    assert (folder / "ca.crt").read_text() == "CA"
    assert (folder / "namespace").read_text() == "ns"
    path, body = api.requests[0]
    assert path == "/api/v1/namespaces/ns/serviceaccounts/robot/token"
    assert body["spec"]["boundObjectRef"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "uid": "u-1",
    }
    assert volume.refresh_at is not None
    assert 0.75 * 3600 < volume.refresh_at - time.monotonic() <= 0.8 * 3600
    assert volume.ensure() and len(api.requests) == 1  # not due yet
    volume.refresh_at = time.monotonic() - 1  # as if 80% of the lifetime had passed
    api.failing = True
    assert volume.ensure()  # still the old, valid token; retried later
    assert (folder / "token").read_text() == "token-1"
    api.failing = False
    volume.retry_at = 0.0
    assert volume.ensure()
    assert (folder / "token").read_text() == "token-2"
    assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "namespace", "token"]
    volume.remove()
    assert not folder.exists()
