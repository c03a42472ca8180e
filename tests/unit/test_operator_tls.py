"""A TLS cluster's certificates and pods: made by the operator or named by the user, checked
before use, and good for a real scheduler, worker and client."""

from __future__ import annotations

import dataclasses
import datetime
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apportion.operator import tls
from apportion.operator.manifests import (
    scheduler_deployment,
    tls_secret,
    worker_command,
    worker_pod,
)
from apportion.operator.spec import ClusterSpec, InvalidSpec, parse

from apportion import Client, LocalCluster, config
from tests.conftest import wait_until
from tests.integration.tasks import inc
from tests.integration.test_worker_readiness import free_port, get

NOW = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.timezone.utc)
OWNER = {
    "apiVersion": "apportion.dev/v1alpha1",
    "kind": "ResourceCluster",
    "metadata": {"name": "secure", "namespace": "ml", "uid": "u-1"},
}


def secure(**tls_spec: Any) -> ClusterSpec:
    groups = [{"name": "cpu", "replicas": 1, "resources": {"process": 1}}]
    return parse("secure", "ml", {"workerGroups": groups, "tls": {"enabled": True, **tls_spec}})


def test_the_operators_certificate_passes_its_own_checks() -> None:
    spec = secure()
    pem = tls.make_certificates(spec, NOW)
    assert sorted(pem) == ["ca.crt", "tls.crt", "tls.key"]
    assert tls.problems(spec, pem, NOW) == []
    secret = tls_secret(spec, OWNER, pem)
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["name"] == "secure-tls"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_unusable_certificates_are_explained() -> None:
    spec = secure(secretName="from-cert-manager")
    pem = tls.make_certificates(spec, NOW)
    other = tls.make_certificates(secure(), NOW)
    assert tls.problems(spec, {"tls.crt": pem["tls.crt"]}, NOW) == [
        "TLS Secret ml/from-cert-manager lacks ca.crt, tls.key (it needs ca.crt, tls.crt and "
        "tls.key)"
    ]
    (wrong_ca,) = tls.problems(spec, {**pem, "ca.crt": other["ca.crt"]}, NOW)
    assert "tls.crt is not signed by ca.crt" in wrong_ca
    (expired,) = tls.problems(spec, pem, NOW + datetime.timedelta(days=400))
    assert "tls.crt is valid only from 2026-11-24 11:55 to 2027-11-24 12:00 UTC" in expired
    elsewhere = parse("secure", "other-namespace", {"tls": {"enabled": True}})
    (unnamed,) = tls.problems(elsewhere, pem, NOW)
    assert "tls.crt does not name secure-scheduler.other-namespace.svc" in unnamed


def test_a_secret_name_without_tls_enabled_is_invalid() -> None:
    with pytest.raises(InvalidSpec, match=r"tls\.secretName needs tls\.enabled: true"):
        parse("c", "ml", {"tls": {"secretName": "x"}})


def test_tls_pods_mount_the_certificate_and_speak_tls_everywhere() -> None:
    spec = secure()
    assert spec.scheduler_address == "tls://secure-scheduler.ml.svc:8786"
    assert worker_command(spec, spec.groups[0])[2] == "tls://secure-scheduler.ml.svc:8786"
    template = {"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}}
    deployment = scheduler_deployment(parse("secure", "ml", {
        "tls": {"enabled": True}, "scheduler": {"template": template}}), OWNER)  # fmt: skip
    worker = worker_pod(spec, spec.groups[0], 0, OWNER)
    for pod in (deployment["spec"]["template"], worker):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == "secure-tls"
        (container,) = pod["spec"]["containers"]
        assert {"name": "tls", "mountPath": "/etc/apportion/tls", "readOnly": True} in container[
            "volumeMounts"
        ]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["APPORTION_COMM__TLS__CERT_FILE"] == "/etc/apportion/tls/tls.crt"
        assert env["APPORTION_COMM__TLS__CA_FILE"] == "/etc/apportion/tls/ca.crt"
    assert "scratch" in {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
    scheduler = deployment["spec"]["template"]["spec"]["containers"][0]
    assert scheduler["readinessProbe"]["tcpSocket"] == {"port": 8787}
    worker_env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert worker_env["APPORTION_COMM__TLS__CHECK_HOSTNAME"] == "false"  # peers by pod IP
    plain = parse("secure", "ml", {"workerGroups": [{"name": "cpu", "replicas": 1}]})
    plain_pod = worker_pod(plain, plain.groups[0], 0, OWNER)
    assert [v["name"] for v in plain_pod["spec"]["volumes"]] == ["tmp"]  # no certificate
    assert worker["metadata"]["annotations"] != plain_pod["metadata"]["annotations"]


def test_the_operators_certificate_serves_a_real_cluster(tmp_path: Path) -> None:
    pem = tls.make_certificates(secure(), datetime.datetime.now(datetime.timezone.utc))
    files = {}
    for key, text in pem.items():
        (tmp_path / key).write_text(text)
        files[key] = str(tmp_path / key)
    settings = {
        "comm.tls.ca-file": files["ca.crt"],
        "comm.tls.cert-file": files["tls.crt"],
        "comm.tls.key-file": files["tls.key"],
    }
    with config.set(settings):
        cluster = LocalCluster(workers=[{"name": "a"}, {"name": "b"}], http_port=0)
        try:
            assert cluster.scheduler_address.startswith("tls://")
            with Client(cluster) as client:
                first = client.submit(inc, 1)
                assert client.submit(inc, first).result(timeout=30) == 3
            # A worker with the pods' settings: ready (plain HTTP, as the kubelet probes)
            # once connected over TLS.
            spec = secure()
            (container,) = worker_pod(spec, spec.groups[0], 0, OWNER)["spec"]["containers"]
            env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
            env = {**env, **{k: files[v.rsplit("/", 1)[1]] for k, v in env.items() if
                             v.startswith(tls.MOUNT_PATH)}}  # fmt: skip
            port = free_port()
            env |= {
                "APPORTION_WORKER__READINESS_PORT": str(port),
                "APPORTION_TOKEN": cluster.token or "",
            }
            worker = subprocess.Popen(
                [sys.executable, "-m", "apportion", "worker", cluster.scheduler_address],
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
            )
            try:
                wait_until(lambda: get(port, "/ready")[0] == 200, timeout=60, what="ready")
            finally:
                worker.terminate()
                worker.wait(30)
        finally:
            cluster.close()


def test_a_new_certificate_replaces_the_pods() -> None:
    spec = secure()
    first = tls.make_certificates(spec, NOW)
    renewed = tls.make_certificates(spec, NOW + datetime.timedelta(days=300))
    assert tls.digest(first) != tls.digest(renewed)
    old, new = (dataclasses.replace(spec, tls_digest=tls.digest(p)) for p in (first, renewed))
    pods = [worker_pod(s, s.groups[0], 0, OWNER)["metadata"]["annotations"] for s in (old, new)]
    assert pods[0] != pods[1]  # the group hash differs: the plan replaces the workers
    templates = [scheduler_deployment(s, OWNER)["spec"]["template"] for s in (old, new)]
    assert [t["metadata"]["annotations"][tls.DIGEST_ANNOTATION] for t in templates] == [
        tls.digest(first),
        tls.digest(renewed),
    ]  # the scheduler's Deployment rolls
