"""Dask collections on apportion: the scheduler protocol behind ``Client.get``,
``Client.compute`` and ``Client.persist``.

A graph goes to the scheduler as one ``submit`` message holding every task, in
dependency order, followed by one ``release`` of the intermediate keys: the client then
holds futures only for the keys asked for, and the scheduler forgets each intermediate
result once the tasks that need it are done. The graph's nodes travel in chunks
(``load_chunk``), each a task of its own; a task (``run_node``) takes its chunk and its
dependencies' values as arguments, by the persistent-id mechanism that passes futures
as arguments (``apportion.serialize``). How annotations reach the tasks:
``apportion.dask_graph``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dask
from dask.base import collections_to_expr, is_dask_collection, unpack_collections
from dask.core import flatten

from apportion import dask_graph
from apportion.annotations import current as current_annotations
from apportion.dask_graph import Key, to_key
from apportion.future_table import FutureTable
from apportion.futures import Future
from apportion.restrictions import worker_restriction
from apportion.serialize import dumps_args
from apportion.session import task_bytes_limit


class _Ref:
    """A dependency inside a task's arguments: its key, resolved to the value on the worker."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


# Tasks per graph chunk: each chunk of the graph is pickled at once (one memo for all its
# tasks: some twenty times faster than a pickle per task) and becomes a task of its own
# that every task of the chunk depends on, so a worker unpickles a chunk once.
CHUNK_TASKS = 1000


def load_chunk(chunk: list[tuple[Any, tuple]]) -> list[tuple[Any, tuple]]:
    """On the worker: a chunk of the graph, ``[(node, dependency keys), ...]``, already
    unpickled (futures written into the graph, as ``delayed(f)(future)`` does, resolved to
    their values on the way)."""
    return chunk


def run_node(chunk: list[tuple[Any, tuple]], index: int, *values: Any) -> Any:
    """On the worker: run one Dask task, given its dependencies' values in order.

    A lazy result (bags pass ``map``/``filter`` iterators between tasks) is evaluated here,
    so its work runs where its task's resources were granted, not in a later task."""
    node, deps = chunk[index]
    result = node(dict(zip(deps, values, strict=True)))
    if isinstance(result, Iterator):
        result = list(result)
        if result and isinstance(result[0], Iterator):
            result = [list(part) for part in result]
    return result


# -------------------------------------------------------------------- submission
@dataclass(frozen=True)
class GraphOptions:
    """What a call (``Client.compute``, ``persist``, ``get``) asks of every task of its
    graph: annotations (resources, retries, priority) where a layer says nothing else, and
    the workers it may run on."""

    defaults: dict[str, Any] = field(default_factory=dict)
    restriction: dict[str, Any] = field(default_factory=dict)


def graph_options(
    resources: dict[str, float] | None = None,
    workers: str | list[str] | None = None,
    allow_other_workers: bool = False,
    retries: int | None = None,
    priority: int | None = None,
) -> GraphOptions:
    """Options of a call, as Dask's ``compute``/``persist``/``get`` take them: they apply to
    every task of the graph, over the annotations in force where the call is made (the
    annotations of the collection's own layers still win, as in Dask)."""
    given = {"resources": resources, "retries": retries, "priority": priority}
    defaults = {**call_annotations(), **{k: v for k, v in given.items() if v is not None}}
    dask_graph.task_options(defaults)  # checked now, with a clear error, not per task
    restriction = {} if workers is None else worker_restriction(workers, allow_other_workers)
    return GraphOptions(defaults, restriction)


def submit_graph(
    table: FutureTable, expr: Any, outputs: list[Key], options: GraphOptions | None = None
) -> dict[Key, Future]:
    """Submit the graph of ``expr`` in one message; futures for ``outputs``."""
    graph, annotations = dask_graph.graph_of(expr, outputs)
    options = options or graph_options()
    return submit_tasks(table, graph, annotations, outputs, options.defaults, options.restriction)


def submit_tasks(
    table: FutureTable,
    graph: dict[Key, Any],
    annotations: dict[Key, Any],
    outputs: list[Key],
    defaults: dict[str, Any] | None = None,
    restriction: dict[str, Any] | None = None,
) -> dict[Key, Future]:
    if defaults is None:
        defaults = call_annotations()
    plan = dask_graph.plan(graph, outputs, annotations, defaults)
    session = table.session
    session.check_open()
    missing = sorted(k for k in plan.external if k not in table.states)
    if missing:
        raise KeyError(
            f"the graph uses results {missing[:5]} that this client holds no future for: "
            "keep persisted collections (or their futures) alive while computing from them"
        )
    run = session.functions.dumps(run_node)
    load = session.functions.dumps(load_chunk)
    limit = task_bytes_limit(session.peer_max_frame)
    prefix = f"dask-graph-{table.unique_token()}"
    specs: list[dict[str, Any]] = []
    for start in range(0, len(plan.tasks), CHUNK_TASKS):
        tasks = plan.tasks[start : start + CHUNK_TASKS]
        chunk_key = f"{prefix}-{start // CHUNK_TASKS}"
        data, held = dumps_args(([(t.node, tuple(t.deps)) for t in tasks],), {}, Future)
        if len(data) > limit:
            raise ValueError(
                f"{len(tasks)} Dask tasks serialize to {len(data):,} bytes, more than "
                f"comm.max-frame-bytes allows ({limit:,}): build the collection from data "
                "the workers load (or from client.scatter futures) instead of embedding it"
            )
        chunk_spec: dict[str, Any] = {"key": chunk_key, "func": load, "args": data}
        if held:
            chunk_spec["deps"] = held
        specs.append(chunk_spec)
        chunk = _Ref(chunk_key)
        for index, task in enumerate(tasks):
            refs = [_Ref(key) for key in task.deps.values()]
            args, deps = dumps_args((chunk, index, *refs), {}, _Ref)
            specs.append(
                {
                    "key": task.key,
                    "func": run,
                    "args": args,
                    "deps": deps,
                    **task.options,
                    **(restriction or {}),
                }
            )
    futures = {key: table.future(to_key(key)) for key in dict.fromkeys(outputs)}
    wanted = table.attach_lineage(specs)  # for a new scheduler after a restart
    intermediate = [s["key"] for s in specs if s["key"] not in wanted]
    if specs:
        session.post({"op": "submit", "tasks": specs})
    if intermediate:
        session.post({"op": "release", "keys": intermediate})
    return futures


def call_annotations() -> dict[str, Any]:
    """Annotations in force where compute/persist is called: they apply to the whole graph
    (layers' own annotations win)."""
    return {**dask.get_annotations(), **current_annotations()}


def cluster_settings() -> Any:
    """Dask settings for graphs that run on a cluster, where the user has not chosen.

    Dask shuffles dataframes on local disk (partd) unless a dask.distributed client
    exists: apportion's workers are separate processes, on other hosts on Kubernetes, so
    shuffles (groupby with split_out, merge, set_index, shuffle) run as tasks instead."""
    if dask.config.get("dataframe.shuffle.method", None) is None:
        return dask.config.set({"dataframe.shuffle.method": "tasks"})
    return contextlib.nullcontext()


# -------------------------------------------------------------------- the protocol
def get(
    table: FutureTable,
    dsk: Any,
    keys: Any,
    options: GraphOptions | None = None,
    sync: bool = True,
) -> Any:
    """Dask's scheduler function: ``dask.compute(x, scheduler=client.get)``; futures in
    place of results when not ``sync``."""
    outputs = list(flatten(keys)) if isinstance(keys, list) else [keys]
    expr = _as_expr(dsk, outputs)
    futures = submit_graph(table, expr, outputs, options)
    if not sync:
        return _pack(keys, futures)
    values = dict(zip(futures, table.gather(list(futures.values())), strict=True))
    return _pack(keys, values)


def _pack(keys: Any, values: dict[Key, Any]) -> Any:
    if isinstance(keys, list):
        return [_pack(k, values) for k in keys]
    return values[keys]


def _as_expr(dsk: Any, outputs: list[Key]) -> Any:
    """What ``get`` was given (an expression from dask.compute, a high-level graph or a
    plain dict) as an expression."""
    from dask._expr import Expr, HLGExpr
    from dask.highlevelgraph import HighLevelGraph

    if isinstance(dsk, Expr):
        return dsk
    if not isinstance(dsk, HighLevelGraph):
        dsk = HighLevelGraph.from_collections(f"graph-{id(dsk)}", dict(dsk), dependencies=())
    return HLGExpr(dsk=dsk, output_keys=outputs)


def compute(
    table: FutureTable,
    collections: Any,
    optimize_graph: bool = True,
    options: GraphOptions | None = None,
) -> Any:
    """Futures of the results: one for a collection, a list for a list."""
    from dask._expr import FinalizeCompute

    single = not isinstance(collections, (list, tuple))
    items = [collections] if single else list(collections)
    found = [c for c in items if is_dask_collection(c) and not isinstance(c, Future)]
    if found:
        with cluster_settings():
            expr = FinalizeCompute(collections_to_expr(found, optimize_graph)).optimize()
        keys = list(flatten(expr.__dask_keys__()))
        if len(keys) != len(found):
            raise RuntimeError(
                f"expected one result key per collection, got {len(keys)} for {len(found)}"
            )
        futures = submit_graph(table, expr, keys, options)
        by_collection = {id(c): futures[k] for c, k in zip(found, keys, strict=True)}
    else:
        by_collection = {}
    out = [by_collection.get(id(c), c) for c in items]
    return out[0] if single else out


def persist(
    table: FutureTable,
    collections: Any,
    optimize_graph: bool = True,
    options: GraphOptions | None = None,
) -> Any:
    """The same collections, their chunks held by futures on the cluster."""
    from dask._expr import CompositeExpr, _ExprSequence
    from dask.base import _rebuild_composite_collection

    single = not isinstance(collections, (list, tuple))
    items, repack = unpack_collections(*([collections] if single else collections))
    if not items:
        return collections
    # As dask.persist does it, with futures instead of results.
    expr = collections_to_expr(items, optimize_graph)
    collection_exprs = list(expr.operands) if isinstance(expr, _ExprSequence) else [expr]
    composite = any(isinstance(e, CompositeExpr) for e in collection_exprs)
    with cluster_settings():
        expr = expr.optimize()
    if composite:
        collection_exprs = list(expr.operands) if isinstance(expr, _ExprSequence) else [expr]
    else:
        collection_exprs = [None] * len(items)
    keys: list[Key] = []
    rebuilds: list[tuple[Any, Any, Any]] = []
    for item, item_expr, item_keys in zip(
        items, collection_exprs, expr.__dask_keys__(), strict=True
    ):
        flat = list(flatten(item_keys))
        keys.extend(flat)
        if isinstance(item_expr, CompositeExpr):
            rebuilds.append((item, item_expr, None))
        else:
            rebuild, state = item.__dask_postpersist__()
            rebuilds.append((rebuild, flat, state))
    futures = submit_graph(table, expr, keys, options)
    out = []
    for rebuild, item_keys, state in rebuilds:
        if state is None:
            out.append(
                _rebuild_composite_collection(rebuild, item_keys, futures, cull_to_child_keys=True)
            )
        else:
            out.append(rebuild({k: futures[k] for k in item_keys}, *state))
    results = repack(out)
    return results[0] if single else list(results)
