"""The ResourceCluster CRD and the Helm chart against a real API server.

The CRD is cluster-scoped and shared with other tests: it is applied idempotently and never
deleted. Each chart install uses its own release name (its ClusterRole and binding are
cluster-scoped) and is uninstalled afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from .controlplane import REPO_ROOT, Cluster

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(300)]

Obj = dict[str, Any]

CRD_FILE = REPO_ROOT / "crds" / "resourceclusters.apportion.dev.yaml"
CRD_NAME = "resourceclusters.apportion.dev"
CHART = REPO_ROOT / "charts" / "apportion"
EXAMPLE = REPO_ROOT / "examples" / "seed-cluster.yaml"
RESOURCE_NAME_MESSAGE = (
    "resource names must be 1-63 letters, digits, '.', '_', '-' or '/', "
    "starting with a letter or digit"
)


@pytest.fixture(scope="module")
def crd(k8s_cluster: Cluster) -> Cluster:
    """The CRD, applied (idempotently) and Established."""
    k8s_cluster.kubectl("apply", "-f", str(CRD_FILE))

    k8s_cluster.wait_crd_established(CRD_NAME)

    def published() -> bool:
        # The API server publishes a new CRD's OpenAPI (what kubectl explain reads) a few
        # seconds after Established.
        return k8s_cluster.kubectl("explain", "resourcecluster", check=False).returncode == 0

    k8s_cluster.wait_for(published, f"{CRD_NAME} in the OpenAPI", 60)
    return k8s_cluster


def resource_cluster(name: str, spec: Obj | None = None) -> Obj:
    obj: Obj = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "metadata": {"name": name},
    }
    if spec is not None:
        obj["spec"] = spec
    return obj


def get_rc(cluster: Cluster, name: str, namespace: str) -> Obj:
    out = cluster.kubectl("get", "resourceclusters", name, "-n", namespace, "-o", "json")
    result: Obj = json.loads(out.stdout)
    return result


def can_i(cluster: Cluster, sa: str, *args: str) -> bool:
    """`kubectl auth can-i --as=<service account> ARGS` (exit 1 means "no")."""
    result = cluster.kubectl("auth", "can-i", f"--as={sa}", *args, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stdout + result.stderr
    return answer == "yes"


# ----- defaults ----------------------------------------------------------------------------


def test_example_applies_with_defaults(crd: Cluster, k8s_namespace: str) -> None:
    crd.kubectl("apply", "-n", k8s_namespace, "-f", str(EXAMPLE))
    spec = get_rc(crd, "pipeline", k8s_namespace)["spec"]
    # No image defaults in the schema: the operator applies the chart's.
    assert "image" not in spec and "imagePullPolicy" not in spec
    assert spec["auth"] == {"enabled": True}
    assert spec["scheduler"] == {"port": 8786, "httpPort": 8787, "serviceType": "ClusterIP"}
    assert spec["resourceMap"] == {"GPU": "nvidia.com/gpu", "MEMORY": "memory"}
    assert spec["workerGroups"] == [
        {"name": "gpu", "replicas": 2, "nthreads": 2, "resources": {"GPU": 2}},
        {"name": "highmem", "replicas": 1, "nthreads": 2, "resources": {"MEMORY": 100e9}},
    ]


def test_minimal_cluster_gets_every_default(crd: Cluster, k8s_namespace: str) -> None:
    crd.apply(
        resource_cluster("bare"),
        resource_cluster("one-group", {"workerGroups": [{"name": "cpu"}]}),
        namespace=k8s_namespace,
    )
    bare = get_rc(crd, "bare", k8s_namespace)["spec"]
    assert "image" not in bare
    assert bare["scheduler"]["port"] == 8786
    assert bare["auth"] == {"enabled": True}
    assert "workerGroups" not in bare  # zero groups is valid
    (group,) = get_rc(crd, "one-group", k8s_namespace)["spec"]["workerGroups"]
    # No replicas default: a group may be autoscaled instead (the operator fixes 1).
    assert group == {"name": "cpu", "nthreads": 1}


def test_kubectl_number_forms(crd: Cluster, k8s_namespace: str) -> None:
    """kubectl reads `100e9` as a number (PyYAML would not; the example uses `100.0e+9`)."""
    manifest = (
        "apiVersion: apportion.dev/v1alpha1\nkind: ResourceCluster\nmetadata: {name: forms}\n"
        "spec:\n  workerGroups:\n"
        "    - {name: a, resources: {MEMORY: 100e9, GPU: 0.5, process: 1}}\n"
        "    - {name: b, resources: {MEMORY: 100.0e+9}}\n"
    )
    crd.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=manifest)
    a, b = get_rc(crd, "forms", k8s_namespace)["spec"]["workerGroups"]
    assert a["resources"] == {"MEMORY": 100e9, "GPU": 0.5, "process": 1}
    assert b["resources"] == {"MEMORY": 100e9}


# ----- validation --------------------------------------------------------------------------

REJECTED = {
    "duplicate-group": (
        [{"name": "gpu"}, {"name": "gpu", "replicas": 3}],
        ['spec.workerGroups[1]: Duplicate value: {"name":"gpu"}'],
    ),
    "uppercase-group": (
        [{"name": "Gpu"}],
        ["spec.workerGroups[0].name", "should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"],
    ),
    "underscore-group": (
        [{"name": "high_mem"}],
        ["spec.workerGroups[0].name", "should match"],
    ),
    "long-group": (
        [{"name": "g" * 41}],
        ["spec.workerGroups[0].name", "Too long: may not be more than 40"],
    ),
    "negative-replicas": (
        [{"name": "gpu", "replicas": -1}],
        ["spec.workerGroups[0].replicas", "should be greater than or equal to 0"],
    ),
    "zero-nthreads": (
        [{"name": "gpu", "nthreads": 0}],
        ["spec.workerGroups[0].nthreads", "should be greater than or equal to 1"],
    ),
    "zero-amount": (
        [{"name": "gpu", "resources": {"GPU": 0}}],
        ["spec.workerGroups[0].resources.GPU", "should be greater than 0"],
    ),
    "negative-amount": (
        [{"name": "gpu", "resources": {"MEMORY": -1e9}}],
        ["spec.workerGroups[0].resources.MEMORY", "should be greater than 0"],
    ),
    "string-amount": (
        [{"name": "gpu", "resources": {"GPU": "two"}}],
        ["spec.workerGroups[0].resources.GPU", "must be of type number"],
    ),
    "resource-name-space": (
        [{"name": "gpu", "resources": {"bad name": 1}}],
        ["spec.workerGroups[0].resources", RESOURCE_NAME_MESSAGE],
    ),
    "resource-name-leading-dash": (
        [{"name": "gpu", "resources": {"-GPU": 1}}],
        [RESOURCE_NAME_MESSAGE],
    ),
    "resource-name-too-long": (
        [{"name": "gpu", "resources": {"x" * 64: 1}}],
        [RESOURCE_NAME_MESSAGE],
    ),
    "missing-group-name": (
        [{"replicas": 1}],
        ["spec.workerGroups[0].name: Required value"],
    ),
    "replicas-and-bounds": (
        [{"name": "gpu", "replicas": 2, "maxReplicas": 4}],
        ["spec.workerGroups[0]", "replicas fixes the group's size"],
    ),
    "bounds-without-max": (
        [{"name": "gpu", "minReplicas": 1}],
        ["spec.workerGroups[0]", "autoscaling needs maxReplicas"],
    ),
    "min-above-max": (
        [{"name": "gpu", "minReplicas": 3, "maxReplicas": 2}],
        ["spec.workerGroups[0]", "minReplicas must not exceed maxReplicas"],
    ),
    "template-containers-not-a-list": (
        [{"name": "gpu", "template": {"spec": {"containers": "oops"}}}],
        ["spec.workerGroups[0].template.spec.containers", "must be of type array"],
    ),
    "template-env-without-name": (
        [
            {
                "name": "gpu",
                "template": {"spec": {"containers": [{"name": "worker", "env": [{"value": "1"}]}]}},
            }
        ],
        ["spec.workerGroups[0].template.spec.containers[0].env[0].name: Required value"],
    ),
    "negative-idle-timeout": (
        [{"name": "gpu", "maxReplicas": 2, "idleTimeoutSeconds": -1}],
        ["spec.workerGroups[0].idleTimeoutSeconds", "should be greater than or equal to 0"],
    ),
}


def test_scheduler_ports_must_differ(crd: Cluster, k8s_namespace: str) -> None:
    spec = {"scheduler": {"port": 8786, "httpPort": 8786}}
    manifest = yaml.safe_dump(resource_cluster("same-ports", spec))
    result = crd.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=manifest, check=False)
    assert result.returncode != 0, result.stdout
    assert "scheduler.port and scheduler.httpPort must differ" in result.stderr, result.stderr


def test_a_tls_secret_name_needs_tls_enabled(crd: Cluster, k8s_namespace: str) -> None:
    spec = {"tls": {"secretName": "my-cert"}}
    manifest = yaml.safe_dump(resource_cluster("half-tls", spec))
    result = crd.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=manifest, check=False)
    assert result.returncode != 0, result.stdout
    assert "tls.secretName needs tls.enabled true" in result.stderr, result.stderr
    spec = {"tls": {"enabled": True, "secretName": "my-cert"}}
    crd.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=yaml.safe_dump(
        resource_cluster("half-tls", spec)))  # fmt: skip
    assert get_rc(crd, "half-tls", k8s_namespace)["spec"]["tls"] == spec["tls"]


def test_a_misspelt_template_field_is_refused_not_dropped(crd: Cluster, k8s_namespace: str) -> None:
    """kubectl validates strictly against the CRD's pod-template schema."""
    template = {"spec": {"nodeSelecter": {"apportion.dev/node-type": "gpu"}}}
    manifest = yaml.safe_dump(
        resource_cluster("typo", {"workerGroups": [{"name": "gpu", "template": template}]})
    )
    result = crd.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=manifest, check=False)
    assert result.returncode != 0, result.stdout
    assert 'unknown field "spec.workerGroups[0].template.spec.nodeSelecter"' in result.stderr
    template = {"spec": {"nodeSelector": {"apportion.dev/node-type": "gpu"}}}
    manifest = yaml.safe_dump(
        resource_cluster("typo", {"workerGroups": [{"name": "gpu", "template": template}]})
    )
    crd.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=manifest)
    (group,) = get_rc(crd, "typo", k8s_namespace)["spec"]["workerGroups"]
    assert group["template"] == template


def test_kubectl_explain_documents_every_spec_field(crd: Cluster) -> None:
    spec = crd.kubectl("explain", "resourcecluster.spec").stdout
    for field in (
        "image",
        "imagePullPolicy",
        "imagePullSecrets",
        "auth",
        "scheduler",
        "resourceMap",
        "workerGroups",
        "tls",
    ):
        assert field in spec, spec
    tls = crd.kubectl("explain", "resourcecluster.spec.tls").stdout
    assert "secretName" in tls and "<no description>" not in tls, tls
    group = crd.kubectl("explain", "resourcecluster.spec.workerGroups").stdout
    assert "<no description>" not in group, group
    pod = crd.kubectl("explain", "resourcecluster.spec.workerGroups.template.spec").stdout
    assert "nodeSelector" in pod and "tolerations" in pod


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_api_server_rejects(crd: Cluster, k8s_namespace: str, case: str) -> None:
    groups, messages = REJECTED[case]
    manifest = yaml.safe_dump(resource_cluster("bad", {"workerGroups": groups}))
    result = crd.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=manifest, check=False)
    assert result.returncode != 0, f"{case} was accepted:\n{result.stdout}"
    assert 'The ResourceCluster "bad" is invalid' in result.stderr, result.stderr
    for message in messages:
        assert message in result.stderr, result.stderr
    gone = crd.kubectl("get", "resourceclusters", "bad", "-n", k8s_namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("imagePullPolicy", "Sometimes", 'spec.imagePullPolicy: Unsupported value: "Sometimes"'),
        ("scheduler", {"port": 0}, "spec.scheduler.port"),
        ("scheduler", {"httpPort": 70000}, "spec.scheduler.httpPort"),
        ("scheduler", {"serviceType": "ExternalName"}, "spec.scheduler.serviceType"),
        ("resourceMap", {"GPU": 1}, "spec.resourceMap.GPU"),
    ],
)
def test_api_server_rejects_bad_spec_fields(
    crd: Cluster, k8s_namespace: str, field: str, value: object, message: str
) -> None:
    manifest = yaml.safe_dump(resource_cluster("bad", {field: value}))
    result = crd.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=manifest, check=False)
    assert result.returncode != 0, result.stdout
    assert message in result.stderr, result.stderr


# ----- status subresource and printer columns ----------------------------------------------


def test_status_subresource_and_printer_columns(crd: Cluster, k8s_namespace: str) -> None:
    crd.kubectl("apply", "-n", k8s_namespace, "-f", str(EXAMPLE))
    status = {
        "phase": "Running",
        "workers": "3/3",
        "schedulerAddress": f"tcp://pipeline-scheduler.{k8s_namespace}.svc:8786",
        "workerGroups": [{"name": "gpu", "replicas": 2, "readyReplicas": 2}],
        "unmetDemand": [],
        "observedGeneration": 1,
        "resourcesSummary": "GPU 1/4,MEMORY 0/100e9",
    }
    crd.kubectl(
        "patch", "resourceclusters", "pipeline", "-n", k8s_namespace,
        "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}),
    )  # fmt: skip
    obj = get_rc(crd, "pipeline", k8s_namespace)
    assert obj["status"] == status  # free-form: nothing pruned
    assert obj["metadata"]["generation"] == 1  # status writes do not bump the generation

    # A status written through the main resource is ignored (status subresource enabled).
    spec_patch = {"spec": {"image": "apportion:dev"}, "status": {"phase": "Failed"}}
    crd.kubectl(
        "patch", "resourceclusters", "pipeline", "-n", k8s_namespace,
        "--type=merge", "-p", json.dumps(spec_patch),
    )  # fmt: skip
    obj = get_rc(crd, "pipeline", k8s_namespace)
    assert obj["status"]["phase"] == "Running"
    assert obj["spec"]["image"] == "apportion:dev"
    assert obj["metadata"]["generation"] == 2

    for name in ("resourceclusters", "resourcecluster", "rcluster", CRD_NAME):
        out = crd.kubectl("get", name, "-n", k8s_namespace).stdout.splitlines()
        header = ["NAME", "PHASE", "WORKERS", "RESOURCES", "VALID", "SCHEDULER", "OBSERVED", "AGE"]
        assert out[0].split() == header, out
        row = out[1].split()  # VALID and OBSERVED are blank: this status has neither
        assert row[:3] == ["pipeline", "Running", "3/3"], out
        assert f" {status['resourcesSummary']} " in out[1], out
        assert row[-2] == status["schedulerAddress"], out


def test_kubectl_scale_of_a_cluster_says_to_scale_a_group(crd: Cluster, k8s_namespace: str) -> None:
    groups = [{"name": "cpu", "replicas": 1}, {"name": "gpu", "replicas": 2}]
    manifest = yaml.safe_dump(resource_cluster("sized", {"workerGroups": groups}))
    crd.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=manifest)
    scaled = crd.kubectl(
        "scale", "rcluster", "sized", "-n", k8s_namespace, "--replicas=3", check=False
    )
    assert scaled.returncode != 0
    assert "NotFound" not in scaled.stderr and "not found" not in scaled.stderr, scaled.stderr
    assert "sized per worker group: kubectl scale rworkergroup <cluster>-<group>" in scaled.stderr
    spec = get_rc(crd, "sized", k8s_namespace)["spec"]
    assert "replicas" not in spec and [g["replicas"] for g in spec["workerGroups"]] == [1, 2]
    # Nor through an edit of the cluster itself.
    edited = crd.kubectl(
        "patch", "rcluster", "sized", "-n", k8s_namespace, "--type=merge",
        "-p", json.dumps({"spec": {"replicas": 3}}), check=False,
    )  # fmt: skip
    assert edited.returncode != 0 and "sized per worker group" in edited.stderr


# ----- Helm chart --------------------------------------------------------------------------


@pytest.fixture
def release(crd: Cluster) -> Iterator[str]:
    """A unique release name; the release (with its cluster-scoped RBAC) is removed after."""
    name = f"ap-{uuid.uuid4().hex[:8]}"
    yield name
    for namespace in _release_namespaces(crd, name):
        crd.helm("uninstall", name, "-n", namespace, "--wait", check=False)


def _release_namespaces(cluster: Cluster, name: str) -> list[str]:
    out = cluster.helm("list", "--all-namespaces", "-o", "json").stdout
    return [r["namespace"] for r in json.loads(out) if r["name"] == name]


def helm_install(cluster: Cluster, name: str, namespace: str, *sets: str) -> None:
    args = ["install", name, str(CHART), "-n", namespace, "--wait", "--timeout", "120s"]
    for item in ("operator.replicas=0", *sets):
        args += ["--set", item]
    cluster.helm(*args)


def check_installed_objects(cluster: Cluster, name: str, namespace: str) -> str:
    """The ServiceAccount and Deployment exist; returns the `--as` user of the operator."""
    fullname = f"{name}-apportion"
    sa = json.loads(
        cluster.kubectl("get", "serviceaccount", fullname, "-n", namespace, "-o", "json").stdout
    )
    assert sa["metadata"]["labels"]["app.kubernetes.io/instance"] == name
    deployment = json.loads(
        cluster.kubectl("get", "deployment", fullname, "-n", namespace, "-o", "json").stdout
    )
    assert deployment["spec"]["replicas"] == 0
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == fullname
    assert pod_spec["containers"][0]["command"] == ["apportion", "operator"]
    pods = cluster.client.get(
        f"/api/v1/namespaces/{namespace}/pods",
        labelSelector=f"app.kubernetes.io/instance={name}",
    )
    assert pods["items"] == []
    return f"system:serviceaccount:{namespace}:{fullname}"


OPERATOR_NEEDS = [
    ("get", "resourceclusters.apportion.dev"),
    ("watch", "resourceclusters.apportion.dev"),
    ("patch", "resourceclusters.apportion.dev"),
    ("patch", "resourceclusters.apportion.dev", "--subresource=status"),
    ("update", "resourceclusters.apportion.dev", "--subresource=status"),
    ("create", "pods"),
    ("delete", "pods"),
    ("watch", "pods"),
    ("create", "services"),
    ("patch", "services"),
    ("create", "secrets"),
    ("get", "secrets"),
    ("create", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("create", "events"),
]
NEVER = [
    ("delete", "nodes"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("create", "pods", "--subresource=exec"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "leases.coordination.k8s.io"),
]


def test_helm_install_cluster_wide_rbac(crd: Cluster, k8s_namespace: str, release: str) -> None:
    helm_install(crd, release, k8s_namespace)
    sa = check_installed_objects(crd, release, k8s_namespace)
    fullname = f"{release}-apportion"
    crd.kubectl("get", "clusterrole", fullname)
    crd.kubectl("get", "clusterrolebinding", fullname)
    for namespace in (k8s_namespace, "default"):
        for verb, resource, *extra in OPERATOR_NEEDS:
            assert can_i(crd, sa, verb, resource, "-n", namespace, *extra), (verb, resource)
    for verb in ("list", "watch"):
        assert can_i(crd, sa, verb, "namespaces")
        assert can_i(crd, sa, verb, "customresourcedefinitions.apiextensions.k8s.io")
    for verb, resource, *extra in NEVER:
        assert not can_i(crd, sa, verb, resource, "-n", k8s_namespace, *extra), (verb, resource)


def test_helm_install_namespaced_rbac(crd: Cluster, k8s_namespace: str, release: str) -> None:
    watched = f"{release}-watched"
    crd.client.create("/api/v1/namespaces", {"metadata": {"name": watched}})
    try:
        helm_install(crd, release, k8s_namespace, f"watch.namespaces={{{watched}}}")
        sa = check_installed_objects(crd, release, k8s_namespace)
        fullname = f"{release}-apportion"
        crd.kubectl("get", "role", fullname, "-n", watched)
        crd.kubectl("get", "rolebinding", fullname, "-n", watched)
        args = crd.kubectl(
            "get", "deployment", fullname, "-n", k8s_namespace,
            "-o", "jsonpath={.spec.template.spec.containers[0].args}",
        ).stdout  # fmt: skip
        assert json.loads(args)[:2] == ["--namespace", watched]

        for verb, resource, *extra in OPERATOR_NEEDS:
            assert can_i(crd, sa, verb, resource, "-n", watched, *extra), (verb, resource)
        # Nothing outside the watched namespace (not even the release's own).
        for namespace in ("default", k8s_namespace):
            assert not can_i(crd, sa, "get", "secrets", "-n", namespace)
            assert not can_i(crd, sa, "create", "pods", "-n", namespace)
            assert not can_i(crd, sa, "list", "resourceclusters.apportion.dev", "-n", namespace)
        # Reading namespaces is cluster-wide (kopf looks the watched ones up at start);
        # changing them is not allowed, nor any other cluster-wide reading.
        assert can_i(crd, sa, "list", "namespaces")
        assert not can_i(crd, sa, "delete", "namespaces")
        assert not can_i(crd, sa, "list", "pods", "--all-namespaces")
        assert can_i(crd, sa, "watch", "customresourcedefinitions.apiextensions.k8s.io")
        for verb, resource, *extra in NEVER:
            assert not can_i(crd, sa, verb, resource, "-n", watched, *extra), (verb, resource)
    finally:
        crd.client.delete(f"/api/v1/namespaces/{watched}")


def test_api_server_accepts_autoscaled_groups(crd: Cluster, k8s_namespace: str) -> None:
    groups = [
        {"name": "gpu", "maxReplicas": 4, "idleTimeoutSeconds": 30, "resources": {"GPU": 2}},
        {"name": "cpu", "minReplicas": 2, "maxReplicas": 2},
        {"name": "highmem", "replicas": 0},
    ]
    crd.apply(resource_cluster("elastic", {"workerGroups": groups}), namespace=k8s_namespace)
    stored = get_rc(crd, "elastic", k8s_namespace)["spec"]["workerGroups"]
    assert [g.get("maxReplicas") for g in stored] == [4, 2, None]
