"""Write the pod-template schemas of the ResourceCluster and ResourceJob CRDs from Kubernetes'
own OpenAPI.

    python crds/generate.py [--openapi PATH]

``spec.scheduler.template`` and ``spec.workerGroups[].template`` are pod templates; their
schema is ``io.k8s.api.core.v1.PodSpec`` of the Kubernetes release pinned in
``tests/k8s/versions.env``, read from that release's ``api/openapi-spec/v3/api__v1_openapi.json``
(in the Go module cache once ``tests/k8s/build.sh`` has run, or given with ``--openapi``),
so a misspelt field (``nodeSelecter``) is refused at admission instead of dropped.

The schema is made structural (a CRD allows no ``$ref``, ``allOf`` or ``oneOf``): references
are inlined, quantities and int-or-string fields become ``x-kubernetes-int-or-string``, and
what only built-in types may carry (patch strategies, list types, defaults, formats, enums)
is left out: the API server still validates the pods themselves when the operator creates
them. Descriptions are kept for the fields of the pod spec and of a container (what
``kubectl explain`` shows) and dropped deeper down, which keeps the CRD small enough for
``kubectl apply``'s last-applied annotation (256 KiB).

The ResourceJob CRD gets the ResourceCluster's spec schema as ``spec.cluster`` (its pod
templates left open: the ResourceCluster made from it is validated when it is created, and
two more copies of the pod schema would pass the annotation's size) and a pod template as
``spec.template`` (the submitter pod).

The CRD files are rewritten in place (their leading comments kept), then copied into the chart.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = ROOT / "crds" / "resourceclusters.apportion.dev.yaml"
CHART_CRD_FILE = ROOT / "charts" / "apportion" / "crds" / CRD_FILE.name
JOB_CRD_FILE = ROOT / "crds" / "resourcejobs.apportion.dev.yaml"
CHART_JOB_CRD_FILE = ROOT / "charts" / "apportion" / "crds" / JOB_CRD_FILE.name
VERSIONS = ROOT / "tests" / "k8s" / "versions.env"

Schema = dict[str, Any]

# Keys a CRD's structural schema may not hold, or that would default fields of the template.
DROPPED = {
    "x-kubernetes-patch-merge-key",
    "x-kubernetes-patch-strategy",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-unions",
    "default",
    "format",
    "enum",
}
# Types whose fields keep their descriptions (template.spec.*, template.spec.containers[].*).
DESCRIBED = {"io.k8s.api.core.v1.PodSpec", "io.k8s.api.core.v1.Container"}


def kube_version() -> str:
    for line in VERSIONS.read_text().splitlines():
        if line.startswith("KUBE_VERSION="):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"no KUBE_VERSION in {VERSIONS}")


def default_openapi() -> Path:
    try:
        cache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        cache = str(Path.home() / "go" / "pkg" / "mod")
    return (
        Path(cache)
        / f"k8s.io/kubernetes@{kube_version()}"
        / "api/openapi-spec/v3/api__v1_openapi.json"
    )


class Converter:
    def __init__(self, schemas: dict[str, Schema]) -> None:
        self.schemas = schemas

    def named(self, name: str, describe: bool = False) -> Schema:
        return self.convert(
            self.schemas[name], describe=describe, describe_fields=name in DESCRIBED
        )

    def convert(self, raw: Schema, describe: bool = False, describe_fields: bool = False) -> Schema:
        if "$ref" in raw:
            return self.named(raw["$ref"].rsplit("/", 1)[-1], describe)
        if "allOf" in raw:
            (only,) = raw["allOf"]
            out = self.convert(only, describe)
            if describe and raw.get("description"):
                out["description"] = raw["description"]
            return out
        if "oneOf" in raw:  # Quantity (string or number), IntOrString (integer or string)
            out = {"x-kubernetes-int-or-string": True}
            if describe and raw.get("description"):
                out["description"] = raw["description"]
            return out
        out = {}
        for key, value in raw.items():
            if key in DROPPED or (key == "description" and not describe):
                continue
            if key == "properties":
                out[key] = {
                    name: self.convert(field, describe=describe_fields)
                    for name, field in value.items()
                }
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                out[key] = self.convert(value)
            else:
                out[key] = value
        return out


def pod_template_schema(openapi: Schema, description: str) -> Schema:
    converter = Converter(openapi["components"]["schemas"])
    pod_spec = converter.named("io.k8s.api.core.v1.PodSpec")
    # A template may leave out the containers: the operator brings its own.
    pod_spec.pop("required", None)
    pod_spec["description"] = "Pod spec fields laid under the operator's (Kubernetes PodSpec)."
    string_map = {"type": "object", "additionalProperties": {"type": "string"}}
    return {
        "type": "object",
        "description": description,
        "properties": {
            "metadata": {
                "type": "object",
                "description": "Labels and annotations added to the pods.",
                "properties": {"labels": string_map, "annotations": string_map},
            },
            "spec": pod_spec,
        },
    }


def rewrite(crd: Schema, openapi: Schema) -> Schema:
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    scheduler = spec["scheduler"]["properties"]
    group = spec["workerGroups"]["items"]["properties"]
    scheduler["template"] = pod_template_schema(
        openapi,
        "Pod template for the scheduler pod ({metadata: {labels, annotations}, spec: PodSpec}); "
        "the operator's command, ports and probes win over the same fields here.",
    )
    group["template"] = pod_template_schema(
        openapi,
        "Pod template for this group's worker pods ({metadata: {labels, annotations}, spec: "
        "PodSpec}); limits here that no declared resource covers are advertised too.",
    )
    return crd


def open_template(description: str) -> Schema:
    return {
        "type": "object",
        "description": description,
        "x-kubernetes-preserve-unknown-fields": True,
    }


def rewrite_job(job_crd: Schema, cluster_crd: Schema, openapi: Schema) -> Schema:
    """The job's ``spec.cluster`` (the cluster's spec schema) and ``spec.template``."""
    (version,) = job_crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    (cluster_version,) = cluster_crd["spec"]["versions"]
    cluster = copy.deepcopy(cluster_version["schema"]["openAPIV3Schema"]["properties"]["spec"])
    cluster.pop("default", None)  # given or not: exactly one of cluster and clusterSelector
    cluster["description"] = (
        "The spec of a ResourceCluster made for the job (named as the job, owned by it): "
        "every field of kubectl explain resourcecluster.spec."
    )
    fields = cluster["properties"]
    fields["scheduler"]["properties"]["template"] = open_template(
        "Pod template for the scheduler pod, as in a ResourceCluster (checked when the "
        "cluster is made)."
    )
    fields["workerGroups"]["items"]["properties"]["template"] = open_template(
        "Pod template for this group's worker pods, as in a ResourceCluster (checked when "
        "the cluster is made)."
    )
    spec["cluster"] = cluster
    spec["template"] = pod_template_schema(
        openapi,
        "Pod template for the submitter pod ({metadata: {labels, annotations}, spec: PodSpec}); "
        "the image defaults to the cluster's; the operator's command, environment and "
        "restart policy win over the same fields here.",
    )
    return job_crd


def write(path: Path, chart_copy: Path, crd: Schema, text: str) -> None:
    header = "".join(
        f"{line}\n"
        for line in itertools.takewhile(lambda line: line.startswith("#"), text.splitlines())
    )
    path.write_text(header + yaml.safe_dump(crd, sort_keys=False, width=100))
    shutil.copyfile(path, chart_copy)
    print(f"wrote {path.relative_to(ROOT)} and {chart_copy.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--openapi", type=Path, default=None)
    args = parser.parse_args(argv)
    source = args.openapi or default_openapi()
    if not source.is_file():
        print(
            f"{source} not found: run 'bash tests/k8s/build.sh' (it downloads the pinned "
            "Kubernetes release into the Go module cache) or pass --openapi PATH",
            file=sys.stderr,
        )
        return 2
    openapi = json.loads(source.read_text())
    text = CRD_FILE.read_text()
    crd = rewrite(yaml.safe_load(text), openapi)
    write(CRD_FILE, CHART_CRD_FILE, crd, text)
    job_text = JOB_CRD_FILE.read_text()
    write(
        JOB_CRD_FILE,
        CHART_JOB_CRD_FILE,
        rewrite_job(yaml.safe_load(job_text), crd, openapi),
        job_text,
    )
    print(f"from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
