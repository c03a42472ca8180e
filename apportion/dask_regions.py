"""Annotations on dataframe expressions that survive Dask's expression optimizer.

A Dask dataframe is an expression that the optimizer rewrites before any task exists: a
column projection is pushed into a groupby or a merge, a merge is lowered into shuffles
and a blockwise join, blockwise steps are fused, and every rewritten step gets a new name.
Annotations recorded by expression name are lost on the way.

So an annotated step is *bracketed* instead. When a dataframe collection is created
inside an annotate block (``bracket``), its new expression is wrapped between identity
expressions (``AnnotationBoundary``): an *exit* above it, and an *enter* above each input
it was built from (the expressions of collections that existed before). Boundaries are
blockwise no-ops that let projections and filters through, so the optimizer moves, lowers
and fuses the step as it would without them; whatever it leaves between a region's exit
and its enters is that step's work, and takes the step's annotations
(``annotations_by_name``). A boundary's task is an alias of its input: it runs nothing,
and disappears inside a fused task or where ``dask_graph`` collapses aliases.

What this costs: an optimization that must see a node's exact type *across* the edge of
an annotated step does not happen there (each such edge is one where an unannotated and
an annotated task would otherwise be fused into one, which apportion must not do anyway).

Everything here is pure (no I/O, no client); only ``dask.dataframe`` is imported, and
only by the callers that already hold a dataframe.
"""

from __future__ import annotations

import functools
import hashlib
import weakref
from collections.abc import Mapping
from typing import Any, Literal

from dask._expr import Expr as AnyExpr
from dask._task_spec import Alias, Task
from dask.dataframe.dask_expr._expr import Elemwise, Expr, Fused

from apportion.dask_annotations import merged

Side = Literal["enter", "exit"]


class Region:
    """One annotated step: the annotations in force when it was written, and a name that
    pairs its exit with its enters (equal steps under equal annotations share it)."""

    __slots__ = ("annotations", "token")

    def __init__(self, annotations: Mapping[str, Any], token: str) -> None:
        self.annotations = dict(annotations)
        self.token = token

    def __dask_tokenize__(self) -> str:
        return self.token

    def __reduce__(self) -> tuple[Any, ...]:
        return (Region, (self.annotations, self.token))

    def __repr__(self) -> str:
        return f"Region({self.annotations!r})"


def _identity(frame: Any, *_: Any) -> Any:
    return frame


class AnnotationBoundary(Elemwise):
    """The edge of an annotated step: its output (``side="exit"``) or one of its inputs
    (``"enter"``). Computes nothing; projections and filters pass through it."""

    _parameters = ["frame", "region", "side"]
    _projection_passthrough = True
    _filter_passthrough = True
    _preserves_partitioning_information = True
    operation = staticmethod(_identity)

    @functools.cached_property
    def _name(self) -> str:
        # Named as the step it stands for: where apportion runs the step's task under
        # the boundary's key (an alias collapsed), progress and logs show its real name.
        prefix = self.frame._name.rsplit("-", 1)[0]
        return f"{prefix}-{self.deterministic_token}"

    def _task(self, name: Any, index: int) -> Task:
        frame = self.frame
        source = (frame._name, 0 if self._broadcast_dep(frame) else index)
        return Alias(name, source)  # type: ignore[return-value]


# The expression of every dataframe collection created since ``remember`` was first
# called, by name: what an annotated step was built from (its inputs) is found here.
_collections: weakref.WeakValueDictionary[str, Expr] = weakref.WeakValueDictionary()


def remember(expr: Expr) -> None:
    """Note the expression of a collection just created."""
    _collections[expr._name] = expr


def bracket(expr: Expr, annotations: Mapping[str, Any]) -> Expr:
    """``expr`` (a collection's, created under ``annotations``) between boundaries.

    An expression that is already a collection's (nothing new was written) comes back as
    it is; so does one under the same annotations again."""
    if expr._name in _collections:
        return expr
    signature = repr(sorted((str(k), repr(v)) for k, v in annotations.items()))
    token = hashlib.sha1(f"{expr._name}|{signature}".encode()).hexdigest()
    region = Region(annotations, token)
    inner: AnyExpr = expr
    for each in _inputs(expr):
        inner = inner.substitute(each, AnnotationBoundary(each, region, "enter"))
    return AnnotationBoundary(inner, region, "exit")


def _inputs(expr: Expr) -> list[Expr]:
    """The expressions ``expr`` was built from that belong to earlier collections."""
    found: dict[str, Expr] = {}
    stack = list(expr.dependencies())
    seen: set[str] = set()
    while stack:
        node = stack.pop()
        if node._name in seen:
            continue
        seen.add(node._name)
        if node._name in _collections or isinstance(node, AnnotationBoundary):
            found[node._name] = node
        else:
            stack.extend(node.dependencies())
    return list(found.values())


def annotations_by_name(expr: Any) -> tuple[dict[str, Mapping[str, Any]], set[str]]:
    """Walk an optimized expression: the annotations of every expression between a
    region's exit and its enters (the innermost region wins), and the boundaries' names
    (they run nothing: neutral when a fused task's parts are compared)."""
    by_name: dict[str, Mapping[str, Any]] = {}
    boundaries: set[str] = set()
    # Each node with the regions it lies in (outermost first).
    stack: list[tuple[Any, tuple[Region, ...]]] = [(expr, ())]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while stack:
        node, regions = stack.pop()
        mark = (node._name, tuple(r.token for r in regions))
        if mark in seen:
            continue
        seen.add(mark)
        if isinstance(node, AnnotationBoundary):
            boundaries.add(node._name)
            region = node.operand("region")
            if node.operand("side") == "exit":
                regions = (*regions, region)
            else:
                tokens = [r.token for r in regions]
                if region.token in tokens:
                    regions = regions[: tokens.index(region.token)]
        elif regions:
            annotations: Mapping[str, Any] = regions[-1].annotations
            previous = by_name.get(node._name)
            if previous is not None and previous != annotations:
                annotations = merged([previous, annotations]) or {}
            by_name[node._name] = annotations
        if isinstance(node, Fused):
            # Its parts keep their own names inside its tasks; its first part leads.
            stack.append((node.exprs[0], regions))
            continue
        for operand in node.operands:
            if isinstance(operand, AnyExpr):
                stack.append((operand, regions))
            elif isinstance(operand, (list, tuple)):
                stack.extend((o, regions) for o in operand if isinstance(o, AnyExpr))
    return by_name, boundaries
