"""Copies of results on every worker: ``client.scatter(..., broadcast=True)``.

The scheduler asks each worker in service that lacks a result for a copy, exactly as it
asks for copies off a retiring worker (``acquire-data``); the worker fetches it from a
holder and says so (``data-acquired``). Asking again is harmless (a worker already
fetching or holding the key only answers once it holds it), so a client asks until no
worker lacks a copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apportion.scheduler.state_view import StateView


def replicate(state: StateView, keys: list[str]) -> dict[str, Any]:
    """Ask for a copy of each result in ``keys`` on every worker in service without one.

    Returns the reply: ``pending``, the keys that are no result yet (unknown, or not
    computed yet: nothing was asked for them), and ``lacking``, the number of copies
    asked for (none: every worker in service holds every result)."""
    pending = []
    lacking = 0
    for key in keys:
        ts = state.tasks.get(key)
        if ts is None or ts.state != "memory":
            pending.append(key)
            continue
        holders = [holder.address for holder in ts.who_has]
        for ws in state.workers.values():
            if not ws.retiring and ws not in ts.who_has:
                lacking += 1
                state.send(ws.address, {"op": "acquire-data", "key": key, "who_has": holders})
    return {"pending": pending, "lacking": lacking}
