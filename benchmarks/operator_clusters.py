"""Many ResourceClusters under one operator, on the local control plane (tests/k8s).

    python -m benchmarks.operator_clusters --clusters 50 --workers 3 [--rest 60]

Starts the control plane, installs the chart (one operator watching one namespace),
applies N clusters of W one-thread workers, waits until every one is Running, then
measures at rest for --rest seconds: API requests per second (the API server's
``apiserver_request_total``, with the operator scaled to zero for the same time as the
baseline that kubelet, controllers and schedulers cost on their own) and the operator
process's CPU (utime + stime from /proc). Finally it applies one more cluster and times
``kubectl apply`` -> Running. Prints one JSON object, with the operator's requests per
second by verb and resource (with it minus without it) and the load average of the machine
at each step (the figures depend on what else runs there).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.controlplane import Cluster
from tests.k8s.deployment import Deployment, deploy_operator

BASE_PORT = 20000


def resource_cluster(index: int, workers: int) -> dict[str, Any]:
    port = BASE_PORT + 2 * index
    return {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": f"c{index}"},
        "spec": {
            "scheduler": {"port": port, "httpPort": port + 1},
            "workerGroups": [{"name": "cpu", "replicas": workers, "resources": {"process": 1}}],
        },
    }


def running(deployed: Deployment) -> set[str]:
    out = deployed.kubectl("get", "resourceclusters", "-o", "json")
    return {
        item["metadata"]["name"]
        for item in json.loads(out.stdout)["items"]
        if (item.get("status") or {}).get("phase") == "Running"
    }


# What the operator reads and writes (besides Events). The difference of the totals with and
# without the operator also holds the control plane's own noise: the endpoint controllers
# retry, with back-off, Endpoints that cannot hold the test pods' loopback IPs, and post and
# patch Events about it.
OPERATOR_RESOURCES = {
    "resourceclusters",
    "resourceclusters/status",
    "resourceworkergroups",
    "resourceworkergroups/status",
    "pods",  # not pods/status: the kubelet writes that
    "services",
    "secrets",
    "deployments",
    "kopfpeerings",
    "clusterkopfpeerings",
}
LABEL = re.compile(r'(\w+)="([^"]*)"')


def requests_by_kind(k8s: Cluster) -> dict[str, float]:
    """The API server's request counter by "VERB resource[/subresource]"."""
    text = k8s.kubectl("get", "--raw", "/metrics").stdout
    counts: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(LABEL.findall(line.split("}", 1)[0]))
            kind = labels.get("resource", "") + (
                f"/{labels['subresource']}" if labels.get("subresource") else ""
            )
            counts[f"{labels.get('verb', '?')} {kind}"] += float(line.rsplit(" ", 1)[1])
    return counts


def operator_events(deployed: Deployment) -> int:
    """Events the operator has posted in the clusters' namespace (with their repeat counts)."""
    out = deployed.kubectl("get", "events", "-o", "json")
    return sum(
        int(e.get("count") or 1)
        for e in json.loads(out.stdout)["items"]
        if (e.get("source") or {}).get("component") == "kopf"
        or e.get("reportingComponent") == "kopf"
    )


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def rates(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    return {kind: (after[kind] - before.get(kind, 0.0)) / seconds for kind in after}


def operator_pid(namespace: str) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"operator" in argv and namespace.encode() in argv:
            return int(entry.name)
    raise RuntimeError(f"no operator process watching {namespace}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scale_operator(deployed: Deployment, replicas: int) -> None:
    deployed.k8s.kubectl(
        "scale",
        "deployment",
        "-n",
        deployed.system,
        "-l",
        "app.kubernetes.io/component=operator",
        f"--replicas={replicas}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=50)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rest", type=float, default=60.0)
    args = parser.parse_args()
    result: dict[str, Any] = {"clusters": args.clusters, "workers": args.workers}
    with Cluster.start() as k8s, deploy_operator(k8s) as deployed:
        manifests = [resource_cluster(i, args.workers) for i in range(args.clusters)]
        started = time.monotonic()
        deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))
        names = {m["metadata"]["name"] for m in manifests}
        k8s.wait_for(lambda: running(deployed) >= names, "every cluster Running", 3600)
        result["all_running_s"] = round(time.monotonic() - started, 1)
        result["load_when_all_running"] = load_average()
        time.sleep(10)  # let the last status writes and scale events settle before measuring

        pid = operator_pid(deployed.namespace)
        events0 = operator_events(deployed)
        cpu0, req0, t0 = cpu_seconds(pid), requests_by_kind(k8s), time.monotonic()
        time.sleep(args.rest)
        cpu1, req1, t1 = cpu_seconds(pid), requests_by_kind(k8s), time.monotonic()
        result["operator_events_posted_at_rest"] = operator_events(deployed) - events0
        result["load_at_rest"] = load_average()
        result["operator_cpu_at_rest"] = round((cpu1 - cpu0) / (t1 - t0), 4)
        with_operator = rates(req0, req1, t1 - t0)
        result["api_requests_per_s_with_operator"] = round(sum(with_operator.values()), 2)

        scale_operator(deployed, 0)
        k8s.wait_for(
            lambda: (
                not subprocess.run(
                    ["pgrep", "-f", f"operator --namespace {deployed.namespace}"],
                    capture_output=True,
                ).stdout
            ),
            "operator stopped",
            120,
        )
        req0, t0 = requests_by_kind(k8s), time.monotonic()
        time.sleep(args.rest)
        req1, t1 = requests_by_kind(k8s), time.monotonic()
        without = rates(req0, req1, t1 - t0)
        result["api_requests_per_s_baseline"] = round(sum(without.values()), 2)
        result["api_requests_per_s_operator"] = round(
            result["api_requests_per_s_with_operator"] - result["api_requests_per_s_baseline"], 2
        )
        operators = {k: with_operator.get(k, 0.0) - without.get(k, 0.0) for k in with_operator}
        result["operator_requests_per_s_by_kind"] = {
            k: round(v, 2) for k, v in sorted(operators.items(), key=lambda kv: -kv[1]) if v >= 0.05
        }
        own = {k: v for k, v in operators.items() if k.split(" ")[-1] in OPERATOR_RESOURCES}
        result["operator_own_requests_per_s_by_kind"] = {
            k: round(v, 2) for k, v in sorted(own.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.05
        }
        result["api_requests_per_s_operator_own_kinds"] = round(
            sum(own.values()) + result["operator_events_posted_at_rest"] / args.rest, 2
        )
        scale_operator(deployed, 1)
        k8s.wait_for(lambda: operator_pid(deployed.namespace), "operator back", 120)
        time.sleep(10)  # its resume pass over every cluster

        extra = resource_cluster(args.clusters, args.workers)
        started = time.monotonic()
        deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump(extra))
        k8s.wait_for(
            lambda: extra["metadata"]["name"] in running(deployed), "one more cluster", 600
        )
        result["apply_to_running_s_next"] = round(time.monotonic() - started, 1)
        result["load_after_next"] = load_average()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
