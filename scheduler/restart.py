"""``client.restart()`` on the scheduler: every task forgotten, its clients told, and the
workers told to restart (their nanny starts them afresh: ``LocalCluster``, ``apportion
worker --nworkers``, or Kubernetes restarting the container)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from apportion.scheduler.model import NOTHING

if TYPE_CHECKING:
    from apportion.scheduler.state_view import StateView


def forget_all_tasks(state: StateView, reason: str) -> int:
    """Cancel every task for every client (each told ``reason``); returns how many."""
    tasks = list(state.tasks.values())
    for ts in tasks:
        for wanter in ts.who_wants:
            state.send(wanter, {"op": "task-cancelled", "key": ts.key, "reason": reason})
        ts.who_wants = NOTHING
    for ts in tasks:
        state.release_if_unneeded(ts)
    return len(tasks)
