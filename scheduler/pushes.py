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

Ahead of their tasks (``inputs_to_push_ahead``): when a task takes the last units of its
demand on a worker (its one GPU, say), the next tasks of that demand queued can start there
only as the runs before them end; their large inputs on other workers are pushed there
now, while those run, so that each starts without waiting for its inputs. Without it, a
worker of one GPU taking 8 MB inputs made on a CPU worker waited 1.3-1.6 ms between runs
of about 1 ms (the transfer, then the run, one after the other); with it, 1.0-1.1 ms (the
report's and the next task's round trip). What is pushed ahead is held there as a copy
(``WorkerState.pushing`` until the worker says it has it) and kept while its task is still
queued next there (``WorkerState.next_up``), then dropped as any copy no task there needs;
a task sent there taking it names the push under way, and no second push is sent (one
sent ahead more than ``AHEAD_FRESH_S`` before is sent again: it may never come).
Bounded: the next ``AHEAD_TASKS`` (two: two transfers overlap where one takes longer than
a run) of the demand per worker, ``AHEAD_MOST_BYTES`` at most, inputs of
``AHEAD_LEAST_BYTES`` or more (smaller ones move in about a round trip), none that a run
there takes already (held or on its way: one copy serves them all), only from a holder in
service, and never to a paused worker or one past its spilling level.

Pure: decides, sends nothing (the state's ``_assign`` puts the messages in its outbox).
"""

from __future__ import annotations

from collections.abc import Iterable

from apportion.scheduler.model import TaskState, WorkerState

AHEAD_TASKS = 2
AHEAD_LEAST_BYTES = 2**20
AHEAD_MOST_BYTES = 256 * 2**20
# Seconds a push ahead counts as on its way: one that never came (the holder freed the
# value meanwhile, and told only the receiver) is sent again after that, not awaited.
AHEAD_FRESH_S = 2.0


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
            deps[dep.key] = _first(pusher, holders)
        if arriving is None:
            arriving = _inputs_of_runs(ws, but=ts)
        if dep in arriving:
            continue  # on its way there already, for another run
        pushed[dep.key] = dep.nbytes
    return pushed


def inputs_to_push_ahead(
    after: list[TaskState], ws: WorkerState, workers: dict[str, WorkerState], now: float
) -> dict[str, str]:
    """The inputs of ``after`` (queued, the next of their demand to start on ``ws``) to
    push to ``ws`` now: key -> the holder to push it (see the module's docstring for the
    bounds)."""
    if ws.paused or ws.nearly_full:
        return {}
    ahead: dict[str, str] = {}
    total = 0
    arriving: set[TaskState] | None = None  # the inputs of its runs: held or on their way
    for nxt in after:
        for dep in nxt.dependencies:
            nbytes, key = dep.nbytes, dep.key
            if nbytes < AHEAD_LEAST_BYTES or ws in dep.who_has:
                continue
            if _under_way(ws, key, now) is not None:
                continue
            if arriving is None:
                arriving = _inputs_of_runs(ws)
            if dep in arriving:
                continue  # one copy serves them all
            if key in ahead or dep.state != "memory" or total + nbytes > AHEAD_MOST_BYTES:
                continue
            pusher = _in_service((holder.address for holder in dep.who_has), workers)
            if pusher is None:  # only from a worker in service: it is not urgent
                continue
            ahead[key] = pusher
            total += nbytes
    return ahead


def named_pusher(key: str, holders: list[str], ws: WorkerState, now: float) -> list[str] | None:
    """Where a push of ``key`` to ``ws`` is under way (sent ahead) from one of
    ``holders``: the holders with that pusher first (the worker awaits the push from the
    first named); None when none is (the entry, if any, is forgotten)."""
    pusher = _under_way(ws, key, now)
    ws.pushing.pop(key, None)
    if pusher is None or pusher not in holders:
        return None
    return _first(pusher, holders)


def _under_way(ws: WorkerState, key: str, now: float) -> str | None:
    """The pusher of ``key`` to ``ws`` sent ahead less than ``AHEAD_FRESH_S`` ago."""
    entry = ws.pushing.get(key)
    if entry is None or now - entry[1] > AHEAD_FRESH_S:
        return None
    return entry[0]


def _pusher(holders: list[str], workers: dict[str, WorkerState]) -> str | None:
    """The holder to push from: the first connected one in service, else the first
    connected one (None: none is connected)."""
    in_service = _in_service(holders, workers)
    if in_service is not None:
        return in_service
    return next((h for h in holders if h in workers), None)


def _in_service(holders: Iterable[str], workers: dict[str, WorkerState]) -> str | None:
    """The first of ``holders`` connected and in service (not retiring or closing)."""
    for address in holders:
        ws = workers.get(address)
        if ws is not None and not (ws.retiring or ws.closing):
            return address
    return None


def _first(pusher: str, holders: list[str]) -> list[str]:
    """``holders`` with ``pusher`` first (the worker awaits a push from the first named)."""
    return [pusher, *(h for h in holders if h != pusher)]


def _inputs_of_runs(ws: WorkerState, but: TaskState | None = None) -> set[TaskState]:
    """The inputs of ``ws``'s runs (but ``but``'s): held there or on their way."""
    found: set[TaskState] = set()
    for run in ws.processing.values():
        if run is not but:
            found.update(run.dependencies)
    return found


def push_message(key: str, receiver: WorkerState) -> dict[str, object]:
    """What the pusher of ``key`` is told: send it to ``receiver``."""
    message: dict[str, object] = {"op": "push-data", "key": key, "to": receiver.address}
    host = receiver.info.get("shared_host")
    if host:
        message["host"] = host
    return message
