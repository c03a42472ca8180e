"""Dask collections on each system: the same collection computed through the system's
client (``dask.compute(..., scheduler=client.get)``), graph optimization included.

- dask_array: a sum over a 10,000-chunk array (one element per chunk: the scheduler's
  cost per task, not numpy's, is what is timed);
- dask_gpu: ``map_blocks`` under ``dask.annotate(resources={"GPU": 1})`` over 1,000
  chunks, then an unannotated step and a sum, on the seed pipeline's cluster;
- dask_groupby: ``groupby().agg()`` over a generated dataframe (``dask.datasets.timeseries``:
  the partitions are generated on the workers, a day of minutes each).

Each is first computed once, one chunk larger (other keys, so nothing is reused): every
worker has imported numpy, pandas and dask before the timed run, on both systems.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import dask


def gpu_kernel(block: Any) -> Any:
    return block * 2


def _timed(session: Any, make: Callable[[int], Any], n: int) -> tuple[float, Any]:
    session.compute(make(n + 1))
    collection = make(n)
    start = time.perf_counter()
    (result,) = session.compute(collection)
    return time.perf_counter() - start, result


def _reduction(n: int) -> Any:
    import dask.array as da

    return da.ones((n,), chunks=1).sum()


def dask_array(session: Any, sizes: Any) -> dict[str, float]:
    n = sizes.dask_chunks
    elapsed, total = _timed(session, _reduction, n)
    assert total == n, "dask_array: wrong answer"
    return {"dask_array_reduction_s": elapsed}


def _gpu_pipeline(n: int) -> Any:
    import dask.array as da

    x = da.arange(4 * n, chunks=4)
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_blocks(gpu_kernel)
    return (y + 1).sum()


def dask_gpu(session: Any, sizes: Any) -> dict[str, float]:
    n = sizes.dask_gpu_chunks
    elapsed, total = _timed(session, _gpu_pipeline, n)
    m = 4 * n
    assert total == m * (m - 1) + m, "dask_gpu: wrong answer"
    return {"dask_gpu_map_blocks_s": elapsed}


def _groupby(days: int) -> Any:
    import pandas as pd

    start = pd.Timestamp("2000-01-01")
    df = dask.datasets.timeseries(
        start=start, end=start + pd.Timedelta(days=days), freq="60s", partition_freq="1D"
    )
    return df.groupby("name").agg({"x": "sum", "y": "mean", "id": "count"})


def dask_groupby(session: Any, sizes: Any) -> dict[str, float]:
    days = sizes.dask_partitions
    elapsed, result = _timed(session, _groupby, days)
    assert int(result["id"].sum()) == days * 1440, "dask_groupby: wrong answer"
    return {"dask_groupby_agg_s": elapsed}
