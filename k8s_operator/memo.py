"""What the operator remembers about one ResourceCluster between reconciles: one record,
kept in kopf's memo of that object, so that it goes when kopf forgets the object.

Nothing here is the truth about a cluster (that is the API server's); it saves API calls
(what was applied, the token, the TLS Secret and context) and repeated Events. A record is
marked ``gone`` when the watch reports its cluster deleted: every reconcile step checks
it, and the timer's filter stops the timer, so a deleted cluster is never acted on again.
"""

from __future__ import annotations

import logging
import ssl
import threading
import weakref
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("apportion.operator")

# The key of the record in kopf's per-object memo.
MEMO_KEY = "apportion_cluster"

# Every record still in memory (weakly: this keeps none alive), for the operator's metrics
# and log. A record lives as long as kopf's memo of its cluster, and any reconcile or timer
# still holding it.
_alive: weakref.WeakSet[ClusterMemo] = weakref.WeakSet()


@dataclass(eq=False)
class TlsRead:
    """The cluster's TLS Secret as last read (``data`` None: not found)."""

    secret: str
    at: float
    data: dict[str, str] | None


@dataclass(eq=False)
class ClusterMemo:
    uid: str
    namespace: str
    name: str
    # One reconcile at a time per cluster: the timer and a spec change never overlap.
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Set when the watch reports the cluster deleted; never cleared.
    gone: threading.Event = field(default_factory=threading.Event)
    # A digest of each child last applied, by kind: a child is applied again only when its
    # manifest changed or it is gone (not every round).
    applied: dict[str, str] = field(default_factory=dict)
    # The cluster's token, read (or created) once.
    token: str | None = None
    tls_read: TlsRead | None = None
    # The operator's own TLS context for the cluster's scheduler, with the digest of the
    # Secret it was made from (ssl loads certificates only from files: made once per
    # certificate).
    tls_context: tuple[str, ssl.SSLContext] | None = None
    # The last problem announced per Event reason: a reconcile that started from an older
    # body (the timer's, queued behind a change) must not announce it again.
    announced: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    def drop(self) -> None:
        """The cluster was deleted: act on it no more, and keep nothing of it."""
        self.gone.set()
        self.applied.clear()
        self.announced.clear()
        self.token = None
        self.tls_read = None
        self.tls_context = None


def cluster_memo(memo: MutableMapping[str, Any], body: Any) -> ClusterMemo:
    """The record of the cluster ``body``, from kopf's memo of it (made on first use)."""
    record = memo.get(MEMO_KEY)
    if record is None:
        meta = body["metadata"]
        fresh = ClusterMemo(meta["uid"], meta["namespace"], meta["name"])
        # setdefault: two handlers of one object may race to make it; one record wins.
        record = memo.setdefault(MEMO_KEY, fresh)
        if record is fresh:
            _alive.add(record)
    assert isinstance(record, ClusterMemo)
    return record


def forget(memo: MutableMapping[str, Any], body: Any) -> ClusterMemo:
    """Mark the record of the cluster ``body`` gone (made gone if no handler made it yet).
    It stays in ``memo``, so that the timer's filter sees it; kopf drops the memo itself
    with the object."""
    record = cluster_memo(memo, body)
    record.drop()
    logger.info(
        "cluster %s deleted: forgotten (%d cluster(s) remembered)", record.where, remembered()
    )
    return record


def alive(memo: MutableMapping[str, Any]) -> bool:
    """False once the cluster of ``memo`` was reported deleted."""
    record = memo.get(MEMO_KEY)
    return not (isinstance(record, ClusterMemo) and record.gone.is_set())


def remembered() -> int:
    """Clusters the operator keeps a record of, deleted ones excluded."""
    return sum(not record.gone.is_set() for record in list(_alive))
