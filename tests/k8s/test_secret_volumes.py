"""The test kubelet mounts Secret volumes (read-only, each key a file), in both pod modes:
the apportion operator mounts TLS certificates that way."""

from __future__ import annotations

import pytest

from .controlplane import Cluster
from .test_harness import apply, pod_manifest

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(180)]

MOUNTED = "/etc/apportion-test/secret-volume"


def test_a_secret_volume_is_mounted_read_only(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "greeting"},
        "stringData": {"hello": "world", "other": "key"},
    }
    script = (
        "import os\n"
        f"print(open('{MOUNTED}/hello').read(), sorted(os.listdir('{MOUNTED}')))\n"
        "try:\n"
        f"    open('{MOUNTED}/hello', 'w')\n"
        "except OSError as exc:\n"
        "    print('read-only', exc.errno)\n"
    )
    pod = pod_manifest(
        "reader",
        script,
        container={"volumeMounts": [{"name": "words", "mountPath": MOUNTED, "readOnly": True}]},
        volumes=[{"name": "words", "secret": {"secretName": "greeting"}}],
    )
    apply(k8s_cluster, k8s_namespace, secret, pod)
    done = k8s_cluster.wait_pod_phase("reader", ("Succeeded", "Failed"), k8s_namespace)
    assert done["status"]["phase"] == "Succeeded", k8s_cluster.pod_log("reader", k8s_namespace)
    lines = k8s_cluster.pod_log("reader", k8s_namespace).splitlines()
    assert lines[0] == "world ['hello', 'other']"
    assert lines[1] == "read-only 30"  # EROFS
