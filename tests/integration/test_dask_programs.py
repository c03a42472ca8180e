"""Dask programs on apportion, converted by changing only the import line.

Each program below is written as it is for dask.distributed (from dask-examples, the dask
tutorial and dask.distributed's documentation), with ``from dask.distributed import ...``
changed to ``from apportion import ...`` and nothing else. A collection program's result is
compared with Dask's own synchronous scheduler running the same code in this process; a
program of dask.distributed's own API (futures, coordination, publish, actors, tasks from
tasks, joblib) with what the same computation gives in plain Python.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import dask
import dask.array as da
import dask.bag as db
import dask.dataframe as dd
import joblib
import numpy as np
import pandas as pd
import pytest

# The one line changed in every program: from dask.distributed import ...
from apportion import (
    Client,
    LocalCluster,
    Lock,
    Queue,
    Variable,
    as_completed,
    get_client,
    rejoin,
    secede,
    wait,
    worker_client,
)
from tests.integration import dask_tasks
from tests.integration.dask_tasks import Counter

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(dask_tasks)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with LocalCluster(n_workers=2, threads_per_worker=2) as cluster, Client(cluster) as client:
        yield client


# ------------------------------------------------------------------ collections
def array_program() -> Any:
    """dask-examples, array.ipynb: a random array, its transpose, a slice's mean."""
    x = da.random.RandomState(42).random_sample((2000, 2000), chunks=(250, 250))
    y = x + x.T
    z = y[::2, 1000:].mean(axis=1)
    return z.compute()


def array_persist_program() -> Any:
    """The tutorial's array chapter: persist, then several reductions of the persisted."""
    x = da.ones((4000, 4000), chunks=(500, 500)).persist()
    return (x.sum().compute(), x.mean(axis=0)[:5].compute(), (x + 1).std().compute())


def dataframe_program() -> Any:
    """dask-examples, dataframe.ipynb: groupby, resample and rolling on timeseries."""
    df = dask.datasets.timeseries(start="2000-01-01", end="2000-01-15", freq="1h", seed=1)
    df = df.persist()
    by_name = df.groupby("name").x.mean().compute().sort_index()
    hourly = df.x.resample("1D").mean().compute()
    rolling = df.x.rolling("6h").mean().head(20)
    return by_name, hourly, rolling


def dataframe_shuffle_program() -> Any:
    """The dataframe best practices: merge, set_index and value_counts (shuffles)."""
    left = dd.from_pandas(pd.DataFrame({"k": np.arange(200) % 17, "a": np.arange(200)}), 5)
    right = dd.from_pandas(pd.DataFrame({"k": np.arange(17), "b": np.arange(17) * 10}), 2)
    merged = left.merge(right, on="k").compute().sort_values(["k", "a"]).reset_index(drop=True)
    indexed = left.set_index("a").compute()
    counts = left.k.value_counts().compute().sort_index()
    return merged, indexed, counts


def object_columns_program() -> Any:
    """A persisted dataframe with Python-object columns, computed from again and again."""
    frame = pd.DataFrame({"id": np.arange(3000), "tag": [f"t{i % 7}" for i in range(3000)]})
    df = dd.from_pandas(frame.astype({"tag": object}), npartitions=6).persist()
    return [df[df.tag == f"t{i}"].id.sum().compute() for i in range(7)]


def delayed_program() -> Any:
    """The delayed tutorial: inc, add and a tree sum built in a loop."""

    @dask.delayed
    def inc(x: int) -> int:
        return x + 1

    @dask.delayed
    def add(x: int, y: int) -> int:
        return x + y

    layer = [inc(i) for i in range(64)]
    while len(layer) > 1:
        layer = [add(a, b) for a, b in zip(layer[::2], layer[1::2], strict=True)]
    return layer[0].compute()


def bag_program() -> Any:
    """dask-examples, bag.ipynb: map, filter, frequencies and foldby over records."""
    records = db.from_sequence(
        [{"name": n, "age": a} for n, a in zip("abcdefghij" * 20, range(200), strict=True)],
        npartitions=8,
    )
    adults = records.filter(lambda r: r["age"] >= 18).map(lambda r: r["name"])
    totals = records.foldby("name", lambda acc, r: acc + r["age"], 0, operator.add, 0)
    return sorted(adults.frequencies().compute()), sorted(totals.compute())


COLLECTION_PROGRAMS: dict[str, Callable[[], Any]] = {
    "array": array_program,
    "array persisted": array_persist_program,
    "dataframe": dataframe_program,
    "dataframe shuffles": dataframe_shuffle_program,
    "object columns": object_columns_program,
    "delayed": delayed_program,
    "bag": bag_program,
}


def assert_same(got: Any, expected: Any) -> None:
    if isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert_same(g, e)
    elif isinstance(expected, pd.DataFrame):
        pd.testing.assert_frame_equal(got, expected)
    elif isinstance(expected, pd.Series):
        pd.testing.assert_series_equal(got, expected)
    elif isinstance(expected, np.ndarray):
        np.testing.assert_allclose(got, expected)
    else:
        assert got == pytest.approx(expected) if isinstance(expected, float) else got == expected


@pytest.mark.parametrize("name", list(COLLECTION_PROGRAMS))
def test_collection_program_gives_dasks_results(client: Client, name: str) -> None:
    program = COLLECTION_PROGRAMS[name]
    with client.as_default():  # what Client(...) did, whatever other tests made since
        got = program()
    with dask.config.set(scheduler="sync"):
        expected = program()
    assert_same(got, expected)


# --------------------------------------------------- dask.distributed's own API
def square(x: int) -> int:
    return x**2


def neg(x: int) -> int:
    return -x


def test_futures_program(client: Client) -> None:
    """The futures documentation: map, chained map, submit of a sum, gather, as_completed."""
    a = client.map(square, range(20))
    b = client.map(neg, a)
    total = client.submit(sum, b)
    assert total.result() == -sum(x**2 for x in range(20))
    seen = sorted(future.result() for future in as_completed(a))
    assert seen == sorted(x**2 for x in range(20))
    wait(b)
    assert client.gather(b) == [-(x**2) for x in range(20)]


def produce(name: str, n: int) -> int:
    queue = Queue(name)
    client = get_client()
    for i in range(n):
        queue.put(client.submit(square, i, pure=False))
    return n


def test_coordination_program(client: Client) -> None:
    """The coordination primitives page: futures through a Queue, a Variable as a stop
    flag, a Lock around a shared counter."""
    client.submit(produce, "programs-q", 5, pure=False).result()
    queue = Queue("programs-q")
    assert sorted(queue.get().result() for _ in range(5)) == [0, 1, 4, 9, 16]
    stop = Variable("programs-stop")
    stop.set(False)
    assert stop.get() is False
    counter = Variable("programs-counter")
    counter.set(0)
    lock = Lock("programs-lock")

    def add_one(_: int) -> int:
        with Lock("programs-lock"):
            value = Variable("programs-counter").get()
            Variable("programs-counter").set(value + 1)
        return value

    wait(client.map(add_one, range(8)))
    with lock:
        assert counter.get() == 8


def test_publish_program(client: Client) -> None:
    """The publish page: persist a dataframe, publish it, a second program reads it."""
    frame = pd.DataFrame({"x": range(100), "y": list(range(50)) * 2})
    df = dd.from_pandas(frame, npartitions=4).persist()
    client.publish_dataset(programs_df=df)

    def reader() -> float:
        return float(get_client().get_dataset("programs_df").y.mean().compute())

    assert client.submit(reader, pure=False).result() == frame.y.mean()
    client.unpublish_dataset("programs_df")


def fib(n: int) -> int:
    if n < 2:
        return n
    with worker_client() as c:
        a, b = c.submit(fib, n - 1), c.submit(fib, n - 2)
        return a.result() + b.result()


def simulation(seed: int) -> int:
    """The futures page's tasks launching tasks: get_client, secede, gather, rejoin."""
    client = get_client()
    parts = client.map(square, range(seed, seed + 4), pure=False)
    secede()
    total = sum(client.gather(parts))
    rejoin()
    return total


def test_tasks_from_tasks_program(client: Client) -> None:
    assert client.submit(fib, 10).result() == 55
    expected = [sum(x**2 for x in range(s, s + 4)) for s in range(6)]
    assert client.gather(client.map(simulation, range(6), pure=False)) == expected


def test_actors_program(client: Client) -> None:
    """The actors page: a counter on one worker, incremented from the client."""
    counter = client.submit(Counter, actor=True).result()
    futures = [counter.increment() for _ in range(100)]
    assert max(f.result() for f in futures) == 100
    assert counter.n == 100


def test_joblib_program(client: Client) -> None:
    """distributed's joblib page: joblib.parallel_backend("dask") around Parallel."""
    with joblib.parallel_backend("dask"):
        got = joblib.Parallel(n_jobs=-1)(joblib.delayed(square)(i) for i in range(50))
    assert got == [i**2 for i in range(50)]
