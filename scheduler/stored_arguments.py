"""A large argument a client stored on a worker that was lost before its tasks ran.

The argument's key is a small task restricted to the worker holding the value
(apportion/stored_args.py). With that worker gone, the task waits in no-worker and the
client hears of it; the client puts the value on another worker and sends the key's task
again, restricted to that worker (or carrying the value, with none connected). This
takes that task in place of the waiting one, on the state (no I/O).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apportion.scheduler.restrictions import restrict

from apportion.protocol import Message
from apportion.resources import to_shape

if TYPE_CHECKING:
    from apportion.scheduler.state_view import StateView


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
