"""Which client an object made without ``client=`` uses (``Variable("x")``, ...): inside a
task the worker's (``get_client()``), elsewhere the latest client made in this process."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from apportion.worker.context import current_task_key

if TYPE_CHECKING:
    from apportion.client import Client

_latest: weakref.ref[Client] | None = None


def remember(client: Client) -> None:
    global _latest
    _latest = weakref.ref(client)


def default_client() -> Client:
    if current_task_key() is not None:
        from apportion.worker_client import get_client

        return get_client()
    client = _latest() if _latest is not None else None
    if client is None or client._closed:
        raise ValueError(
            "no client to use: pass client=..., or create a Client first (inside a task the "
            "worker's client is used)"
        )
    return client
