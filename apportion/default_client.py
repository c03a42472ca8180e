"""Which client an object made without ``client=`` uses (``Variable("x")``, ...): inside a
task the worker's (``get_client()``), elsewhere the latest client made in this process."""

from __future__ import annotations

from apportion.client import Client, latest_client
from apportion.core.context import current_task_key
from apportion.worker_client import get_client


def default_client() -> Client:
    if current_task_key() is not None:
        return get_client()
    client = latest_client()
    if client is None or client.session.closed:
        raise ValueError(
            "no client to use: pass client=..., or create a Client first (inside a task the "
            "worker's client is used)"
        )
    return client
