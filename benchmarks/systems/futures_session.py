"""The session for systems with a dask-style futures client (apportion and dask.distributed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class FuturesSession:
    """Workloads call submit/map/gather/result; both clients spell them the same way."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def submit(
        self, func: Callable[..., Any], *args: Any, resources: dict[str, float] | None = None
    ) -> Any:
        return self.client.submit(func, *args, resources=resources, pure=False)

    def map(
        self,
        func: Callable[..., Any],
        xs: Sequence[Any],
        resources: dict[str, float] | None = None,
    ) -> list[Any]:
        return self.client.map(func, xs, resources=resources, pure=False)

    def gather(self, futures: list[Any]) -> list[Any]:
        return self.client.gather(futures)

    def result(self, future: Any) -> Any:
        return future.result()

    def compute(self, *collections: Any) -> tuple:
        """Dask collections, optimized by Dask and run through the client's ``get``."""
        import dask

        return dask.compute(*collections, scheduler=self.client.get)
