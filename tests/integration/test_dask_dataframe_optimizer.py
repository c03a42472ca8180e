"""Annotated dataframe steps that Dask's expression optimizer rewrites, on a real cluster.

A groupby aggregation, a merge, a shuffle and an elementwise step are written under
``dask.annotate(resources={"GPU": 1})``; the optimizer pushes a later column projection
into each, lowers the merge and shuffle into stages, and renames every step. Each worker
records every Dask task it runs (the functions inside, the resources granted): the step's
tasks ran only on the GPU workers, with one GPU, and the rest (the input partitions, the
unannotated work after the step) ran with nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

from apportion import Client
from tests.integration import dask_tasks
from tests.integration.dask_tasks import records

cloudpickle.register_pickle_by_value(dask_tasks)

GPU_WORKERS = {"gpu-a", "gpu-b"}
FRAME = pd.DataFrame({"a": np.arange(120) % 7, "b": np.arange(120.0), "c": np.arange(120)})
OTHER = pd.DataFrame({"a": range(7), "d": np.arange(7) * 100})


@pytest.fixture(scope="module")
def task_log(client: Client, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every worker records the Dask tasks it runs, from before the first graph."""
    log = tmp_path_factory.mktemp("dask-tasks") / "tasks.jsonl"
    client.run(dask_tasks.record_dask_tasks, str(log))
    return log


@pytest.fixture
def log(task_log: Path) -> Iterator[Path]:
    task_log.write_text("")
    yield task_log


def check_placement(log: Path, step: set[str], outside: set[str]) -> None:
    """Every task running a function of the annotated ``step`` ran on a GPU worker with one
    GPU; every task running only ``outside`` functions ran with no resources."""
    calls = records(log)
    in_step = [c for c in calls if step & set(c["functions"])]
    assert in_step, f"no task ran any of {step}: {calls}"
    for call in in_step:
        assert call["worker"] in GPU_WORKERS, call
        assert call["resources"] == {"GPU": 1}, call
    beside = [c for c in calls if c["functions"] and set(c["functions"]) <= outside]
    assert beside, f"no task ran only {outside}: {calls}"
    assert all(c["resources"] == {} for c in beside), beside


def same_rows(result: pd.DataFrame | pd.Series, expected: pd.DataFrame | pd.Series) -> None:
    """Equal up to row order (shuffles deal rows to partitions in their own order)."""
    if isinstance(result, pd.Series):
        result, expected = result.to_frame(), expected.to_frame()
    order = list(result.columns)
    pd.testing.assert_frame_equal(
        result.reset_index().sort_values([*order]).reset_index(drop=True),
        expected.reset_index().sort_values([*order]).reset_index(drop=True),
    )


def test_annotated_groupby_agg_with_a_projection_pushed_into_it(client: Client, log: Path) -> None:
    x = dd.from_pandas(FRAME, npartitions=6)
    with dask.annotate(resources={"GPU": 1}):
        y = x.groupby("a").agg({"b": "sum", "c": "max"})
    out = y["b"] * 2  # the optimizer drops "c" from the annotated aggregation

    same_rows(out.compute(), out.compute(scheduler="sync"))
    check_placement(log, step={"_groupby_apply_funcs"}, outside={"data", "mul"})


def test_annotated_merge_lowered_into_shuffles(client: Client, log: Path) -> None:
    x = dd.from_pandas(FRAME, npartitions=4)
    z = dd.from_pandas(OTHER, npartitions=2)
    with dask.annotate(resources={"GPU": 1}):
        y = x.merge(z, on="a")
    out = y[["b", "d"]]

    same_rows(out.compute(), out.compute(scheduler="sync"))
    check_placement(log, step={"merge_chunk", "_shuffle_group"}, outside={"data"})


def test_annotated_shuffle(client: Client, log: Path) -> None:
    x = dd.from_pandas(FRAME, npartitions=4)
    with dask.annotate(resources={"GPU": 1}):
        y = x.shuffle("a", npartitions=3)
    out = y[["b"]]

    same_rows(out.compute(), out.compute(scheduler="sync"))
    check_placement(log, step={"_shuffle_group"}, outside={"data"})


def test_annotated_step_renamed_by_a_column_projection(client: Client, log: Path) -> None:
    x = dd.from_pandas(FRAME, npartitions=4)
    with dask.annotate(resources={"GPU": 1}):
        y = x * 10
    out = y[["b"]]  # pushed through the multiplication into from_pandas

    same_rows(out.compute(), out.compute(scheduler="sync"))
    check_placement(log, step={"mul"}, outside={"data"})
