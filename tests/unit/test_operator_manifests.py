"""apportion.operator.manifests: every child object of a ResourceCluster, built purely.

No cluster, no network: the manifests are checked as data, and their commands are parsed
by the real ``apportion`` CLI (without running it).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from apportion.operator.manifests import (
    CONTAINER_SECURITY,
    HASH_ANNOTATION,
    LABEL_CLUSTER,
    LABEL_GROUP,
    POD_SECURITY,
    TMP_MOUNT,
    TMP_VOLUME,
    WORKER_REQUESTS,
    group_hash,
    labels,
    owner_reference,
    scheduler_deployment,
    scheduler_service,
    secret_name,
    token_secret,
    worker_command,
    worker_pod,
    worker_pod_name,
)
from apportion.operator.spec import ClusterSpec, Defaults, parse

from apportion.cli import main as cli
from apportion.resources import parse_spec

OWNER = {
    "apiVersion": "apportion.dev/v1alpha1",
    "kind": "ResourceCluster",
    "metadata": {"name": "pipeline", "namespace": "team-a", "uid": "1234-abcd"},
}
GI = 2**30


def cluster(**spec: Any) -> ClusterSpec:
    return parse("pipeline", "team-a", spec)


def one_group(group: dict[str, Any] | None = None, **spec: Any) -> ClusterSpec:
    return cluster(workerGroups=[{"name": "gpu", **(group or {})}], **spec)


def pod_of(group: dict[str, Any] | None = None, index: int = 0, **spec: Any) -> dict[str, Any]:
    parsed = one_group(group, **spec)
    return worker_pod(parsed, parsed.groups[0], index, OWNER)


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def env_names(c: dict[str, Any]) -> list[str]:
    return [e["name"] for e in c.get("env", [])]


def all_children(spec: ClusterSpec) -> list[dict[str, Any]]:
    children = [
        token_secret(spec, OWNER, "s3cret"),
        scheduler_deployment(spec, OWNER),
        scheduler_service(spec, OWNER),
    ]
    children += [worker_pod(spec, g, i, OWNER) for g in spec.groups for i in range(2)]
    return children


SPECS = {
    "defaults": cluster(),
    "gpu-group": one_group({"resources": {"GPU": 2}, "replicas": 2}),
    "no-auth": one_group({"resources": {"process": 1}}, auth={"enabled": False}),
    "two-groups": cluster(workerGroups=[{"name": "gpu", "resources": {"GPU": 1}}, {"name": "cpu"}]),
}


# --------------------------------------------------------------------------- ownership, labels


def test_owner_reference_makes_the_resource_cluster_the_controller() -> None:
    assert owner_reference(OWNER) == {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "ResourceCluster",
        "name": "pipeline",
        "uid": "1234-abcd",
        "controller": True,
        "blockOwnerDeletion": True,
    }


@pytest.mark.parametrize(
    ("component", "group", "extra"),
    [
        ("scheduler", None, {}),
        ("worker", "gpu", {LABEL_GROUP: "gpu"}),
        ("auth", None, {}),
    ],
)
def test_labels_name_app_instance_component_manager_and_cluster(
    component: str, group: str | None, extra: dict[str, str]
) -> None:
    assert labels(cluster(), component, group) == {
        "app.kubernetes.io/name": "apportion",
        "app.kubernetes.io/instance": "pipeline",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "apportion-operator",
        LABEL_CLUSTER: "pipeline",
        **extra,
    }


@pytest.mark.parametrize("spec", list(SPECS.values()), ids=list(SPECS))
def test_every_child_is_owned_labelled_and_namespaced(spec: ClusterSpec) -> None:
    for child in all_children(spec):
        meta = child["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [owner_reference(OWNER)]
        for key in ("name", "instance", "component", "managed-by"):
            assert f"app.kubernetes.io/{key}" in meta["labels"]
        assert meta["labels"]["app.kubernetes.io/instance"] == "pipeline"
        assert meta["labels"][LABEL_CLUSTER] == "pipeline"


def test_worker_pods_carry_their_group_label() -> None:
    spec = SPECS["two-groups"]
    for group in spec.groups:
        pod = worker_pod(spec, group, 0, OWNER)
        assert pod["metadata"]["labels"][LABEL_GROUP] == group.name
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"


def test_the_scheduler_pod_template_carries_the_labels_its_deployment_selects() -> None:
    deployment = scheduler_deployment(cluster(), OWNER)
    selected = deployment["spec"]["selector"]["matchLabels"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selected.items() <= pod_labels.items()


def test_the_service_selects_the_scheduler_pods() -> None:
    spec = cluster()
    pod_labels = scheduler_deployment(spec, OWNER)["spec"]["template"]["metadata"]["labels"]
    assert scheduler_service(spec, OWNER)["spec"]["selector"].items() <= pod_labels.items()


# --------------------------------------------------------------------------- Secret


def test_token_secret_holds_the_token_under_the_token_key() -> None:
    secret = token_secret(cluster(), OWNER, "s3cret")
    assert (secret["apiVersion"], secret["kind"], secret["type"]) == ("v1", "Secret", "Opaque")
    assert secret["metadata"]["name"] == "pipeline-token" == secret_name(cluster())
    assert secret["stringData"] == {"token": "s3cret"}
    assert secret["metadata"]["labels"]["app.kubernetes.io/component"] == "auth"


# --------------------------------------------------------------------------- scheduler


def test_scheduler_deployment_runs_one_explicit_apportion_scheduler() -> None:
    deployment = scheduler_deployment(cluster(image="img:7", imagePullPolicy="Always"), OWNER)
    assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
    assert deployment["metadata"]["name"] == "pipeline-scheduler"
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    c = container(deployment["spec"]["template"], "scheduler")
    assert c["command"] == ["apportion"]
    assert c["args"][0] == "scheduler"
    assert (c["image"], c["imagePullPolicy"]) == ("img:7", "Always")


@pytest.mark.parametrize(
    ("auth", "token_env", "no_auth_flag"), [(True, True, False), (False, False, True)]
)
def test_scheduler_auth_follows_the_spec(auth: bool, token_env: bool, no_auth_flag: bool) -> None:
    deployment = scheduler_deployment(cluster(auth={"enabled": auth}), OWNER)
    c = container(deployment["spec"]["template"], "scheduler")
    assert ("APPORTION_TOKEN" in env_names(c)) is token_env
    assert ("--no-auth" in c["args"]) is no_auth_flag
    if token_env:
        token = next(e for e in c["env"] if e["name"] == "APPORTION_TOKEN")
        assert token["valueFrom"]["secretKeyRef"] == {"name": "pipeline-token", "key": "token"}


@pytest.mark.parametrize(("port", "http_port"), [(8786, 8787), (9000, 9100), (1, 65535)])
def test_scheduler_ports_probe_and_service_agree(port: int, http_port: int) -> None:
    spec = cluster(scheduler={"port": port, "httpPort": http_port})
    c = container(scheduler_deployment(spec, OWNER)["spec"]["template"], "scheduler")
    args = c["args"]
    assert args[args.index("--port") + 1] == str(port)
    assert args[args.index("--http-port") + 1] == str(http_port)
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert {p["containerPort"] for p in c["ports"]} == {port, http_port}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": http_port}
    assert c["readinessProbe"]["timeoutSeconds"] >= 5  # the default 1 s fails on busy nodes
    service = scheduler_service(spec, OWNER)
    assert service["metadata"]["name"] == "pipeline-scheduler"
    ports = service["spec"]["ports"]
    assert {p["port"] for p in ports} == {port, http_port}
    assert all(p["port"] == p["targetPort"] for p in ports)
    assert {p["name"] for p in ports} == {p["name"] for p in c["ports"]}


@pytest.mark.parametrize("service_type", ["ClusterIP", "NodePort", "LoadBalancer"])
def test_service_type_follows_the_spec(service_type: str) -> None:
    service = scheduler_service(cluster(scheduler={"serviceType": service_type}), OWNER)
    assert service["spec"]["type"] == service_type


def test_scheduler_advertises_its_pod_ip_as_contact_host() -> None:
    c = container(scheduler_deployment(cluster(), OWNER)["spec"]["template"], "scheduler")
    contact = next(e for e in c["env"] if e["name"] == "APPORTION_CONTACT_HOST")
    assert contact["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


@pytest.mark.parametrize("auth", [True, False])
def test_the_scheduler_command_parses_with_the_real_cli(auth: bool) -> None:
    c = container(
        scheduler_deployment(cluster(auth={"enabled": auth}), OWNER)["spec"]["template"],
        "scheduler",
    )
    assert c["command"] == ["apportion"]
    command = cli.commands[c["args"][0]]
    ctx = command.make_context("scheduler", list(c["args"][1:]))
    assert ctx.params["port"] == 8786
    assert ctx.params["http_port"] == 8787
    assert ctx.params["no_auth"] is not auth


def test_scheduler_template_extras_stay_and_our_essentials_win() -> None:
    template = {
        "metadata": {
            "labels": {"team": "ml", "app.kubernetes.io/component": "mine"},
            "annotations": {"prometheus.io/scrape": "true"},
        },
        "spec": {
            "nodeSelector": {"pool": "system"},
            "containers": [
                {
                    "name": "scheduler",
                    "image": "evil:1",
                    "command": ["sh"],
                    "resources": {"requests": {"cpu": "2"}},
                }
            ],
        },
    }
    deployment = scheduler_deployment(cluster(scheduler={"template": template}), OWNER)
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "scheduler"
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    assert pod["spec"]["nodeSelector"] == {"pool": "system"}
    c = container(pod, "scheduler")
    assert c["image"] == "apportion:0.1.0"
    assert c["command"] == ["apportion"]
    # Their request stays; our defaults fill in what the template does not say.
    assert c["resources"] == {
        "requests": {"cpu": "2", "memory": "256Mi", "ephemeral-storage": "256Mi"},
        "limits": {"memory": "2Gi", "ephemeral-storage": "1Gi"},
    }
    # The Deployment's own metadata does not take the template's labels.
    assert "team" not in deployment["metadata"]["labels"]


# --------------------------------------------------------------------------- worker pods


def test_worker_pod_names_are_cluster_group_index() -> None:
    spec = SPECS["gpu-group"]
    assert worker_pod_name(spec, spec.groups[0], 3) == "pipeline-gpu-3"
    pod = worker_pod(spec, spec.groups[0], 3, OWNER)
    assert (pod["apiVersion"], pod["kind"], pod["metadata"]["name"]) == (
        "v1",
        "Pod",
        "pipeline-gpu-3",
    )
    assert pod["spec"]["restartPolicy"] == "Always"


def test_a_pod_name_held_by_another_cluster_is_skipped_not_lost() -> None:
    # Cluster "c" group "y-x" and cluster "c-y" group "x" would both pick "c-y-x-0".
    from apportion.operator.plan import plan

    a = parse("c", "ns", {"workerGroups": [{"name": "y-x", "replicas": 2}]})
    b = parse("c-y", "ns", {"workerGroups": [{"name": "x"}]})
    held_by_b = worker_pod_name(b, b.groups[0], 0)
    assert held_by_b == worker_pod_name(a, a.groups[0], 0)
    todo = plan(a, [], set(), taken={held_by_b})
    names = [worker_pod_name(a, a.groups[0], i) for _, i in todo.create]
    assert held_by_b not in names and len(names) == 2


def test_worker_command_is_an_explicit_apportion_worker_dialling_the_service() -> None:
    spec = SPECS["gpu-group"]
    command = worker_command(spec, spec.groups[0])
    assert command[:3] == ["apportion", "worker", "tcp://pipeline-scheduler.team-a.svc:8786"]
    c = container(worker_pod(spec, spec.groups[0], 0, OWNER), "worker")
    assert c["command"] + c["args"] == command
    assert c["command"] == ["apportion"]


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ({"resources": {"GPU": 2}}, {"GPU": 2}),
        ({"resources": {"MEMORY": 100e9}}, {"MEMORY": 100e9}),
        (
            {"resources": {"GPU": 1, "process": 1, "license": 0.5}},
            {"GPU": 1, "process": 1, "license": 0.5},
        ),
        (
            {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "worker",
                                "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "16Gi"}},
                            }
                        ]
                    }
                }
            },
            {"GPU": 1, "MEMORY": 16 * GI},
        ),
        ({"resources": {"example.com/foo": 3}}, {"example.com/foo": 3}),
        ({"resources": {"MEMORY": 1e20}}, {"MEMORY": 1e20}),
    ],
)
def test_worker_resources_flag_parses_back_to_the_advertised_amounts(
    group: dict[str, Any], expected: dict[str, float]
) -> None:
    spec = one_group(group)
    command = worker_command(spec, spec.groups[0])
    flag = command[command.index("--resources") + 1]
    assert parse_spec(flag) == expected
    assert parse_spec(flag) == spec.groups[0].advertised


def test_a_worker_with_nothing_advertised_gets_no_resources_flag() -> None:
    spec = one_group()
    assert "--resources" not in worker_command(spec, spec.groups[0])


@pytest.mark.parametrize("nthreads", [1, 4, 64])
def test_worker_threads_follow_the_group(nthreads: int) -> None:
    spec = one_group({"nthreads": nthreads})
    command = worker_command(spec, spec.groups[0])
    assert command[command.index("--nthreads") + 1] == str(nthreads)


@pytest.mark.parametrize(
    "group",
    [{}, {"resources": {"GPU": 2, "process": 1}, "nthreads": 3}, {"resources": {"MEMORY": 1e9}}],
)
@pytest.mark.parametrize("auth", [True, False])
def test_the_worker_command_parses_with_the_real_cli(group: dict[str, Any], auth: bool) -> None:
    spec = one_group(group, auth={"enabled": auth})
    command = worker_command(spec, spec.groups[0])
    assert command[0] == "apportion"
    assert command[1] in cli.commands
    ctx = cli.commands[command[1]].make_context("worker", command[2:])
    assert ctx.params["scheduler_address"] == spec.scheduler_address
    assert ctx.params["name"] == "$(POD_NAME)"
    assert ctx.params["contact_host"] == "$(POD_IP)"
    assert ctx.params["nthreads"] == spec.groups[0].nthreads
    assert parse_spec(ctx.params["resources"]) == spec.groups[0].advertised
    assert ctx.params["no_auth"] is not auth


def test_the_variables_the_worker_command_uses_are_defined_in_its_env() -> None:
    c = container(pod_of({"resources": {"GPU": 1}}), "worker")
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert "$(POD_NAME)" in c["args"] and "$(POD_IP)" in c["args"]


def test_the_worker_readiness_probe_is_the_workers_own_endpoint() -> None:
    c = container(pod_of({"resources": {"GPU": 1}}), "worker")
    probe = c["readinessProbe"]
    assert probe["httpGet"] == {"path": "/ready", "port": "readiness"}  # no process per check
    (port,) = [p for p in c["ports"] if p["name"] == "readiness"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    # The worker serves it on its contact host, the pod's IP (--contact-host $(POD_IP)).
    assert env["APPORTION_WORKER__READINESS_PORT"] == str(port["containerPort"])
    assert c["args"][c["args"].index("--contact-host") + 1] == "$(POD_IP)"
    assert probe["timeoutSeconds"] >= 5


@pytest.mark.parametrize(
    ("auth", "token_env", "no_auth_flag"), [(True, True, False), (False, False, True)]
)
def test_worker_auth_follows_the_spec(auth: bool, token_env: bool, no_auth_flag: bool) -> None:
    c = container(pod_of(auth={"enabled": auth}), "worker")
    assert ("APPORTION_TOKEN" in env_names(c)) is token_env
    assert ("--no-auth" in c["args"]) is no_auth_flag
    if token_env:
        token = next(e for e in c["env"] if e["name"] == "APPORTION_TOKEN")
        assert token["valueFrom"]["secretKeyRef"] == {"name": "pipeline-token", "key": "token"}


@pytest.mark.parametrize(
    ("resources", "limits"),
    [
        ({"GPU": 2}, {"nvidia.com/gpu": "2"}),
        ({"GPU": 1.0}, {"nvidia.com/gpu": "1"}),
        ({"MEMORY": 100e9}, {"memory": "100000000000"}),
        ({"GPU": 4, "MEMORY": 16 * GI}, {"nvidia.com/gpu": "4", "memory": "17179869184"}),
    ],
)
def test_mapped_resources_are_both_requests_and_limits(
    resources: dict[str, float], limits: dict[str, str]
) -> None:
    c = container(pod_of({"resources": resources}), "worker")
    assert c["resources"]["limits"] == limits
    assert {k: c["resources"]["requests"][k] for k in limits} == limits
    for amount in c["resources"]["limits"].values():
        assert isinstance(amount, str)


def test_gpu_amounts_are_integer_strings_in_requests_and_limits() -> None:
    c = container(pod_of({"resources": {"GPU": 2.0}}), "worker")
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_unmapped_resources_set_only_the_default_requests() -> None:
    c = container(pod_of({"resources": {"process": 1, "license": 2}, "nthreads": 3}), "worker")
    assert c["resources"] == {"requests": {"cpu": "3", **WORKER_REQUESTS}}


def test_worker_pod_carries_the_group_hash_annotation() -> None:
    spec = SPECS["gpu-group"]
    pod = worker_pod(spec, spec.groups[0], 0, OWNER)
    assert pod["metadata"]["annotations"][HASH_ANNOTATION] == group_hash(spec, spec.groups[0])


FULL_TEMPLATE = {
    "metadata": {
        "labels": {"team": "ml", LABEL_GROUP: "other", "app.kubernetes.io/managed-by": "me"},
        "annotations": {"note": "keep", HASH_ANNOTATION: "forged"},
    },
    "spec": {
        "nodeSelector": {"accelerator": "a100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "high",
        "restartPolicy": "Never",
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "containers": [
            {"name": "log-shipper", "image": "fluent-bit:2"},
            {
                "name": "worker",
                "image": "someone-else:1",
                "imagePullPolicy": "Never",
                "command": ["sleep"],
                "args": ["infinity"],
                "workingDir": "/data",
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                "env": [
                    {"name": "EXTRA", "value": "1"},
                    {"name": "POD_NAME", "value": "forged"},
                    {"name": "APPORTION_TOKEN", "value": "forged"},
                ],
                "resources": {
                    "requests": {"cpu": "2", "nvidia.com/gpu": "9"},
                    "limits": {"cpu": "4", "nvidia.com/gpu": "2"},
                },
            },
        ],
    },
}


@pytest.fixture
def merged_pod() -> dict[str, Any]:
    spec = one_group({"resources": {"GPU": 2}, "template": copy.deepcopy(FULL_TEMPLATE)})
    return worker_pod(spec, spec.groups[0], 0, OWNER)


def test_template_labels_and_annotations_stay_but_ours_win(merged_pod: dict[str, Any]) -> None:
    meta = merged_pod["metadata"]
    assert meta["labels"]["team"] == "ml"
    assert meta["labels"][LABEL_GROUP] == "gpu"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "apportion-operator"
    assert meta["annotations"]["note"] == "keep"
    assert meta["annotations"][HASH_ANNOTATION] != "forged"
    assert meta["name"] == "pipeline-gpu-0"


def test_template_pod_spec_fields_stay(merged_pod: dict[str, Any]) -> None:
    spec = merged_pod["spec"]
    assert spec["nodeSelector"] == {"accelerator": "a100"}
    assert spec["tolerations"] == FULL_TEMPLATE["spec"]["tolerations"]
    assert spec["priorityClassName"] == "high"
    assert spec["volumes"] == [{"name": "scratch", "emptyDir": {}}, TMP_VOLUME]
    assert spec["restartPolicy"] == "Always"


def test_the_worker_container_comes_first_and_sidecars_stay(merged_pod: dict[str, Any]) -> None:
    names = [c["name"] for c in merged_pod["spec"]["containers"]]
    assert names == ["worker", "log-shipper"]
    assert container(merged_pod, "log-shipper") == {"name": "log-shipper", "image": "fluent-bit:2"}


def test_our_command_image_and_essential_env_win(merged_pod: dict[str, Any]) -> None:
    c = container(merged_pod, "worker")
    assert c["image"] == "apportion:0.1.0"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == ["apportion"]
    assert c["args"][0] == "worker"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["APPORTION_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "pipeline-token"
    assert env["EXTRA"] == {"name": "EXTRA", "value": "1"}
    assert len(env) == len(c["env"])  # no duplicates


def test_other_container_fields_of_the_template_stay(merged_pod: dict[str, Any]) -> None:
    c = container(merged_pod, "worker")
    assert c["workingDir"] == "/data"
    assert c["volumeMounts"] == [{"name": "scratch", "mountPath": "/scratch"}, TMP_MOUNT]


def test_our_resources_win_and_other_resources_stay(merged_pod: dict[str, Any]) -> None:
    c = container(merged_pod, "worker")
    assert c["resources"] == {
        "requests": {"cpu": "2", "nvidia.com/gpu": "2", **WORKER_REQUESTS},
        "limits": {"cpu": "4", "nvidia.com/gpu": "2"},
    }


def test_a_reverse_mapped_template_limit_stays_in_the_pod() -> None:
    template = {
        "spec": {
            "containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }
    c = container(pod_of({"template": template}), "worker")
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "GPU=1" in c["args"][c["args"].index("--resources") + 1]


def test_a_single_unnamed_template_container_becomes_the_worker() -> None:
    template = {"spec": {"containers": [{"name": "main", "workingDir": "/w"}]}}
    pod = pod_of({"template": template})
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker"]
    assert pod["spec"]["containers"][0]["workingDir"] == "/w"


def test_building_a_pod_does_not_mutate_the_spec_template() -> None:
    spec = one_group({"resources": {"GPU": 2}, "template": copy.deepcopy(FULL_TEMPLATE)})
    before = copy.deepcopy(spec.groups[0].template)
    worker_pod(spec, spec.groups[0], 0, OWNER)
    worker_pod(spec, spec.groups[0], 1, OWNER)
    assert spec.groups[0].template == before


def test_manifests_are_deterministic() -> None:
    spec = one_group({"resources": {"GPU": 2}, "template": copy.deepcopy(FULL_TEMPLATE)})
    assert all_children(spec) == all_children(spec)


# --------------------------------------------------------------------------- group hash


BASE = {"image": "img:1", "workerGroups": [{"name": "gpu", "resources": {"GPU": 1}}]}


def _hash(spec_dict: dict[str, Any], name: str = "pipeline", namespace: str = "team-a") -> str:
    spec = parse(name, namespace, spec_dict)
    return group_hash(spec, spec.groups[0])


def _with(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    target: Any = spec
    *parents, last = path.split(".")
    for key in parents:
        target = target[int(key)] if key.isdigit() else target.setdefault(key, {})
    target[last] = value
    return spec


@pytest.mark.parametrize(
    "changed",
    [
        _with("image", "img:2"),
        _with("imagePullPolicy", "Always"),
        _with("auth", {"enabled": False}),
        _with("scheduler.port", 9999),
        _with("workerGroups.0.nthreads", 2),
        _with("workerGroups.0.resources", {"GPU": 2}),
        _with("workerGroups.0.resources", {"GPU": 1, "process": 1}),
        _with("resourceMap", {"GPU": "amd.com/gpu"}),
        _with("workerGroups.0.template", {"spec": {"nodeSelector": {"a": "b"}}}),
    ],
    ids=[
        "image",
        "pull-policy",
        "auth",
        "scheduler-port",
        "nthreads",
        "amount",
        "new-resource",
        "resource-map",
        "template",
    ],
)
def test_group_hash_changes_when_the_pods_must_be_replaced(changed: dict[str, Any]) -> None:
    assert _hash(changed) != _hash(BASE)


@pytest.mark.parametrize(
    "same",
    [
        _with("workerGroups.0.replicas", 5),
        _with("scheduler.httpPort", 9999),
        _with("scheduler.serviceType", "NodePort"),
        _with("scheduler.template", {"metadata": {"labels": {"a": "b"}}}),
    ],
    ids=["replicas", "http-port", "service-type", "scheduler-template"],
)
def test_group_hash_ignores_what_does_not_touch_worker_pods(same: dict[str, Any]) -> None:
    assert _hash(same) == _hash(BASE)


def test_group_hash_changes_with_the_namespace_the_workers_dial() -> None:
    assert _hash(BASE, namespace="other") != _hash(BASE)


def test_group_hash_is_short_hex_and_stable() -> None:
    value = _hash(BASE)
    assert len(value) == 16
    int(value, 16)
    assert value == _hash(copy.deepcopy(BASE))


def test_group_hash_does_not_depend_on_key_order() -> None:
    a = _with("workerGroups.0.resources", {"GPU": 1, "process": 1})
    b = _with("workerGroups.0.resources", {"process": 1, "GPU": 1})
    assert _hash(a) == _hash(b)


# ----- production defaults: a template's own values win ------------------------------------


def test_every_pod_runs_hardened_by_default() -> None:
    spec = SPECS["gpu-group"]
    scheduler_pod = scheduler_deployment(spec, OWNER)["spec"]["template"]
    for pod, name in ((scheduler_pod, "scheduler"), (pod_of(), "worker")):
        assert pod["spec"]["securityContext"] == POD_SECURITY
        c = container(pod, name)
        assert c["securityContext"] == CONTAINER_SECURITY
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert TMP_MOUNT in c["volumeMounts"] and TMP_VOLUME in pod["spec"]["volumes"]


def test_the_scheduler_has_requests_a_memory_limit_and_a_liveness_probe() -> None:
    c = container(scheduler_deployment(SPECS["gpu-group"], OWNER)["spec"]["template"], "scheduler")
    assert set(c["resources"]["requests"]) == {"cpu", "memory", "ephemeral-storage"}
    assert set(c["resources"]["limits"]) == {"memory", "ephemeral-storage"}  # no CPU throttling
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["livenessProbe"]["periodSeconds"] * c["livenessProbe"]["failureThreshold"] >= 60


def test_template_values_win_over_the_defaults_field_by_field() -> None:
    template = {
        "spec": {
            "securityContext": {"runAsUser": 20000},
            "containers": [
                {
                    "name": "worker",
                    "securityContext": {"readOnlyRootFilesystem": False},
                    "resources": {"limits": {"memory": "256Mi", "cpu": "500m"}},
                }
            ],
        }
    }
    pod = pod_of({"template": template, "nthreads": 2})
    assert pod["spec"]["securityContext"] == {**POD_SECURITY, "runAsUser": 20000}
    c = container(pod, "worker")
    assert c["securityContext"] == {**CONTAINER_SECURITY, "readOnlyRootFilesystem": False}
    # No default request above a limit the template sets (the API server would refuse it).
    assert c["resources"] == {
        "requests": {"ephemeral-storage": "256Mi"},
        "limits": {"memory": "256Mi", "cpu": "500m"},
    }


def test_a_template_liveness_probe_replaces_the_default() -> None:
    probe = {"exec": {"command": ["true"]}, "periodSeconds": 30}
    template = {"spec": {"containers": [{"name": "scheduler", "livenessProbe": probe}]}}
    spec = one_group(None, scheduler={"template": template})
    c = container(scheduler_deployment(spec, OWNER)["spec"]["template"], "scheduler")
    assert c["livenessProbe"] == probe


def test_the_operators_priority_class_is_a_default_a_template_overrides() -> None:
    defaults = Defaults(priority_class_name="apportion-high")
    plain = parse("c", "ns", {"workerGroups": [{"name": "cpu"}]}, defaults)
    assert worker_pod(plain, plain.groups[0], 0, OWNER)["spec"]["priorityClassName"] == (
        "apportion-high"
    )
    scheduler = scheduler_deployment(plain, OWNER)["spec"]["template"]["spec"]
    assert scheduler["priorityClassName"] == "apportion-high"
    template = {"spec": {"priorityClassName": "batch"}}
    own = parse("c", "ns", {"workerGroups": [{"name": "cpu", "template": template}]}, defaults)
    assert worker_pod(own, own.groups[0], 0, OWNER)["spec"]["priorityClassName"] == "batch"
    # A default is not part of what a pod was built from: changing it replaces no pod.
    assert group_hash(plain, plain.groups[0]) == group_hash(
        parse("c", "ns", {"workerGroups": [{"name": "cpu"}]}), plain.groups[0]
    )
