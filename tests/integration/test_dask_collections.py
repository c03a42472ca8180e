"""Dask collections on a real cluster: the seed's examples with annotations, verbatim.

The cluster is the resources guide's (two workers with GPU=2, one with MEMORY=100e9);
each annotated function records where it ran and with which resources granted.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import cloudpickle
import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from apportion import Client, annotate, fire_and_forget
from tests.conftest import wait_until
from tests.integration import dask_tasks
from tests.integration.dask_tasks import add_one, double, recorded, records, total
from tests.integration.tasks import peak_concurrency

cloudpickle.register_pickle_by_value(dask_tasks)

GPU_WORKERS = {"gpu-a", "gpu-b"}


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


def check_gpu_calls(calls: list[dict], count: int) -> None:
    """Every GPU call ran on a GPU worker with one GPU granted, never more than two at once
    per worker (each has GPU=2 and four threads)."""
    assert len(calls) == count
    assert {c["worker"] for c in calls} <= GPU_WORKERS
    assert all(c["resources"] == {"GPU": 1} for c in calls)
    assert max(peak_concurrency(calls).values()) <= 2


def test_client_is_dasks_default_scheduler(client: Client) -> None:
    assert dask.config.get("scheduler").__self__ is client
    with Client(client.scheduler_address, token=client.token) as other:
        assert dask.config.get("scheduler").__self__ is other
        with client.as_default():
            assert dask.config.get("scheduler").__self__ is client
        assert dask.config.get("scheduler").__self__ is other
    client.as_default()
    assert dask.config.get("scheduler").__self__ is client


def test_seed_array_example(client: Client, log: Path) -> None:
    func1 = recorded(log, "func1", add_one, seconds=0.05)
    func2 = recorded(log, "func2", double)

    x = da.arange(400, chunks=20)  # the seed reads zarr; any array will do
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_blocks(func1)
    z = y.map_blocks(func2)
    result = z.compute()

    np.testing.assert_array_equal(result, z.compute(scheduler="sync"))
    calls = records(log)
    check_gpu_calls([c for c in calls if c["name"] == "func1" and c["pid"]], 20)
    # func2 is not annotated: it runs anywhere, never fused into a GPU task.
    second = [c for c in calls if c["name"] == "func2"]
    assert len(second) == 20
    assert all(c["resources"] == {} for c in second)


def test_seed_dataframe_persist_pattern(client: Client, log: Path) -> None:
    func1 = recorded(log, "func1", add_one, seconds=0.05)
    func2 = recorded(log, "func2", double)
    frame = pd.DataFrame({"a": range(200), "b": np.arange(200.0)})

    x = dd.from_pandas(frame, npartitions=10)
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_partitions(func1).persist()
    z = y.map_partitions(func2)
    del y  # Release distributed memory for y as soon as possible
    result = z.compute()

    pd.testing.assert_frame_equal(result, (frame + 1) * 2)
    calls = records(log)
    check_gpu_calls([c for c in calls if c["name"] == "func1"], 10)
    assert [c["resources"] for c in calls if c["name"] == "func2"] == [{}] * 10


def test_dataframe_expression_annotations_without_persist(client: Client, log: Path) -> None:
    func1 = recorded(log, "func1", add_one, seconds=0.05)
    func2 = recorded(log, "func2", double)
    frame = pd.DataFrame({"a": range(200), "b": np.arange(200.0)})
    x = dd.from_pandas(frame, npartitions=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "annotations will be ignored" from Dask
        with dask.annotate(resources={"GPU": 1}):
            y = x.map_partitions(func1)
    z = y.map_partitions(func2)[["b"]].sum()

    assert z.compute()["b"] == pytest.approx(((frame + 1) * 2)["b"].sum())
    calls = records(log)
    check_gpu_calls([c for c in calls if c["name"] == "func1"], 10)
    assert [c["resources"] for c in calls if c["name"] == "func2"] == [{}] * 10


def test_seed_delayed_example(client: Client, log: Path) -> None:
    load = dask.delayed(recorded(log, "load", add_one))
    process = dask.delayed(recorded(log, "process", double, seconds=0.05))
    aggregate = dask.delayed(recorded(log, "aggregate", total))

    data = [load(i) for i in range(12)]
    with dask.annotate(resources={"GPU": 1}):
        processed = [process(d) for d in data]
    with dask.annotate(resources={"MEMORY": 70e9}):
        final = aggregate(processed)

    assert final.compute() == sum(2 * (i + 1) for i in range(12))
    calls = records(log)
    check_gpu_calls([c for c in calls if c["name"] == "process"], 12)
    (agg,) = [c for c in calls if c["name"] == "aggregate"]
    assert (agg["worker"], agg["resources"]) == ("bigmem", {"MEMORY": 70e9})
    assert [c["resources"] for c in calls if c["name"] == "load"] == [{}] * 12


def test_seed_submit_example_with_dask_annotate(client: Client, log: Path) -> None:
    process = recorded(log, "process", double, seconds=0.05)
    aggregate = recorded(log, "aggregate", total)
    data = [client.submit(add_one, i) for i in range(8)]
    with dask.annotate(resources={"GPU": 1}):
        processed = [client.submit(process, d) for d in data]
    with dask.annotate(resources={"MEMORY": 70e9}):
        final = client.submit(aggregate, processed)
    assert final.result() == sum(2 * (i + 1) for i in range(8))
    check_gpu_calls([c for c in records(log) if c["name"] == "process"], 8)
    assert [c["worker"] for c in records(log) if c["name"] == "aggregate"] == ["bigmem"]


def test_compute_and_get_protocol(client: Client) -> None:
    x = da.arange(100, chunks=10)
    future = client.compute(x.sum())
    assert future.result() == 4950
    assert dask.compute(x.sum(), x.max(), scheduler=client.get) == (4950, 99)
    assert x.sum().compute(scheduler=client) == 4950
    assert client.get({"x": (add_one, 1), "y": (double, "x")}, "y") == 4
    assert client.get({"x": (add_one, 1), "y": (double, "x")}, ["x", ["y"]]) == [2, [4]]
    futures = client.compute([x.sum(), x.min()])
    assert client.gather(futures) == [4950, 0]


def test_persisted_chunks_are_reused(client: Client, log: Path) -> None:
    func1 = recorded(log, "func1", add_one)
    y = client.persist(da.arange(100, chunks=10).map_blocks(func1))
    assert y.sum().compute() == 5050
    assert y.max().compute() == 100
    assert len(records(log)) == 10  # computed once, by persist


def test_apportion_annotate_on_collections(client: Client, log: Path) -> None:
    func1 = recorded(log, "func1", add_one, seconds=0.05)
    with annotate(resources={"GPU": 1}):
        y = da.arange(100, chunks=10).map_blocks(func1)
    assert y.sum().compute() == 5050
    check_gpu_calls(records(log), 10)


def test_annotation_around_compute_applies_to_the_whole_graph(client: Client, log: Path) -> None:
    func1 = recorded(log, "func1", add_one)
    y = da.arange(100, chunks=10).map_blocks(func1)
    with dask.annotate(resources={"MEMORY": 1e9}):
        assert y.sum().compute() == 5050
    assert {c["worker"] for c in records(log)} == {"bigmem"}


def test_invalid_demand_fails_at_compute_like_submit(client: Client) -> None:
    with pytest.raises(ValueError) as from_submit:
        client.submit(add_one, 1, resources={"GPU": -1})
    with dask.annotate(resources={"GPU": -1}):
        y = da.arange(10, chunks=5).map_blocks(add_one)
    with pytest.raises(ValueError) as from_compute:
        y.compute()
    assert str(from_compute.value) == str(from_submit.value)
    with pytest.raises(ValueError, match="GPU"):
        client.persist(y)


def test_unknown_annotation_is_ignored_with_a_warning(client: Client) -> None:
    with dask.annotate(flavour_for_integration_test="vanilla"):
        y = da.arange(10, chunks=5).map_blocks(add_one)
    with pytest.warns(UserWarning, match="'flavour_for_integration_test'"):
        assert y.sum().compute() == 55


def test_scatter_and_futures_inside_collections(client: Client) -> None:
    blocks = [np.arange(5) + 5 * i for i in range(4)]
    futures = client.scatter(blocks)
    assert [f.result().tolist() for f in futures] == [b.tolist() for b in blocks]
    assert client.scatter(blocks[0]).key == futures[0].key  # keyed by content
    named = client.scatter({"a": 1, "b": 2}, broadcast=True)
    assert sorted(named) == ["a", "b"] and named["b"].result() == 2

    array = da.concatenate([da.from_delayed(f, shape=(5,), dtype=int) for f in futures])
    assert array.sum().compute() == sum(range(20))
    frames = client.scatter([pd.DataFrame({"v": [i, i]}) for i in range(3)])
    frame = dd.from_delayed(frames, meta=pd.DataFrame({"v": pd.Series([], dtype=int)}))
    assert frame.v.sum().compute() == 6
    assert dask.delayed(add_one)(futures[1]).compute().tolist() == (blocks[1] + 1).tolist()


def test_scatter_broadcast_puts_a_copy_on_every_worker(client: Client) -> None:
    values = [np.arange(1000) * i for i in range(3)]
    futures = client.scatter(values, broadcast=True)
    named = client.scatter({"weights": np.ones(50)}, broadcast=True)

    info = client.scheduler_info()["workers"]
    assert len(info) == 3
    # Each worker said it holds each value (``data-acquired``, sent once it is stored).
    for future in [*futures, named["weights"]]:
        assert sorted(future._state.who_has) == sorted(info)
    assert all(worker["in_memory"] >= 4 for worker in info.values())
    assert [f.result().tolist() for f in futures] == [v.tolist() for v in values]
    # Tasks on every worker use their own copy, wherever they run.
    totals = client.gather([client.submit(total, futures[2], pure=False) for _ in range(6)])
    assert totals == [int(values[2].sum())] * 6


def test_fire_and_forget_runs_to_completion(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "done.txt"
    fire_and_forget(client.submit(dask_tasks.touch, str(path), pure=False))
    wait_until(path.exists, timeout=30, what="the forgotten task's file")


def test_bag_annotations(client: Client, log: Path) -> None:
    import dask.bag as db

    func1 = recorded(log, "func1", add_one, seconds=0.05)
    func2 = recorded(log, "func2", double)
    b = db.from_sequence(range(12), npartitions=6)
    with dask.annotate(resources={"GPU": 1}):
        c = b.map(func1)
    d = c.map(func2).filter(lambda v: v > 4)
    assert d.sum().compute() == d.sum().compute(scheduler="sync")
    calls = records(log)
    check_gpu_calls([c for c in calls if c["name"] == "func1"], 12)
    assert {c["worker"] for c in calls if c["name"] == "func2"} and all(
        c["resources"] == {} for c in calls if c["name"] == "func2"
    )
