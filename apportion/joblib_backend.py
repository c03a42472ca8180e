"""joblib on apportion: ``with joblib.parallel_backend("dask"):`` (or ``parallel_config``)
runs joblib's batches as tasks of the default client, as dask.distributed's backend does,
so scikit-learn's ``n_jobs`` code runs on the cluster with one changed import line.

The backend is registered under ``"dask"`` (and ``"apportion"``) by ``import apportion``:
at once if joblib is imported, else as soon as it is.
Options given to the backend are ``Client.submit``'s (``resources=``, ``retries=``, ...):
``joblib.parallel_backend("dask", resources={"GPU": 1})``.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

from joblib.parallel import AutoBatchingMixin, ParallelBackendBase, register_parallel_backend

from apportion.default_client import default_client
from apportion.futures import Future


class _Batch:
    """What joblib tracks of a submitted batch: its future, and ``get`` for the result."""

    __slots__ = ("future",)

    def __init__(self, future: Future) -> None:
        self.future = future

    def get(self, timeout: float | None = None) -> Any:
        return self.future.result(timeout)


def _run_batch(batch: Callable[[], Any]) -> Any:
    return batch()


class ApportionBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's backend for apportion (``n_jobs=-1``: every thread of the cluster)."""

    supports_retrieve_callback = True
    supports_timeout = True
    default_n_jobs = -1

    def __init__(self, client: Any = None, **submit_kwargs: Any) -> None:
        """``client``: a Client (default: the default client, when first needed)."""
        super().__init__()
        self.client = client
        self.submit_kwargs = submit_kwargs
        self._running: set[Future] = set()
        # joblib's completion callback fetches the result: never on the client's I/O
        # thread (where futures call back), which that fetch needs.
        self._callbacks: concurrent.futures.ThreadPoolExecutor | None = None

    def _client(self) -> Any:
        if self.client is None:
            self.client = default_client()
        return self.client

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        workers = self._client().scheduler_info()["workers"].values()
        threads = sum(int(w.get("nthreads", 1)) for w in workers)
        if n_jobs is None or n_jobs < 0:
            return max(1, threads)
        return max(1, n_jobs)

    def configure(self, n_jobs: int = 1, parallel: Any = None, **backend_args: Any) -> int:
        self.parallel = parallel
        return self.effective_n_jobs(n_jobs)

    def start_call(self) -> None:
        self._callbacks = concurrent.futures.ThreadPoolExecutor(1, "apportion-joblib")

    def stop_call(self) -> None:
        if self._callbacks is not None:
            self._callbacks.shutdown(wait=False)
            self._callbacks = None

    def submit(self, func: Callable[[], Any], callback: Callable[[Any], None] | None = None) -> Any:
        future = self._client().submit(_run_batch, func, pure=False, **self.submit_kwargs)
        batch = _Batch(future)
        self._running.add(future)
        future.add_done_callback(self._running.discard)
        if callback is not None:
            callbacks = self._callbacks or concurrent.futures.ThreadPoolExecutor(1)
            self._callbacks = callbacks
            future.add_done_callback(lambda _: callbacks.submit(callback, batch))
        return batch

    def retrieve_result_callback(self, out: _Batch) -> Any:
        return out.get()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """joblib stops (a batch failed): what it submitted and still runs is cancelled."""
        running = [f for f in list(self._running) if not f.done()]
        self._running.clear()
        if running:
            self._client().cancel(running)


def register() -> None:
    """Make ``"dask"`` and ``"apportion"`` name this backend in joblib."""
    register_parallel_backend("dask", ApportionBackend)
    register_parallel_backend("apportion", ApportionBackend)
