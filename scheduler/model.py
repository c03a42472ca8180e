"""The scheduler's records of tasks and workers (plain data, no behaviour)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from apportion.resources import Resources, Shape
from apportion.serialize import Pickled

# A task's life: released (known, nothing under way) -> waiting (for dependencies) ->
# queued (ready, no worker free) or no-worker (none could ever run it) -> processing (sent
# to a worker) -> memory (held by workers) or erred; forgotten once dropped. Every change
# goes through SchedulerState._set_state.
TaskStateName = Literal[
    "released", "waiting", "queued", "no-worker", "processing", "memory", "erred", "forgotten"
]

# The legal changes of state: SchedulerState._set_state refuses any other (a bug, never a
# user's mistake). Leaving a state is handled once, in _set_state; the reasons for each
# change are in the task's story (SchedulerState.story).
TRANSITIONS: dict[str, frozenset[str]] = {
    "released": frozenset(
        {"waiting", "queued", "no-worker", "processing", "memory", "erred", "forgotten"}
    ),
    "waiting": frozenset({"released", "queued", "no-worker", "processing", "memory", "erred"}),
    "queued": frozenset({"released", "waiting", "processing", "memory", "erred"}),
    "no-worker": frozenset({"released", "waiting", "memory", "erred"}),
    "processing": frozenset({"released", "memory", "erred"}),
    "memory": frozenset({"released"}),
    "erred": frozenset({"released"}),
    "forgotten": frozenset(),
}

# States in which a task still has to run (so it needs its dependencies).
ACTIVE = frozenset({"waiting", "queued", "no-worker", "processing"})
# Those of them not yet sent to a worker.
WAITING_TO_RUN = frozenset({"waiting", "queued", "no-worker"})

# Shared empty placeholder for a task's sets until something is added: most tasks never
# get dependents, and three empty sets per task were most of a pending task's memory.
# ``frozenset()`` is a singleton, so ``x in NOTHING`` is always False and costs nothing.
NOTHING: frozenset[Any] = frozenset()


class TaskState:
    __slots__ = (
        "args",
        "attempt",
        "dependencies",
        "dependents",
        "exception",
        "func",
        "key",
        "n_waiting",
        "nbytes",
        "no_worker_since",
        "priority",
        "processing_on",
        "reserved_on",
        "retries",
        "run_id",
        "seq",
        "shape",
        "state",
        "suspicious",
        "timeout",
        "traceback",
        "who_has",
        "who_wants",
    )

    def __init__(
        self,
        key: str,
        func: bytes,
        args: bytes | Pickled,  # a pickle, or one with out-of-band buffers (large arrays)
        shape: Shape,
        priority: int,
        retries: int,
        seq: int,
        who_wants: frozenset[str] = NOTHING,
    ) -> None:
        self.key = key
        self.func = func
        self.args = args
        self.shape = shape
        self.priority = priority
        self.retries = retries
        self.seq = seq
        self.state: TaskStateName = "released"
        self.dependencies: Sequence[TaskState] = ()
        # Created on the first dependent (NOTHING until then).
        self.dependents: set[TaskState] | frozenset[TaskState] = NOTHING
        self.n_waiting = 0
        # Copy-on-write frozensets, usually one shared singleton per worker or client
        # (see SchedulerState._one): replaced, never mutated in place.
        self.who_has: frozenset[WorkerState] = NOTHING
        self.who_wants: frozenset[str] = who_wants
        self.processing_on: WorkerState | None = None
        # The worker holding units for this queued task (see SchedulerState._reserve).
        self.reserved_on: WorkerState | None = None
        self.run_id: int | None = None
        # Runs of this key placed so far (the current run's attempt number): each
        # placement is a new attempt, so a superseded run can be told from the current one.
        self.attempt = 0
        self.nbytes = 0
        self.exception: bytes | None = None
        self.traceback: str | None = None
        self.suspicious = 0
        self.no_worker_since: float | None = None
        # Seconds a run may take before its worker fails it and is replaced (None: any).
        self.timeout: float | None = None

    def __repr__(self) -> str:
        return f"<Task {self.key!r} {self.state}>"


class WorkerState:
    __slots__ = (
        "address",
        "closing",
        "depth",
        "fetched",
        "fitting_shapes",
        "free",
        "gang",
        "has_what",
        "held",
        "idle_since",
        "info",
        "last_seen",
        "local",
        "max_slots",
        "memory",
        "memory_limit",
        "menu",
        "menu_size",
        "menu_version",
        "name",
        "nearly_full",
        "next_up",
        "nthreads",
        "paused",
        "processing",
        "pushing",
        "reserved_for",
        "retired",
        "retiring",
        "run_mean",
        "slots",
        "total",
        "used",
    )

    def __init__(
        self,
        address: str,
        name: str,
        nthreads: int,
        resources: Resources,
        prefetch: int,
        memory_limit: int | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.address = address
        self.name = name
        self.nthreads = max(1, int(nthreads))
        self.total: Resources = dict(resources)
        self.used: Resources = dict.fromkeys(resources, 0)
        # Kept equal to total - used - held, so fit checks need no subtraction on the hot
        # path, and units held for a reservation look taken to every other task.
        self.free: Resources = dict(resources)
        # The queued task this worker is reserved for (a demand too large for what is free
        # anywhere now), and the units of that demand set aside for it as they come free:
        # held[name] = min(its demand, total - used). Empty while not reserved.
        self.reserved_for: TaskState | None = None
        self.held: Resources = {}
        # What placement groups hold or claim here (placement_groups.WorkerGang); None
        # while they hold nothing, so that the hot path pays one check for them.
        self.gang: Any = None
        # Runs it is sent beyond its threads (see prefetch.py: deeper while its runs are
        # short), and its mean run time in seconds (None until one is reported).
        self.depth = max(0, prefetch)
        self.run_mean: float | None = None
        self.max_slots = self.nthreads + self.depth
        self.slots = self.max_slots
        # Chosen for removal (scale-down): no new work (slots 0) until stopped or kept.
        self.retiring = False
        # Retired and still connected (``retire_workers(close_workers=False)``): out of
        # service for good, so it no longer counts as a worker that could run anything.
        self.retired = False
        # run_id -> task. Entries stay until the worker reports the run over, even when
        # the task was cancelled meanwhile: that is when its resources are really free.
        self.processing: dict[int, TaskState] = {}
        self.has_what: set[TaskState] = set()
        # The results of has_what copied here only as inputs of tasks here (not asked for):
        # dropped once no task here needs them, if a worker in service holds another copy.
        self.fetched: set[TaskState] = set()
        # Tasks waiting for a slot here because their large inputs are here (a heap kept
        # by placement.LocalQueues: priority, submission, order, task, attempt).
        self.local: list[tuple[int, int, int, TaskState, int]] = []
        # The queued tasks whose inputs were pushed here ahead of them (pushes.py): the
        # next of their demand to start here; and those pushes not yet here (key -> pusher,
        # and when the push was sent).
        self.next_up: list[TaskState] = []
        self.pushing: dict[str, tuple[str, float]] = {}
        self.fitting_shapes: set[Shape] = set()
        # The ready queues of those shapes, cached by ReadyQueues (see ReadyQueues.pop_for).
        self.menu: list[Any] = []
        self.menu_version = -1
        self.menu_size = 0
        self.memory_limit = memory_limit
        # Paused for memory (the worker said so): no new work (slots 0) until it resumes.
        self.paused = False
        # Ending itself soon (the worker said so): no new work (slots 0), for good.
        self.closing = False
        # The worker's latest memory report (heartbeats): rss, spilled bytes and counts.
        self.memory: dict[str, Any] = {}
        # Its memory is past its spilling level (the worker said so in that report): new
        # results there would go to disk, so placement passes it over while another fits.
        self.nearly_full = False
        self.last_seen = 0.0
        # Scheduler clock time it last became idle (running nothing); None while busy.
        self.idle_since: float | None = None
        self.info = info or {}

    def __repr__(self) -> str:
        return f"<Worker {self.name} {self.address}>"


def resize_slots(ws: WorkerState, delta: int, with_slots: dict[WorkerState, None]) -> None:
    """``ws`` is sent ``delta`` more runs at most (fewer when negative): its slots follow,
    and its place among the workers with open slots (``with_slots``), unless it takes no
    work now (paused, retiring or closing: its slots come back as ``max_slots``)."""
    ws.max_slots += delta
    if ws.retiring or ws.paused or ws.closing:
        return
    ws.slots = ws.max_slots
    if len(ws.processing) < ws.slots:
        with_slots[ws] = None
    else:
        with_slots.pop(ws, None)


class Retirement:
    """One request to retire workers, answered once none of them is still ``waiting``.

    A waiting worker runs no new tasks; it moves to ``retired`` once it runs nothing and
    every result it holds that is still needed has a copy on a worker staying in service,
    or to ``kept`` (name -> reason) when that cannot be done.
    """

    __slots__ = ("deadline", "kept", "reply_id", "requester", "retired", "waiting")

    def __init__(
        self, requester: str, reply_id: Any, waiting: list[WorkerState], deadline: float
    ) -> None:
        self.requester = requester
        self.reply_id = reply_id
        self.waiting: dict[WorkerState, None] = dict.fromkeys(waiting)
        self.deadline = deadline
        self.retired: list[str] = []
        self.kept: dict[str, str] = {}
