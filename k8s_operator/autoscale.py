"""How many workers each group should have: a pure autoscaling decision.

Inputs are what one reconcile observed: every group's per-pod resources, its bounds and
current target, which of its workers are idle and for how long, and the scheduler's
waiting demand by resource shape. The output is a new target per group, the exact workers
to remove, and why.

Policy, in words:
- A demand shape scales only groups that fit it (every resource it asks for, per pod) and
  carry no other kinds of resource than needed, or the fewest extra kinds when every
  fitting group carries some: plain tasks never start GPU pods while a plain group exists.
- Among those, the cheapest group grows first (cost: each resource's amount relative to the
  largest amount of it in any group, summed); one at ``maxReplicas`` spills to the next.
- Pods already wanted but not connected yet count as capacity, so a slow start does not
  trigger more scale-ups (no thrash).
- A group shrinks only when no demand is waiting for it: its workers idle past the group's
  timeout go, longest idle first, never below ``minReplicas``; so do pods that never
  connected within the timeout (e.g. unschedulable).
- Demand no group could ever run (a GPU=8 task when the largest group has GPU=2) is
  reported, never scaled for.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apportion.operator.manifests import LABEL_GROUP
from apportion.operator.pod_state import unschedulable
from apportion.operator.spec import ClusterSpec

from apportion.resources import format_resources


@dataclass(frozen=True)
class GroupView:
    """One worker group as observed in this round."""

    name: str
    resources: Mapping[str, float]  # what each pod advertises
    nthreads: int
    min_replicas: int
    max_replicas: int
    idle_timeout: float
    desired: int  # the current target
    # Connected workers of the group: name -> seconds idle (None while running something).
    connected: Mapping[str, float | None] = field(default_factory=dict)
    # Pods of the group not connected (yet): name -> seconds since created.
    unconnected: Mapping[str, float] = field(default_factory=dict)
    # Those of them Kubernetes reports it cannot place (no node has room).
    unplaced: frozenset[str] = frozenset()

    @property
    def autoscaled(self) -> bool:
        return self.min_replicas != self.max_replicas

    @property
    def stale(self) -> int:
        """Pods not connected within the idle timeout."""
        return sum(1 for age in self.unconnected.values() if age >= self.idle_timeout)


@dataclass(frozen=True)
class Demand:
    """Tasks waiting for a worker with free resources, of one shape."""

    resources: Mapping[str, float]
    tasks: int


@dataclass
class ScaleDecision:
    targets: dict[str, int] = field(default_factory=dict)  # group -> new target replicas
    # group -> pods to remove: idle connected workers (retire through the scheduler first)
    # and pods that never connected.
    remove: dict[str, list[str]] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # group -> why its target changed
    # group -> the pods the nodes place now, where that and not demand bounds the target
    limited: dict[str, int] = field(default_factory=dict)
    impossible: list[tuple[Demand, str]] = field(default_factory=list)  # demand, why


@dataclass
class Scaling:
    """One round's autoscaling, as the status reports it."""

    decision: ScaleDecision
    before: dict[str, int]  # each group's target before this round
    unmet: list[dict[str, Any]]  # waiting demand no worker will be started for


def slots_per_pod(group: GroupView, demand: Mapping[str, float]) -> int:
    """How many tasks of this demand one pod of the group runs at once (0: does not fit)."""
    slots = group.nthreads
    for name, amount in demand.items():
        if amount <= 0:
            continue
        offered = group.resources.get(name, 0.0)
        slots = min(slots, math.floor(offered / amount + 1e-9))
    return max(0, slots)


def cost(group: GroupView, groups: Iterable[GroupView]) -> float:
    """A pod's size relative to the largest of each resource among all groups."""
    largest: dict[str, float] = {}
    for g in groups:
        for name, amount in g.resources.items():
            largest[name] = max(largest.get(name, 0.0), amount)
    return sum(amount / largest[name] for name, amount in group.resources.items() if amount > 0)


def _extra_kinds(group: GroupView, demand: Mapping[str, float]) -> int:
    return sum(1 for name, amount in group.resources.items() if amount > 0 and name not in demand)


def eligible_groups(groups: list[GroupView], demand: Mapping[str, float]) -> list[GroupView]:
    """Groups that may grow for this demand, cheapest first (see the module docstring)."""
    fitting = [g for g in groups if g.max_replicas > 0 and slots_per_pod(g, demand) > 0]
    if not fitting:
        return []
    fewest = min(_extra_kinds(g, demand) for g in fitting)
    chosen = [g for g in fitting if _extra_kinds(g, demand) == fewest]
    return sorted(chosen, key=lambda g: (cost(g, groups), g.name))


def why_impossible(groups: list[GroupView], demand: Mapping[str, float]) -> str:
    """Name the largest offer of each resource the demand asks too much of."""
    if not any(g.max_replicas > 0 for g in groups):
        return "no worker group may have any workers"
    parts = []
    for name, amount in sorted(demand.items()):
        offers = [(g.resources.get(name, 0.0), g.name) for g in groups if g.max_replicas > 0]
        largest, holder = max(offers)
        if largest < amount:
            parts.append(
                f"{name}={amount:g} needed, the most a group offers is {largest:g} ({holder})"
                if largest
                else f"{name}={amount:g} needed, no group has any"
            )
    if not parts:  # each resource fits some group, but no single group has all of them
        parts.append("no single group has all of these together")
    return "no worker group can ever run it: " + "; ".join(parts)


def decide(groups: list[GroupView], demand: list[Demand]) -> ScaleDecision:
    """New targets for the autoscaled groups (fixed groups are left as they are)."""
    decision = ScaleDecision()
    # Pods each group takes on for waiting demand, on top of its connected ones; tasks
    # routed to it (for the reason given); groups some waiting demand could use.
    taken = {g.name: 0 for g in groups}
    routed = {g.name: 0 for g in groups}
    needed: set[str] = set()
    # The most constrained demand first: it has the fewest places to go.
    for item in sorted(demand, key=lambda d: (-len(d.resources), sorted(d.resources.items()))):
        if item.tasks <= 0:
            continue
        order = eligible_groups(groups, item.resources)
        if not order:
            decision.impossible.append((item, why_impossible(groups, item.resources)))
            continue
        needed.update(g.name for g in order)
        left = item.tasks
        for group in order:
            if not group.autoscaled:
                continue  # a fixed group's workers will get to it; they cannot be added to
            # Pods that did not start within the timeout (unschedulable, say) are no
            # capacity: they hold places, so demand spills on to the next group.
            room = group.max_replicas - len(group.connected) - group.stale - taken[group.name]
            if group.unplaced:
                room = 0  # the nodes have no room for more of these pods now
            if room <= 0:
                continue
            slots = slots_per_pod(group, item.resources)
            pods = min(room, math.ceil(left / slots))
            taken[group.name] += pods
            routed[group.name] += min(left, pods * slots)
            left -= pods * slots
            if left <= 0:
                break
    for group in groups:
        if not group.autoscaled:
            continue
        if group.name in needed:
            _grow(group, taken[group.name], routed[group.name], decision)
        else:
            _shrink(group, decision)
    return decision


def _bounded(group: GroupView, target: int) -> int:
    return max(group.min_replicas, min(group.max_replicas, target))


def _grow(group: GroupView, taken: int, tasks: int, decision: ScaleDecision) -> None:
    # Pods wanted but not connected yet (starting) are already part of ``desired``.
    wanted = max(group.desired, len(group.connected) + taken)
    target = _bounded(group, wanted)
    if group.unplaced and _limit_to_placed(group, target, decision):
        return
    decision.targets[group.name] = target
    if target > group.desired and wanted >= target:  # not just raised to minReplicas
        # format_resources writes "-" for nothing at all.
        per_pod = format_resources(dict(group.resources)) if group.resources else "no resources"
        decision.reasons[group.name] = (
            f"{tasks} waiting task(s) fit {group.name} ({per_pod} per pod)"
        )
    elif target != group.desired:
        decision.reasons[group.name] = _bounds_reason(group)


def _limit_to_placed(group: GroupView, target: int, decision: ScaleDecision) -> bool:
    """Some pods of the group cannot be placed: no target above the pods the nodes hold
    now and one pending (the cue a cluster autoscaler adds a node for, and the first to
    start when room appears); the other unplaceable pods go. False: nothing to limit."""
    placed = len(group.connected) + len(group.unconnected) - len(group.unplaced)
    ceiling = max(group.min_replicas, placed + 1)
    if target <= ceiling:
        return False
    surplus = min(len(group.unplaced), target - ceiling)
    decision.targets[group.name] = target - surplus
    decision.remove[group.name] = sorted(group.unplaced)[:surplus]
    decision.limited[group.name] = placed
    decision.reasons[group.name] = (
        f"the nodes place {placed} pod(s) of {group.name} now: {len(group.unplaced)} cannot "
        "be placed; one stays pending for capacity that appears"
    )
    return True


def _shrink(group: GroupView, decision: ScaleDecision) -> None:
    """Nothing waits for this group: drop what idled (or never started) past the timeout."""
    current = _bounded(group, group.desired)
    removable = current - group.min_replicas
    # Pods wanted but never created (refused, e.g. by a quota) go first: nothing is there.
    missing = max(0, current - len(group.connected) - len(group.unconnected))
    dropped = min(removable, missing)
    stale = sorted(
        ((age, name) for name, age in group.unconnected.items() if age >= group.idle_timeout),
        reverse=True,
    )
    idle = sorted(
        (
            (seconds, name)
            for name, seconds in group.connected.items()
            if seconds is not None and seconds >= group.idle_timeout
        ),
        reverse=True,
    )
    chosen = [name for _, name in stale + idle][: removable - dropped]
    target = current - dropped - len(chosen)
    decision.targets[group.name] = target
    if chosen:
        decision.remove[group.name] = chosen
    if chosen or dropped:
        decision.reasons[group.name] = (
            f"no task waits for {group.name} and {len(chosen) + dropped} worker(s) idled or "
            f"did not start within idleTimeoutSeconds={group.idle_timeout:g}"
        )
    elif target != group.desired:
        decision.reasons[group.name] = _bounds_reason(group)


def _bounds_reason(group: GroupView) -> str:
    return f"kept within minReplicas={group.min_replicas}, maxReplicas={group.max_replicas}"


def observe(
    spec: ClusterSpec,
    pods: Sequence[Mapping[str, Any]],
    info: Mapping[str, Any],
    previous_desired: Mapping[str, int],
    now: float,
) -> tuple[list[GroupView], list[Demand]]:
    """GroupViews and waiting demand from one round's pods and scheduler ``info``.

    ``previous_desired``: each group's target from the last status; a group without one
    (new, or just made autoscaled) starts from the pods it has, kept within its bounds.
    """
    workers = {w["name"]: w for w in info.get("workers", {}).values()}
    views = []
    for group in spec.groups:
        mine = [
            p
            for p in pods
            if (p["metadata"].get("labels") or {}).get(LABEL_GROUP) == group.name
            and not p["metadata"].get("deletionTimestamp")
        ]
        connected: dict[str, float | None] = {}
        unconnected: dict[str, float] = {}
        unplaced = set()
        for pod in mine:
            name = pod["metadata"]["name"]
            if name in workers:
                connected[name] = workers[name].get("idle_seconds")
            else:
                unconnected[name] = max(0.0, now - _created(pod, now))
                if unschedulable(pod):
                    unplaced.add(name)
        desired = group.replicas  # fixed size
        if group.autoscaled:
            desired = previous_desired.get(group.name, len(mine))
            desired = max(group.min_replicas, min(group.max_replicas, desired))
        views.append(
            GroupView(
                name=group.name,
                resources=group.advertised,
                nthreads=group.nthreads,
                min_replicas=group.min_replicas,
                max_replicas=group.max_replicas,
                idle_timeout=group.idle_timeout,
                desired=desired,
                connected=connected,
                unconnected=unconnected,
                unplaced=frozenset(unplaced),
            )
        )
    waiting: dict[tuple[tuple[str, float], ...], int] = {}
    for entry in [*info.get("queued", []), *info.get("no_worker", [])]:
        shape = tuple(sorted((entry.get("resources") or {}).items()))
        waiting[shape] = waiting.get(shape, 0) + int(entry.get("tasks", 0))
    return views, [Demand(dict(shape), tasks) for shape, tasks in waiting.items() if tasks > 0]


def _created(pod: Mapping[str, Any], now: float) -> float:
    stamp = pod["metadata"].get("creationTimestamp")
    if not stamp:
        return now
    return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()


def unmet_demand(
    decision: ScaleDecision, groups: list[GroupView], info: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Tasks that wait for a worker nobody will start: impossible ones, and those only a
    fixed-size group without a connected worker could run (the scheduler's reason)."""
    unmet = [
        {"resources": dict(d.resources), "tasks": d.tasks, "why": why}
        for d, why in decision.impossible
    ]
    impossible = {tuple(sorted(d.resources.items())) for d, _ in decision.impossible}
    for entry in info.get("no_worker", []):
        resources = entry.get("resources") or {}
        if tuple(sorted(resources.items())) in impossible:
            continue
        if not any(g.autoscaled for g in eligible_groups(groups, resources)):
            unmet.append({"resources": resources, "tasks": entry["tasks"], "why": entry.get("why")})
    return unmet
