"""A large argument a client stored on a worker: held there at once, and restored when
that worker was lost before its tasks ran.

The argument's key is a small task restricted to the worker holding the value
(apportion/stored_args.py), marked ``stored`` (the value's pickled size). While that
worker is connected, the key is taken as held there the moment it is submitted, and the
worker told to hold the value as the key's result (``adopt-stored``, before any task
taking it, on the same connection): no run and no report before the tasks taking it can
be sent, which would cost a task's round trip on the path of every such submit. The task
stays the key's lineage: should the value be gone from the worker (its client's
connection to it ended), a task taking it misses it there, and the scheduler makes it
again from that task, which says the value is gone.

With that worker gone, the task waits in no-worker and the client hears of it; the client
puts the value on another worker and sends the key's task again, restricted to that
worker (or carrying the value, with none connected). This takes that task in place of the
waiting one, on the state (no I/O).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apportion.scheduler.restrictions import restrict

from apportion.protocol import Message
from apportion.resources import to_shape

if TYPE_CHECKING:
    from apportion.scheduler.model import TaskState
    from apportion.scheduler.state_view import StateView


def take_stored(state: StateView, ts: TaskState, spec: Message) -> bool:
    """The new task ``ts`` of a stored argument (``spec``) is held on its worker from now
    on, that worker told to take the value; False (nothing changed) when that worker is not
    connected or is leaving: the task is placed as any other then."""
    ws = state.workers.get(spec["workers"][0])
    if ws is None or ws.closing or ws.retiring:
        return False
    # Before anything about the key reaches the worker: a task taking it, a push of it.
    state.send(ws.address, {"op": "adopt-stored", "key": ts.key, "nbytes": spec["stored"]})
    state.hold_without_run(ts, ws, spec["stored"], "held where its client stored it")
    return True


def restore_argument(state: StateView, client: str, spec: Message) -> bool:
    """The task ``spec`` replaces the one of its key that ``client`` wants and that waits
    for a worker; False (nothing changed) when there is no such task any more (the lost
    worker came back, or the key was released meanwhile)."""
    ts = state.tasks.get(spec["key"])
    if ts is None or ts.state != "no-worker" or client not in ts.who_wants:
        return False
    shape = to_shape(spec.get("resources"))
    if spec.get("workers"):
        shape = restrict(shape, spec["workers"], bool(spec.get("allow_other_workers")))
    state.redefine(ts, spec["func"], spec["args"], shape, "its stored argument was restored")
    return True
