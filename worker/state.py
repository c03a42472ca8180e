"""The worker's state machine: events in, instructions out; no I/O, no threads.

Events are the scheduler's messages (``compute``, ``cancel``, ``free-keys``,
``acquire-data``, ``reacquired``, ``set-resources``), the outcomes of fetches from peers,
what a run asks from its own thread (``secede``, ``rejoin``), the end of a run, the
worker's memory passing its pause threshold or falling back (``memory_pressure``), and the
loss of the scheduler. Each event method changes state and returns the instructions that
the process edge (``worker/server.py``) carries out:

- ``Execute(task)``: run the task in a thread (its resources are already taken);
- ``Send(message)``: a message for the scheduler;
- ``TellClients(clients, message)``: tell clients connected here of a result directly;
- ``Fetch(key, holders)``: get a result from the peers holding it, then call
  ``fetched`` or ``fetch_failed``;
- ``Resume(task)``: wake a seceded run waiting in ``rejoin()``: it has its thread (and its
  resources) back.

Every change of a task's status goes through one funnel that checks it against
``TRANSITIONS`` (any other raises ``InvalidTransition``) and records it in a bounded story
(``WorkerState.story(key)``).

Resource accounting: a task's resources are taken from the local ledger when it starts
(``Execute``) and given back when its run ends (``free_run``), whatever the
scheduler sent; so the worker never runs more than it declared. A task starts only when
a thread is free and its resources fit; among the ready tasks the most urgent starts.

Seceding (``secede()`` in a task, worker/secession.py): the run stops counting as running,
so another ready task may start in its place; with ``release`` its resources go back to the
ledger too, and ``rejoin`` must first ask the scheduler to grant them back (``reacquire``,
answered by ``reacquired``), then wait for the local ledger to fit them. Seceded runs
waiting to rejoin take free threads before any ready task.

Data: every result held here (computed, or fetched for a task as its input, or copied
for a retiring peer) is known to the scheduler as held here, and stays until the
scheduler frees it (``free-keys``); a key freed while a task here still needs it goes
once that need ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import MutableMapping
from time import time
from typing import Any, Literal, NamedTuple

from apportion.worker.local_resources import LocalResources
from apportion.worker.output import Capture, add_run_report

from apportion.errors import ApportionError, Reschedule
from apportion.resources import Shape, format_resources, to_shape
from apportion.serialize import Payload, dumps_exception

Message = dict[str, Any]

TaskStatus = Literal[
    "new",  # just received
    "fetching",  # waits for inputs from peers
    "ready",  # waits for a thread and its resources
    "running",  # in a thread, counted as running, holding its resources
    "seceded",  # in a thread that left the pool; still holding its resources
    "seceded-released",  # in a thread that left the pool; its resources back in the ledger
    "reacquiring",  # released, wants to rejoin: the scheduler was asked to grant them back
    "granted",  # the scheduler granted them back: waits for a thread and the ledger to fit
    "rejoining",  # seceded with its resources, wants to rejoin: waits for a thread
    "done",  # its run ended; its thread and resources are given back
    "dropped",  # never ran: cancelled, inputs not found, scheduler lost, or too big here
]

# The legal changes of a task's status; any other is a bug (InvalidTransition). A run ends
# only from its thread (running) or seceded: a run waiting to rejoin is blocked in rejoin().
TRANSITIONS: frozenset[tuple[TaskStatus, TaskStatus]] = frozenset(
    {
        ("new", "fetching"),
        ("new", "ready"),
        ("new", "dropped"),
        ("fetching", "ready"),
        ("fetching", "dropped"),
        ("ready", "running"),
        ("ready", "dropped"),
        ("running", "seceded"),
        ("running", "seceded-released"),
        ("running", "done"),
        ("seceded", "rejoining"),
        ("seceded", "done"),
        ("seceded-released", "reacquiring"),
        ("seceded-released", "done"),
        ("reacquiring", "granted"),
        ("granted", "running"),
        ("rejoining", "running"),
    }
)
# The same table by status (a lookup without building a pair on every change).
_NEXT: dict[str, frozenset[str]] = {
    start: frozenset(finish for first, finish in TRANSITIONS if first == start)
    for start, _ in TRANSITIONS
}
_NEXT["done"] = _NEXT["dropped"] = frozenset()

# The statuses of a run in a thread: a cancel only marks it (a thread cannot be
# interrupted), and the loss of the scheduler keeps it.
IN_THREAD: frozenset[str] = frozenset(
    {"running", "seceded", "seceded-released", "reacquiring", "granted", "rejoining"}
)
# How a seceded run stands, for a new scheduler (registration_report): released means
# not granted back yet; a run granted its resources but not resumed holds them already.
_SECEDED_REPORT: dict[str, dict[str, bool]] = {
    "seceded": {"seceded": True, "released": False, "reacquiring": False},
    "seceded-released": {"seceded": True, "released": True, "reacquiring": False},
    "reacquiring": {"seceded": True, "released": True, "reacquiring": True},
    "granted": {"seceded": True, "released": False, "reacquiring": False},
    "rejoining": {"seceded": True, "released": False, "reacquiring": False},
}

# One line of a task's story: (key, from status, to status, the event that caused it, time).
# A cancel of a run in a thread changes no status: it is recorded with from == to.
StoryEntry = tuple[str, str, str, str, float]


class InvalidTransition(ApportionError, RuntimeError):
    """A task's status was to change in a way ``TRANSITIONS`` does not allow: a bug in
    the worker's state machine. Carries the task's ``story`` up to that point."""

    def __init__(
        self, key: str, start: str, finish: str, stimulus: str, story: list[StoryEntry]
    ) -> None:
        super().__init__(
            f"task {key!r}: no transition from {start!r} to {finish!r} (on {stimulus}); "
            f"its story: {story}"
        )
        self.key = key
        self.start = start
        self.finish = finish
        self.stimulus = stimulus
        self.story = story


class WorkerTask:
    __slots__ = (
        "args",
        "attempt",
        "cancelled",
        "deps",
        "epoch",
        "fetched",
        "func",
        "key",
        "missing",
        "notify",
        "output",
        "priority",
        "run_id",
        "shape",
        "start",
        "status",
        "stop",
        "timeout",
        "units",
    )

    def __init__(self, message: Message, epoch: int) -> None:
        self.key: str = message["key"]
        self.run_id: int = message["run_id"]
        # Which run of the key this is (1 first; the scheduler counts every reschedule).
        self.attempt: int = message.get("attempt", 1)
        self.func: bytes = message["func"]
        self.args: bytes = message["args"]
        # Each input's key -> the workers holding it (as the scheduler knew when sending).
        self.deps: dict[str, list[str]] = message.get("deps") or {}
        self.shape: Shape = to_shape(message.get("resources"))
        self.priority: int = message.get("priority", 0)
        # Seconds the run may take (None: any); past it the worker fails it and is replaced.
        self.timeout: float | None = message.get("timeout")
        # Clients waiting for the result: told directly when connected here.
        self.notify: list[str] = message.get("notify") or []
        self.status: TaskStatus = "new"
        # Cancelled while in its thread: its result is dropped at its end.
        self.cancelled = False
        self.units: dict[str, list[int]] = {}
        # Inputs still on their way from peers.
        self.missing: set[str] = set()
        # The scheduler connection it came from (see WorkerState.scheduler_lost).
        self.epoch = epoch
        # For the run's report (dashboard, metrics, the client's output; worker/output.py):
        # inputs fetched from peers, when it ran (wall clock, set by its thread) and what it
        # printed (a Capture while it runs, then the captured chunks).
        self.fetched = 0
        self.start = self.stop = 0.0
        self.output: Capture | list[list[str]] | None = None

    def __repr__(self) -> str:
        cancelled = " cancelled" if self.cancelled else ""
        return f"<WorkerTask {self.key!r} run {self.run_id} {self.status}{cancelled}>"


class Execute(NamedTuple):
    """Run ``task`` in a thread (its resources are taken)."""

    task: WorkerTask


class Send(NamedTuple):
    """A message for the scheduler."""

    message: Message


class TellClients(NamedTuple):
    """Tell ``clients`` of a finished result (``message`` is the scheduler's copy: the
    edge names the clients it reached in its ``notified`` field before sending it)."""

    clients: list[str]
    message: Message


class Fetch(NamedTuple):
    """Get ``key`` from the first of ``holders`` that has it, then report the outcome
    with ``epoch`` (``fetched`` or ``fetch_failed``)."""

    key: str
    holders: list[str]
    epoch: int


class Resume(NamedTuple):
    """Wake ``task``'s thread, waiting in ``rejoin()``: the run has its thread (and its
    resources) back."""

    task: WorkerTask


class AwaitPush(NamedTuple):
    """``key`` is on its way from ``pusher``, told by the scheduler to send it here (no
    request to make): past ``seconds`` without it, call ``push_missed`` with ``serial``."""

    key: str
    pusher: str
    seconds: float
    serial: int


Instruction = Execute | Send | TellClients | Fetch | Resume | AwaitPush

# How long an input the scheduler had pushed here may take before it is fetched as any
# other: a lost pusher or connection is told sooner (``push_missed`` from the edge); this
# bounds the cases nothing tells of (a pusher that cannot connect here). Seconds, plus one
# per PUSH_WAIT_BYTES_PER_S of the input, so a large one in flight is not asked for twice.
PUSH_WAIT_S = 5.0
PUSH_WAIT_BYTES_PER_S = 50e6


class _Fetching:
    """One result on its way from peers: the tasks waiting for it, and whether the
    scheduler asked for a copy of it (``acquire-data``)."""

    __slots__ = ("acquire", "holders", "push_serial", "pusher", "waiting")

    def __init__(self, holders: list[str]) -> None:
        self.holders = holders
        self.waiting: list[WorkerTask] = []
        self.acquire = False
        # The peer the scheduler told to send it here (no request made), while awaited.
        self.pusher: str | None = None
        self.push_serial = 0


class WorkerState:
    def __init__(
        self,
        nthreads: int,
        resources: dict[str, float],
        name: str = "",
        inline_limit: int = 64 * 1024,
        story_length: int = 10_000,
        data: MutableMapping[str, Any] | None = None,
    ) -> None:
        self.nthreads = nthreads
        self.resources = dict(resources)
        self.name = name
        self.inline_limit = inline_limit
        self.ledger = LocalResources(self.resources)
        # Bumped when the scheduler is lost: what came from an earlier connection is stale.
        self.epoch = 0
        self.tasks: dict[int, WorkerTask] = {}
        self.ready: list[WorkerTask] = []
        # Runs in threads counted as running (seceded ones are not).
        self.running = 0
        # Seceded runs that may take a thread again (rejoining, granted), oldest first:
        # they take free threads before any ready task.
        self.rejoining: list[WorkerTask] = []
        # The results held here: a dict, or a store that spills them to disk and reads
        # them back on use (worker/spill.py), transparently to this machine.
        self.data: MutableMapping[str, Any] = {} if data is None else data
        # Paused for memory (worker/memory.py): ready tasks wait; runs in threads go on.
        self.paused = False
        # Pickled size of each held result, for a new scheduler's placement (it prefers
        # the worker holding a task's inputs' bytes).
        self.nbytes: dict[str, int] = {}
        # The attempt of each result whose run ended while no scheduler knew of it: a
        # newer attempt may run elsewhere by now, and then the scheduler drops this one.
        self.unreported_attempts: dict[str, int] = {}
        # Errors of runs that ended while no scheduler listened, for the next one (as held
        # results are): key -> (pickled exception, traceback).
        self.errors: dict[str, tuple[Payload, str]] = {}
        # Key -> the tasks here (not yet ended) that take it as an input.
        self.needed: dict[str, int] = {}
        # Keys the scheduler freed while a task here still needed them: gone when it ends.
        self.doomed: set[str] = set()
        self.fetching: dict[str, _Fetching] = {}
        self._push_serials = 0
        # The latest changes of tasks' statuses, all tasks together (see story()).
        self._story: deque[StoryEntry] = deque(maxlen=story_length)

    # ------------------------------------------------------------ scheduler events
    def compute(
        self, message: Message, inline: dict[str, tuple[Any, int]] | None = None
    ) -> list[Instruction]:
        """A task to run. ``inline``: inputs that came with it (the scheduler keeps small
        results; see scheduler/small_results.py), loaded, each with its pickled size: held
        here only while tasks here need them, as the scheduler does not count these copies."""
        task = WorkerTask(message, self.epoch)
        if not self.ledger.can_ever_fit(task.shape):
            problem = ValueError(
                f"task {task.key!r} needs {format_resources(dict(task.shape))}, more than "
                f"worker {self.name} declared ({format_resources(self.resources)})"
            )
            self._to(task, "dropped", "compute")
            return [Send(erred_message(task, *dumps_exception(problem)))]
        self.tasks[task.run_id] = task
        if not task.deps:
            self._to(task, "ready", "compute")
            self.ready.append(task)
            return self._start("compute")
        instructions: list[Instruction] = []
        needed, data = self.needed, self.data
        # Inputs the scheduler told their holder to send here, by their pickled size.
        pushed: dict[str, int] = message.get("pushed") or {}
        for key, holders in task.deps.items():
            needed[key] = needed.get(key, 0) + 1
            if key in data:
                continue
            if inline is not None and key in inline and key not in self.fetching:
                data[key], self.nbytes[key] = inline[key]
                self.doomed.add(key)  # gone when no task here needs it (see _unneed)
                continue
            task.missing.add(key)
            pending = self.fetching.get(key)
            if pending is None:
                pending = self.fetching[key] = _Fetching(holders)
                if key in pushed and holders:
                    instructions.append(self._await_push(pending, key, pushed[key]))
                else:
                    instructions.append(Fetch(key, holders, self.epoch))
            pending.waiting.append(task)
        task.fetched = len(task.missing)
        if not task.missing:
            self._to(task, "ready", "compute")
            self.ready.append(task)
            return self._start("compute")
        self._to(task, "fetching", "compute")
        return instructions

    def cancel(self, run_id: int) -> list[Instruction]:
        task = self.tasks.get(run_id)
        if task is None:
            return []
        if task.status in IN_THREAD:
            # A thread cannot be interrupted: the run is reported released when it ends.
            task.cancelled = True
            self._story.append((task.key, task.status, task.status, "cancel", time()))
            return []
        self._drop(task, "cancel")
        return [Send({"op": "task-released", "key": task.key, "run_id": run_id})]

    def free_keys(self, keys: list[str]) -> None:
        for key in keys:
            if key in self.needed:
                self.doomed.add(key)
            else:
                self._forget(key)

    def acquire(self, key: str, holders: list[str]) -> list[Instruction]:
        """Keep a copy of a result held elsewhere (its holder is being retired)."""
        if key in self.data:
            self.doomed.discard(key)  # (a copy that came with a task: kept from now on)
            return [Send({"op": "data-acquired", "key": key})]
        pending = self.fetching.get(key)
        if pending is not None:
            pending.acquire = True
            return []
        pending = self.fetching[key] = _Fetching(holders)
        pending.acquire = True
        return [Fetch(key, holders, self.epoch)]

    def reacquired(self, run_id: int) -> list[Instruction]:
        """The scheduler granted a seceded run's resources back: it rejoins once a thread
        is free and the local ledger fits them (a run here may still be giving them back)."""
        task = self.tasks.get(run_id)
        if task is None or task.status != "reacquiring":
            return []
        self._to(task, "granted", "reacquired")
        self.rejoining.append(task)
        return self._start("reacquired")

    def set_resources(self, resources: dict[str, float]) -> list[Instruction]:
        """New totals (``client.set_resources``), from now on: runs keep what they hold;
        what fits now starts."""
        self.resources = dict(resources)
        self.ledger.resize(self.resources)
        return self._start("set-resources")

    def scheduler_lost(self) -> None:
        """The scheduler connection dropped: keep what a new scheduler can adopt.

        Results held here and runs in threads stay (the next scheduler is told of them by
        ``registration_report``); what had not started yet (waiting for a thread or for
        inputs) is dropped, as the next scheduler places it afresh. Runs that end before
        the report keep their result here and report nothing (no scheduler knows them).
        """
        self.epoch += 1
        for task in list(self.tasks.values()):
            if task.status not in IN_THREAD:
                self._drop(task, "scheduler-lost")
        self.fetching.clear()

    def registration_report(self) -> Message:
        """What a new scheduler must know of this worker, sent as its first message: the
        results held here and the runs in threads, each with the resources it holds.
        Reported runs belong to the new connection from now on (their ends are reported),
        and so do the errors kept for it (handed over: not reported again)."""
        running = []
        for task in self.tasks.values():
            task.epoch = self.epoch
            run = {
                "key": task.key,
                "run_id": task.run_id,
                "resources": dict(task.shape),
                "cancelled": task.cancelled,
                "attempt": task.attempt,
            }
            seceded = _SECEDED_REPORT.get(task.status)
            if seceded is not None:
                run.update(seceded)
            running.append(run)
        nbytes = self.nbytes
        held = {key: nbytes.get(key, 0) for key in self.data if key not in self.doomed}
        erred = [
            {"key": key, "exception": exception, "traceback": traceback}
            for key, (exception, traceback) in self.errors.items()
        ]
        self.errors = {}
        attempts = {key: n for key, n in self.unreported_attempts.items() if key in held}
        self.unreported_attempts = {}
        report: Message = {"op": "recover", "held": held, "running": running, "erred": erred}
        if attempts:
            report["attempts"] = attempts
        return report

    # ----------------------------------------------------------------- fetches
    def fetched(self, key: str, value: Any, epoch: int, nbytes: int = 0) -> list[Instruction]:
        """A peer sent ``key`` (``nbytes`` pickled): it is held here from now on, and the
        scheduler hears so."""
        pending = self.fetching.get(key)
        if epoch != self.epoch or pending is None:
            return []
        del self.fetching[key]
        self.data[key] = value
        self.nbytes[key] = nbytes
        # The scheduler counts this copy too (a replica): when the original holder dies
        # this one is used instead of recomputing.
        instructions: list[Instruction] = [
            Send({"op": "data-acquired", "key": key, "replica": not pending.acquire})
        ]
        started = False
        for task in pending.waiting:
            task.missing.discard(key)
            if not task.missing and task.status == "fetching":
                self._to(task, "ready", "fetched")
                self.ready.append(task)
                started = True
        if started:
            instructions.extend(self._start("fetched"))
        return instructions

    def fetch_failed(self, key: str, epoch: int, reason: str) -> list[Instruction]:
        """No holder of ``key`` answered: the tasks waiting for it go back to the scheduler."""
        pending = self._fetch_over(key, epoch)
        if pending is None:
            return []
        instructions: list[Instruction] = []
        if pending.acquire:
            instructions.append(Send({"op": "acquire-failed", "key": key, "reason": reason}))
        for task in pending.waiting:
            if self.tasks.get(task.run_id) is not task:
                continue  # cancelled meanwhile
            self._drop(task, "fetch-failed")
            # Only this input is known missing: others may still be on their way.
            missing = {key: task.deps[key]}
            instructions.append(
                Send(
                    {
                        "op": "missing-deps",
                        "key": task.key,
                        "run_id": task.run_id,
                        "missing": missing,
                    }
                )
            )
        return instructions

    def fetch_unloadable(
        self, key: str, epoch: int, exception: Payload, traceback: str
    ) -> list[Instruction]:
        """``key`` arrived but does not load here (the pickled ``exception`` says why): it
        would not load any better fetched again or recomputed, so the tasks waiting for it
        fail with that error, and a copy the scheduler asked for is refused."""
        pending = self._fetch_over(key, epoch)
        if pending is None:
            return []
        instructions: list[Instruction] = []
        if pending.acquire:
            reason = f"{key!r} does not load on this worker"
            instructions.append(Send({"op": "acquire-failed", "key": key, "reason": reason}))
        for task in pending.waiting:
            if self.tasks.get(task.run_id) is not task:
                continue  # cancelled meanwhile
            self._drop(task, "fetch-unloadable")
            instructions.append(Send(erred_message(task, exception, traceback)))
        return instructions

    # ------------------------------------------------------------------- pushes
    def _await_push(self, pending: _Fetching, key: str, nbytes: int) -> AwaitPush:
        pending.pusher = pending.holders[0]  # the scheduler names the pusher first
        self._push_serials += 1
        pending.push_serial = self._push_serials
        seconds = PUSH_WAIT_S + nbytes / PUSH_WAIT_BYTES_PER_S
        return AwaitPush(key, pending.pusher, seconds, pending.push_serial)

    def adopt(self, key: str, value: Any, nbytes: int) -> None:
        """Hold ``value`` as ``key``'s result, made by no run here: the scheduler counts it
        as held here already (a client's stored argument)."""
        self._hold(key, value, nbytes)

    def pushed(self, key: str, value: Any, nbytes: int) -> list[Instruction]:
        """A peer sent ``key`` unasked (the scheduler told it to, with a task here taking
        it): as a fetched input when a task awaits it (pushed or fetched); dropped when held
        here already; and when it came before its task, held as a copy the scheduler hears
        of, as any fetched one (it frees it when no task here needs it)."""
        if key in self.data:
            return []  # a copy that came another way first
        if key in self.fetching:
            return self.fetched(key, value, self.epoch, nbytes)
        self.data[key] = value
        self.nbytes[key] = nbytes
        return [Send({"op": "data-acquired", "key": key, "replica": True})]

    def push_missed(self, key: str, pusher: str, serial: int | None = None) -> list[Instruction]:
        """The push of ``key`` from ``pusher`` will not come (it does not hold it, or it
        left), or took too long (``serial``: the wait that ran out): fetched from its
        holders then, as any input (the pusher last, or not at all when it is gone)."""
        pending = self.fetching.get(key)
        if pending is None or pending.pusher != pusher:
            return []
        if serial is not None and pending.push_serial != serial:
            return []  # a wait for an earlier push of the key
        pending.pusher = None
        holders = [holder for holder in pending.holders if holder != pusher]
        if serial is not None:
            holders.append(pusher)  # only late: it may still answer a request
        return [Fetch(key, holders, self.epoch)]

    def pusher_left(self, address: str) -> list[Instruction]:
        """``address`` left: what it was to push here is fetched from other holders."""
        instructions: list[Instruction] = []
        for key in [key for key, pending in self.fetching.items() if pending.pusher == address]:
            instructions.extend(self.push_missed(key, address))
        return instructions

    def _fetch_over(self, key: str, epoch: int) -> _Fetching | None:
        """The fetch of ``key`` that ended, no longer under way (None: not one of this
        scheduler's, or not under way)."""
        pending = self.fetching.get(key)
        if epoch != self.epoch or pending is None:
            return None
        del self.fetching[key]
        return pending

    # --------------------------------------------------------------------- runs
    def report_run(
        self,
        task: WorkerTask,
        ok: bool,
        value: Any,
        payload: Payload,
        traceback: str = "",
        busy: bool = False,
    ) -> list[Instruction]:
        """What to tell of a run that ended: ``value`` and its pickled ``payload`` when
        ``ok``, else the pickled exception and its ``traceback``. Its thread and resources
        stay taken until ``free_run``, so that a task thread can send the report first (the
        scheduler's next task for this worker is on its way sooner). ``busy``: more work is
        already on its way to a thread (no direct client notice)."""
        if self.tasks.get(task.run_id) is task:
            del self.tasks[task.run_id]  # a cancel from now on crosses the report
        if task.epoch != self.epoch:
            # Ended while no scheduler knew of it: the result (or the error) stays here,
            # for the next scheduler to adopt; a Reschedule is nothing to keep (it runs
            # again), nor is a cancelled run.
            if task.cancelled:
                return []
            if ok:
                self._hold(task.key, value, len(payload))
                self.unreported_attempts[task.key] = task.attempt
            elif not isinstance(value, Reschedule):
                self.errors[task.key] = (payload, traceback)
            return []
        if task.cancelled:
            return [Send({"op": "task-released", "key": task.key, "run_id": task.run_id})]
        if not ok:
            if isinstance(value, Reschedule):  # the task asked to be placed again
                return [Send({"op": "task-released", "key": task.key, "run_id": task.run_id})]
            return [Send(erred_message(task, payload, traceback))]
        # Stored before the scheduler hears of it: a peer may ask for it at once.
        self._hold(task.key, value, len(payload))
        message = self.finished_message(task, payload)
        if task.notify and not busy and not self.ready:
            # About to go idle: someone likely waits on this very result. (Busy workers
            # leave it to the scheduler, which batches for clients.)
            return [TellClients(task.notify, message), Send(message)]
        return [Send(message)]

    def free_run(self, task: WorkerTask) -> list[Instruction]:
        """Give back a reported run's thread and resources; start what can start now. A
        run that ends seceded gives back only what it still holds."""
        status = task.status
        if status == "running":
            self.running -= 1
            self.ledger.release(task.shape, task.units)
        elif status == "seceded":
            self.ledger.release(task.shape, task.units)
        self._to(task, "done", "free-run")
        self._unneed(task)
        return self._start("free-run")

    def secede(self, task: WorkerTask, release: bool) -> list[Instruction]:
        """``task``'s run gives its thread back while it waits (``secede()`` in the task):
        another ready task may start in its place; with ``release`` (and resources to
        release) its resources go back to the ledger too. The scheduler hears of it. A run
        that seceded already changes nothing (no instructions)."""
        if task.status != "running":
            return []
        self.running -= 1
        release = release and bool(task.shape)
        if release:
            self.ledger.release(task.shape, task.units)
            task.units = {}
            self._to(task, "seceded-released", "secede")
        else:
            self._to(task, "seceded", "secede")
        message = {"op": "secede", "key": task.key, "run_id": task.run_id, "release": release}
        return [Send(message), *self._start("secede")]

    def rejoin(self, task: WorkerTask) -> list[Instruction]:
        """``task``'s seceded run wants a thread again (``rejoin()`` in the task): it gets
        one before any ready task (``Resume(task)`` once it has). A run that released its
        resources first asks the scheduler to grant them back (``reacquire``; answered by
        ``reacquired``). A run that has its thread is answered ``Resume`` at once."""
        status = task.status
        if status == "seceded":
            self._to(task, "rejoining", "rejoin")
            self.rejoining.append(task)
            return self._start("rejoin")
        if status == "seceded-released":
            self._to(task, "reacquiring", "rejoin")
            return [Send({"op": "reacquire", "key": task.key, "run_id": task.run_id})]
        if status == "running":
            return [Resume(task)]
        return []  # waiting to rejoin already

    def memory_pressure(
        self, paused: bool, memory: dict[str, int] | None = None
    ) -> list[Instruction]:
        """The worker's memory passed its pause threshold (``paused``) or fell back under
        it: paused, no ready task starts (runs in threads go on); the scheduler hears of
        each change (with ``memory``, the measure that decided it: ``rss`` and ``limit``),
        and places nothing here while paused."""
        if paused == self.paused:
            return []
        self.paused = paused
        status = "paused" if paused else "running"
        message: Message = {"op": "worker-status", "status": status}
        if memory is not None:
            message["memory"] = memory
        instructions: list[Instruction] = [Send(message)]
        if not paused:
            instructions.extend(self._start("memory-resumed"))
        return instructions

    def finished_message(self, task: WorkerTask, payload: Payload) -> Message:
        message: Message = {
            "op": "task-finished",
            "key": task.key,
            "run_id": task.run_id,
            "nbytes": len(payload),
        }
        if len(payload) <= self.inline_limit:
            message["data"] = payload
        return with_run_report(message, task)

    # ---------------------------------------------------------------- internals
    def _to(self, task: WorkerTask, status: TaskStatus, stimulus: str) -> None:
        """The one place a task's status changes: checked against TRANSITIONS, recorded
        in the story."""
        start = task.status
        if status not in _NEXT[start]:
            raise InvalidTransition(task.key, start, status, stimulus, self.story(task.key))
        self._story.append((task.key, start, status, stimulus, time()))
        task.status = status

    def _start(self, stimulus: str) -> list[Instruction]:
        """Start what can start now, while threads are free: first seceded runs waiting to
        rejoin (oldest first), then the most urgent ready tasks that fit."""
        started: list[Instruction] = []
        if self.rejoining:
            self._resume(started, stimulus)
        ready, ledger = self.ready, self.ledger
        while ready and self.running < self.nthreads and not self.paused:
            best: WorkerTask | None = None
            for task in ready:
                if (best is None or task.priority > best.priority) and ledger.fits_now(task.shape):
                    best = task
            if best is None:
                break
            ready.remove(best)
            best.units = ledger.acquire(best.shape)
            self._to(best, "running", stimulus)
            self.running += 1
            started.append(Execute(best))
        return started

    def _resume(self, started: list[Instruction], stimulus: str) -> None:
        ledger = self.ledger
        for task in list(self.rejoining):
            if self.running >= self.nthreads:
                break
            if task.status == "granted":
                if not ledger.fits_now(task.shape):
                    continue  # the scheduler's grant is ahead of a run here giving them back
                task.units = ledger.acquire(task.shape)
            self.rejoining.remove(task)
            self._to(task, "running", stimulus)
            self.running += 1
            started.append(Send({"op": "rejoin", "key": task.key, "run_id": task.run_id}))
            started.append(Resume(task))

    def _drop(self, task: WorkerTask, stimulus: str) -> None:
        """Forget a task that never started (cancelled, or its inputs were not found)."""
        del self.tasks[task.run_id]
        if task.status == "ready":
            self.ready.remove(task)
        for key in task.missing:
            pending = self.fetching.get(key)
            if pending is not None and task in pending.waiting:
                pending.waiting.remove(task)
        self._unneed(task)
        self._to(task, "dropped", stimulus)

    def _unneed(self, task: WorkerTask) -> None:
        needed = self.needed
        for key in task.deps:
            left = needed.get(key, 0) - 1
            if left > 0:
                needed[key] = left
                continue
            needed.pop(key, None)
            if key in self.doomed:
                self.doomed.discard(key)
                self._forget(key)

    def _hold(self, key: str, value: Any, nbytes: int) -> None:
        """A result run here, which the scheduler counts as held here from its report on:
        kept even if an earlier copy here was to go once no task needed it."""
        self.data[key] = value
        self.nbytes[key] = nbytes
        self.doomed.discard(key)

    def _forget(self, key: str) -> None:
        if key in self.data:  # (not pop: that would read a spilled result back first)
            del self.data[key]
        self.nbytes.pop(key, None)
        self.unreported_attempts.pop(key, None)

    # ------------------------------------------------------------ introspection
    def story(self, *keys: str) -> list[StoryEntry]:
        """The recorded changes of these tasks' statuses, oldest first, as (key, from, to,
        the event that caused it, time): the latest ``story_length`` of all tasks'."""
        return [entry for entry in self._story if entry[0] in keys]

    def check_invariants(self) -> list[str]:
        """Problems with the books (empty when all is well); used by the tests."""
        problems = []
        counted = [t for t in self.tasks.values() if t.status == "running"]
        holding: dict[str, float] = dict.fromkeys(self.resources, 0)
        if len(counted) > self.running:
            problems.append(f"{len(counted)} running tasks > running count {self.running}")
        if self.running > self.nthreads:
            problems.append(f"{self.running} runs > {self.nthreads} threads")
        for task in self.tasks.values():
            if task.status in ("new", "done", "dropped"):
                problems.append(f"{task!r} is still among the tasks")
            if task.status in ("running", "seceded", "rejoining"):
                for name, amount in task.shape:
                    holding[name] = holding.get(name, 0) + amount
        for name, total in self.resources.items():
            used = self.ledger.used.get(name, 0)
            # Beyond the total only while runs hold more than a new, smaller one.
            if used > max(total, holding[name]) + 1e-9:
                problems.append(f"{name} used {used} > total {total}")
            if used + 1e-9 < holding[name]:
                problems.append(f"{name} used {used} < held by running tasks {holding[name]}")
        for task in self.ready:
            if task.status != "ready" or self.tasks.get(task.run_id) is not task:
                problems.append(f"ready list holds {task!r}")
        for task in self.rejoining:
            if (
                task.status not in ("granted", "rejoining")
                or self.tasks.get(task.run_id) is not task
            ):
                problems.append(f"rejoining list holds {task!r}")
        for key, pending in self.fetching.items():
            if key in self.data:
                problems.append(f"fetching {key!r}, which is held")
            for task in pending.waiting:
                if key not in task.missing:
                    problems.append(f"{task!r} waits for {key!r} but does not miss it")
        return problems


def erred_message(task: WorkerTask, exception: Payload, traceback: str) -> Message:
    message = {
        "op": "task-erred",
        "key": task.key,
        "run_id": task.run_id,
        "exception": exception,
        "traceback": traceback,
    }
    return with_run_report(message, task)


def with_run_report(message: Message, task: WorkerTask) -> Message:
    captured = task.output if isinstance(task.output, list) else None
    return add_run_report(message, task.start, task.stop, task.units, task.fetched, captured)
