"""Reading a ResourceCluster's spec: defaults, resource mapping, contradictions.

Pure functions. The API server's schema already rejects malformed specs (bad names,
negative amounts, duplicate groups); what is checked here needs more than a schema:
a declared amount that contradicts an explicit limit in the pod template, and
mapped Kubernetes resource names that are not valid.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from apportion.operator.idle import POLICIES

from apportion.resources import format_resources

DEFAULT_IMAGE = "apportion:0.1.0"
DEFAULT_RESOURCE_MAP = {"GPU": "nvidia.com/gpu", "MEMORY": "memory"}
DEFAULT_IDLE_TIMEOUT = 60.0  # seconds a worker of an autoscaled group may idle before removal
# Kubernetes resource names: an optional DNS-subdomain prefix, then a name.
_K8S_RESOURCE = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_SUFFIXES: dict[str, int | Decimal] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}


# Children are named "<cluster>-scheduler" (a Service: a DNS-1035 label, at most 63
# characters) and carry the cluster name as a label value (at most 63 characters).
_CLUSTER_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,51}[a-z0-9])?$")


class InvalidSpec(ValueError):
    """The spec cannot be turned into a cluster; the message says why and what to change."""


@dataclass(frozen=True)
class GroupSpec:
    name: str
    replicas: int
    nthreads: int
    # What workers advertise: declared resources plus unmapped limits found in the template.
    advertised: dict[str, float]
    # Container requests/limits the pod must carry (from the declared, mapped resources).
    limits: dict[str, str]
    template: dict[str, Any] = field(default_factory=dict)
    # Autoscaling bounds; equal (both ``replicas``) for a group of fixed size.
    min_replicas: int = 0
    max_replicas: int = 0
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT

    @property
    def autoscaled(self) -> bool:
        return self.min_replicas != self.max_replicas


@dataclass(frozen=True)
class TenantSpec:
    """A team sharing the cluster (the scheduler's ``scheduler.tenants.<name>``): its
    clients present the token in ``secret_name``/``secret_key``."""

    name: str
    secret_name: str
    secret_key: str = "token"
    weight: float = 1.0
    quota: tuple[tuple[str, float], ...] = ()


# A tenant's name becomes part of environment variable names (APPORTION_SCHEDULER__...).
TENANT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    namespace: str
    image: str
    image_pull_policy: str
    auth: bool
    port: int
    http_port: int
    service_type: str
    scheduler_template: dict[str, Any]
    resource_map: dict[str, str]
    groups: list[GroupSpec]
    image_pull_secrets: tuple[str, ...] = ()
    priority_class_name: str = ""  # the operator's default, for pods whose template names none
    tls: bool = False
    # The Secret (ca.crt, tls.crt, tls.key) the user names; None: the operator makes one.
    tls_secret_name: str | None = None
    # A digest of the Secret's certificate, filled in by the operator once it has read the
    # Secret: pods load certificates at start, so a new one (a renewal) replaces them.
    tls_digest: str = ""
    # Every pod removed while True; the spec is kept and resumes when set back.
    suspend: bool = False
    # Seconds without a client or a task after which the cluster ends (None: never), and how.
    idle_timeout: float | None = None
    idle_policy: str = "delete"
    tenants: tuple[TenantSpec, ...] = ()

    @property
    def scheduler_service(self) -> str:
        return f"{self.name}-scheduler"

    @property
    def scheduler_address(self) -> str:
        scheme = "tls" if self.tls else "tcp"
        return f"{scheme}://{self.scheduler_service}.{self.namespace}.svc:{self.port}"

    def group(self, name: str) -> GroupSpec | None:
        return next((g for g in self.groups if g.name == name), None)


def parse_quantity(text: str | int | float) -> float:
    """A Kubernetes quantity (``"100Gi"``, ``"1.5"``, ``"500m"``, ``2``) as a number."""
    if isinstance(text, (int, float)):
        return float(text)
    raw = str(text).strip()
    for suffix, factor in sorted(_SUFFIXES.items(), key=lambda item: -len(item[0])):
        if raw.endswith(suffix) and raw[: -len(suffix)]:
            number, scale = raw[: -len(suffix)], Decimal(factor)
            break
    else:
        number, scale = raw, Decimal(1)
    if scale != 1 and any(ch in number for ch in "eE"):
        raise InvalidSpec(
            f"{text!r} is not a Kubernetes quantity: use an exponent or a suffix, not both"
        )
    try:
        value = Decimal(number) * scale
    except InvalidOperation:
        raise InvalidSpec(f"{text!r} is not a Kubernetes quantity") from None
    if not value.is_finite():
        raise InvalidSpec(f"{text!r} is not a finite Kubernetes quantity")
    return float(value)


def format_quantity(amount: float) -> str:
    """A number as a Kubernetes quantity string (whole numbers stay exact)."""
    return str(int(amount)) if float(amount).is_integer() else repr(float(amount))


def _worker_container(template: Mapping[str, Any]) -> dict[str, Any]:
    containers = (template.get("spec") or {}).get("containers") or []
    named = [c for c in containers if c.get("name") == "worker"]
    return (named or containers or [{}])[0]


def _group(raw: Mapping[str, Any], resource_map: Mapping[str, str]) -> GroupSpec:
    name = raw["name"]
    declared = {k: float(v) for k, v in (raw.get("resources") or {}).items()}
    template = dict(raw.get("template") or {})
    explicit = (_worker_container(template).get("resources") or {}).get("limits") or {}
    reverse = {k8s: abstract for abstract, k8s in resource_map.items()}
    problems, limits, advertised = [], {}, dict(declared)
    for abstract, amount in declared.items():
        k8s_name = resource_map.get(abstract)
        if k8s_name is None:
            continue  # unmapped (process, license): only advertised
        if k8s_name in explicit:
            found = parse_quantity(explicit[k8s_name])
            if abs(found - amount) > 1e-9 * max(1.0, amount):
                problems.append(
                    f"group {name!r} declares {format_resources({abstract: amount})}"
                    f" but its template sets limit {k8s_name}={explicit[k8s_name]}: make them "
                    "agree, or drop one of them"
                )
        if k8s_name == "nvidia.com/gpu" or "/" in k8s_name:
            if not float(amount).is_integer():
                problems.append(
                    f"group {name!r}: {abstract}={amount} maps to {k8s_name}, "
                    "which Kubernetes only allocates in whole units"
                )
        limits[k8s_name] = format_quantity(amount)
    for k8s_name, quantity in explicit.items():
        abstract = reverse.get(k8s_name)
        if abstract is not None and abstract not in declared:
            advertised[abstract] = parse_quantity(quantity)  # a limit nobody declared
    if problems:
        raise InvalidSpec("; ".join(problems))
    replicas, low, high, idle_timeout = _sizing(raw)
    return GroupSpec(
        name,
        replicas,
        int(raw.get("nthreads", 1)),
        advertised,
        limits,
        template,
        min_replicas=low,
        max_replicas=high,
        idle_timeout=idle_timeout,
    )


def _sizing(raw: Mapping[str, Any]) -> tuple[int, int, int, float]:
    """(starting replicas, minReplicas, maxReplicas, idle timeout) of a group.

    ``replicas`` fixes the size; ``minReplicas``/``maxReplicas`` hand it to the autoscaler,
    which starts at the minimum. The API server's schema rules say the same; they are
    checked here too so a spec that bypassed them gets a precise condition, not a crash.
    """
    name = raw["name"]
    autoscaling = [k for k in ("minReplicas", "maxReplicas", "idleTimeoutSeconds") if k in raw]
    if not autoscaling:
        replicas = int(raw.get("replicas", 1))
        return replicas, replicas, replicas, DEFAULT_IDLE_TIMEOUT
    if "replicas" in raw:
        raise InvalidSpec(
            f"group {name!r} sets replicas and {', '.join(autoscaling)}: replicas fixes the "
            "size, minReplicas/maxReplicas let the operator choose it; keep one of them"
        )
    if "maxReplicas" not in raw:
        raise InvalidSpec(f"group {name!r} sets {', '.join(autoscaling)} without maxReplicas")
    low, high = int(raw.get("minReplicas", 0)), int(raw["maxReplicas"])
    if not 0 <= low <= high:
        raise InvalidSpec(
            f"group {name!r}: minReplicas={low} and maxReplicas={high} need "
            "0 <= minReplicas <= maxReplicas"
        )
    idle_timeout = float(raw.get("idleTimeoutSeconds", DEFAULT_IDLE_TIMEOUT))
    if idle_timeout < 0:
        raise InvalidSpec(f"group {name!r}: idleTimeoutSeconds must be >= 0, not {idle_timeout:g}")
    return low, low, high, idle_timeout


@dataclass(frozen=True)
class Defaults:
    """What a spec that names no image gets: the operator's own (the chart's values)."""

    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    priority_class_name: str = ""  # for pods whose template names no PriorityClass


def pinned_defaults(
    spec: Mapping[str, Any], defaults: Defaults, running_image: str | None
) -> Defaults:
    """The defaults a cluster's pods get. A cluster that names no image keeps the one its
    pods run (``running_image``: from its status, or its pods) when the operator's default
    changes, unless its ``imageUpdatePolicy`` is ``FollowOperator``: an operator upgrade
    then restarts no running cluster, and new clusters get the new default at once."""
    if spec.get("image") or spec.get("imageUpdatePolicy") == "FollowOperator":
        return defaults
    if not running_image:
        return defaults
    return dataclasses.replace(defaults, image=running_image)


def _template_problems(where: str, template: Any) -> list[str]:
    """What makes a pod template unusable, in words (the CRD's schema says the same at
    admission; this catches specs stored before it, or written around it)."""
    if not isinstance(template, Mapping):
        return [f"{where} must be an object ({{metadata, spec}}), not {template!r}"]
    pod = template.get("spec") or {}
    if not isinstance(pod, Mapping):
        return [f"{where}.spec must be an object (a pod spec), not {pod!r}"]
    containers = pod.get("containers") or []
    if not isinstance(containers, list) or not all(isinstance(c, Mapping) for c in containers):
        return [f"{where}.spec.containers must be a list of containers, not {containers!r}"]
    problems = []
    for i, container in enumerate(containers):
        env = container.get("env") or []
        if not isinstance(env, list) or not all(isinstance(e, Mapping) for e in env):
            problems.append(f"{where}.spec.containers[{i}].env must be a list, not {env!r}")
            continue
        for j, entry in enumerate(env):
            if not entry.get("name"):
                problems.append(
                    f"{where}.spec.containers[{i}].env[{j}] has no name: {dict(entry)!r}"
                )
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            amounts = resources.get(kind) or {}
            if not isinstance(amounts, Mapping):
                problems.append(f"{where}.spec.containers[{i}].resources.{kind} must be a map")
                continue
            for resource, amount in amounts.items():
                try:
                    parse_quantity(amount)
                except InvalidSpec as exc:
                    problems.append(
                        f"{where}.spec.containers[{i}].resources.{kind}.{resource}: {exc}"
                    )
    return problems


def parse(
    name: str,
    namespace: str,
    spec: Mapping[str, Any],
    default_image: str | Defaults = DEFAULT_IMAGE,
) -> ClusterSpec:
    """Turn a ResourceCluster spec into a ClusterSpec, or raise InvalidSpec saying why."""
    defaults = (
        default_image if isinstance(default_image, Defaults) else Defaults(image=default_image)
    )
    if not _CLUSTER_NAME.match(name):
        raise InvalidSpec(
            f"the name {name!r} cannot name this cluster's Service ('{name}-scheduler'): use "
            "at most 53 lowercase letters, digits and '-', starting with a letter"
        )
    resource_map = dict(DEFAULT_RESOURCE_MAP)
    resource_map.update(spec.get("resourceMap") or {})
    bad = [f"{k}: {v}" for k, v in resource_map.items() if not _K8S_RESOURCE.match(str(v))]
    if bad:
        raise InvalidSpec(f"resourceMap has invalid Kubernetes resource names: {bad}")
    groups_raw = spec.get("workerGroups") or []
    scheduler = spec.get("scheduler") or {}
    port, http_port = int(scheduler.get("port", 8786)), int(scheduler.get("httpPort", 8787))
    if port == http_port:
        raise InvalidSpec(
            f"scheduler.port and scheduler.httpPort are both {port}: give them different ports"
        )
    template_problems = _template_problems("scheduler.template", scheduler.get("template") or {})
    for raw in groups_raw:
        template_problems += _template_problems(
            f"workerGroups[{raw.get('name')}].template", raw.get("template") or {}
        )
    if template_problems:
        raise InvalidSpec("; ".join(template_problems))
    names = [g.get("name") for g in groups_raw]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidSpec(f"worker group names must be unique; repeated: {duplicates}")
    problems, groups = [], []
    for raw in groups_raw:
        try:
            groups.append(_group(raw, resource_map))
        except InvalidSpec as exc:
            problems.append(str(exc))
    if problems:
        raise InvalidSpec("; ".join(problems))
    pull_secrets = spec.get("imagePullSecrets")
    tls = spec.get("tls") or {}
    if tls.get("secretName") and not tls.get("enabled"):
        raise InvalidSpec("tls.secretName needs tls.enabled: true")
    idle_timeout, idle_policy = _idle(spec)
    tenants = _tenants(spec.get("tenants") or [])
    return ClusterSpec(
        name=name,
        namespace=namespace,
        image=spec.get("image") or defaults.image,
        image_pull_policy=spec.get("imagePullPolicy") or defaults.image_pull_policy,
        image_pull_secrets=(
            tuple(s["name"] for s in pull_secrets)
            if pull_secrets is not None
            else defaults.image_pull_secrets
        ),
        auth=bool((spec.get("auth") or {}).get("enabled", True)),
        port=port,
        http_port=http_port,
        service_type=scheduler.get("serviceType", "ClusterIP"),
        scheduler_template=dict(scheduler.get("template") or {}),
        resource_map=resource_map,
        groups=groups,
        tls=bool(tls.get("enabled")),
        tls_secret_name=tls.get("secretName") or None,
        priority_class_name=defaults.priority_class_name,
        suspend=bool(spec.get("suspend", False)),
        idle_timeout=idle_timeout,
        idle_policy=idle_policy,
        tenants=tenants,
    )


def _tenants(raw: list[Mapping[str, Any]]) -> tuple[TenantSpec, ...]:
    """spec.tenants, checked as the CRD's schema does (and names unique, not ``default``,
    which is the cluster token's tenant)."""
    tenants: list[TenantSpec] = []
    for entry in raw:
        name = str(entry.get("name", ""))
        if not TENANT_NAME.match(name):
            raise InvalidSpec(
                f"tenants: name {name!r} must start with a letter and hold only letters, "
                "digits and _ (it names environment variables of the scheduler)"
            )
        if name == "default":
            raise InvalidSpec(
                "tenants: 'default' is the tenant of the cluster's own token; name another"
            )
        if any(t.name == name for t in tenants):
            raise InvalidSpec(f"tenants: {name!r} is declared twice")
        secret = entry.get("secretName")
        if not secret:
            raise InvalidSpec(f"tenants: {name!r} needs secretName, the Secret of its token")
        weight = float(entry.get("weight", 1))
        if not weight > 0:
            raise InvalidSpec(f"tenants: {name!r} weight must be > 0, not {weight:g}")
        quota = tuple(
            (resource, parse_quantity(amount))
            for resource, amount in sorted((entry.get("quota") or {}).items())
        )
        tenants.append(
            TenantSpec(name, str(secret), str(entry.get("secretKey") or "token"), weight, quota)
        )
    return tuple(tenants)


def _idle(spec: Mapping[str, Any]) -> tuple[float | None, str]:
    """(idleTimeoutSeconds or None, idlePolicy), checked as the CRD's schema does."""
    policy = str(spec.get("idlePolicy") or "delete")
    if policy not in POLICIES:
        raise InvalidSpec(f"idlePolicy must be one of {', '.join(POLICIES)}, not {policy!r}")
    raw = spec.get("idleTimeoutSeconds")
    if raw is None:
        return None, policy
    try:
        timeout = float(raw)
    except (TypeError, ValueError):
        raise InvalidSpec(f"idleTimeoutSeconds must be a number of seconds, not {raw!r}") from None
    if not timeout > 0:
        raise InvalidSpec(f"idleTimeoutSeconds must be > 0, not {timeout:g}")
    return timeout, policy
