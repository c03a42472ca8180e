"""TLS everywhere: scheduler, worker peers and clients, with mutual certificate checks."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from apportion import Client, LocalCluster, config
from tests.integration.tasks import inc


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_pki(directory: Path) -> dict[str, str]:
    """A CA and one certificate for 127.0.0.1, usable as server and client."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("apportion test CA"))
        .issuer_name(_name("apportion test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("apportion"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = {
        "ca": directory / "ca.pem",
        "cert": directory / "cert.pem",
        "key": directory / "key.pem",
    }
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return {name: str(path) for name, path in paths.items()}


def _settings(pki: dict[str, str]) -> dict[str, str]:
    return {
        "comm.tls.ca-file": pki["ca"],
        "comm.tls.cert-file": pki["cert"],
        "comm.tls.key-file": pki["key"],
    }


def tls_settings(directory: Path) -> dict[str, str]:
    """Settings for mutual TLS with a fresh CA and certificate written to ``directory``."""
    return _settings(_write_pki(directory))


def test_cluster_runs_entirely_over_mutual_tls(tmp_path: Path) -> None:
    with config.set(tls_settings(tmp_path)):
        cluster = LocalCluster(workers=[{"name": "a"}, {"name": "b", "resources": {"GPU": 1}}])
        try:
            assert cluster.scheduler_address.startswith("tls://")
            with Client(cluster) as client:
                workers = client.scheduler_info()["workers"]
                assert all(address.startswith("tls://") for address in workers)
                first = client.submit(inc, 1)
                # The dependency moves between workers over TLS, too.
                assert client.submit(inc, first, resources={"GPU": 1}).result(timeout=30) == 3
            plain = cluster.scheduler_address.replace("tls://", "tcp://")
            with pytest.raises(OSError):
                Client(plain, timeout=5)
            with (
                config.set({"comm.tls.cert-file": None, "comm.tls.key-file": None}),
                pytest.raises(OSError),
            ):
                Client(cluster, timeout=5)  # no client certificate: refused by mutual TLS
        finally:
            cluster.close()


def test_the_http_api_is_tls_and_a_browser_needs_only_the_token(tmp_path: Path) -> None:
    import http.cookiejar
    import json
    import ssl
    import urllib.error
    import urllib.request

    pki = _write_pki(tmp_path)
    (tmp_path / "stranger").mkdir()
    stranger = _write_pki(tmp_path / "stranger")  # a certificate of another CA
    tls = _settings(pki)
    with config.set(tls):
        cluster = LocalCluster(workers=[{"name": "a"}], http_port=0)
        try:
            port, token = cluster.http_port, cluster.token
            with Client(cluster) as client:
                client.scheduler_info()  # the worker is connected
            url = f"https://127.0.0.1:{port}/api/v1/info"
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            # A browser or Prometheus: it trusts the CA and has no client certificate; the
            # token lets it in, and without the token nothing is shown.
            browser_tls = ssl.create_default_context(cafile=pki["ca"])
            with urllib.request.urlopen(request, timeout=10, context=browser_tls) as reply:
                assert "a" in {w["name"] for w in json.loads(reply.read())["workers"].values()}
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=10, context=browser_tls)
            assert refused.value.code == 401
            # A certificate that is offered is still checked.
            wrong = ssl.create_default_context(cafile=pki["ca"])
            wrong.load_cert_chain(stranger["cert"], stranger["key"])
            with pytest.raises(OSError):
                urllib.request.urlopen(request, timeout=10, context=wrong)
            mutual = ssl.create_default_context(cafile=pki["ca"])
            mutual.load_cert_chain(pki["cert"], pki["key"])
            with urllib.request.urlopen(request, timeout=10, context=mutual) as reply:
                assert reply.status == 200
            link = cluster.dashboard_link  # the dashboard is on the same TLS port
            assert link is not None and link.startswith("https://"), link
            cookies = http.cookiejar.CookieJar()  # the link signs in with a cookie
            browser = urllib.request.build_opener(
                urllib.request.HTTPSHandler(context=browser_tls),
                urllib.request.HTTPCookieProcessor(cookies),
            )
            with browser.open(link, timeout=10) as page:
                assert page.status == 200 and page.url.endswith("/dashboard")
            assert [c.secure for c in cookies] == [True]  # never sent over plain HTTP
        finally:
            cluster.close()


def test_without_a_token_the_http_api_stays_mutual_tls(tmp_path: Path) -> None:
    import ssl

    from apportion.protocol.tls import http_server_context

    with config.set(_settings(_write_pki(tmp_path))):
        guarded = http_server_context(token_protected=True)
        unguarded = http_server_context(token_protected=False)
    assert guarded is not None and guarded.verify_mode == ssl.CERT_OPTIONAL
    assert unguarded is not None and unguarded.verify_mode == ssl.CERT_REQUIRED
