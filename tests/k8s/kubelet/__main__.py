"""The test kubelet: `python -m tests.k8s.kubelet --kubeconfig ... --pods-dir ...`.

It registers the fake nodes, keeps them Ready, watches every pod bound to them and runs
each one through a PodRunner, its containers as podman containers of their images
(`--pods containers`, the default) or as local processes (`--pods processes`). On
SIGTERM/SIGINT it stops every pod's containers and exits.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from .. import paths
from ..api import ApiError, Client, Credentials
from . import dns, server, serviceaccount
from .nodes import NODE_IP, NODES, NodeKeeper
from .runner import PodRunner
from .runtime import PodmanRuntime, ProcessRuntime, Runtime
from .serviceaccount import ApiForwarder, TokenVolume

log = logging.getLogger("kubelet")

Obj = dict[str, Any]

DNS_REFRESH_S = 0.5
FINISH_DELETIONS_S = 5.0
# Environment variables passed from the kubelet to pods; everything else comes from the spec.
PASSTHROUGH_ENV = (
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "COVERAGE_PROCESS_START",
)


def unshare_args() -> list[str] | None:
    """unshare options giving a pod a private mount namespace in which /etc/hosts can be
    covered by a bind mount, or None where that is impossible. As root a mount namespace is
    enough; otherwise a user namespace maps the user to root inside it."""
    if shutil.which("unshare") is None:
        return None
    options = ["--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        options = ["--user", "--map-root-user", *options]
    with tempfile.NamedTemporaryFile("w", suffix=".hosts") as hosts:
        hosts.write("127.0.0.1 localhost\n")
        hosts.flush()
        done = subprocess.run(
            [
                "unshare",
                *options,
                "--",
                "/bin/sh",
                "-c",
                'mount --bind "$0" /etc/hosts',
                hosts.name,
            ],
            capture_output=True,
        )
    return options if done.returncode == 0 else None


class Kubelet:
    def __init__(
        self,
        client: Client,
        pods_dir: Path,
        api_port: int,
        ip_octet: int,
        ca: Path,
        containers: bool = True,
    ) -> None:
        self.client = client
        self.pods_dir = pods_dir
        self.api_port = api_port
        self.ca = ca
        # Where pods' /etc/hosts sends kubernetes.default.svc: the API server itself (only
        # right for clients that use KUBERNETES_SERVICE_PORT), or a forwarder on port 443.
        self.api_ip = NODE_IP
        self.forwarder_ip = f"127.{ip_octet}.255.254"
        self.runners: dict[str, PodRunner] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._ips = (f"127.{ip_octet}.{n // 250}.{n % 250 + 2}" for n in itertools.count())
        self.runtime: Runtime
        if containers:
            # Each container gets the pod's hosts file and token folder as bind mounts.
            self.runtime = PodmanRuntime(pods_dir)
            self.private_hosts = self.sa_mounts = True
        else:
            unshare = unshare_args()
            self.runtime = ProcessRuntime(unshare)
            self.private_hosts = unshare is not None
            if unshare is None:
                log.warning(
                    "cannot unshare a mount namespace: Service names will not resolve and "
                    "pods get no service-account token"
                )
            self.sa_mounts = unshare is not None and serviceaccount.prepare_mount_point()
        # Processes: the current Python environment's bin dir first, so `python` and
        # `apportion` resolve to the test virtualenv.
        self.path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])

    # ----- the Context a PodRunner uses -------------------------------------------------

    def base_env(self, pod: Obj) -> dict[str, str]:
        """What every container's environment starts with: a container's starts from its
        image's, a process's from the kubelet's (PATH to the test venv first)."""
        env: dict[str, str] = {}
        if self.runtime.mode == "processes":
            env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
            env["PATH"] = self.path
        env.update(
            HOSTNAME=pod["spec"].get("hostname") or pod["metadata"]["name"],
            # Unbuffered output, so pod logs can be read while the pod runs.
            PYTHONUNBUFFERED="1",
            # The real API server: the `kubernetes` Service's ClusterIP does not route here.
            KUBERNETES_SERVICE_HOST=NODE_IP,
            KUBERNETES_SERVICE_PORT=str(self.api_port),
            KUBERNETES_SERVICE_PORT_HTTPS=str(self.api_port),
            KUBERNETES_PORT=f"tcp://{NODE_IP}:{self.api_port}",
        )
        return env

    def token_volume(self, pod: Obj, folder: Path) -> TokenVolume | None:
        """The pod's service-account folder, or None where it gets none."""
        if not self.sa_mounts or not serviceaccount.wants_token(pod, self.client):
            return None
        return TokenVolume(self.client, pod, folder, self.ca)

    def hosts_content(self, pod: Obj, pod_ip: str) -> str:
        services = self.client.get("/api/v1/services")["items"]
        pods = self.client.get("/api/v1/pods")["items"]
        return dns.hosts_file(pod, pod_ip, services, pods, self.api_ip)

    def finished(self, runner: PodRunner) -> None:
        with self.lock:
            self.runners.pop(runner.uid, None)

    # ----- pods -------------------------------------------------------------------------

    def is_running(self, namespace: str, name: str) -> bool:
        """Whether a container process of the pod runs (ends `kubectl logs -f`)."""
        with self.lock:
            return any(
                r.namespace == namespace and r.pod_name == name and r.running_pids
                for r in self.runners.values()
            )

    def pod_ip(self, namespace: str, name: str) -> str | None:
        """The IP of a running pod (the target of a port-forward)."""
        with self.lock:
            for r in self.runners.values():
                if r.namespace == namespace and r.pod_name == name and r.running_pids:
                    return r.pod_ip
        return None

    def handle(self, kind: str, pod: Obj) -> None:
        if pod["spec"].get("nodeName") not in NODES or self.stopping.is_set():
            return
        uid = pod["metadata"]["uid"]
        with self.lock:
            runner = self.runners.get(uid)
            if runner is not None:
                if kind == "DELETED":
                    runner.remove()
                else:
                    runner.update(pod)
                return
            if kind == "DELETED":
                return
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                if pod["metadata"].get("deletionTimestamp"):
                    self._finalise(pod)  # nothing runs; just let the object go
                return
            ip = NODE_IP if pod["spec"].get("hostNetwork") else next(self._ips)
            runner = PodRunner(self, pod, ip)
            self.runners[uid] = runner
        runner.start()

    def _finalise(self, pod: Obj) -> None:
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            self.client.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body)
        except ApiError as err:
            log.warning("finalising %s/%s: %s", meta["namespace"], meta["name"], err)

    def watch_pods(self) -> None:
        """List, then watch, all pods; relist whenever the watch cannot resume."""
        while not self.stopping.is_set():
            try:
                listing = self.client.get("/api/v1/pods")
                seen = {p["metadata"]["uid"] for p in listing["items"]}
                with self.lock:
                    vanished = [r for uid, r in self.runners.items() if uid not in seen]
                for runner in vanished:
                    runner.remove()
                for pod in listing["items"]:
                    self.handle("ADDED", pod)
                version = listing["metadata"]["resourceVersion"]
                while not self.stopping.is_set():
                    for event in self.client.watch("/api/v1/pods", version):
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            raise ApiError(obj.get("code", 500), str(obj), "WATCH", "pods")
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self.handle(event["type"], obj)
            except Exception as err:
                if not self.stopping.is_set():
                    log.info("pod watch restarting: %s", err)
                    time.sleep(0.5)

    def finish_deletions(self) -> None:
        """Every few seconds, hands each pod of ours that is being deleted and that no runner
        holds (its runner failed, or an event was missed) to handle(), which terminates it
        and removes the object: a deleted pod never stays Terminating for good."""
        while not self.stopping.wait(FINISH_DELETIONS_S):
            try:
                pods = self.client.get("/api/v1/pods")["items"]
            except (ApiError, OSError) as err:
                log.warning("listing pods being deleted failed: %s", err)
                continue
            for pod in pods:
                if pod["metadata"].get("deletionTimestamp"):
                    with self.lock:
                        held = pod["metadata"]["uid"] in self.runners
                    if not held:
                        self.handle("MODIFIED", pod)

    def refresh_dns(self) -> None:
        """Rewrites each running pod's hosts file when Services or endpoints changed.
        Written in place (same inode), so the bind mount inside the pod sees it."""
        while not self.stopping.wait(DNS_REFRESH_S):
            try:
                services = self.client.get("/api/v1/services")["items"]
                pods = self.client.get("/api/v1/pods")["items"]
                entries = dns.service_entries(services, pods)
                with self.lock:
                    runners = list(self.runners.values())
                for runner in runners:
                    content = dns.render_hosts(runner.pod, runner.pod_ip, entries, self.api_ip)
                    if runner.hosts.exists() and runner.hosts.read_text() != content:
                        runner.hosts.write_text(content)
            except Exception as err:
                log.warning("DNS refresh failed: %s", err)

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            runners = list(self.runners.values())
        for runner in runners:
            runner.stop_now()
        for runner in runners:
            runner.join(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.k8s.kubelet")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--pods-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True, help="HTTPS port for kubectl logs")
    parser.add_argument("--serving-cert", type=Path, required=True)
    parser.add_argument("--serving-key", type=Path, required=True)
    parser.add_argument("--client-ca", type=Path, help="(unused: any client may read logs)")
    parser.add_argument(
        "--pods",
        choices=("containers", "processes"),
        default="containers",
        help="run containers as podman containers of their images (default) or as local "
        "processes of the current Python environment, ignoring images",
    )
    parser.add_argument(
        "--pod-ip-octet",
        type=int,
        default=0,
        help="second octet of pod IPs 127.N.x.y (default: from --port)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stdout,
    )
    creds = Credentials.from_kubeconfig(args.kubeconfig)
    client = Client(creds)
    api_port = urllib.parse.urlsplit(creds.server).port or 443
    octet = args.pod_ip_octet or 10 + args.port % 240
    kubelet = Kubelet(
        client, args.pods_dir, api_port, octet, creds.ca, containers=args.pods == "containers"
    )
    forwarder = ApiForwarder(kubelet.forwarder_ip, api_port)
    if forwarder.start():
        kubelet.api_ip = forwarder.listen_ip

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    keeper = NodeKeeper(client, args.port, paths.versions()["KUBE_VERSION"])
    server.serve(
        args.port,
        args.serving_cert,
        args.serving_key,
        args.pods_dir,
        kubelet.is_running,
        kubelet.pod_ip,
    )
    keeper.register()
    for target in (keeper.run, kubelet.watch_pods, kubelet.refresh_dns, kubelet.finish_deletions):
        threading.Thread(target=target, name=target.__name__, daemon=True).start()
    log.info(
        "test kubelet up: pods as %s, nodes %s, pod IPs 127.%d.x.y, private /etc/hosts: %s, "
        "service-account tokens: %s, kubernetes.default.svc: %s",
        kubelet.runtime.mode,
        ", ".join(NODES),
        octet,
        kubelet.private_hosts,
        kubelet.sa_mounts,
        kubelet.api_ip,
    )
    while not stop.wait(1.0):
        pass
    log.info("stopping: stopping every pod's containers")
    keeper.stopping.set()
    kubelet.shutdown()
    forwarder.close()


if __name__ == "__main__":
    main()
