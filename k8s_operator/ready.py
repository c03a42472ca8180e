"""A worker pod's readiness probe: ready means connected to its scheduler.

    python -m apportion.operator.ready

Run by the kubelet inside the worker container (an exec probe). It asks the scheduler's
HTTP API (``APPORTION_SCHEDULER_HTTP``, set by the operator) which workers are connected
and exits 0 only when this pod's worker (``POD_NAME``) is one of them; otherwise it exits 1
saying why, which ``kubectl describe pod`` shows. Imports nothing beyond the standard
library, so each probe costs one short Python start.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def connected(info: dict, name: str) -> bool:
    return any(w.get("name") == name for w in (info.get("workers") or {}).values())


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
        with urllib.request.urlopen(request, timeout=5) as reply:
            info = json.loads(reply.read())
    except (OSError, ValueError) as exc:
        print(f"scheduler at {base} not answering: {exc}", file=sys.stderr)
        return 1
    if not connected(info, name):
        print(f"worker {name} is not connected to the scheduler at {base}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
