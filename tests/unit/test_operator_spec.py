"""apportion.operator.spec: parsing a ResourceCluster spec, resource mapping, quantities.

Pure functions only: no cluster, no network.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from apportion.operator.manifests import labels, scheduler_service
from apportion.operator.spec import (
    DEFAULT_IMAGE,
    DEFAULT_RESOURCE_MAP,
    ClusterSpec,
    Defaults,
    InvalidSpec,
    format_quantity,
    parse,
    parse_quantity,
    pinned_defaults,
)

GI = 2**30


def worker_template(limits: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    """A group template whose ``worker`` container carries ``limits``."""
    body: dict[str, Any] = {"name": "worker", **container}
    if limits is not None:
        body["resources"] = {"limits": limits}
    return {"spec": {"containers": [body]}}


def one_group(**group: Any) -> dict[str, Any]:
    return {"workerGroups": [{"name": "g", **group}]}


def parse_group(**group: Any):  # type: ignore[no-untyped-def]
    return parse("c", "ns", one_group(**group)).groups[0]


# --------------------------------------------------------------------------- quantities


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100Gi", 100 * GI),
        ("16Gi", 16 * GI),
        ("1Ki", 1024.0),
        ("2Mi", 2 * 2**20),
        ("1Ti", 2.0**40),
        ("1Pi", 2.0**50),
        ("1Ei", 2.0**60),
        ("0.5Gi", GI / 2),
        ("500m", 0.5),
        ("250m", 0.25),
        ("100n", 1e-7),
        ("3u", 3e-6),
        ("1k", 1000.0),
        ("2M", 2e6),
        ("100G", 100e9),
        ("1T", 1e12),
        ("1P", 1e15),
        ("2E", 2e18),
        ("1.5", 1.5),
        ("1", 1.0),
        ("0", 0.0),
        ("1e3", 1000.0),
        ("1E3", 1000.0),
        ("1e-3", 0.001),
        ("+5", 5.0),
        (" 3 ", 3.0),
        (2, 2.0),
        (1.5, 1.5),
        (100e9, 100e9),
    ],
)
def test_parse_quantity_reads_kubernetes_quantities(text: Any, expected: float) -> None:
    assert parse_quantity(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("text", ["", "abc", "Gi", "m", "1K", "1Gb", "1.2.3", "GPU"])
def test_parse_quantity_rejects_what_is_not_a_quantity(text: str) -> None:
    with pytest.raises(InvalidSpec, match="not a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["NaN", "inf", "Infinity"])
def test_parse_quantity_rejects_non_finite_numbers(text: str) -> None:
    with pytest.raises(InvalidSpec):
        parse_quantity(text)


def test_parse_quantity_rejects_an_exponent_with_a_suffix() -> None:
    with pytest.raises(InvalidSpec):
        parse_quantity("1e3Gi")


@pytest.mark.parametrize(
    ("amount", "expected"),
    [
        (2.0, "2"),
        (2, "2"),
        (0.0, "0"),
        (100e9, "100000000000"),
        (17179869184.0, "17179869184"),
        (1e20, "100000000000000000000"),
        (0.5, "0.5"),
        (1.25, "1.25"),
    ],
)
def test_format_quantity_keeps_whole_numbers_exact(amount: float, expected: str) -> None:
    assert format_quantity(amount) == expected


@pytest.mark.parametrize("amount", [1.0, 2.0, 0.5, 0.25, 1e-7, 123456.789, 100e9, 2.0**40])
def test_format_quantity_round_trips_through_parse_quantity(amount: float) -> None:
    assert parse_quantity(format_quantity(amount)) == amount


# --------------------------------------------------------------------------- defaults


def test_parse_of_an_empty_spec_gives_defaults() -> None:
    spec = parse("pipeline", "team-a", {})
    assert spec == ClusterSpec(
        name="pipeline",
        namespace="team-a",
        image=DEFAULT_IMAGE,
        image_pull_policy="IfNotPresent",
        auth=True,
        port=8786,
        http_port=8787,
        service_type="ClusterIP",
        scheduler_template={},
        resource_map=dict(DEFAULT_RESOURCE_MAP),
        groups=[],
    )


def test_default_resource_map_sends_gpu_and_memory_to_kubernetes_names() -> None:
    assert DEFAULT_RESOURCE_MAP == {"GPU": "nvidia.com/gpu", "MEMORY": "memory"}


def test_parse_uses_the_operators_default_image_when_the_spec_names_none() -> None:
    assert parse("c", "ns", {}, default_image="reg/apportion:dev").image == "reg/apportion:dev"
    assert parse("c", "ns", {"image": "x:1"}, default_image="reg/apportion:dev").image == "x:1"


def test_parse_reads_every_top_level_field() -> None:
    spec = parse(
        "c",
        "ns",
        {
            "image": "img:2",
            "imagePullPolicy": "Always",
            "auth": {"enabled": False},
            "scheduler": {
                "port": 9000,
                "httpPort": 9001,
                "serviceType": "NodePort",
                "template": {"metadata": {"labels": {"a": "b"}}},
            },
        },
    )
    assert (spec.image, spec.image_pull_policy, spec.auth) == ("img:2", "Always", False)
    assert (spec.port, spec.http_port, spec.service_type) == (9000, 9001, "NodePort")
    assert spec.scheduler_template == {"metadata": {"labels": {"a": "b"}}}


def test_scheduler_service_and_address_follow_name_namespace_and_port() -> None:
    spec = parse("pipeline", "team-a", {"scheduler": {"port": 9000}})
    assert spec.scheduler_service == "pipeline-scheduler"
    assert spec.scheduler_address == "tcp://pipeline-scheduler.team-a.svc:9000"


def test_group_defaults_are_one_replica_one_thread_nothing_advertised() -> None:
    group = parse_group()
    assert (group.name, group.replicas, group.nthreads) == ("g", 1, 1)
    assert group.advertised == {}
    assert group.limits == {}
    assert group.template == {}


def test_groups_keep_their_order_and_are_found_by_name() -> None:
    spec = parse(
        "c",
        "ns",
        {"workerGroups": [{"name": "b", "replicas": 3, "nthreads": 4}, {"name": "a"}]},
    )
    assert [g.name for g in spec.groups] == ["b", "a"]
    assert spec.group("b") is spec.groups[0]
    assert (spec.groups[0].replicas, spec.groups[0].nthreads) == (3, 4)
    assert spec.group("missing") is None


def test_zero_replicas_is_a_valid_group() -> None:
    assert parse_group(replicas=0).replicas == 0


# --------------------------------------------------------------------------- resource mapping


@pytest.mark.parametrize(
    ("resources", "advertised", "limits"),
    [
        ({"GPU": 2}, {"GPU": 2.0}, {"nvidia.com/gpu": "2"}),
        ({"MEMORY": 100e9}, {"MEMORY": 100e9}, {"memory": "100000000000"}),
        (
            {"GPU": 1, "MEMORY": 16 * GI},
            {"GPU": 1.0, "MEMORY": 16.0 * GI},
            {"nvidia.com/gpu": "1", "memory": "17179869184"},
        ),
        ({"process": 1}, {"process": 1.0}, {}),
        ({"license": 0.5}, {"license": 0.5}, {}),
        ({"GPU": 4, "process": 1}, {"GPU": 4.0, "process": 1.0}, {"nvidia.com/gpu": "4"}),
        # An unmapped name that looks like a Kubernetes name is still only advertised.
        ({"example.com/foo": 0.5}, {"example.com/foo": 0.5}, {}),
    ],
)
def test_mapped_resources_become_limits_unmapped_ones_are_only_advertised(
    resources: dict[str, float], advertised: dict[str, float], limits: dict[str, str]
) -> None:
    group = parse_group(resources=resources)
    assert group.advertised == advertised
    assert group.limits == limits


def test_gpu_limits_are_integer_strings() -> None:
    group = parse_group(resources={"GPU": 2.0})
    assert group.limits["nvidia.com/gpu"] == "2"


def test_resource_map_extends_the_defaults() -> None:
    spec = parse(
        "c",
        "ns",
        {
            "resourceMap": {"FPGA": "xilinx.com/fpga"},
            "workerGroups": [{"name": "g", "resources": {"FPGA": 1, "GPU": 1}}],
        },
    )
    assert spec.resource_map == {**DEFAULT_RESOURCE_MAP, "FPGA": "xilinx.com/fpga"}
    assert spec.groups[0].limits == {"xilinx.com/fpga": "1", "nvidia.com/gpu": "1"}


def test_resource_map_can_override_a_default_mapping() -> None:
    spec = parse(
        "c",
        "ns",
        {
            "resourceMap": {"GPU": "amd.com/gpu"},
            "workerGroups": [{"name": "g", "resources": {"GPU": 2}}],
        },
    )
    assert spec.groups[0].limits == {"amd.com/gpu": "2"}


@pytest.mark.parametrize(
    "k8s_name", ["", "has space", "UPPER.example.com/gpu", "-leading", "a/b/c", "trailing-"]
)
def test_invalid_kubernetes_names_in_the_resource_map_are_rejected(k8s_name: str) -> None:
    with pytest.raises(InvalidSpec, match="resourceMap has invalid Kubernetes resource names"):
        parse("c", "ns", {"resourceMap": {"X": k8s_name}})


@pytest.mark.parametrize("k8s_name", ["cpu", "memory", "nvidia.com/gpu", "example.com/foo_bar"])
def test_valid_kubernetes_names_in_the_resource_map_are_accepted(k8s_name: str) -> None:
    assert parse("c", "ns", {"resourceMap": {"X": k8s_name}}).resource_map["X"] == k8s_name


# --------------------------------------------------------------------------- reverse mapping


@pytest.mark.parametrize(
    ("limits", "advertised"),
    [
        ({"nvidia.com/gpu": 1}, {"GPU": 1.0}),
        ({"nvidia.com/gpu": "2"}, {"GPU": 2.0}),
        ({"memory": "16Gi"}, {"MEMORY": 17179869184.0}),
        ({"memory": "100G"}, {"MEMORY": 100e9}),
        ({"nvidia.com/gpu": "1", "memory": "1Gi"}, {"GPU": 1.0, "MEMORY": float(GI)}),
        # Limits that no abstract resource maps to are neither advertised nor rejected.
        ({"cpu": "2"}, {}),
        ({"example.com/foo": "3"}, {}),
    ],
)
def test_template_limits_with_no_declared_resource_are_advertised(
    limits: dict[str, Any], advertised: dict[str, float]
) -> None:
    group = parse_group(template=worker_template(limits))
    assert group.advertised == advertised
    # They are already in the template: the operator adds no limits of its own.
    assert group.limits == {}


def test_reverse_mapping_follows_a_custom_resource_map() -> None:
    spec = parse(
        "c",
        "ns",
        {
            "resourceMap": {"CPU": "cpu"},
            "workerGroups": [{"name": "g", "template": worker_template({"cpu": "500m"})}],
        },
    )
    assert spec.groups[0].advertised == {"CPU": 0.5}


def test_declared_and_template_limits_combine() -> None:
    group = parse_group(resources={"GPU": 1}, template=worker_template({"memory": "16Gi"}))
    assert group.advertised == {"GPU": 1.0, "MEMORY": 16.0 * GI}
    assert group.limits == {"nvidia.com/gpu": "1"}


def test_limits_are_read_from_the_container_named_worker() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": "sidecar", "resources": {"limits": {"memory": "1Gi"}}},
                {"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ]
        }
    }
    assert parse_group(template=template).advertised == {"GPU": 1.0}


def test_limits_are_read_from_the_first_container_when_none_is_named_worker() -> None:
    template = {
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"memory": "2Gi"}}}]}
    }
    assert parse_group(template=template).advertised == {"MEMORY": 2.0 * GI}


def test_requests_in_the_template_are_not_advertised() -> None:
    template = {
        "spec": {"containers": [{"name": "worker", "resources": {"requests": {"memory": "1Gi"}}}]}
    }
    assert parse_group(template=template).advertised == {}


@pytest.mark.parametrize(
    ("declared", "limit"),
    [
        ({"GPU": 2}, {"nvidia.com/gpu": "2"}),
        ({"GPU": 2}, {"nvidia.com/gpu": 2}),
        ({"MEMORY": 17179869184}, {"memory": "16Gi"}),
        ({"MEMORY": 100e9}, {"memory": "100G"}),
        ({"MEMORY": 100e9}, {"memory": "1e11"}),
    ],
)
def test_a_declared_amount_agreeing_with_the_template_limit_is_accepted(
    declared: dict[str, float], limit: dict[str, Any]
) -> None:
    group = parse_group(resources=declared, template=worker_template(limit))
    assert group.advertised == {k: float(v) for k, v in declared.items()}


@pytest.mark.parametrize(
    ("declared", "limit", "fragments"),
    [
        ({"GPU": 2}, {"nvidia.com/gpu": "1"}, ["GPU", "2", "nvidia.com/gpu=1"]),
        ({"GPU": 1}, {"nvidia.com/gpu": 4}, ["GPU", "1", "nvidia.com/gpu=4"]),
        ({"MEMORY": 100e9}, {"memory": "16Gi"}, ["MEMORY", "100e9", "memory=16Gi"]),
    ],
)
def test_a_declared_amount_contradicting_the_template_limit_is_rejected_clearly(
    declared: dict[str, float], limit: dict[str, Any], fragments: list[str]
) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse("c", "ns", one_group(resources=declared, template=worker_template(limit)))
    message = str(caught.value)
    assert "'g'" in message  # the group
    for fragment in fragments:  # both values
        assert fragment in message
    assert "make them agree, or drop one of them" in message  # what to do


def test_the_contradiction_message_names_the_declared_amount_once() -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse(
            "c",
            "ns",
            one_group(resources={"GPU": 2}, template=worker_template({"nvidia.com/gpu": "1"})),
        )
    assert "declares GPU=2 " in str(caught.value)
    assert "GPU=GPU" not in str(caught.value)


def test_contradictions_in_several_groups_are_all_reported() -> None:
    spec = {
        "workerGroups": [
            {
                "name": "one",
                "resources": {"GPU": 2},
                "template": worker_template({"nvidia.com/gpu": 1}),
            },
            {"name": "ok", "resources": {"GPU": 1}},
            {
                "name": "two",
                "resources": {"MEMORY": 1},
                "template": worker_template({"memory": "1Gi"}),
            },
        ]
    }
    with pytest.raises(InvalidSpec) as caught:
        parse("c", "ns", spec)
    assert "'one'" in str(caught.value)
    assert "'two'" in str(caught.value)
    assert "'ok'" not in str(caught.value)


@pytest.mark.parametrize(
    ("resource_map", "resources"),
    [
        ({}, {"GPU": 1.5}),
        ({}, {"GPU": 0.5}),
        ({"FPGA": "xilinx.com/fpga"}, {"FPGA": 0.5}),
    ],
)
def test_fractional_amounts_of_slash_named_kubernetes_resources_are_rejected(
    resource_map: dict[str, str], resources: dict[str, float]
) -> None:
    with pytest.raises(InvalidSpec, match="whole units") as caught:
        parse("c", "ns", {"resourceMap": resource_map, **one_group(resources=resources)})
    assert "'g'" in str(caught.value)


@pytest.mark.parametrize(
    ("resource_map", "resources", "limits"),
    [
        ({}, {"MEMORY": 1.5}, {"memory": "1.5"}),
        ({"CPU": "cpu"}, {"CPU": 0.5}, {"cpu": "0.5"}),
        ({}, {"process": 0.5}, {}),
    ],
)
def test_fractional_amounts_of_other_resources_are_accepted(
    resource_map: dict[str, str], resources: dict[str, float], limits: dict[str, str]
) -> None:
    spec = parse("c", "ns", {"resourceMap": resource_map, **one_group(resources=resources)})
    assert spec.groups[0].limits == limits


def test_repeated_group_names_are_rejected() -> None:
    with pytest.raises(InvalidSpec, match=r"unique; repeated: \['a'\]"):
        parse("c", "ns", {"workerGroups": [{"name": "a"}, {"name": "b"}, {"name": "a"}]})


def test_a_malformed_template_limit_is_rejected() -> None:
    with pytest.raises(InvalidSpec, match="not a Kubernetes quantity"):
        parse_group(template=worker_template({"memory": "lots"}))


@pytest.mark.parametrize("kind", ["limits", "requests"])
def test_a_malformed_scheduler_template_quantity_is_invalid_and_named(kind: str) -> None:
    template = {
        "spec": {"containers": [{"name": "scheduler", "resources": {kind: {"memory": "lots"}}}]}
    }
    with pytest.raises(
        InvalidSpec,
        match=rf"scheduler.template.spec.containers\[0\].resources.{kind}.memory: "
        "'lots' is not a Kubernetes quantity",
    ):
        parse("c", "ns", {"scheduler": {"template": template}, **one_group()})


def test_parse_does_not_mutate_its_input() -> None:
    raw = one_group(resources={"GPU": 2}, template=worker_template({"memory": "1Gi"}))
    before = repr(raw)
    parse("c", "ns", raw)
    assert repr(raw) == before


# --------------------------------------------------------------------------- names of children

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@pytest.mark.parametrize("name", ["a" * 54, "my.cluster", "b" * 64])
def test_a_name_children_cannot_carry_is_rejected_as_invalid(name: str) -> None:
    try:
        spec = parse(name, "ns", {})
    except InvalidSpec:
        return
    owner = {"metadata": {"name": name, "uid": "u"}}
    assert _DNS1035.match(scheduler_service(spec, owner)["metadata"]["name"])
    assert len(scheduler_service(spec, owner)["metadata"]["name"]) <= 63
    assert all(len(v) <= 63 and _LABEL_VALUE.match(v) for v in labels(spec, "scheduler").values())


# --------------------------------------------------------------------------- autoscaling bounds


@pytest.mark.parametrize(
    ("sizing", "replicas", "low", "high", "timeout", "autoscaled"),
    [
        ({}, 1, 1, 1, 60.0, False),
        ({"replicas": 3}, 3, 3, 3, 60.0, False),
        ({"replicas": 0}, 0, 0, 0, 60.0, False),
        ({"maxReplicas": 4}, 0, 0, 4, 60.0, True),  # minReplicas defaults to 0
        ({"minReplicas": 1, "maxReplicas": 4}, 1, 1, 4, 60.0, True),  # starts at the minimum
        ({"maxReplicas": 4, "idleTimeoutSeconds": 300}, 0, 0, 4, 300.0, True),
        ({"maxReplicas": 4, "idleTimeoutSeconds": 0}, 0, 0, 4, 0.0, True),
        ({"maxReplicas": 4, "idleTimeoutSeconds": 2.5}, 0, 0, 4, 2.5, True),
        # Equal bounds fix the size: not autoscaled.
        ({"minReplicas": 2, "maxReplicas": 2}, 2, 2, 2, 60.0, False),
        ({"minReplicas": 0, "maxReplicas": 0}, 0, 0, 0, 60.0, False),
    ],
)
def test_a_group_is_fixed_by_replicas_or_autoscaled_within_its_bounds(
    sizing: dict[str, Any], replicas: int, low: int, high: int, timeout: float, autoscaled: bool
) -> None:
    group = parse_group(**sizing)
    assert (group.replicas, group.min_replicas, group.max_replicas) == (replicas, low, high)
    assert group.idle_timeout == timeout
    assert group.autoscaled is autoscaled


@pytest.mark.parametrize(
    ("sizing", "message"),
    [
        (
            {"replicas": 2, "maxReplicas": 4},
            "group 'g' sets replicas and maxReplicas: replicas fixes the size, "
            "minReplicas/maxReplicas let the operator choose it; keep one of them",
        ),
        (
            {"replicas": 2, "minReplicas": 1, "maxReplicas": 4, "idleTimeoutSeconds": 5},
            "group 'g' sets replicas and minReplicas, maxReplicas, idleTimeoutSeconds: ",
        ),
        ({"replicas": 2, "idleTimeoutSeconds": 5}, "sets replicas and idleTimeoutSeconds: "),
        ({"minReplicas": 1}, "group 'g' sets minReplicas without maxReplicas"),
        ({"idleTimeoutSeconds": 30}, "group 'g' sets idleTimeoutSeconds without maxReplicas"),
        (
            {"minReplicas": 1, "idleTimeoutSeconds": 30},
            "group 'g' sets minReplicas, idleTimeoutSeconds without maxReplicas",
        ),
        (
            {"minReplicas": 5, "maxReplicas": 2},
            "group 'g': minReplicas=5 and maxReplicas=2 need 0 <= minReplicas <= maxReplicas",
        ),
        ({"minReplicas": -1, "maxReplicas": 2}, "minReplicas=-1 and maxReplicas=2 need"),
        ({"maxReplicas": -1}, "minReplicas=0 and maxReplicas=-1 need"),
        (
            {"maxReplicas": 3, "idleTimeoutSeconds": -1},
            "group 'g': idleTimeoutSeconds must be >= 0, not -1",
        ),
    ],
)
def test_contradictory_autoscaling_bounds_are_rejected_precisely(
    sizing: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse("c", "ns", one_group(**sizing))
    assert message in str(caught.value)


def test_bounds_problems_in_several_groups_are_all_reported() -> None:
    raw = {
        "workerGroups": [
            {"name": "a", "replicas": 1, "maxReplicas": 2},
            {"name": "ok", "maxReplicas": 2},
            {"name": "b", "minReplicas": 3, "maxReplicas": 1},
        ]
    }
    with pytest.raises(InvalidSpec) as caught:
        parse("c", "ns", raw)
    assert "'a'" in str(caught.value) and "'b'" in str(caught.value)
    assert "'ok'" not in str(caught.value)


def test_autoscaling_bounds_do_not_change_resources_or_limits() -> None:
    group = parse_group(minReplicas=0, maxReplicas=4, resources={"GPU": 2})
    assert (group.advertised, group.limits) == ({"GPU": 2.0}, {"nvidia.com/gpu": "2"})
    assert group == dataclasses.replace(
        parse_group(replicas=0, resources={"GPU": 2}), max_replicas=4
    )


# ----- what would crash the operator, refused with a reason --------------------------------


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"scheduler": {"port": 9000, "httpPort": 9000}}, "both 9000"),
        (
            {"workerGroups": [{"name": "g", "template": {"spec": {"containers": "oops"}}}]},
            "workerGroups[g].template.spec.containers must be a list",
        ),
        (
            {
                "workerGroups": [
                    {
                        "name": "g",
                        "template": {
                            "spec": {"containers": [{"name": "w", "env": [{"value": 1}]}]}
                        },
                    }
                ]
            },
            "env[0] has no name",
        ),
        ({"scheduler": {"template": "x"}}, "scheduler.template must be an object"),
        ({"scheduler": {"template": {"spec": ["x"]}}}, "scheduler.template.spec must be an object"),
    ],
)
def test_specs_that_would_break_the_children_are_invalid_with_a_reason(
    spec: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidSpec, match=re.escape(words)):
        parse("c", "ns", spec)


def test_the_operators_defaults_apply_where_the_spec_names_no_image() -> None:
    defaults = Defaults(image="reg/a:1", image_pull_policy="Always", image_pull_secrets=("cred",))
    spec = parse("c", "ns", {}, defaults)
    assert (spec.image, spec.image_pull_policy, spec.image_pull_secrets) == (
        "reg/a:1",
        "Always",
        ("cred",),
    )
    own = parse(
        "c",
        "ns",
        {"image": "mine:2", "imagePullPolicy": "Never", "imagePullSecrets": []},
        defaults,
    )
    assert (own.image, own.image_pull_policy, own.image_pull_secrets) == ("mine:2", "Never", ())


# --------------------------------------------------------------------------- image updates


def test_a_cluster_naming_no_image_keeps_the_one_it_runs() -> None:
    new_default = Defaults(image="apportion:0.2.0")
    kept = pinned_defaults({}, new_default, "apportion:0.1.0")
    assert parse("c", "ns", one_group(), kept).image == "apportion:0.1.0"
    # A new cluster (nothing runs yet) gets the new default at once.
    assert parse("c", "ns", one_group(), pinned_defaults({}, new_default, None)).image == (
        "apportion:0.2.0"
    )


def test_follow_operator_or_a_named_image_ignore_what_runs() -> None:
    new_default = Defaults(image="apportion:0.2.0")
    follow = {"imageUpdatePolicy": "FollowOperator"}
    assert pinned_defaults(follow, new_default, "apportion:0.1.0") == new_default
    named = {"image": "mine:1"}
    assert (
        parse("c", "ns", {**one_group(), **named}, pinned_defaults(named, new_default, "x")).image
        == "mine:1"
    )


def test_idle_timeout_suspend_and_policy_are_read() -> None:
    spec = parse(
        "c", "ns", {"idleTimeoutSeconds": 300, "idlePolicy": "scaleToZero", "suspend": True}
    )
    assert (spec.idle_timeout, spec.idle_policy, spec.suspend) == (300.0, "scaleToZero", True)
    plain = parse("c", "ns", {})
    assert (plain.idle_timeout, plain.idle_policy, plain.suspend) == (None, "delete", False)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"idlePolicy": "shrink"}, "idlePolicy must be one of delete, scaleToZero, not 'shrink'"),
        ({"idleTimeoutSeconds": 0}, "idleTimeoutSeconds must be > 0, not 0"),
        ({"idleTimeoutSeconds": "soon"}, "idleTimeoutSeconds must be a number of seconds"),
    ],
)
def test_bad_idle_settings_are_refused_saying_why(raw: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidSpec, match=re.escape(says)):
        parse("c", "ns", raw)
