"""Thin I/O layer: the Kubernetes API (server-side apply) and the scheduler's HTTP API."""

from __future__ import annotations

import copy
import functools
import json
import logging
from base64 import b64decode
from collections.abc import Mapping
from typing import Any

from apportion.operator.scheduler_http import SchedulerHttp
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

logger = logging.getLogger("apportion.operator")

FIELD_MANAGER = "apportion-operator"

__all__ = ["ApiException", "apply", "create_if_absent", "delete_pod", "reason", "refused"]


@functools.lru_cache(maxsize=1)
def api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


@functools.lru_cache(maxsize=1)
def dynamic() -> DynamicClient:
    return DynamicClient(api_client())


def apply(manifest: Mapping[str, Any]) -> None:
    """Create or update an object to match ``manifest`` (server-side apply, we own our fields)."""
    resource = dynamic().resources.get(api_version=manifest["apiVersion"], kind=manifest["kind"])
    resource.server_side_apply(
        body=dict(manifest),
        name=manifest["metadata"]["name"],
        namespace=manifest["metadata"].get("namespace"),
        field_manager=FIELD_MANAGER,
        force_conflicts=True,
    )


def create_if_absent(manifest: Mapping[str, Any]) -> bool:
    resource = dynamic().resources.get(api_version=manifest["apiVersion"], kind=manifest["kind"])
    try:
        resource.create(body=dict(manifest), namespace=manifest["metadata"].get("namespace"))
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def reason(exc: ApiException) -> str:
    """The API server's own message for a refusal (e.g. 'exceeded quota: ...')."""
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)


def delete_pod(namespace: str, name: str) -> bool:
    """Delete a pod; False when it was gone already."""
    try:
        client.CoreV1Api(api_client()).delete_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return True


def refused(manifest: Mapping[str, Any]) -> str | None:
    """Why the API server would refuse ``manifest`` (a dry run stores nothing), or None.

    Pods are tried as a create (an existing pod cannot change its spec; validation comes
    before the name clash, so AlreadyExists means accepted); everything else as the
    server-side apply the operator will do. Only a refusal of the object itself counts:
    anything else (a timeout, a 503) is raised.
    """
    resource = dynamic().resources.get(api_version=manifest["apiVersion"], kind=manifest["kind"])
    body = copy.deepcopy(dict(manifest))
    namespace = body["metadata"].get("namespace")
    try:
        if body["kind"] == "Pod":
            resource.create(body=body, namespace=namespace, dry_run="All")
        else:
            resource.server_side_apply(
                body=body,
                name=body["metadata"]["name"],
                namespace=namespace,
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
                dry_run="All",
            )
    except ApiException as exc:
        if exc.status == 409 and body["kind"] == "Pod":
            return None
        # 500 here is the apply machinery refusing the object (e.g. a duplicate list key).
        if exc.status in (400, 422) or (exc.status == 500 and "typed" in (exc.body or "")):
            return reason(exc)
        raise
    return None


def read_secret(namespace: str, secret: str) -> dict[str, str] | None:
    """A Secret's keys, decoded; None when there is no such Secret."""
    try:
        found = client.CoreV1Api(api_client()).read_namespaced_secret(secret, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return {k: b64decode(v).decode() for k, v in (found.data or {}).items() if v}


def read_token(namespace: str, secret: str, key: str) -> str | None:
    return (read_secret(namespace, secret) or {}).get(key)


# Above the scheduler's default retire-timeout (30 s): it answers by then at the latest.
RETIRE_TIMEOUT = 45


def scheduler_info(scheduler: SchedulerHttp) -> dict[str, Any] | None:
    try:
        return scheduler.call("/api/v1/info")
    except (OSError, ValueError) as exc:
        logger.debug("scheduler at %s not answering: %s", scheduler.base, exc)
        return None


def retire(
    scheduler: SchedulerHttp, names: list[str], count: int
) -> tuple[list[str], dict[str, str]]:
    """Ask the scheduler to retire ``count`` of ``names``: (workers safe to stop, workers
    it kept in service -> why).

    The scheduler answers once their results are copied to workers that stay (up to its
    ``scheduler.retire-timeout``, 30 s by default).
    """
    try:
        answer = scheduler.call(
            "/api/v1/retire", {"names": names, "count": count}, timeout=RETIRE_TIMEOUT
        )
    except (OSError, ValueError) as exc:
        # Includes a 400 for a worker that left since the scheduler was asked: next round.
        logger.warning("scheduler did not retire workers %s: %s", names, exc)
        return [], {}
    return list(answer.get("retired") or []), dict(answer.get("kept") or {})


def patch(api_version: str, kind: str, namespace: str, name: str, body: Mapping[str, Any]) -> Any:
    """A merge patch; returns the object as the API server stored it."""
    resource = dynamic().resources.get(api_version=api_version, kind=kind)
    return resource.patch(
        body=dict(body),
        name=name,
        namespace=namespace,
        content_type="application/merge-patch+json",
    )


def patch_status(
    api_version: str,
    kind: str,
    namespace: str,
    name: str,
    status: Mapping[str, Any],
    resource_version: str | None = None,
) -> None:
    """A merge patch of the status; with ``resource_version``, only onto that version of
    the object (else ApiException 409: it changed since it was read)."""
    resource = dynamic().resources.get(api_version=api_version, kind=kind).subresources["status"]
    body: dict[str, Any] = {"status": dict(status)}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    resource.patch(
        body=body,
        name=name,
        namespace=namespace,
        content_type="application/merge-patch+json",
    )


def delete(api_version: str, kind: str, namespace: str, name: str) -> None:
    resource = dynamic().resources.get(api_version=api_version, kind=kind)
    try:
        resource.delete(name=name, namespace=namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
