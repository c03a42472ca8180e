"""Certificates, keys and kubeconfigs for a loopback-only control plane.

One CA signs everything: the API server's serving certificate, the client certificates of
the admin, controller-manager, scheduler and kubelet, and the API server's client
certificate towards the kubelet. A separate RSA key pair signs service-account tokens.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The first address of --service-cluster-ip-range: the in-cluster `kubernetes` Service.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"

_Key = ec.EllipticCurvePrivateKey
_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _new_key() -> _Key:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: _Key | rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organisation: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organisation:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation))
    return x509.Name(attrs)


class CertificateAuthority:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = _new_key()
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name("apportion-test-ca"))
            .issuer_name(_name("apportion-test-ca"))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pair = KeyPair(folder / "ca.crt", folder / "ca.key")
        self.pair.cert.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        _write_key(self.key, self.pair.key)

    def issue(
        self,
        stem: str,
        common_name: str,
        organisation: str | None = None,
        *,
        server_names: tuple[str, ...] = (),
    ) -> KeyPair:
        """Writes <stem>.crt/.key; with server_names (DNS names or IPs) a serving cert."""
        key = _new_key()
        now = datetime.datetime.now(datetime.timezone.utc)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server_names else []
        usage.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organisation))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if server_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(n) for n in server_names]),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        pair = KeyPair(self.folder / f"{stem}.crt", self.folder / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pair.key)
        return pair


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def write_service_account_keys(folder: Path) -> tuple[Path, Path]:
    """RSA pair that signs and verifies service-account tokens: (private, public)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = folder / "sa.key", folder / "sa.pub"
    _write_key(key, private)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def write_kubeconfig(path: Path, server: str, ca: Path, client: KeyPair, user: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "apportion-test",
                "cluster": {"server": server, "certificate-authority": str(ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(client.cert),
                    "client-key": str(client.key),
                },
            }
        ],
        "contexts": [
            {"name": "apportion-test", "context": {"cluster": "apportion-test", "user": user}}
        ],
        "current-context": "apportion-test",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class ClusterPki:
    ca: KeyPair
    apiserver: KeyPair
    apiserver_kubelet_client: KeyPair
    admin: KeyPair
    controller_manager: KeyPair
    scheduler: KeyPair
    kubelet: KeyPair
    kubelet_serving: KeyPair
    sa_private: Path
    sa_public: Path


def make_pki(folder: Path) -> ClusterPki:
    folder.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority(folder)
    apiserver_names = (
        "127.0.0.1",
        "localhost",
        KUBERNETES_SERVICE_IP,
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    )
    sa_private, sa_public = write_service_account_keys(folder)
    return ClusterPki(
        ca=ca.pair,
        apiserver=ca.issue("apiserver", "kube-apiserver", server_names=apiserver_names),
        apiserver_kubelet_client=ca.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"
        ),
        admin=ca.issue("admin", "admin", "system:masters"),
        # These users are bound to their roles by the API server's bootstrap RBAC policy.
        controller_manager=ca.issue("controller-manager", "system:kube-controller-manager"),
        scheduler=ca.issue("scheduler", "system:kube-scheduler"),
        # The process kubelet serves several nodes, so it cannot use a per-node identity
        # (system:node:<name>); it acts as a cluster admin instead.
        kubelet=ca.issue("kubelet", "apportion-process-kubelet", "system:masters"),
        kubelet_serving=ca.issue("kubelet-serving", "kubelet", server_names=("127.0.0.1",)),
        sa_private=sa_private,
        sa_public=sa_public,
    )
