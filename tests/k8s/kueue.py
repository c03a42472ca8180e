"""Kueue's manager against the test control plane, as a local process.

build.sh builds ``sigs.k8s.io/kueue/cmd/kueue`` from the Go module proxy and keeps the
release's CRDs beside it; here they are applied (server-side: they are larger than kubectl's
annotation) and the manager runs with the admin kubeconfig, one namespace of its own
(``kueue-system``), no leader election, no metrics server, no visibility server, its health
probe on a free loopback port, and ResourceJob declared as an external framework (its
Workloads are made by the apportion operator, Kueue admits them).

Kueue's webhooks are served (the manager needs a serving certificate to start) on a free
loopback port but not registered with the API server: they default and validate Kueue's own
objects and the built-in job kinds, which the tests write complete, and a registered pod
webhook would sit in the path of every pod of the shared control plane.

With its own certificate management off, the manager reads a metrics certificate from the
fixed path /etc/kueue/metrics/certs (``cmd/kueue/main.go``) even when metrics are off: made
there (self-signed) when missing, and left in place.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from . import paths, procs
from .controlplane import Cluster

METRICS_CERTS = Path("/etc/kueue/metrics/certs")
NAMESPACE = "kueue-system"
JOB_FRAMEWORK = "ResourceJob.v1alpha1.apportion.dev"


def _self_signed(folder: Path) -> None:
    """tls.crt/tls.key for 127.0.0.1, self-signed (never checked: nothing calls them)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kueue-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    (folder / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def configuration(webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [JOB_FRAMEWORK]},
        # Pods ask for ephemeral storage too; quota is about CPUs, memory and GPUs here.
        "resources": {"excludeResourcePrefixes": ["ephemeral-storage"]},
    }


@contextmanager
def running_kueue(k8s: Cluster) -> Iterator[Path]:
    """Kueue's CRDs applied and its manager running; yields its log file."""
    binary, crds = paths.kueue()
    for crd in sorted(crds.glob("*.yaml")):
        k8s.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    for crd in sorted(crds.glob("*.yaml")):
        name = yaml.safe_load(crd.read_text())["metadata"]["name"]
        k8s.wait_crd_established(name)
    if k8s.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        k8s.kubectl("create", "namespace", NAMESPACE)
    if not (METRICS_CERTS / "tls.crt").exists():
        _self_signed(METRICS_CERTS)
    folder = k8s.workdir / "kueue"
    _self_signed(folder / "webhook-certs")
    health = procs.free_port()
    config = folder / "config.yaml"
    config.write_text(
        yaml.safe_dump(configuration(procs.free_port(), health, folder / "webhook-certs"))
    )
    log = k8s.workdir / "logs" / "kueue.log"
    env = {**os.environ, "KUBECONFIG": str(k8s.kubeconfig)}
    manager = procs.start(
        [
            binary,
            f"--config={config}",
            # The visibility API server needs its own certificate (/visibility) and an
            # APIService; the tests read the queue from Workloads instead.
            "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=2",
        ],
        log,
        env=env,
    )
    try:
        k8s.wait_for(
            lambda: manager.poll() is None and _healthy(health),
            f"Kueue's manager healthy (log: {log})",
            timeout=120,
        )
        yield log
    finally:
        procs.signal_group(manager.pid, signal.SIGTERM)
        try:
            manager.wait(timeout=30)
        except Exception:
            procs.signal_group(manager.pid, signal.SIGKILL)
            manager.wait(timeout=30)


def _healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False
