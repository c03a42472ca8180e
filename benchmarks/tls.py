"""TLS for the data workload's TLS rows: one CA and one certificate, made with the
``openssl`` command and used by every system alike, and OpenSSL's own AES-GCM speed as the
reference those rows are read against (what encrypting, or decrypting, alone allows).

TLS 1.3 between two Python processes negotiates TLS_AES_256_GCM_SHA384 (OpenSSL's first
choice; Python offers no way to reorder TLS 1.3 suites): AES-256-GCM is the cipher the
rows pay for, AES-128-GCM the usual headline figure; both are printed.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CIPHERS = ("aes-128-gcm", "aes-256-gcm")
BLOCK_BYTES = 16_384  # a full TLS record's plaintext


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA, and a certificate for 127.0.0.1 (server and client) with its key."""

    ca: str
    cert: str
    key: str


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certificates(directory: Path | None = None) -> Certificates:
    """A CA and one certificate signed by it for 127.0.0.1 / localhost, usable by servers
    and clients (mutual TLS), valid for a day."""
    where = Path(directory or tempfile.mkdtemp(prefix="apportion-bench-tls-"))
    ca, ca_key = where / "ca.pem", where / "ca-key.pem"
    cert, key, request = where / "cert.pem", where / "key.pem", where / "cert.csr"
    extensions = where / "cert.ext"
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *curve, "-keyout", str(ca_key), "-out", str(ca), "-days", "1",
        "-subj", "/CN=apportion benchmark CA", "-addext", "basicConstraints=critical,CA:TRUE",
    )  # fmt: skip
    _openssl("req", *curve, "-keyout", str(key), "-out", str(request), "-subj", "/CN=127.0.0.1")
    extensions.write_text(
        "subjectAltName = IP:127.0.0.1, DNS:localhost\nextendedKeyUsage = serverAuth, clientAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(extensions),
    )  # fmt: skip
    return Certificates(str(ca), str(cert), str(key))


def openssl_speed(seconds: int = 1) -> dict[str, float]:
    """MB/s of ``openssl speed -evp CIPHER`` on 16 KB blocks, per cipher ({} without the
    ``openssl`` command)."""
    if shutil.which("openssl") is None:
        return {}
    speeds: dict[str, float] = {}
    for cipher in CIPHERS:
        out = subprocess.run(
            ["openssl", "speed", "-mr", "-evp", cipher, "-seconds", str(seconds),
             "-bytes", str(BLOCK_BYTES)],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        for line in out.splitlines():  # +F:<n>:<name>:<bytes per second>
            if line.startswith("+F:"):
                speeds[cipher] = round(float(line.rsplit(":", 1)[1]) / 1e6, 1)
    return speeds


def describe(speeds: object) -> str:
    """The sentence under the table ('' for results recorded before it was measured)."""
    if not isinstance(speeds, dict) or not speeds:
        return ""
    figures = ", ".join(f"{name.upper()} {mb:,.0f} MB/s" for name, mb in speeds.items())
    return f" OpenSSL on 16 KB blocks (openssl speed -evp): {figures}."


def mutual_tls_contexts(files: Certificates) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts for mutual TLS with ``files``: the server requires the
    client's certificate, the client checks the server's against the CA."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=files.ca)
    server.load_cert_chain(files.cert, files.key)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files.ca)
    client.load_cert_chain(files.cert, files.key)
    return server, client
