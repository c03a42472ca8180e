"""The operator forgets a deleted cluster: its per-cluster caches are emptied when the watch
reports the cluster DELETED, and only then."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from apportion.operator import handlers


def _caches() -> dict[str, dict[Any, Any]]:
    return {
        "_locks": handlers._locks,
        "_tokens": handlers._tokens,
        "_applied": handlers._applied,
        "_tls_contexts": handlers._tls_contexts,
        "_tls_reads": handlers._tls_reads,
        "_announced": handlers._announced,
    }


@pytest.fixture
def two_clusters() -> Iterator[None]:
    saved = {name: dict(cache) for name, cache in _caches().items()}
    for uid in ("gone", "kept"):
        handlers._lock(uid)
        handlers._tokens[uid] = "token"
        handlers._applied[(uid, "Deployment")] = "digest"
        handlers._tls_contexts[(uid, "digest")] = object()  # type: ignore[assignment]
        handlers._tls_reads[(uid, f"{uid}-tls")] = (0.0, None)
        handlers._announced[(uid, "Invalid")] = "message"
    yield
    for name, cache in _caches().items():
        cache.clear()
        cache.update(saved[name])


def _uids(cache: dict[Any, Any]) -> set[str]:
    return {key if isinstance(key, str) else key[0] for key in cache}


def test_a_deleted_cluster_leaves_no_entry_in_any_cache(two_clusters: None) -> None:
    handlers.on_event(type="DELETED", uid="gone")
    for name, cache in _caches().items():
        assert "gone" not in _uids(cache), name
        assert "kept" in _uids(cache), name


@pytest.mark.parametrize("kind", ["ADDED", "MODIFIED", None])
def test_other_events_forget_nothing(two_clusters: None, kind: str | None) -> None:
    handlers.on_event(type=kind, uid="gone")
    for name, cache in _caches().items():
        assert {"gone", "kept"} <= _uids(cache), name
