"""A cluster's TLS material: a CA of its own and one certificate it signs, held by every
pod of the cluster (scheduler, workers) and by its clients; or a Secret the user names
(cert-manager's Certificate writes the same three keys).

Trust is the cluster's CA: a connection is accepted only from a holder of a certificate it
signed. Workers reach their peers by pod IP, which no certificate names, so they check the
CA but not host names; clients and workers check the scheduler's name where they use it.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
from collections.abc import Mapping
from typing import Any

from apportion.operator.spec import ClusterSpec
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The keys of a kubernetes.io/tls Secret, and the CA as cert-manager adds it.
CA_KEY, CERT_KEY, KEY_KEY = "ca.crt", "tls.crt", "tls.key"
MOUNT_PATH = "/etc/apportion/tls"
# On the pods: which certificate they were started with.
DIGEST_ANNOTATION = "apportion.dev/tls-certificate"
VOLUME = "tls"
VALIDITY = datetime.timedelta(days=365)


def tls_secret_name(spec: ClusterSpec) -> str:
    return spec.tls_secret_name or f"{spec.name}-tls"


def scheduler_names(spec: ClusterSpec) -> list[str]:
    """The names the scheduler is reached by inside the cluster."""
    service = spec.scheduler_service
    return [
        service,
        f"{service}.{spec.namespace}",
        f"{service}.{spec.namespace}.svc",
        f"{service}.{spec.namespace}.svc.cluster.local",
    ]


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def make_certificates(spec: ClusterSpec, now: datetime.datetime) -> dict[str, str]:
    """A new CA and a certificate it signs for the cluster (server and client use, the
    scheduler's Service names), as PEM text under the Secret's keys. The CA's key is not
    kept: nothing else is ever signed with it."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"apportion CA {spec.namespace}/{spec.name}")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in scheduler_names(spec)]
    names += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{spec.scheduler_service}.{spec.namespace}.svc"))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return {CA_KEY: _pem(ca), CERT_KEY: _pem(cert), KEY_KEY: private}


def digest(data: Mapping[str, str]) -> str:
    """Changes whenever the CA or the certificate does."""
    text = "".join(data.get(k, "") for k in (CA_KEY, CERT_KEY))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def problems(spec: ClusterSpec, data: Mapping[str, str], now: datetime.datetime) -> list[str]:
    """Why the Secret's certificate would keep workers and clients from connecting; empty
    when it will do. ``data``: the Secret's keys, decoded."""
    where = f"TLS Secret {spec.namespace}/{tls_secret_name(spec)}"
    missing = [k for k in (CA_KEY, CERT_KEY, KEY_KEY) if not data.get(k)]
    if missing:
        return [f"{where} lacks {', '.join(missing)} (it needs ca.crt, tls.crt and tls.key)"]
    try:
        ca = x509.load_pem_x509_certificate(data[CA_KEY].encode())
        cert = x509.load_pem_x509_certificate(data[CERT_KEY].encode())
    except ValueError as exc:
        return [f"{where}: not a PEM certificate: {exc}"]
    found = []
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        found.append(f"{where}: tls.crt is not signed by ca.crt ({ca.subject.rfc4514_string()})")
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        found.append(
            f"{where}: tls.crt is valid only from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} "
            f"to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    try:
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        usages = {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    for usage, what in (
        (ExtendedKeyUsageOID.SERVER_AUTH, "server auth"),
        (ExtendedKeyUsageOID.CLIENT_AUTH, "client auth"),
    ):
        if usage not in usages:
            found.append(f"{where}: tls.crt does not allow {what} (every pod is both)")
    try:
        dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        named = set(dns.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        named = set()
    dialled = f"{spec.scheduler_service}.{spec.namespace}.svc"  # the address workers use
    if dialled not in named:
        found.append(f"{where}: tls.crt does not name {dialled}, the scheduler workers dial")
    return found


def volume(spec: ClusterSpec) -> dict[str, Any]:
    return {"name": VOLUME, "secret": {"secretName": tls_secret_name(spec), "defaultMode": 0o440}}


MOUNT = {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True}


def env(check_hostname: bool) -> list[dict[str, str]]:
    """The engine's TLS settings (comm.tls.*) pointing at the mounted files."""
    found = [
        {"name": "APPORTION_COMM__TLS__CA_FILE", "value": f"{MOUNT_PATH}/{CA_KEY}"},
        {"name": "APPORTION_COMM__TLS__CERT_FILE", "value": f"{MOUNT_PATH}/{CERT_KEY}"},
        {"name": "APPORTION_COMM__TLS__KEY_FILE", "value": f"{MOUNT_PATH}/{KEY_KEY}"},
    ]
    if not check_hostname:
        found.append({"name": "APPORTION_COMM__TLS__CHECK_HOSTNAME", "value": "false"})
    return found
