"""What a container spec means for the test kubelet: its environment, command and probes."""

from __future__ import annotations

import base64
import http.client
import re
import socket
import ssl
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..api import Client

Obj = dict[str, Any]
Mount = tuple[Path, str]  # a folder of the pod's, and where the container sees it

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names are replaced, $$ escapes a dollar,
    unknown references stay as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR_REF.sub(replace, text)


def field_value(pod: Obj, path: str) -> str:
    """Downward-API fieldRef values (metadata.*, spec.*, status.pod/hostIP(s))."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return meta.get(match.group(1), {}).get(match.group(2), "")
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs", [])),
        "status.hostIP": status.get("hostIP", ""),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs", [])),
    }
    if path not in simple:
        raise ValueError(f"unsupported fieldRef {path!r}")
    return simple[path]


def _resource_value(container: Obj, ref: Obj) -> str:
    kind, _, name = ref["resource"].partition(".")
    return str(container.get("resources", {}).get(kind, {}).get(name, "0"))


def _config_data(client: Client, namespace: str, kind: str, name: str) -> dict[str, str]:
    obj = client.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
    if kind == "secrets":
        return {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
    return dict(obj.get("data", {}))


def secret_mounts(pod: Obj, container: Obj, pod_dir: Path, client: Client) -> list[Mount]:
    """The container's Secret volumes, their files written under the pod's folder (each
    key a file, or the volume's ``items``): (folder, mountPath) pairs, mounted read-only.
    A missing Secret raises (the container waits, as the kubelet's FailedMount)."""
    # ConfigMap volumes the same way (each key a file; binary keys are not written).
    volumes = {
        v["name"]: ("secrets", v["secret"]["secretName"], v["secret"])
        if "secret" in v
        else ("configmaps", v["configMap"]["name"], v["configMap"])
        for v in pod["spec"].get("volumes", [])
        if "secret" in v or "configMap" in v
    }
    mounts = []
    for mount in container.get("volumeMounts", []):
        if mount["name"] not in volumes:
            continue
        kind, name, source = volumes[mount["name"]]
        data = _config_data(client, pod["metadata"]["namespace"], kind, name)
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        folder = pod_dir / "volumes" / mount["name"]
        folder.mkdir(parents=True, exist_ok=True)
        for item in items:
            (folder / item["path"]).write_text(data[item["key"]])
            (folder / item["path"]).chmod(0o644)
        mounts.append((folder, mount["mountPath"]))
    return mounts


def container_env(
    pod: Obj, container: Obj, base: Mapping[str, str], client: Client
) -> dict[str, str]:
    """base, then envFrom, then env in order; each value may use $(earlier vars)."""
    namespace = pod["metadata"]["namespace"]
    env = dict(base)
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        for key, kind in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
            if key in source:
                data = _config_data(client, namespace, kind, source[key]["name"])
                env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
            continue
        source = var.get("valueFrom", {})
        if "fieldRef" in source:
            env[var["name"]] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[var["name"]] = _resource_value(container, source["resourceFieldRef"])
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind, ref = (
                ("configmaps", source["configMapKeyRef"])
                if "configMapKeyRef" in source
                else ("secrets", source["secretKeyRef"])
            )
            data = _config_data(client, namespace, kind, ref["name"])
            env[var["name"]] = data[ref["key"]]
        else:
            env[var["name"]] = ""
    return env


def container_command(container: Obj, env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """command and args with $(VAR) expansion (either may be empty: the image's own)."""
    command = [expand(part, env) for part in container.get("command") or []]
    return command, [expand(part, env) for part in container.get("args") or []]


def _port(value: int | str, container: Obj) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for port in container.get("ports", []):
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"unknown named port {value!r}")


def probe_ok(
    probe: Obj,
    container: Obj,
    pod_ip: str,
    exec_prefix: list[str],
    env: Mapping[str, str],
    cwd: str,
    exec_env: Mapping[str, str] | None = None,
    exec_timeout: float | None = None,
) -> bool:
    """Runs one probe attempt (exec, httpGet or tcpSocket). An exec probe runs
    exec_prefix + its command (in exec_env, default env) and gets exec_timeout seconds
    (default the probe's timeoutSeconds); $(VAR)s in its command expand from env."""
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "exec" in probe:
            argv = [expand(a, env) for a in probe["exec"].get("command", [])]
            done = subprocess.run(
                [*exec_prefix, *argv],
                env=dict(env if exec_env is None else exec_env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout if exec_timeout is None else exec_timeout,
            )
            return done.returncode == 0
        if "httpGet" in probe:
            return _http_ok(probe["httpGet"], container, pod_ip, timeout)
        if "tcpSocket" in probe:
            spec = probe["tcpSocket"]
            host = spec.get("host") or pod_ip
            with socket.create_connection((host, _port(spec["port"], container)), timeout):
                return True
    except (OSError, subprocess.SubprocessError, ValueError, http.client.HTTPException):
        return False
    return False  # grpc probes and unknown kinds are not supported: never ready


def _http_ok(spec: Obj, container: Obj, pod_ip: str, timeout: float) -> bool:
    host = spec.get("host") or pod_ip
    port = _port(spec["port"], container)
    if spec.get("scheme", "HTTP").upper() == "HTTPS":
        context = ssl._create_unverified_context()  # like the kubelet: no verification
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=context
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {h["name"]: h["value"] for h in spec.get("httpHeaders", [])}
        conn.request("GET", spec.get("path", "/"), headers=headers)
        return 200 <= conn.getresponse().status < 400
    finally:
        conn.close()
