"""spec.tenants of a ResourceCluster: checked, turned into the scheduler's tenant settings
(each tenant's token Secret mounted, scheduler.tenants.<name>.* pointing at it), and what
each tenant holds reported in the status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apportion.operator.manifests import TENANTS_PATH, scheduler_deployment
from apportion.operator.spec import InvalidSpec, parse
from apportion.operator.status import tenant_usage

OWNER = {
    "apiVersion": "apportion.dev/v1alpha1",
    "kind": "ResourceCluster",
    "metadata": {"name": "shared", "namespace": "gpus", "uid": "1234-abcd"},
}
TEAMS = [
    {"name": "vision", "secretName": "vision-token", "weight": 3, "quota": {"GPU": 2}},
    {"name": "nlp_team", "secretName": "nlp", "secretKey": "key"},
]


def scheduler_pod(tenants: list[dict[str, Any]]) -> dict[str, Any]:
    spec = parse("shared", "gpus", {"workerGroups": [{"name": "gpu"}], "tenants": tenants})
    return scheduler_deployment(spec, OWNER)["spec"]["template"]


def test_each_tenant_is_parsed_with_its_defaults() -> None:
    spec = parse("shared", "gpus", {"workerGroups": [{"name": "gpu"}], "tenants": TEAMS})
    vision, nlp = spec.tenants
    assert (vision.name, vision.secret_name, vision.secret_key) == (
        "vision",
        "vision-token",
        "token",
    )
    assert (vision.weight, vision.quota) == (3, (("GPU", 2.0),))
    assert (nlp.secret_key, nlp.weight, nlp.quota) == ("key", 1.0, ())


@pytest.mark.parametrize(
    ("tenants", "problem"),
    [
        ([{"name": "team-a", "secretName": "s"}], "must start with a letter"),
        ([{"name": "default", "secretName": "s"}], "'default' is the tenant of the cluster"),
        ([{"name": "a", "secretName": "s"}, {"name": "a", "secretName": "t"}], "twice"),
        ([{"name": "a"}], "needs secretName"),
        ([{"name": "a", "secretName": "s", "weight": 0}], "weight must be > 0"),
    ],
)
def test_a_wrong_tenant_is_refused_saying_what_is_wrong(
    tenants: list[dict[str, Any]], problem: str
) -> None:
    with pytest.raises(InvalidSpec, match=problem):
        parse("shared", "gpus", {"workerGroups": [{"name": "gpu"}], "tenants": tenants})


def test_the_scheduler_mounts_each_token_and_is_given_the_tenant_settings() -> None:
    pod = scheduler_pod(TEAMS)
    (scheduler,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in scheduler["env"]}
    prefix = "APPORTION_SCHEDULER__TENANTS__"
    assert env[f"{prefix}vision__TOKEN_FILE"] == f"{TENANTS_PATH}/vision/token"
    assert env[f"{prefix}vision__WEIGHT"] == "3"
    assert env[f"{prefix}vision__QUOTA__GPU"] == "2"
    assert env[f"{prefix}nlp_team__TOKEN_FILE"] == f"{TENANTS_PATH}/nlp_team/token"
    assert f"{prefix}nlp_team__QUOTA__GPU" not in env
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["tenant-nlp-team"]["secret"] == {
        "secretName": "nlp",
        "items": [{"key": "key", "path": "token"}],
        "defaultMode": 0o400,
    }
    mounts = {m["mountPath"]: m for m in scheduler["volumeMounts"]}
    assert mounts[f"{TENANTS_PATH}/vision"]["readOnly"] is True
    assert "tmp" in volumes  # the scheduler's other volumes are kept


def test_no_tenant_declared_changes_nothing_in_the_scheduler_pod() -> None:
    pod = scheduler_pod([])
    (scheduler,) = pod["spec"]["containers"]
    assert not [e for e in scheduler["env"] if "TENANTS" in e["name"]]
    assert not [v for v in pod["spec"]["volumes"] if v["name"].startswith("tenant-")]


def test_the_settings_given_to_the_scheduler_declare_the_tenants(tmp_path: Path) -> None:
    """The environment the pod gets, read by the engine's own configuration."""
    (scheduler,) = scheduler_pod(TEAMS)["spec"]["containers"]
    env = {e["name"]: e["value"] for e in scheduler["env"] if "TENANTS" in e["name"]}
    env = {k: v.replace(TENANTS_PATH, str(tmp_path)) for k, v in env.items()}
    code = (
        "import json; from apportion import config; "
        "print(json.dumps(config.get('scheduler.tenants')))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(shown) == {
        "vision": {"token-file": f"{tmp_path}/vision/token", "weight": 3, "quota": {"GPU": 2}},
        "nlp_team": {"token-file": f"{tmp_path}/nlp_team/token", "weight": 1},
    }


def test_the_status_reports_what_each_tenant_holds_and_waits_for() -> None:
    info = {
        "tenants": {
            "vision": {"weight": 3, "quota": {"GPU": 2}, "used": {"GPU": 2}, "runs": 2,
                       "waiting": 5, "over_quota": 5, "share": 0.5},
        }
    }  # fmt: skip
    assert tenant_usage(info) == {
        "tenants": {"vision": {"used": {"GPU": 2}, "share": 0.5, "waiting": 5, "over_quota": 5}}
    }
    assert tenant_usage({"workers": {}}) == {} == tenant_usage(None)
