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


# ------------------------------------------------- programs of Dask's documentation
# Four of the programs of tests/integration/test_dask_programs.py, each as a Dask user
# writes it, through the system's own client: only the client differs between systems.
def square(x: int) -> int:
    return x**2


def neg(x: int) -> int:
    return -x


def _array_program(client: Any) -> float:
    """dask-examples, array.ipynb: a random array, its transpose, a slice's mean."""
    import dask.array as da

    x = da.random.RandomState(42).random_sample((2000, 2000), chunks=(250, 250))
    (z,) = dask.compute((x + x.T)[::2, 1000:].mean(axis=1), scheduler=client.get)
    return float(z.sum())


def _dataframe_program(client: Any) -> float:
    """dask-examples, dataframe.ipynb: a groupby mean over two weeks of timeseries."""
    df = dask.datasets.timeseries(start="2000-01-01", end="2000-01-15", freq="1h", seed=1)
    (by_name,) = dask.compute(df.groupby("name").x.mean(), scheduler=client.get)
    return float(by_name.sum())


def _futures_program(client: Any) -> float:
    """dask.distributed's quickstart: map, map over the futures, submit their sum."""
    squares = client.map(square, range(1000))
    negated = client.map(neg, squares)
    return float(client.submit(sum, negated).result())


def _delayed_program(client: Any) -> float:
    """The tutorial's delayed chapter: a tree of small additions."""
    from operator import add

    layer = [dask.delayed(square)(i) for i in range(512)]
    while len(layer) > 1:
        layer = [dask.delayed(add)(a, b) for a, b in zip(layer[::2], layer[1::2], strict=True)]
    (total,) = dask.compute(layer[0], scheduler=client.get)
    return float(total)


PROGRAMS: dict[str, Callable[[Any], float]] = {
    "array": _array_program,
    "dataframe": _dataframe_program,
    "futures": _futures_program,
    "delayed": _delayed_program,
}


def dask_programs(session: Any, sizes: Any) -> dict[str, float]:
    """Each program once untimed (imports, connections), then timed; answers checked."""
    figures = {}
    for name, program in PROGRAMS.items():
        expected = program(session.client)
        start = time.perf_counter()
        got = program(session.client)
        figures[f"dask_program_{name}_s"] = time.perf_counter() - start
        assert abs(got - expected) <= 1e-9 * max(1.0, abs(expected)), f"{name}: {got} != {expected}"
    assert figures, "no program ran"
    return figures
