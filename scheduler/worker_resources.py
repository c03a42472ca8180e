"""Changing a worker's resources at runtime (``client.set_resources``), on the state (no I/O).

The new amounts apply to placement at once; runs under way keep what they hold (a worker
may hold more than its new total until they end). Which demands the worker could ever run
is worked out again: queued tasks that no worker could run any longer wait in no-worker,
and tasks waiting in no-worker that it can run now are placed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from apportion.scheduler.adjustments import adjustments

from apportion.resources import format_resources

logger = logging.getLogger("apportion.scheduler")

if TYPE_CHECKING:
    from apportion.scheduler.model import WorkerState
    from apportion.scheduler.state_view import StateView


def set_resources(state: StateView, ws: WorkerState, resources: dict[str, float]) -> None:
    """Give ``ws`` the totals ``resources`` (a resource left out goes to 0)."""
    for name in set(ws.total) | set(resources):
        ws.total[name] = resources.get(name, 0)
        ws.used.setdefault(name, 0)
        ws.free[name] = ws.total[name] - ws.used[name] - ws.held.get(name, 0)
    # First: the tasks placed below must find the new amounts on the worker already.
    state.send(ws.address, {"op": "set-resources", "resources": dict(ws.total)})
    if any(ws.used[name] > ws.total[name] + 1e-9 for name in ws.total):
        adjustments(state).shrunk.add(ws)  # runs keep what they hold: over its total until they end
    else:
        adjustments(state).shrunk.discard(ws)
    state.refit(ws, "its worker's resources were set")
    logger.info("worker %s resources set to %s", ws.name, format_resources(ws.total))
