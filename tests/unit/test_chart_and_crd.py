"""The ResourceCluster CRD, the Helm chart, the Dockerfile and the example, without a cluster.

`helm lint` / `helm template` use the helm binary that tests/k8s/build.sh builds; those tests
skip (saying so) only when it is missing.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s import paths

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

Obj = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "resourceclusters.apportion.dev.yaml"
CHART = ROOT / "charts" / "apportion"
CHART_CRD_FILE = CHART / "crds" / "resourceclusters.apportion.dev.yaml"
EXAMPLE = ROOT / "examples" / "seed-cluster.yaml"
DOCKERFILE = ROOT / "Dockerfile"

GROUP_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
RESOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")


def load_crd() -> Obj:
    crd = yaml.safe_load(CRD_FILE.read_text())
    assert isinstance(crd, dict)
    return crd


def version_schema(crd: Obj) -> Obj:
    (version,) = crd["spec"]["versions"]
    return version


def spec_schema() -> Obj:
    schema = version_schema(load_crd())["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]


def group_schema() -> Obj:
    return spec_schema()["properties"]["workerGroups"]["items"]


# ----- CRD ---------------------------------------------------------------------------------


def test_chart_crd_is_byte_identical_to_crds_folder() -> None:
    assert CHART_CRD_FILE.read_bytes() == CRD_FILE.read_bytes(), (
        f"{CHART_CRD_FILE.relative_to(ROOT)} drifted from {CRD_FILE.relative_to(ROOT)}: "
        f"cp {CRD_FILE.relative_to(ROOT)} {CHART_CRD_FILE.relative_to(ROOT)}"
    )


def test_every_crd_of_the_chart_is_a_copy_of_crds_folder() -> None:
    for name in ("resourceclusters.apportion.dev.yaml", "resourceworkergroups.apportion.dev.yaml"):
        assert (CHART / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), name


def test_worker_groups_have_a_scale_subresource() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "resourceworkergroups.apportion.dev.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_crd_names_and_version() -> None:
    crd = load_crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "resourceclusters.apportion.dev"
    spec = crd["spec"]
    assert spec["group"] == "apportion.dev"
    assert spec["scope"] == "Namespaced"
    names = spec["names"]
    assert names["kind"] == "ResourceCluster"
    assert names["plural"] == "resourceclusters"
    assert names["singular"] == "resourcecluster"
    # "rc" is deliberately absent: kubectl resolves it to ReplicationController.
    assert names["shortNames"] == ["rcluster"]
    version = version_schema(crd)
    assert version["name"] == "v1alpha1"
    assert version["served"] is True
    assert version["storage"] is True
    # scale only so that `kubectl scale rcluster` is refused saying what to do (not NotFound).
    assert version["subresources"] == {
        "status": {},
        "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"},
    }


def test_crd_printer_columns() -> None:
    columns = {
        c["name"]: (c["type"], c["jsonPath"])
        for c in version_schema(load_crd())["additionalPrinterColumns"]
    }
    assert columns == {
        "Phase": ("string", ".status.phase"),
        "Workers": ("string", ".status.workers"),
        "Resources": ("string", ".status.resourcesSummary"),
        "Valid": ("string", '.status.conditions[?(@.type=="Valid")].status'),
        "Scheduler": ("string", ".status.schedulerAddress"),
        "Observed": ("date", ".status.lastObserved"),
        "Age": ("date", ".metadata.creationTimestamp"),
        "Idle-Deadline": ("date", ".status.idleDeadline"),
    }


def test_crd_top_level_defaults() -> None:
    spec = spec_schema()
    props = spec["properties"]
    assert spec["type"] == "object"
    # No schema defaults for the image: the operator fills in the chart's image, pull
    # policy and pull secrets for clusters that name none.
    assert props["image"]["type"] == "string" and "default" not in props["image"]
    assert props["imagePullPolicy"]["enum"] == ["Always", "IfNotPresent", "Never"]
    assert "default" not in props["imagePullPolicy"]
    assert props["imagePullSecrets"]["items"]["required"] == ["name"]
    (ports,) = props["scheduler"]["x-kubernetes-validations"]
    assert ports["rule"] == "!has(self.port) || !has(self.httpPort) || self.port != self.httpPort"
    # Objects default to {} so that their inner defaults apply when they are left out.
    assert props["auth"]["default"] == {}
    assert props["auth"]["properties"]["enabled"] == {
        **props["auth"]["properties"]["enabled"],
        "type": "boolean",
        "default": True,
    }
    assert props["resourceMap"]["additionalProperties"] == {"type": "string"}
    assert props["resourceMap"]["default"] == {"GPU": "nvidia.com/gpu", "MEMORY": "memory"}


def test_crd_scheduler_schema() -> None:
    scheduler = spec_schema()["properties"]["scheduler"]
    assert scheduler["default"] == {}
    props = scheduler["properties"]
    for port, default in (("port", 8786), ("httpPort", 8787)):
        assert props[port]["type"] == "integer"
        assert (props[port]["minimum"], props[port]["maximum"]) == (1, 65535)
        assert props[port]["default"] == default
    assert props["serviceType"]["enum"] == ["ClusterIP", "NodePort", "LoadBalancer"]
    assert props["serviceType"]["default"] == "ClusterIP"
    assert_pod_template_schema(props["template"])


def assert_pod_template_schema(template: Obj) -> None:
    """A full pod-template schema (generated from Kubernetes' OpenAPI): unknown fields are
    refused at admission instead of kept or silently dropped."""
    text = yaml.safe_dump(template)
    assert "x-kubernetes-preserve-unknown-fields" not in text and "$ref" not in text
    assert set(template["properties"]) == {"metadata", "spec"}
    pod = template["properties"]["spec"]
    assert "nodeSelector" in pod["properties"] and "nodeSelecter" not in pod["properties"]
    assert "required" not in pod  # the operator brings the containers
    container = pod["properties"]["containers"]["items"]
    assert container["required"] == ["name"]
    assert container["properties"]["env"]["items"]["required"] == ["name"]
    limits = container["properties"]["resources"]["properties"]["limits"]
    assert limits["additionalProperties"] == {"x-kubernetes-int-or-string": True}
    assert pod["properties"]["tolerations"]["description"]  # what kubectl explain shows


def test_crd_worker_groups_schema() -> None:
    groups = spec_schema()["properties"]["workerGroups"]
    assert groups["type"] == "array"
    assert "minItems" not in groups  # zero groups is a valid (scheduler-only) cluster
    assert groups["x-kubernetes-list-type"] == "map"
    assert groups["x-kubernetes-list-map-keys"] == ["name"]
    item = group_schema()
    assert item["required"] == ["name"]
    props = item["properties"]
    assert props["name"]["pattern"] == GROUP_NAME.pattern
    assert props["name"]["maxLength"] == 40
    assert (props["replicas"]["type"], props["replicas"]["minimum"]) == ("integer", 0)
    # No schema default: the CEL rules must tell a fixed size from autoscaling bounds.
    assert "default" not in props["replicas"]
    for bound in ("minReplicas", "maxReplicas", "idleTimeoutSeconds"):
        assert (props[bound]["type"], props[bound]["minimum"]) == ("integer", 0)
    rules = [r["rule"] for r in item["x-kubernetes-validations"]]
    assert any("minReplicas <= self.maxReplicas" in r for r in rules)
    assert (props["nthreads"]["type"], props["nthreads"]["minimum"]) == ("integer", 1)
    assert props["nthreads"]["default"] == 1
    assert_pod_template_schema(props["template"])


def test_crd_resources_schema() -> None:
    resources = group_schema()["properties"]["resources"]
    assert resources["type"] == "object"
    # OpenAPI v3.0 (apiextensions v1): exclusiveMinimum is a boolean modifying minimum.
    assert resources["additionalProperties"] == {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
    }
    (rule,) = resources["x-kubernetes-validations"]
    assert rule["rule"] == f"self.all(k, k.matches('{RESOURCE_NAME.pattern}'))"
    assert rule["message"] == (
        "resource names must be 1-63 letters, digits, '.', '_', '-' or '/', "
        "starting with a letter or digit"
    )
    # Without these bounds the API server refuses the rule as too costly.
    assert resources["maxProperties"] > 0
    assert spec_schema()["properties"]["workerGroups"]["maxItems"] > 0


def test_crd_status_is_free_form() -> None:
    schema = version_schema(load_crd())["schema"]["openAPIV3Schema"]
    assert schema["properties"]["status"] == {
        **schema["properties"]["status"],
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }


def test_resource_name_rule() -> None:
    for good in ("GPU", "MEMORY", "process", "nvidia.com/gpu", "a", "x" * 63, "lic_2-b"):
        assert RESOURCE_NAME.match(good), good
    for bad in ("", "-GPU", "/x", "bad name", "x" * 64, "GPU!", "é"):
        assert not RESOURCE_NAME.match(bad), bad


# ----- example -----------------------------------------------------------------------------


def test_example_matches_the_schema() -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    assert example["apiVersion"] == "apportion.dev/v1alpha1"
    assert example["kind"] == "ResourceCluster"
    assert example["metadata"]["name"] == "pipeline"
    groups = {g["name"]: g for g in example["spec"]["workerGroups"]}
    assert groups == {
        "gpu": {"name": "gpu", "replicas": 2, "nthreads": 2, "resources": {"GPU": 2}},
        "highmem": {"name": "highmem", "replicas": 1, "nthreads": 2, "resources": {"MEMORY": 1e11}},
    }
    for group in groups.values():
        assert GROUP_NAME.match(group["name"])
        for name, amount in group["resources"].items():
            assert RESOURCE_NAME.match(name)
            # A YAML 1.1 parser (PyYAML) must read every amount as a number, not "100e9".
            assert isinstance(amount, (int, float)) and not isinstance(amount, bool)
            assert amount > 0


# ----- Dockerfile --------------------------------------------------------------------------


def test_dockerfile_installs_the_package_and_runs_as_non_root() -> None:
    lines = [
        line.strip()
        for line in DOCKERFILE.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    # python:3.11-slim unless BASE_IMAGE names another (`make image` where none can be pulled).
    assert lines[:2] == ["ARG BASE_IMAGE=python:3.11-slim", "FROM ${BASE_IMAGE}"]
    text = "\n".join(lines)
    install = re.search(r"pip install --no-cache-dir \"?\.(\[(?P<extras>[\w,-]+)\])?\"?", text)
    assert install, "the image must `pip install` the repository"
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users, "the image must switch to a non-root USER"
    assert users[-1].split(":")[0] == "10001"
    assert re.search(r"^EXPOSE 8786 8787$", text, re.MULTILINE)
    # The build context is a list of what `pip install .` needs: everything else is left out.
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored
    included = [line[1:] for line in ignored if line.startswith("!")]
    for entry in (".venv", ".git", "tests", "benchmarks"):
        assert entry not in included, entry
    # pyproject's readme must reach the build context, or `pip install .` fails.
    assert "README.md" in included
    extras = (install.group("extras") or "").split(",")
    if "kubernetes" not in extras:
        pytest.fail("the image runs `apportion operator`: install the kubernetes extra")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    if "kubernetes" not in pyproject.get("optional-dependencies", {}):
        pytest.skip("the kubernetes extra is not yet merged into pyproject.toml")


# ----- chart -------------------------------------------------------------------------------


OPERATOR_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "128Mi", "ephemeral-storage": "64Mi"},
    "limits": {"cpu": "1", "memory": "256Mi", "ephemeral-storage": "256Mi"},
}


def test_chart_metadata_and_values() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["apiVersion"], chart["name"]) == ("v2", "apportion")
    assert (chart["version"], chart["appVersion"]) == ("0.1.0", "0.1.0")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"] == {"repository": "apportion", "tag": "", "pullPolicy": "IfNotPresent"}
    assert values["operator"] == {
        "replicas": 1,
        "peeringLifetime": 20,
        "resources": OPERATOR_RESOURCES,
        "logLevel": "INFO",
        "extraArgs": [],
        "extraEnv": [],
        "podAnnotations": {},
        "podLabels": {},
        "priorityClassName": "",
        "volumes": [],
        "volumeMounts": [],
        "nodeSelector": {},
        "tolerations": [],
        "affinity": {},
        "podDisruptionBudget": {"enabled": True},
    }
    assert values["clusterDefaults"] == {"priorityClassName": ""}
    assert values["imagePullSecrets"] == []
    assert values["networkPolicy"] == {
        "enabled": False,
        "namespaces": [],
        "clientNamespaceSelector": {},
    }
    assert values["watch"] == {"namespaces": []}
    assert values["serviceAccount"] == {"create": True, "name": ""}
    assert values["rbac"] == {"create": True}


def helm_bin() -> Path:
    helm = paths.bin_dir() / "helm"
    if not os.access(helm, os.X_OK):
        pytest.skip(f"helm not built at {helm}: run `bash tests/k8s/build.sh`")
    return helm


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_bin()), *args], capture_output=True, text=True, timeout=60, check=False
    )


def render(*sets: str) -> list[Obj]:
    args = ["template", "rel", str(CHART), "--namespace", "ops"]
    for item in sets:
        args += ["--set", item]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs: list[Obj], kind: str) -> list[Obj]:
    return [d for d in docs if d["kind"] == kind]


def operator_container(docs: list[Obj]) -> Obj:
    (deployment,) = by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


# Resources no Role can grant (they have no namespace): those the chart's rules mention.
CLUSTER_SCOPED = {
    "namespaces",
    "nodes",
    "customresourcedefinitions",
    "clusterkopfpeerings",
    "persistentvolumes",
}


def rules_allow(rules: list[Obj], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules
    )


@pytest.mark.parametrize("extra", [[], ["watch.namespaces={a,b}"]], ids=["cluster", "namespaced"])
def test_helm_lint_is_clean(extra: list[str]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for item in extra:
        args += ["--set", item]
    result = helm(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_template_cluster_wide() -> None:
    docs = render()
    assert {d["kind"] for d in docs} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
    }
    (sa,) = by_kind(docs, "ServiceAccount")
    assert (sa["metadata"]["name"], sa["metadata"]["namespace"]) == ("rel-apportion", "ops")
    labels = sa["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "apportion"
    assert labels["app.kubernetes.io/instance"] == "rel"
    assert labels["app.kubernetes.io/version"] == "0.1.0"
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert labels["helm.sh/chart"] == "apportion-0.1.0"

    (role,) = by_kind(docs, "ClusterRole")
    rules = role["rules"]
    for verb in ("get", "list", "watch", "patch", "update"):
        assert rules_allow(rules, "apportion.dev", "resourceclusters", verb)
        assert rules_allow(rules, "apportion.dev", "resourceclusters/status", verb)
    # An idle cluster with idlePolicy: delete is deleted by the operator.
    assert rules_allow(rules, "apportion.dev", "resourceclusters", "delete")
    for verb in ("get", "list", "watch", "create", "delete", "patch"):
        assert rules_allow(rules, "", "pods", verb)
        assert rules_allow(rules, "", "services", verb)
        assert rules_allow(rules, "", "secrets", verb)
        assert rules_allow(rules, "apps", "deployments", verb)
    for verb in ("get", "list", "watch"):
        assert rules_allow(rules, "", "namespaces", verb)
        assert rules_allow(rules, "apiextensions.k8s.io", "customresourcedefinitions", verb)
    assert rules_allow(rules, "", "events", "create")
    assert not rules_allow(rules, "", "nodes", "delete")
    assert not rules_allow(rules, "coordination.k8s.io", "leases", "create")
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules)
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rel-apportion", "namespace": "ops"}
    ]

    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1
    assert pod["serviceAccountName"] == "rel-apportion"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    container = operator_container(docs)
    assert container["image"] == "apportion:0.1.0"
    assert container["command"] == ["apportion", "operator"]
    assert container["args"] == [
        "--all-namespaces",
        "--log-level",
        "INFO",
        "--liveness=http://$(POD_IP):8081/healthz",
    ]
    assert {"name": "APPORTION_OPERATOR__IMAGE", "value": "apportion:0.1.0"} in container["env"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 10001
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe["path"] == "/healthz"
    assert ports.get(probe["port"], probe["port"]) == 8081
    assert container["resources"] == OPERATOR_RESOURCES


def test_template_namespaced() -> None:
    docs = render(
        "watch.namespaces={team-a,team-b}",
        "image.tag=1.2.3",
        "image.repository=registry.example/apportion",
        "operator.logLevel=DEBUG",
        "operator.extraArgs={--verbose}",
    )
    roles = by_kind(docs, "Role")
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for role in roles:
        rules = role["rules"]
        assert rules_allow(rules, "apportion.dev", "resourceclusters/status", "patch")
        assert rules_allow(rules, "", "pods", "create")
        assert rules_allow(rules, "", "secrets", "create")
        # A Role grants only namespaced resources: a cluster-scoped one named in it would
        # grant nothing, and the operator would fail at run time (those are in the
        # ClusterRole below).
        named = {res for rule in rules for res in rule["resources"]}
        assert not named & CLUSTER_SCOPED, named & CLUSTER_SCOPED
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "rel-apportion",
        }
        assert binding["subjects"][0]["namespace"] == "ops"
    # The only cluster-wide grants left: reading CRDs and namespaces, which kopf scans, and
    # Kueue's ResourceFlavors (cluster-scoped), which a queued ResourceJob is placed by.
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert [
        (r["apiGroups"], r["resources"], sorted(r["verbs"])) for r in cluster_role["rules"]
    ] == [
        (["apiextensions.k8s.io"], ["customresourcedefinitions"], ["get", "list", "watch"]),
        (["kueue.x-k8s.io"], ["resourceflavors"], ["get", "list", "watch"]),
        ([""], ["namespaces"], ["get", "list", "watch"]),
    ]

    container = operator_container(docs)
    assert container["args"] == [
        "--namespace",
        "team-a",
        "--namespace",
        "team-b",
        "--log-level",
        "DEBUG",
        "--liveness=http://$(POD_IP):8081/healthz",
        "--verbose",
    ]
    image = "registry.example/apportion:1.2.3"
    assert container["image"] == image
    assert {"name": "APPORTION_OPERATOR__IMAGE", "value": image} in container["env"]


def test_template_without_rbac_or_service_account() -> None:
    docs = render("rbac.create=false", "serviceAccount.create=false", "serviceAccount.name=ops-sa")
    assert {d["kind"] for d in docs} == {"Deployment"}
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "ops-sa"


# ----- commands the chart puts into pods ---------------------------------------------------


def test_pod_commands_are_cli_entry_points() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    command = operator_container(render())["command"]
    assert command[0] in scripts, f"{command[0]!r} is not a [project.scripts] entry point"
    module_name, _, attr = scripts[command[0]].partition(":")
    main = getattr(importlib.import_module(module_name), attr)
    subcommands = main.commands  # a click group
    if command[1] not in subcommands:
        pytest.skip(f"{command[1]} command not yet merged")
    assert command[1] in subcommands


def test_autoscaling_example_parses_into_an_autoscaled_gpu_group() -> None:
    from apportion.operator.spec import parse

    example = yaml.safe_load((ROOT / "examples" / "autoscaling-cluster.yaml").read_text())
    spec = parse(example["metadata"]["name"], "default", example["spec"])
    gpu, highmem = spec.groups
    assert (gpu.autoscaled, gpu.min_replicas, gpu.max_replicas) == (True, 0, 4)
    assert (gpu.idle_timeout, gpu.replicas, gpu.limits) == (120, 0, {"nvidia.com/gpu": "2"})
    assert (highmem.autoscaled, highmem.replicas) == (False, 1)


def test_the_chart_sets_the_operator_only_through_its_settings_variables() -> None:
    from apportion import config, config_schema

    docs = render("operator.replicas=2", "imagePullSecrets[0].name=regcred")
    env = {
        e["name"]: e.get("value")
        for e in operator_container(docs)["env"]
        if e["name"].startswith("APPORTION_")
    }
    by_variable = {config_schema.env_name(s.key): s.key for s in config_schema.SETTINGS}
    assert set(env) <= set(by_variable), set(env) - set(by_variable)
    try:
        config.refresh(env)
        assert config.get("operator.image") == "apportion:0.1.0"
        assert config.get("operator.image-pull-policy") == "IfNotPresent"
        assert config.get("operator.image-pull-secrets") == "regcred"
        assert config.get("operator.peering.name") == "rel-apportion"
        assert config.get("operator.peering.lifetime") == 20
    finally:
        config.refresh()


def test_two_operator_replicas_get_a_disruption_budget_and_spread_over_nodes() -> None:
    docs = render("operator.replicas=2")
    (budget,) = by_kind(docs, "PodDisruptionBudget")
    (deployment,) = by_kind(docs, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert budget["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    (term,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    assert by_kind(render(), "PodDisruptionBudget") == []  # one replica: nothing to keep


def test_operator_pod_extras_and_the_clusters_priority_class_come_from_values() -> None:
    docs = render(
        "operator.podAnnotations.team=ml",
        "operator.priorityClassName=system-cluster-critical",
        "operator.extraEnv[0].name=HTTPS_PROXY",
        "operator.extraEnv[0].value=http://proxy:3128",
        "operator.volumes[0].name=ca",
        "operator.volumes[0].configMap.name=corp-ca",
        "operator.volumeMounts[0].name=ca",
        "operator.volumeMounts[0].mountPath=/etc/corp-ca",
        "clusterDefaults.priorityClassName=apportion-high",
    )
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"team": "ml"}
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HTTPS_PROXY"] == "http://proxy:3128"
    assert env["APPORTION_OPERATOR__PRIORITY_CLASS_NAME"] == "apportion-high"
    assert {"name": "ca", "configMap": {"name": "corp-ca"}} in pod["spec"]["volumes"]
    assert {"name": "ca", "mountPath": "/etc/corp-ca"} in container["volumeMounts"]


def test_network_policies_cover_schedulers_and_workers_and_the_operator() -> None:
    docs = render(
        "networkPolicy.enabled=true",
        "networkPolicy.namespaces={ml,etl}",  # a cluster-wide install names them
        "networkPolicy.clientNamespaceSelector.matchLabels.team=true",
    )
    policies = {
        (p["metadata"]["namespace"], p["metadata"]["name"]): p
        for p in by_kind(docs, "NetworkPolicy")
    }
    assert set(policies) == {
        ("ml", "rel-apportion-clusters"),
        ("etl", "rel-apportion-clusters"),
        ("ops", "rel-apportion-operator"),
    }
    clusters = policies[("ml", "rel-apportion-clusters")]["spec"]
    # Every pod the operator makes (not only schedulers: clients fetch from workers too).
    assert clusters["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/managed-by": "apportion-operator"}
    }
    clients = clusters["ingress"][0]["from"][2]["namespaceSelector"]
    assert clients == {"matchLabels": {"team": "true"}}  # a string, as the API server wants
    operator = policies[("ops", "rel-apportion-operator")]["spec"]
    assert operator["ingress"] == [{"ports": [{"port": 8081, "protocol": "TCP"}]}]


def test_network_policies_need_the_namespaces_of_the_clusters() -> None:
    failed = helm("template", "rel", str(CHART), "--set", "networkPolicy.enabled=true")
    assert failed.returncode != 0
    assert "networkPolicy.namespaces" in failed.stderr


def test_replicas_elect_a_leader_through_a_lease_they_may_write() -> None:
    docs = render("operator.replicas=2", "watch.namespaces={ml}")
    (role,) = [
        r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")
    ]
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
    env = {e["name"]: e for e in operator_container(docs)["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert not [r for r in by_kind(render(), "Role") if "leader" in r["metadata"]["name"]]
