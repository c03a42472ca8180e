"""When a cluster that nobody uses ends: ``spec.idleTimeoutSeconds`` and ``spec.idlePolicy``.

A cluster is idle while its scheduler reports no client connected and no task under way
(waiting, queued, processing, ...; results kept in memory do not count: nobody is left to
read them but a client, and none is connected). After ``idleTimeoutSeconds`` of that, the
operator deletes the cluster (``idlePolicy: delete``, the default) or scales every worker
group to zero (``scaleToZero``: fixed groups to ``replicas: 0``, autoscaled ones to
``minReplicas: 0``; the scheduler stays, so a client that comes back can ask for more).

Pure functions: the reconcile reads the scheduler and the status, asks ``idleness`` what
holds, and carries out what it says (``reconcile.idle_out``).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

IdlePolicy = Literal["delete", "scaleToZero"]
POLICIES: tuple[IdlePolicy, ...] = ("delete", "scaleToZero")
# Task states that are no work under way: a result held, a failure kept, a task let go.
AT_REST = frozenset({"memory", "erred", "released", "forgotten"})
STAMP = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class Idleness:
    """What the status says of an idle cluster, and whether its time is up.

    ``since``/``deadline``: Unix times (None while the cluster is in use, or not watched);
    ``due``: the policy is to be carried out now; ``why``: why the cluster counts as busy
    or idle, in words (for the Event)."""

    since: float | None = None
    deadline: float | None = None
    due: bool = False
    why: str = ""

    def status(self) -> dict[str, Any]:
        """The status fields (None removes one from a merge patch)."""
        return {
            "idleSince": stamp(self.since) if self.since is not None else None,
            "idleDeadline": stamp(self.deadline) if self.deadline is not None else None,
        }


def busy_reason(info: Mapping[str, Any]) -> str | None:
    """Why the scheduler's ``/api/v1/info`` answer says the cluster is in use, or None."""
    clients = int(info.get("clients") or 0)
    if clients:
        return f"{clients} client(s) connected"
    working = {s: n for s, n in (info.get("tasks") or {}).items() if s not in AT_REST and n}
    if working:
        return "tasks under way: " + ", ".join(f"{n} {s}" for s, n in sorted(working.items()))
    return None


def idleness(
    timeout: float | None,
    info: Mapping[str, Any] | None,
    previous_since: float | None,
    now: float,
) -> Idleness:
    """Whether the cluster is idle, since when and until when.

    ``timeout``: the spec's idleTimeoutSeconds (None: never ends on its own);
    ``info``: the scheduler's answer (None while unreachable: nothing is known, so the
    clock neither starts nor fires, but an idle time already counted is kept, so that a
    scheduler restart does not reset it); ``previous_since``: the status's idleSince."""
    if timeout is None:
        return Idleness()
    if info is None:
        if previous_since is None:
            return Idleness(why="the scheduler is not answering")
        return Idleness(previous_since, previous_since + timeout, False, "scheduler not answering")
    busy = busy_reason(info)
    if busy is not None:
        return Idleness(why=busy)
    since = previous_since if previous_since is not None and previous_since <= now else now
    deadline = since + timeout
    return Idleness(
        since,
        deadline,
        now >= deadline,
        f"no client connected and no task for {now - since:.0f} s (idleTimeoutSeconds {timeout:g})",
    )


def scaled_to_zero(workergroups: list[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The spec's ``workerGroups`` with every group at zero: fixed groups ``replicas: 0``,
    autoscaled groups ``minReplicas: 0`` (their autoscaler removes idle workers and adds
    them again on demand). None when every group is at zero already."""
    changed, groups = False, []
    for raw in workergroups:
        group = dict(raw)
        key = "minReplicas" if "maxReplicas" in group else "replicas"
        default = 0 if key == "minReplicas" else 1
        if int(group.get(key, default)) != 0:
            group[key] = 0
            changed = True
        groups.append(group)
    return groups if changed else None


def stamp(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).strftime(STAMP)


def parse_stamp(text: Any) -> float | None:
    """A status timestamp as a Unix time; None for anything else (absent, malformed)."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.datetime.strptime(text, STAMP)
    except ValueError:
        return None
    return moment.replace(tzinfo=datetime.timezone.utc).timestamp()
