"""From a Dask expression to apportion tasks, with every annotation where it was written.

Dask keeps annotations on the layers of a high-level graph, but its low-level fusion
(arrays, bags) rebuilds the graph as a plain dict and drops them, blockwise fusion merges
layers whose annotations differ, and dataframes (expressions) ignore them altogether.
So apportion reads them *before* optimization and checks them again after:

1. ``read_annotations`` records, per key, the annotations of the layers of every
   high-level graph in the expression before Dask optimizes it, plus those of the
   dataframe steps written inside an annotate block, found between their boundaries in
   the optimized expression (``apportion.dask_regions``; ``apportion.dask_patches``).
2. ``materialize`` lets Dask optimize as usual, except that blockwise fusion may not
   merge layers whose annotations differ (``optimization.annotations.fuse: False``).
3. ``split_mixed`` takes apart every fused task whose parts were written under different
   annotations and fuses again only runs with equal ones, so fusion never merges tasks
   with different demands and graphs whose annotations agree keep Dask's task count.
4. ``plan`` lists the tasks in dependency order, each with its options (resources,
   retries, priority, timeout) validated exactly as ``Client.submit`` validates them.

Everything here is pure (no I/O, no client): tested on its own.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import dask
from dask._task_spec import (
    Alias,
    GraphNode,
    Task,
    TaskRef,
    _execute_subgraph,
    convert_legacy_graph,
    fuse_linear_task_spec,
)

from apportion.annotations import KNOWN, check_timeout
from apportion.dask_annotations import Annotations, merged
from apportion.resources import validate

Key = Any  # a Dask key: a string, or a tuple such as ("x-1a2b", 3)

# What apportion reads from an annotation (as apportion.annotate takes); Dask's others
# ("workers", "allow_other_workers", ...) name dask.distributed's concepts and are ignored,
# with a warning naming them.
UNDERSTOOD = KNOWN


def to_key(key: Key) -> str:
    """The apportion key of a Dask key (a string, or a tuple such as ``("x-1a2b", 3)``)."""
    return key if isinstance(key, str) else str(key)


class UnknownAnnotationWarning(UserWarning):
    """An annotation key apportion does not use (it understands resources, retries,
    priority, timeout)."""


@dataclass
class AnnotationTable:
    """Annotations per Dask key (from graph layers) and per expression name (dataframes)."""

    by_key: dict[Key, Annotations] = field(default_factory=dict)
    by_name: dict[str, Annotations] = field(default_factory=dict)
    # Tasks that run nothing of their own: Dask's final step (``finalize-...``, added at
    # compute time; fused with the user's last tasks, it takes theirs, so agreeing
    # annotations keep Dask's task count) and the boundaries of annotated dataframe
    # steps (aliases). By key or by name.
    neutral: set[Key] = field(default_factory=set)
    _by_token: dict[str, Annotations] | None = field(default=None, repr=False)

    def lookup(self, key: Key) -> Annotations | None:
        found = self.by_key.get(key)
        if found is None and self.by_name:
            found = self._by_key_name(_name_of(key))
            if found is not None and any(callable(v) for v in found.values()):
                found = _resolved(found, key)  # annotate(priority=lambda key: ...)
        return found

    def _by_key_name(self, name: Any) -> Annotations | None:
        """An expression's tasks are named after it, or (a shuffle's stages, a merge's
        splits) carry its token inside a name of their own: ``split-<name>``."""
        if not isinstance(name, str):
            return None
        found = self.by_name.get(name)
        if found is None:
            if self._by_token is None:
                self._by_token = {n.rsplit("-", 1)[-1]: a for n, a in self.by_name.items()}
            for token in _TOKEN.findall(name):
                found = self._by_token.get(token)
                if found is not None:
                    break
        return found

    def is_neutral(self, key: Key) -> bool:
        return key in self.neutral or _name_of(key) in self.neutral

    def __bool__(self) -> bool:
        return bool(self.by_key) or bool(self.by_name)


# ----------------------------------------------------------------- reading annotations
def read_annotations(expr: Any) -> AnnotationTable:
    """Per-key annotations of every high-level-graph layer in ``expr``, before optimization."""
    from dask._expr import Expr, HLGExpr, HLGFinalizeCompute

    table = AnnotationTable()
    if "dask.dataframe" in sys.modules:  # never imported here: pandas is slow to import
        from apportion import dask_regions

        table.by_name, boundaries = dask_regions.annotations_by_name(expr)
        table.neutral.update(boundaries)
    stack, seen = [expr], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, HLGFinalizeCompute):
            table.neutral.add(node._name)
        if isinstance(node, HLGExpr):
            for layer in node.hlg.layers.values():
                if layer.annotations:
                    _read_layer(layer, layer.annotations, table.by_key)
        for operand in node.operands:
            if isinstance(operand, Expr):
                stack.append(operand)
            elif isinstance(operand, (list, tuple)):
                stack.extend(o for o in operand if isinstance(o, Expr))
    return table


# Dask's deterministic tokens (an md5 in hex) inside a key's name.
_TOKEN = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")


def _name_of(key: Key) -> Any:
    return key[0] if isinstance(key, tuple) and key else key


def _resolved(annotations: Annotations, key: Key) -> dict[str, Any]:
    """Per-key annotations (``annotate(priority=lambda key: ...)``) evaluated for ``key``."""
    from dask._expr import _AnnotationsTombstone

    values = {name: value(key) if callable(value) else value for name, value in annotations.items()}
    # Dask rebuilds delayed graphs with per-key annotations whose "none" is a tombstone.
    return {k: v for k, v in values.items() if not isinstance(v, _AnnotationsTombstone)}


def _read_layer(keys: Iterable[Key], annotations: Annotations, out: dict[Key, Annotations]) -> None:
    if not any(callable(value) for value in annotations.values()):
        shared = dict(annotations)
        out.update(dict.fromkeys(keys, shared))
        return
    for key in keys:  # Dask's per-key form: annotate(priority=lambda key: ...)
        values = _resolved(annotations, key)
        if values:
            out[key] = values


def install() -> None:
    """What Dask needs so that annotations reach apportion intact; idempotent."""
    from apportion import dask_patches

    dask_patches.install()


# ------------------------------------------------------------------------ the graph
def materialize(expr: Any) -> dict[Key, GraphNode]:
    """The optimized task graph of an (already simplified) expression."""
    # Blockwise fusion would otherwise merge an annotated layer into its unannotated
    # neighbours, giving them its demand.
    with dask.config.set({"optimization.annotations.fuse": False}):
        dsk = expr.__dask_graph__()
    return convert_legacy_graph(dsk)


class _Unsplittable(Exception):
    """A fused task whose inputs are not plain references to other tasks."""


def _is_fused(node: GraphNode) -> TypeGuard[Task]:
    return isinstance(node, Task) and node.func is _execute_subgraph


def _parts(node: GraphNode) -> dict[Key, GraphNode]:
    """The tasks a fused task was made of; the node itself for any other.

    Inside, a fused task names its inputs by placeholder keys (``inkeys``) bound to its
    arguments; its parts are rewritten to name the real keys. A part that is itself
    fused is a blockwise unit (tasks of layers Dask fused before, whose annotations agree,
    see ``materialize``) and stays whole: its inner keys are the layer's, not graph keys.
    """
    if not _is_fused(node):
        return {node.key: node}
    fused: Any = node
    inner_dsk, _outkey, inkeys, *inputs = fused.args
    local: dict[Key, Key] = {}
    for inkey, value in zip(inkeys, inputs, strict=True):
        if not isinstance(value, TaskRef):
            raise _Unsplittable(node.key)
        if inkey != value.key:
            local[inkey] = value.key
    # A part may carry no key of its own (bags' lazified tasks): it gets its place's.
    return {
        key: part.substitute(local, key=key) if local or part.key != key else part
        for key, part in inner_dsk.items()
    }


def _annotations_of_parts(
    parts: dict[Key, GraphNode], table: AnnotationTable
) -> dict[Key, Annotations | None]:
    """Each part's annotations; an alias has its target's."""
    found = {k: table.lookup(k) for k, p in parts.items() if not isinstance(p, Alias)}
    for key, part in parts.items():
        target = key
        while isinstance(part, Alias) and part.target in parts:
            target = part.target
            part = parts[target]
        found[key] = found.get(target)
    return found


def _signature(annotations: Annotations | None) -> tuple:
    return () if not annotations else tuple(sorted((k, repr(v)) for k, v in annotations.items()))


def split_mixed(
    graph: dict[Key, GraphNode], table: AnnotationTable, outputs: Iterable[Key]
) -> tuple[dict[Key, GraphNode], dict[Key, Annotations | None]]:
    """Undo fusion across different annotations; returns the graph and each task's annotations.

    A fused task whose parts all carry the same annotations keeps them; one with parts
    under different annotations is replaced by its parts, fused again only along runs of
    equal annotations, and an alias keeps its key reachable.
    """
    result: dict[Key, GraphNode] = {}
    annotations: dict[Key, Annotations | None] = {}
    # Parts of split tasks, added last: a part's key may be held in ``graph`` by Dask's
    # alias to the fused task (its former top), which the part itself now replaces.
    split: dict[Key, GraphNode] = {}
    for key, node in graph.items():
        own = table.lookup(key)
        if own is not None or not _is_fused(node):
            result[key] = node
            annotations[key] = own
            continue
        try:
            parts = _parts(node)
        except _Unsplittable:
            # Cannot be taken apart: it runs as one task, with the largest of each demand.
            result[key] = node
            inner = dict(node.args[0])
            annotations[key] = merged(_annotations_of_parts(inner, table).values())
            continue
        found = _annotations_of_parts(parts, table)
        distinct = {_signature(a): a for k, a in found.items() if not table.is_neutral(k)}
        if len(distinct) <= 1:
            result[key] = node
            annotations[key] = next(iter(distinct.values()), None)
            continue
        outkey = node.args[1]
        # A part whose dependent (inside this task) is written under other annotations ends
        # a run: fuse_linear_task_spec never fuses a key it is asked to keep.
        boundaries = {outkey}
        for k, part in parts.items():
            for dep in part.dependencies:
                if dep in found and _signature(found[dep]) != _signature(found[k]):
                    boundaries.add(dep)
        refused = fuse_linear_task_spec(parts, keys=boundaries)
        for k, part in refused.items():
            split[k] = part
            # A refused run's parts share their annotations: any one's will do.
            members = part.args[0] if _is_fused(part) else (k,)
            annotations[k] = found.get(next(iter(members)), found.get(k))
        if key != outkey:
            split[key] = Alias(key, target=outkey)
            annotations[key] = found.get(outkey)
    result.update(split)
    _collapse_aliases(result, annotations, set(outputs))
    return result, {k: v for k, v in annotations.items() if v is not None}


def _collapse_aliases(
    graph: dict[Key, GraphNode], annotations: dict[Key, Annotations | None], outputs: set[Key]
) -> None:
    """Replace ``a -> b`` aliases by ``b`` itself where only ``a`` uses ``b``: one task fewer."""
    dependents: dict[Key, int] = {}
    for each in graph.values():
        for dep in each.dependencies:
            dependents[dep] = dependents.get(dep, 0) + 1
    for key in list(graph):
        node: GraphNode | None = graph.get(key)
        if not isinstance(node, Alias):
            continue
        target: Key = node.target
        while (
            isinstance(node, Alias)
            and target != key
            and target in graph
            and target not in outputs
            and dependents.get(target) == 1
        ):
            moved: GraphNode = graph.pop(target).substitute({}, key=key)
            graph[key] = moved
            moved_annotations = annotations.pop(target, None)
            annotations.pop(key, None)
            if moved_annotations is not None:
                annotations[key] = moved_annotations
            node = moved
            target = node.target if isinstance(node, Alias) else None


# --------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class GraphTask:
    """One task to submit: what runs, which keys it needs, and its options."""

    key: str
    node: GraphNode
    deps: dict[Key, str]  # Dask key -> apportion key of each dependency
    options: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    tasks: list[GraphTask]  # dependencies first
    external: set[str]  # keys used but not computed here: results the client already holds


def plan(
    graph: dict[Key, GraphNode],
    outputs: Iterable[Key],
    annotations: Mapping[Key, Annotations | None],
    defaults: Annotations | None = None,
) -> Plan:
    """Tasks in dependency order with validated options; ``defaults`` (the annotations in
    force when compute/persist is called) apply wherever a layer says nothing else."""
    options = _OptionsCache(defaults or {})
    order: list[GraphTask] = []
    external: set[str] = set()
    done: set[Key] = set()
    for root in outputs:
        if root in done:
            continue
        stack: list[tuple[Key, bool]] = [(root, False)]
        while stack:
            key, expanded = stack.pop()
            if key in done:
                continue
            node = graph.get(key)
            if node is None:
                external.add(to_key(key))
                done.add(key)
                continue
            if _is_existing(key, node):
                external.add(to_key(node.target))  # type: ignore[attr-defined]
                done.add(key)
                continue
            if not expanded:
                if key in node.dependencies:
                    raise ValueError(f"Dask task {key!r} depends on itself")
                stack.append((key, True))
                stack.extend((dep, False) for dep in node.dependencies if dep not in done)
                continue
            done.add(key)
            deps = {dep: _apportion_key(graph, dep) for dep in node.dependencies}
            order.append(GraphTask(to_key(key), node, deps, options.get(annotations.get(key))))
    return Plan(order, external)


def _is_existing(key: Key, node: GraphNode) -> bool:
    """Whether graph key ``key`` stands for a future's result (a persisted collection's
    chunk, say). Compared with the graph's key, not the node's own: an alias collapsed into
    another key (``_collapse_aliases``) keeps its node, and that key still needs a task."""
    return isinstance(node, Alias) and to_key(node.target) == to_key(key)


def _apportion_key(graph: dict[Key, GraphNode], key: Key) -> str:
    node = graph.get(key)
    if node is not None and _is_existing(key, node):
        return to_key(node.target)  # type: ignore[attr-defined]
    return to_key(key)


class _OptionsCache:
    """Validated task options per distinct annotation (many keys share one)."""

    def __init__(self, defaults: Annotations) -> None:
        self.defaults = dict(defaults)
        self._cache: dict[tuple, dict[str, Any]] = {}

    def get(self, annotations: Annotations | None) -> dict[str, Any]:
        merged = {**self.defaults, **annotations} if annotations else self.defaults
        signature = _signature(merged)
        found = self._cache.get(signature)
        if found is None:
            found = self._cache[signature] = task_options(merged)
        return found


_warned_unknown: set[str] = set()


def task_options(annotations: Annotations) -> dict[str, Any]:
    """Submit options from annotations, checked as ``Client.submit`` checks its arguments.

    Only non-default options are returned (the scheduler treats absent as none/zero).
    """
    unknown = sorted(set(annotations) - set(UNDERSTOOD))
    for name in unknown:
        if name not in _warned_unknown:
            _warned_unknown.add(name)
            warnings.warn(
                f"annotation {name!r} is ignored: apportion reads only {list(UNDERSTOOD)} "
                "from Dask annotations",
                UnknownAnnotationWarning,
                stacklevel=2,
            )
    out: dict[str, Any] = {}
    resources = validate(annotations.get("resources"))
    if resources:
        out["resources"] = resources
    retries = annotations.get("retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be a whole number >= 0, got {retries!r}")
    if retries:
        out["retries"] = retries
    priority = annotations.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        raise TypeError(f"priority must be an integer, got {priority!r}")
    if priority:
        out["priority"] = int(priority)
    timeout = check_timeout(annotations.get("timeout"))
    if timeout is not None:
        out["timeout"] = timeout
    return out


def graph_of(expr: Any, outputs: list[Key]) -> tuple[dict[Key, GraphNode], dict[Key, Any]]:
    """Optimized graph of ``expr`` and each task's annotations (see the module's steps)."""
    table = read_annotations(expr)
    graph = materialize(expr)
    if table:
        return split_mixed(graph, table, outputs)
    annotations: dict[Key, Annotations | None] = {}
    _collapse_aliases(graph, annotations, set(outputs))
    return graph, annotations
