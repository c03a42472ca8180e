"""What a client re-registers with a new scheduler: the tasks it still wants, and the tasks
they were computed from, each as it was first submitted (no results).

Each future's state keeps the ``submit`` spec it was sent with and the states of its
dependencies (``FutureState.spec`` / ``.deps``): references to what the client built when
submitting, not copies. The tasks of a piece of a map keep only their row in a
``MapPiece`` (apportion/futures.py): the rest of their message shared, their arguments in
one buffer. A
dependency whose own future was dropped stays reachable from its dependents, so a result
lost with its worker can still be recomputed after a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from apportion.futures import FutureState

Message = dict[str, Any]

# A wanted future: still pending, or finished (its result may be needed again).
WANTED = frozenset({"pending", "finished"})


def re_registration(states: Iterable[FutureState]) -> tuple[list[Message], list[str]]:
    """The specs to submit again, every dependency before its dependents, and the keys
    among them the client holds no future for (only lineage: released once registered)."""
    specs: list[Message] = []
    seen: set[str] = set()
    wanted: set[str] = set()
    for root in states:
        if root.status not in WANTED or not root.has_lineage():
            continue
        wanted.add(root.key)
        if root.key in seen:
            continue
        seen.add(root.key)
        for state in _dependencies_first(root, seen, FutureState.has_lineage):
            specs.append(state.spec)  # type: ignore[arg-type]  # checked on the way in
    lineage_only = [spec["key"] for spec in specs if spec["key"] not in wanted]
    return specs, lineage_only


def attach(states: dict[str, FutureState], specs: list[Message]) -> None:
    """Give lineage to states made without ``Client.submit`` (a Dask graph's outputs):
    ``specs`` in submission order, dependencies first. Keys without a state here (the
    graph's intermediates) get one of their own, reachable only from their dependents."""
    nodes: dict[str, FutureState] = {}
    for spec in specs:
        key = spec["key"]
        state = states.get(key)
        if state is None or state.has_lineage():
            state = FutureState(key)  # not held by any future: lineage only
        state.spec = spec
        deps = spec.get("deps")
        if deps:
            found = (nodes.get(dep) or states.get(dep) for dep in deps)
            state.deps = [dep for dep in found if dep is not None]
        nodes[key] = state


def failed(states: Iterable[FutureState]) -> list[FutureState]:
    """The failed tasks to run again for ``states`` (``Future.retry``): each failed one with
    its lineage, and the failed tasks it was computed from, dependencies first."""
    out: list[FutureState] = []
    seen: set[str] = set()
    for root in states:
        if root.status != "error" or not root.has_lineage() or root.key in seen:
            continue
        seen.add(root.key)
        out.extend(
            _dependencies_first(root, seen, lambda d: d.status == "error" and d.has_lineage())
        )
    return out


def _dependencies_first(
    root: FutureState, seen: set[str], follow: Callable[[FutureState], bool]
) -> Iterator[FutureState]:
    """``root`` and the dependencies ``follow`` accepts that are not in ``seen`` (added to
    it), each after its own dependencies. Iterative (chains may be long): a state is given
    on its second visit, once its dependencies have been."""
    stack: list[tuple[FutureState, bool]] = [(root, False)]
    while stack:
        state, expanded = stack.pop()
        if expanded:
            yield state
            continue
        stack.append((state, True))
        for dep in reversed(state.deps):
            if dep.key not in seen and follow(dep):
                seen.add(dep.key)
                stack.append((dep, False))
