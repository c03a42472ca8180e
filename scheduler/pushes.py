"""Inputs sent to a task's worker by their holder as the task is sent (a push), instead
of asked for by that worker once it reads the task (a fetch): no request's trip and no
holder woken by it, on the path of every task whose input is on another worker.

The scheduler sends ``compute`` to the task's worker naming the inputs pushed
(``pushed``: key -> pickled size), and in the same batch ``push-data`` to one holder of
each (the first the ``deps`` of the task name). The holder sends the value to the worker
unasked (``pushed-data`` on its connection to it, or ``push-failed`` when it does not hold
it any more); the worker awaits it as it would await a fetch, and fetches it as before when
the pusher says it cannot, leaves, or takes too long (worker/state.py, ``push_missed``).

Not pushed: inputs sent with the task (small ones, scheduler/small_results.py), and inputs
the worker holds or is getting for another of its runs (that copy serves both: nothing
comes twice). Between two workers of one host that share memory, the holder pushes the
value's description in shared memory, as it would answer the worker's request (the
``host`` of ``push-data``: the receiving worker's, as it registered). Memory: a push
goes only with a task sent to the worker, which fetches the same input as it reads the
task: it takes no more than the fetch did, and a paused worker is sent no task.

Pure: decides, sends nothing (the state's ``_assign`` puts the messages in its outbox).
"""

from __future__ import annotations

from apportion.scheduler.model import TaskState, WorkerState


def inputs_to_push(
    ts: TaskState,
    ws: WorkerState,
    deps: dict[str, list[str]],
    inline: dict[str, bytes] | None,
    workers: dict[str, WorkerState],
) -> dict[str, int]:
    """The inputs of ``ts``, sent to ``ws``, that their first holder in ``deps`` (key ->
    holders' addresses) should push there, by pickled size. Where the first holder is
    leaving (retiring or closing) and another is not, that one is named first instead (a
    new list in ``deps``: the lists it holds may be shared), so that no push waits on a
    worker about to go."""
    pushed: dict[str, int] = {}
    arriving: set[TaskState] | None = None  # the inputs of the worker's other runs
    for dep in ts.dependencies:
        if ws in dep.who_has or (inline is not None and dep.key in inline):
            continue
        holders = deps[dep.key]
        pusher = _pusher(holders, workers)
        if pusher is None:
            continue
        if pusher != holders[0]:
            deps[dep.key] = [pusher, *(h for h in holders if h != pusher)]
        if arriving is None:
            arriving = set()
            for run in ws.processing.values():
                if run is not ts:
                    arriving.update(run.dependencies)
        if dep in arriving:
            continue  # on its way there already, for another run
        pushed[dep.key] = dep.nbytes
    return pushed


def _pusher(holders: list[str], workers: dict[str, WorkerState]) -> str | None:
    """The holder to push from: the first connected one in service, else the first
    connected one (None: none is connected)."""
    connected = [h for h in holders if h in workers]
    for address in connected:
        ws = workers[address]
        if not (ws.retiring or ws.closing):
            return address
    return connected[0] if connected else None


def push_message(key: str, receiver: WorkerState) -> dict[str, object]:
    """What the pusher of ``key`` is told: send it to ``receiver``."""
    message: dict[str, object] = {"op": "push-data", "key": key, "to": receiver.address}
    host = receiver.info.get("shared_host")
    if host:
        message["host"] = host
    return message
