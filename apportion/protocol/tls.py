"""TLS for every connection, from certificate files named in configuration or flags.

Servers (scheduler, worker peers) need ``comm.tls.cert-file`` and ``key-file``; with a
``ca-file`` too they also require clients to present a certificate signed by that CA
(mutual TLS). Clients verify the server against ``ca-file`` and present their own
certificate when one is configured. Addresses then read ``tls://host:port``.
"""

from __future__ import annotations

import ssl

from apportion import config


def enabled() -> bool:
    return bool(config.get("comm.tls.cert-file", None))


def server_context() -> ssl.SSLContext | None:
    cert = config.get("comm.tls.cert-file", None)
    if not cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, config.get("comm.tls.key-file", None))
    ca = config.get("comm.tls.ca-file", None)
    if ca:
        context.load_verify_locations(ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def http_server_context(token_protected: bool) -> ssl.SSLContext | None:
    """The HTTP port's context: like the TCP port's, except that where a token protects
    every route a client certificate is optional, so a browser (which has none) can open
    the dashboard of a TLS cluster and Prometheus can scrape it; a certificate offered is
    still checked. Without a token, mutual TLS stays the only protection."""
    context = server_context()
    if context is not None and token_protected and context.verify_mode == ssl.CERT_REQUIRED:
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def client_context() -> ssl.SSLContext:
    ca = config.get("comm.tls.ca-file", None)
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    context.check_hostname = bool(config.get("comm.tls.check-hostname", True))
    cert = config.get("comm.tls.cert-file", None)
    if cert:
        context.load_cert_chain(cert, config.get("comm.tls.key-file", None))
    return context
