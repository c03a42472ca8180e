"""Which operator replica may act: a Kubernetes Lease, held and renewed by one replica.

Every replica watches (its caches stay fresh, so one that takes over plans from what is
true now), but only the holder of the Lease acts. A replica that was frozen (a paused
container, a stalled node) must not act on waking from what it saw before: it acts only
while its own last renewal is younger than two thirds of the lease by its monotonic clock
(which runs on while a process is stopped), and the others take the Lease only after it
went unrenewed for the whole lease by theirs, later than that. A replica that finds
another holding the Lease it held exits: its next start reads everything afresh (the
pattern of controller-runtime's leader election).

Decisions are pure (``next_move``, ``Fence``); ``Elector`` is the thread that talks to
the API server.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

logger = logging.getLogger("apportion.operator")

LEASE_SECONDS = 15.0  # unrenewed this long (as another replica sees it), the Lease is free
RENEW_DEADLINE = LEASE_SECONDS * 2 / 3  # a replica stops acting this long after renewing
RETRY_SECONDS = 2.0


@dataclass(frozen=True)
class Record:
    """The Lease as read: who holds it, and the renewal others watch for change."""

    holder: str | None
    renew_time: str | None
    transitions: int = 0


Move = Literal["renew", "take", "wait"]


def next_move(
    record: Record | None,
    me: str,
    observed: Record | None,
    observed_at: float,
    now: float,
    lease_seconds: float = LEASE_SECONDS,
) -> Move:
    """What a replica does with the Lease: renew it (it holds it), take it (none, free, or
    unrenewed for ``lease_seconds`` since this replica ``observed`` it unchanged, at
    ``observed_at`` on its own monotonic clock: no two clocks are compared), or wait."""
    if record is None or not record.holder:
        return "take"
    if record.holder == me:
        return "renew"
    if observed != record:
        return "wait"  # a renewal seen just now: its holder is alive
    return "take" if now - observed_at >= lease_seconds else "wait"


@dataclass
class Fence:
    """Whether this replica may act now: it holds the Lease, renewed recently enough by
    its own clock that nobody else can have taken it."""

    renewed_at: float | None = None  # monotonic time a renewal was sent that succeeded

    def acting(self, now: float, deadline: float = RENEW_DEADLINE) -> bool:
        return self.renewed_at is not None and now - self.renewed_at < deadline


# What the reconciles ask before every step. A single operator (no peering) always acts;
# with several replicas, handlers.configure points it at the Elector's fence.
def _always() -> bool:
    return True


may_act: Callable[[], bool] = _always


def _now_micro() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """Holds the Lease ``name`` in ``namespace`` for ``me``; ``fence.acting`` says when this
    replica may act. ``on_lost`` runs when another replica took the Lease it held."""

    def __init__(
        self,
        name: str,
        namespace: str,
        me: str,
        on_lost: Callable[[str], None] | None = None,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self.name, self.namespace, self.me = name, namespace, me
        self.lease_seconds = lease_seconds
        self.fence = Fence()
        self.on_lost = on_lost or _exit
        self._observed: Record | None = None
        self._observed_at = 0.0
        self._held = False

    def start(self) -> None:
        threading.Thread(target=self._run, name="leader-election", daemon=True).start()

    def acting(self) -> bool:
        return self.fence.acting(time.monotonic(), self.lease_seconds * 2 / 3)

    def _run(self) -> None:
        from kubernetes import client

        api = client.CoordinationV1Api()
        while True:
            try:
                self._round(api)
            except Exception as exc:  # an API server away: the fence closes by itself
                logger.warning("leader election: %s", exc)
            time.sleep(RETRY_SECONDS)

    def _round(self, api: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            lease = api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            lease = None
        record = None
        if lease is not None:
            held = lease.spec
            last = held.renew_time.isoformat() if held.renew_time else None
            record = Record(held.holder_identity, last, held.lease_transitions or 0)
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        if self._held and record is not None and record.holder != self.me:
            self.fence.renewed_at = None
            self.on_lost(str(record.holder))
            return
        move = next_move(
            record, self.me, self._observed, self._observed_at, now, self.lease_seconds
        )
        if move == "wait":
            return
        sent = time.monotonic()  # the fence counts from before the request
        renewed = _now_micro()
        spec: dict[str, Any] = {
            "holderIdentity": self.me,
            "leaseDurationSeconds": int(self.lease_seconds),
            "renewTime": renewed,
            "leaseTransitions": (record.transitions if record else 0)
            + (0 if move == "renew" else 1),
        }
        if move == "take":
            spec["acquireTime"] = renewed
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        try:
            if lease is None:
                api.create_namespaced_lease(self.namespace, {"metadata": metadata, "spec": spec})
            else:
                metadata["resourceVersion"] = lease.metadata.resource_version
                body = {"metadata": metadata, "spec": spec}
                api.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as exc:
            if exc.status in (404, 409):  # someone else wrote it first: read it again
                return
            raise
        if not self._held:
            logger.info("leader election: %s holds Lease %s/%s", self.me, self.namespace, self.name)
        self._held = True
        self.fence.renewed_at = sent


def _exit(holder: str) -> None:
    logger.error(
        "leader election: %s took the Lease this replica held; exiting, so that a fresh "
        "start reads everything again",
        holder,
    )
    logging.shutdown()
    os._exit(1)
