"""kopf handlers: level-based reconciliation of ResourceClusters.

The reconcile itself is ``reconcile.py`` (a list of steps); here it is wired to kopf: on
create, update and resume, and on a timer so that status and scaling follow what happens
in the cluster; watch-fed indexes of the children (never a listing); the operator's
settings; and the end of a cluster.

A deleted cluster is never acted on again. Its record (``memo.py``, in kopf's memo of the
cluster) is marked gone when the watch reports it DELETED: a reconcile under way stops at
its next step, and the timer's filter no longer matches, so kopf stops the timer. (kopf
would stop it on the deletion timestamp, but that needs a finalizer, which would block
deletion while no operator runs; see ``_no_finalizers``.)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import kopf
from apportion.operator import (
    job_handlers,  # noqa: F401  (registers the ResourceJob handlers)
    leadership,
)
from apportion.operator import memo as memos
from apportion.operator.manifests import (
    GROUP,
    LABEL_CLUSTER,
    PLURAL,
    VERSION,
    WORKER_GROUP_PLURAL,
)
from apportion.operator.reconcile import reconcile
from apportion.operator.settings import OperatorSettings

logger = logging.getLogger("apportion.operator")

# Read once, at start: the timer's interval is fixed when the handlers are registered.
SETTINGS = OperatorSettings.from_config()
MANAGED = {"app.kubernetes.io/managed-by": "apportion-operator"}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Our own events are explicit (kopf.event/warn); handler log lines stay in the log.
    # (This level also silences kopf.info, hence kopf.event(type="Normal").)
    settings.posting.level = logging.WARNING
    # Only to remove it from clusters an older operator marked (see _no_finalizers below).
    settings.persistence.finalizer = "apportion.dev/operator"
    # Reconciles are synchronous and may wait on a scheduler's retire call: many clusters
    # need more threads than the default (CPUs + 4).
    settings.execution.max_workers = SETTINGS.threads
    # Every replica runs kopf on its own (fresh caches from its own watches, so a replica
    # that takes over never plans from what it saw long ago); which one acts is decided
    # by a Lease (leadership.py), checked before every step of a reconcile.
    settings.peering.standalone = True
    peering = SETTINGS.peering
    if peering.name:
        elector = leadership.Elector(
            f"{peering.name}-leader",
            _own_namespace(),
            _identity(),
            lease_seconds=peering.lifetime,
        )
        leadership.may_act = elector.acting
        elector.start()
        logger.info(
            "leader election: %s standing by until it holds the Lease %s-leader",
            elector.me,
            peering.name,
        )


def _identity() -> str:
    """This replica's name in the Lease: its pod's (the chart sets POD_ID), else the host's."""
    return os.environ.get("POD_ID") or socket.gethostname()


def _own_namespace() -> str:
    """The operator's namespace: the chart's POD_NAMESPACE, else the service account's."""
    found = os.environ.get("POD_NAMESPACE")
    if found:
        return found
    account = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    return account.read_text().strip() if account.exists() else "default"


@kopf.index("pods", labels=MANAGED)
def cluster_pods(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str | None], kopf.Body]:
    """Every pod the operator made, by (namespace, cluster): a cache fed by one watch."""
    return {(namespace, labels.get(LABEL_CLUSTER)): body}


def _child(
    namespace: str | None, name: str, labels: Mapping[str, str], body: kopf.Body
) -> dict[tuple[str | None, str | None], str]:
    return {(namespace, labels.get(LABEL_CLUSTER)): f"{body['kind']}/{name}"}


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
def scheduler_deployments(
    namespace: str | None, name: str, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str | None], str]:
    """Which scheduler Deployments exist, by (namespace, cluster)."""
    return _child(namespace, name, labels, body)


@kopf.index("services", labels=MANAGED)
def scheduler_services(
    namespace: str | None, name: str, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str | None], str]:
    """Which scheduler Services exist, by (namespace, cluster)."""
    return _child(namespace, name, labels, body)


@kopf.index(GROUP, VERSION, WORKER_GROUP_PLURAL, labels=MANAGED)
def worker_groups(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str | None], kopf.Body]:
    """Every ResourceWorkerGroup, by (namespace, cluster)."""
    return {(namespace, labels.get(LABEL_CLUSTER)): body}


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_change(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    reconcile(body, memos.cluster_memo(memo, body), kwargs, SETTINGS.defaults)


def _alive(memo: MutableMapping[str, Any], **_: Any) -> bool:
    """The timer's filter: False once the cluster was reported deleted, which makes kopf
    stop the timer."""
    return memos.alive(memo)


@kopf.timer(GROUP, VERSION, PLURAL, interval=SETTINGS.interval, when=_alive)
def on_timer(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    reconcile(body, memos.cluster_memo(memo, body), kwargs, SETTINGS.defaults, wait=False)


def _deleted(type: str | None, **_: Any) -> bool:
    return type == "DELETED"


# Only DELETED events call it: kopf logs every handler it calls, and a status patch is an
# event too. kopf runs it before it matches the timer's filter against the same event.
@kopf.on.event(GROUP, VERSION, PLURAL, when=_deleted)
def on_event(
    type: str | None, body: Mapping[str, Any], memo: MutableMapping[str, Any], **_: Any
) -> None:
    """A cluster's watch event: kopf calls these without a finalizer, so a deleted cluster
    is seen here (there is no delete handler, on purpose: see _no_finalizers)."""
    if type == "DELETED":
        memos.forget(memo, body)


def _no_finalizers() -> None:
    """kopf puts a finalizer on every object a timer watches, so that it can stop the timer
    before the object goes; without a running operator that blocks deletion (and
    ``helm uninstall``) forever. Our timer needs no goodbye: the children go with their
    owner (ownerReferences), and the timer's filter stops it when the watch reports the
    object deleted. kopf then also removes the finalizer an older operator added."""
    spawning = kopf.get_default_registry()._spawning
    spawning._handlers = [
        dataclasses.replace(h, requires_finalizer=False) for h in spawning._handlers
    ]


_no_finalizers()
