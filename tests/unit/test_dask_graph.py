"""Annotations through Dask's optimizations, on graphs alone (apportion.dask_graph)."""

from __future__ import annotations

import warnings

import dask
import dask.array as da
import dask.dataframe as dd
import pandas as pd
import pytest
from dask._expr import FinalizeCompute
from dask._task_spec import Alias, DataNode, Task, _execute_subgraph
from dask.base import collections_to_expr
from dask.core import flatten

from apportion import annotate, dask_graph
from apportion.dask_graph import _signature

dask_graph.install()


def f1(block):
    return block + 1


def f2(block):
    return block * 2


def optimized(collection):
    expr = FinalizeCompute(collections_to_expr([collection])).optimize()
    return expr, list(flatten(expr.__dask_keys__()))


def dask_task_count(collection) -> int:
    """How many tasks Dask's own optimization leaves (annotations aside), not counting
    aliases (a key standing for another: apportion runs none where it can)."""
    expr, _ = optimized(collection)
    return sum(not isinstance(node, Alias) for node in expr.__dask_graph__().values())


def planned(collection):
    expr, keys = optimized(collection)
    graph, annotations = dask_graph.graph_of(expr, keys)
    return graph, annotations, dask_graph.plan(graph, keys, annotations)


def name(key) -> str:
    """A Dask key's name without its token: ("f1-1a2b...", 3) -> "f1", "f2-<uuid>" -> "f2"."""
    if isinstance(key, tuple):
        return key[0].rsplit("-", 1)[0]
    return key.split("-")[0]


def names_inside(node) -> set[str]:
    """The names of every task a (possibly fused, possibly nested) task runs."""
    if getattr(node, "func", None) is _execute_subgraph:
        return set().union(*(names_inside(inner) for inner in node.args[0].values()))
    return {name(node.key)}


def demands(graph, annotations, task_name: str) -> set:
    """Each distinct demand of the tasks that run a task named ``task_name``."""
    return {
        _signature(annotations.get(key))
        for key, node in graph.items()
        if task_name in names_inside(node)
    }


def test_annotations_read_before_fusion_reach_the_tasks_written_under_them():
    x = da.arange(100, chunks=10)
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_blocks(f1)
    z = y.map_blocks(f2)
    graph, annotations, plan = planned(z)
    gpu = _signature({"resources": {"GPU": 1}})
    assert demands(graph, annotations, "f1") == {gpu}
    # f2 and arange are written outside the block: never fused into a GPU task.
    assert demands(graph, annotations, "f2") == {()}
    assert demands(graph, annotations, "arange") == {()}
    options = [t.options for t in plan.tasks]
    assert options.count({"resources": {"GPU": 1}}) == 10


def test_every_task_keeps_one_annotation_and_dasks_own_graph_loses_them():
    x = da.arange(100, chunks=10)
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_blocks(f1)
    z = y.map_blocks(f2).sum()
    expr, _ = optimized(z)
    assert expr.__dask_annotations__() == {}  # what Dask hands a scheduler: nothing
    graph, _, _ = planned(z)
    for node in graph.values():
        inner = names_inside(node)
        assert not ("f1" in inner and inner - {"f1"}), inner


def test_graphs_whose_annotations_agree_keep_dasks_task_count():
    with dask.annotate(resources={"GPU": 1}, retries=2, priority=5):
        z = da.arange(1000, chunks=10).map_blocks(f1).map_blocks(f2).sum()
    _, _, plan = planned(z)
    assert len(plan.tasks) == dask_task_count(z)
    fused = [t for t in plan.tasks if {"f1", "f2"} & names_inside(t.node)]
    assert fused and all(
        t.options == {"resources": {"GPU": 1}, "retries": 2, "priority": 5} for t in fused
    )


def test_unannotated_graphs_keep_dasks_task_count():
    z = da.arange(1000, chunks=10).map_blocks(f1).map_blocks(f2).sum()
    _, annotations, plan = planned(z)
    assert annotations == {}
    assert len(plan.tasks) == dask_task_count(z)
    assert all(t.options == {} for t in plan.tasks)


def test_split_keeps_fusing_runs_with_equal_annotations():
    x = da.arange(100, chunks=10)
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_blocks(f1).map_blocks(f2)  # one run: fused together
    z = y.map_blocks(f1).map_blocks(f2)  # another run
    _, _, plan = planned(z)
    unannotated = dask_task_count(z)
    # Per block: arange, the GPU run, the other run (instead of one fused task).
    assert len(plan.tasks) == unannotated + 2 * 10


def test_per_key_callable_annotations():
    x = da.arange(100, chunks=10)
    with dask.annotate(priority=lambda key: key[1]):
        y = x.map_blocks(f1)
    _, _, plan = planned(y.map_blocks(f2))
    priorities = sorted(
        t.options.get("priority", 0) for t in plan.tasks if name(t.node.key) == "f1"
    )
    assert priorities == list(range(10))


def test_delayed_layers_keep_their_annotations():
    process = dask.delayed(f2)
    with dask.annotate(resources={"GPU": 1}):
        processed = [process(i) for i in range(4)]
    with dask.annotate(resources={"MEMORY": 70e9}):
        final = dask.delayed(sum)(processed)
    _, _, plan = planned(final)
    by_name = {name(t.node.key): t.options for t in plan.tasks}
    assert by_name["f2"] == {"resources": {"GPU": 1}}
    assert by_name["sum"] == {"resources": {"MEMORY": 70e9}}


def test_dataframe_expression_annotations_are_kept():
    df = pd.DataFrame({"a": range(40), "b": range(40)})
    x = dd.from_pandas(df, npartitions=4)
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_partitions(f1)
    z = y.map_partitions(f2)
    _, _, plan = planned(z)
    by_name = {}
    for t in plan.tasks:
        by_name.setdefault(name(t.node.key), set()).add(tuple(t.options))
    assert by_name["f1"] == {("resources",)}
    assert by_name["f2"] == {()}


def test_apportion_annotate_marks_collections_too():
    x = da.arange(100, chunks=10)
    with annotate(resources={"GPU": 1}):
        y = x.map_blocks(f1)
    _, _, plan = planned(y.map_blocks(f2))
    marked = [t.options for t in plan.tasks if name(t.node.key) == "f1"]
    assert marked == [{"resources": {"GPU": 1}}] * 10


@pytest.mark.parametrize(
    ("annotations", "error"),
    [
        ({"resources": {"GPU": -1}}, ValueError),
        ({"resources": {"GPU": "two"}}, TypeError),
        ({"retries": -1}, ValueError),
        ({"priority": "high"}, TypeError),
    ],
)
def test_invalid_annotations_fail_with_submits_error(annotations, error):
    with pytest.raises(error):
        dask_graph.task_options(annotations)


def test_unknown_annotation_is_warned_by_name():
    with pytest.warns(dask_graph.UnknownAnnotationWarning, match="'colour_for_unit_test'"):
        assert dask_graph.task_options({"colour_for_unit_test": "red"}) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dask_graph.task_options({"colour_for_unit_test": "blue"})  # once per name


def test_a_delayed_call_inside_a_block_leaves_its_arguments_unannotated():
    load, process = dask.delayed(f1), dask.delayed(f2)
    data = [load(i) for i in range(3)]
    with dask.annotate(resources={"GPU": 1}):
        processed = [process(d) for d in data]
    with dask.annotate(resources={"MEMORY": 70e9}):  # culls the graphs of ``processed``
        final = dask.delayed(sum)(processed)
    _, _, plan = planned(final)
    by_name: dict[str, list] = {}
    for t in plan.tasks:
        by_name.setdefault(name(t.node.key), []).append(t.options)
    assert by_name["f1"] == [{}] * 3
    assert by_name["f2"] == [{"resources": {"GPU": 1}}] * 3
    assert by_name["sum"] == [{"resources": {"MEMORY": 70e9}}]


FRAME = pd.DataFrame({"a": [i % 7 for i in range(60)], "b": range(60), "c": range(60)})


def functions(node) -> set[str]:
    """The functions a (possibly fused) task calls; "data" for an embedded partition."""
    if getattr(node, "func", None) is _execute_subgraph:
        return set().union(*(functions(inner) for inner in node.args[0].values()))
    if isinstance(node, Task):
        return {getattr(node.func, "__name__", "")}
    return {"data"} if isinstance(node, DataNode) else set()


def annotated_step(step: str):
    x = dd.from_pandas(FRAME, npartitions=4)
    other = dd.from_pandas(pd.DataFrame({"a": range(7), "d": range(7)}), npartitions=2)
    with dask.annotate(resources={"GPU": 1}):
        y = {
            "groupby-agg": lambda: x.groupby("a").agg({"b": "sum", "c": "max"}),
            "merge": lambda: x.merge(other, on="a"),
            "shuffle": lambda: x.shuffle("a", npartitions=3),
            "elementwise": lambda: x * 10,
        }[step]()
    return y[["b"]] if step != "groupby-agg" else y["b"] * 2  # a projection pushed in


@pytest.mark.parametrize(
    ("step", "its_functions"),
    [
        ("groupby-agg", {"_groupby_apply_funcs"}),
        ("merge", {"merge_chunk", "_shuffle_group"}),
        ("shuffle", {"_shuffle_group"}),
        ("elementwise", {"mul"}),
    ],
)
def test_annotated_dataframe_steps_keep_their_annotations_through_the_optimizer(
    step, its_functions
):
    with dask.config.set({"dataframe.shuffle.method": "tasks"}):
        _, _, plan = planned(annotated_step(step))
    ran = [(functions(t.node), t.options) for t in plan.tasks]
    in_step = [options for called, options in ran if called & its_functions]
    assert in_step and all(o == {"resources": {"GPU": 1}} for o in in_step)
    inputs = [options for called, options in ran if called == {"data"}]
    assert inputs and all(o == {} for o in inputs)


def test_boundaries_of_an_annotated_step_run_no_task_of_their_own():
    x = dd.from_pandas(FRAME, npartitions=4)
    plain = x.map_partitions(f1).map_partitions(f2)
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_partitions(f1)
    _, _, plan = planned(y.map_partitions(f2))
    assert len(plan.tasks) == dask_task_count(plain)
    # Each task keeps the name of what it runs (progress and logs show it).
    names = sorted(name(t.node.key) for t in plan.tasks)
    assert names == sorted(name(t.node.key) for t in planned(plain)[2].tasks)


def test_a_collection_rebuilt_from_an_annotated_one_is_not_bracketed_again():
    x = dd.from_pandas(FRAME, npartitions=4)
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_partitions(f1)
        again = dd.DataFrame(y.expr)  # e.g. what persist and copies rebuild
    assert again.expr._name == y.expr._name
