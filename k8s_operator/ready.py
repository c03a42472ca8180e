"""A worker pod's readiness probe: ready means connected to its scheduler.

It asks the scheduler's HTTP API (``APPORTION_SCHEDULER_HTTP``, set by the operator) which
workers are connected and exits 0 only when this pod's worker (``POD_NAME``) is one of
them; otherwise it exits 1 saying why, which ``kubectl describe pod`` shows. Over TLS it
presents the worker's certificate (the ``APPORTION_COMM__TLS__*`` files the worker uses).

The kubelet runs it every few seconds in the worker's container, so it costs one bare
Python start: the operator puts this file's source in the probe (``python -I -c``, see
``probe_command``), and it imports nothing but the standard library; ``python -m
apportion.operator.ready`` would import all of apportion first.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request


def connected(info: dict, name: str) -> bool:
    return any(w.get("name") == name for w in (info.get("workers") or {}).values())


def tls_context() -> ssl.SSLContext | None:
    cert = os.environ.get("APPORTION_COMM__TLS__CERT_FILE")
    if not cert:
        return None
    context = ssl.create_default_context(cafile=os.environ.get("APPORTION_COMM__TLS__CA_FILE"))
    context.check_hostname = os.environ.get("APPORTION_COMM__TLS__CHECK_HOSTNAME") != "false"
    context.load_cert_chain(cert, os.environ.get("APPORTION_COMM__TLS__KEY_FILE"))
    return context


def main() -> int:
    name, base = os.environ.get("POD_NAME", ""), os.environ.get("APPORTION_SCHEDULER_HTTP", "")
    if not name or not base:
        print("POD_NAME and APPORTION_SCHEDULER_HTTP must be set", file=sys.stderr)
        return 1
    headers = {}
    if os.environ.get("APPORTION_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['APPORTION_TOKEN']}"
    request = urllib.request.Request(f"{base}/api/v1/info", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5, context=tls_context()) as reply:
            info = json.loads(reply.read())
    except (OSError, ValueError) as exc:
        print(f"scheduler at {base} not answering: {exc}", file=sys.stderr)
        return 1
    if not connected(info, name):
        print(f"worker {name} is not connected to the scheduler at {base}", file=sys.stderr)
        return 1
    return 0


def probe_command() -> list[str]:
    """The probe's command: this file's source run by a bare interpreter (``-I``: no
    user site, no PYTHON* variables, no current directory on the path)."""
    with open(__file__, encoding="utf-8") as source:
        return ["python", "-I", "-c", source.read()]


if __name__ == "__main__":
    sys.exit(main())
