"""A cluster's token and TLS material: read from their Secrets (made once when absent),
kept in the cluster's memo so that a reconcile costs no GET."""

from __future__ import annotations

import datetime
import hashlib
import json
import ssl
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from apportion.operator import kube, tls
from apportion.operator.manifests import TOKEN_KEY, secret_name, tls_secret, token_secret
from apportion.operator.memo import ClusterMemo, TlsRead
from apportion.operator.spec import ClusterSpec

from apportion.auth import generate_token

# A found TLS Secret is read again this often: soon enough to roll the pods onto a renewed
# certificate, without a GET per reconcile.
TLS_REREAD = 30.0


def ensure_token(memo: ClusterMemo, spec: ClusterSpec, owner: Mapping[str, Any]) -> str | None:
    """The cluster's token: read once per operator process, the Secret created only when
    it does not exist (never re-posted with a token thrown away)."""
    if not spec.auth:
        return None
    if memo.token is None:
        token = kube.read_token(spec.namespace, secret_name(spec), TOKEN_KEY)
        if token is None:
            kube.create_if_absent(token_secret(spec, owner, generate_token()))
            token = kube.read_token(spec.namespace, secret_name(spec), TOKEN_KEY)
        memo.token = token
    return memo.token


def ensure_tls(
    memo: ClusterMemo, spec: ClusterSpec, owner: Mapping[str, Any]
) -> tuple[ssl.SSLContext | None, list[str], str]:
    """For a TLS cluster: the operator's own TLS context for the scheduler's HTTP API (the
    cluster's certificate), why workers could not connect with the Secret's certificate
    (empty when they can), and the certificate's digest. Makes the Secret (a new CA and
    certificate) once, unless the spec names one."""
    if not spec.tls:
        return None, [], ""
    name = tls.tls_secret_name(spec)
    data = _read_tls_secret(memo, spec)
    if data is None and spec.tls_secret_name is None:
        pem = tls.make_certificates(spec, datetime.datetime.now(datetime.timezone.utc))
        kube.create_if_absent(tls_secret(spec, owner, pem))
        data = _read_tls_secret(memo, spec)
    if data is None:
        missing = (
            f"TLS Secret {spec.namespace}/{name} not found: create it (e.g. a cert-manager "
            f"Certificate with secretName {name}) or remove spec.tls.secretName"
        )
        return None, [missing], ""
    found = tls.problems(spec, data, datetime.datetime.now(datetime.timezone.utc))
    context = None if found else _tls_context(memo, data)
    return context, found, tls.digest(data)


def _read_tls_secret(memo: ClusterMemo, spec: ClusterSpec) -> dict[str, str] | None:
    """The cluster's TLS Secret, read again at most every TLS_REREAD seconds once found."""
    name = tls.tls_secret_name(spec)
    last = memo.tls_read
    if last is None or last.secret != name or last.data is None or _older(last, TLS_REREAD):
        last = memo.tls_read = TlsRead(
            name, time.monotonic(), kube.read_secret(spec.namespace, name)
        )
    return last.data


def _older(read: TlsRead, seconds: float) -> bool:
    return time.monotonic() - read.at > seconds


def _tls_context(memo: ClusterMemo, data: Mapping[str, str]) -> ssl.SSLContext:
    """An SSL context presenting the cluster's certificate, kept until the Secret's
    content changes (a renewed certificate replaces it)."""
    digest = hashlib.sha256(json.dumps(dict(data), sort_keys=True).encode()).hexdigest()
    if memo.tls_context is None or memo.tls_context[0] != digest:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=data[tls.CA_KEY])
        context.check_hostname = False  # the scheduler pod is reached by its IP
        with tempfile.TemporaryDirectory() as folder:
            cert, private = Path(folder, "tls.crt"), Path(folder, "tls.key")
            cert.write_text(data[tls.CERT_KEY])
            private.touch(mode=0o600)
            private.write_text(data[tls.KEY_KEY])
            context.load_cert_chain(cert, private)
        memo.tls_context = (digest, context)
    return memo.tls_context[1]
