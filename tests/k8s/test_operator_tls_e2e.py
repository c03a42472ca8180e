"""Mutual TLS on Kubernetes, on the real control plane: the operator makes a cluster's CA
and certificate, mounts them, and every connection (client, worker, worker peers, the HTTP
API the operator uses) is TLS; a certificate the user names is
checked, and the status says why workers cannot connect while it will not do."""

from __future__ import annotations

import base64
import datetime
import http.cookiejar
import json
import ssl
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
from apportion.operator import tls
from apportion.operator.spec import parse

from apportion import Client, config, get_worker
from apportion.kubernetes import KubeCluster

from .controlplane import Cluster
from .deployment import Deployment, deploy_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

GROUPS = [
    {"name": "a", "replicas": 1, "resources": {"A": 1}},
    {"name": "b", "replicas": 1, "resources": {"B": 1}},
]


def where(x: Any) -> tuple[str, Any]:
    return get_worker().name, x


@pytest.fixture(scope="module")
def deployed(k8s_cluster: Cluster) -> Iterator[Deployment]:
    with deploy_operator(k8s_cluster) as deployment:
        yield deployment


def tls_condition(deployed: Deployment, name: str) -> dict[str, Any]:
    conditions = deployed.status(name).get("conditions") or []
    return next((c for c in conditions if c["type"] == "TLSReady"), {})


def test_a_tls_cluster_is_mutual_tls_everywhere(deployed: Deployment) -> None:
    cluster = KubeCluster(
        "secure",
        deployed.namespace,
        kubeconfig=str(deployed.k8s.kubeconfig),
        timeout=240,
        worker_groups=GROUPS,
        scheduler={"port": 11686, "httpPort": 11687},
        tls=True,
    )
    try:
        status = deployed.status("secure")
        assert (
            status["schedulerAddress"] == f"tls://secure-scheduler.{deployed.namespace}.svc:11686"
        )
        assert tls_condition(deployed, "secure")["status"] == "True"
        # connectedWorkers comes from the scheduler's HTTP API, which the operator reached
        # over TLS with the cluster's certificate.
        assert {g["name"]: g["connectedWorkers"] for g in status["workerGroups"]} == {
            "a": 1,
            "b": 1,
        }
        secret = json.loads(deployed.kubectl("get", "secret", "secure-tls", "-o", "json").stdout)
        assert secret["type"] == "kubernetes.io/tls"
        assert sorted(secret["data"]) == ["ca.crt", "tls.crt", "tls.key"]

        def ready(pod: dict[str, Any]) -> bool:
            conditions = pod["status"].get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        deployed.wait(  # a worker is Ready once connected over TLS
            lambda: all(ready(p) for p in deployed.pods("app.kubernetes.io/instance=secure")),
            "every pod of the TLS cluster Ready",
            timeout=60,
        )

        address = cluster.scheduler_address
        assert address.startswith("tls://")
        with Client(cluster) as client:
            first = client.submit(where, 1, resources={"A": 1})
            # Its input moves from worker a to worker b: worker peers speak TLS too.
            second = client.submit(lambda r: where(r[1] + 1), first, resources={"B": 1})
            assert first.result(timeout=60) == ("secure-a-0", 1)
            assert second.result(timeout=60) == ("secure-b-0", 2)
            workers = client.scheduler_info()["workers"]
            assert all(w.startswith("tls://") for w in workers)

        # Through a port of this machine forwarded by the Kubernetes API: still TLS.
        cluster.forward_ports()
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:"), cluster.scheduler_address
        link = cluster.dashboard_link
        assert link is not None and link.startswith("https://127.0.0.1:"), link
        # A browser has no client certificate: the link's token lets it in all the same
        # (it trusts the cluster's CA, as a person who imported it, or clicked through).
        ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
        browser_tls = ssl.create_default_context(cadata=ca)
        browser_tls.check_hostname = False  # the certificate names the Service, not 127.0.0.1
        browser = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=browser_tls),
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()),
        )
        with browser.open(link, timeout=30) as page:
            assert page.status == 200 and page.url.endswith("/dashboard")
        with Client(cluster) as client:
            forwarded = client.submit(where, 3, resources={"A": 1})
            assert forwarded.result(timeout=60) == ("secure-a-0", 3)

        plain = address.replace("tls://", "tcp://")
        with pytest.raises(OSError):
            Client(plain, token=cluster.token, timeout=10)
        with config.set({"comm.tls.cert-file": None, "comm.tls.key-file": None}):
            with pytest.raises(OSError):  # TLS, but no client certificate
                Client(cluster, timeout=10)
    finally:
        cluster.close()
    assert config.get("comm.tls.cert-file", None) is None  # close() undid the settings


def test_a_named_secret_is_checked_and_the_status_says_why_workers_wait(
    deployed: Deployment,
) -> None:
    manifest = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": "vouched"},
        "spec": {
            "scheduler": {"port": 11786, "httpPort": 11787},
            "workerGroups": [GROUPS[0]],
            "tls": {"enabled": True, "secretName": "vouched-cert"},
        },
    }
    deployed.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def said(words: str) -> dict[str, Any] | None:
        found = tls_condition(deployed, "vouched")
        return found if words in found.get("message", "") else None

    missing = deployed.wait(lambda: said("not found"), "TLSReady False: no such Secret")
    assert missing["status"] == "False" and missing["reason"] == "CertificateUnusable"
    assert "TLS Secret" in missing["message"] and "vouched-cert" in missing["message"]
    deployed.wait(
        lambda: any("vouched-cert" in m for m in deployed.events("CertificateUnusable")),
        "a CertificateUnusable event",
    )

    # As cert-manager would: a Secret with ca.crt, tls.crt and tls.key, here first one whose
    # certificate names another namespace's scheduler.
    now = datetime.datetime.now(datetime.timezone.utc)
    elsewhere = tls.make_certificates(parse("vouched", "elsewhere", {}), now)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "vouched-cert"},
        "type": "kubernetes.io/tls",
        "stringData": elsewhere,
    }
    deployed.kubectl("apply", "-f", "-", input=json.dumps(secret))
    named = deployed.wait(
        lambda: said(f"does not name vouched-scheduler.{deployed.namespace}.svc"),
        "TLSReady False: the certificate names another scheduler",
    )
    assert named["status"] == "False"

    right = tls.make_certificates(parse("vouched", deployed.namespace, {}), now)
    deployed.kubectl("apply", "-f", "-", input=json.dumps({**secret, "stringData": right}))
    deployed.wait_running("vouched", {"a": 1})
    assert tls_condition(deployed, "vouched")["status"] == "True"
    deployed.kubectl("delete", "resourcecluster", "vouched", "--wait=true")
