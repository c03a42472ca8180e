"""Seceding on the worker: a task gives its thread back while it waits for other work.

Pure functions on the worker's state machine (worker/state.py), called with its lock held,
plus the thread-local record of which task a task thread runs (for ``secede()``).

- ``secede``: the run stops counting as running (another ready task may start in its
  place; the edge starts a thread for it); with ``release`` its resources go back to the
  ledger too. The scheduler hears of it (``secede``) and counts a slot more.
- ``rejoin``: the run waits for a thread (and, when it released them, for its resources:
  the scheduler grants them back first with ``reacquired``, then the local ledger must fit
  them); seceded runs waiting to rejoin start before any ready task.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from apportion.worker.state import Send, WorkerState, WorkerTask

from apportion.core import context
from apportion.core.task_host import set_task_host

if TYPE_CHECKING:
    from apportion.worker.server import Worker


class Rejoin:
    """A seceded run waiting to take a thread (and its resources) again."""

    __slots__ = ("event", "granted", "task")

    def __init__(self, task: WorkerTask, granted: bool) -> None:
        self.task = task
        # Whether its resources are its own again (always, when it kept them).
        self.granted = granted
        self.event = threading.Event()


class Resume(NamedTuple):
    """Wake the seceded run: it has its thread (and resources) back."""

    rejoin: Rejoin


class Books:
    """What the worker state machine knows of seceded runs (one per WorkerState)."""

    def __init__(self) -> None:
        self.seceded: set[int] = set()  # run ids not counted as running
        self.unheld: set[int] = set()  # run ids whose resources went back to the ledger
        self.rejoining: list[Rejoin] = []  # ready to take a thread, oldest first
        self.awaiting_grant: dict[int, Rejoin] = {}  # asked the scheduler for resources

    def resume(self, state: WorkerState) -> list[Any]:
        """Called first when threads may be free: seceded runs take them before ready
        tasks (WorkerState._start)."""
        resumed: list[Any] = []
        for waiting in list(self.rejoining):
            if state.running >= state.nthreads:
                break
            task = waiting.task
            if task.run_id in self.unheld:
                if not state.ledger.fits_now(task.shape):
                    continue  # the scheduler's grant is ahead of a run here giving them back
                task.units = state.ledger.acquire(task.shape)
                self.unheld.discard(task.run_id)
            self.rejoining.remove(waiting)
            self.seceded.discard(task.run_id)
            state.running += 1
            resumed.append(Send({"op": "rejoin", "key": task.key, "run_id": task.run_id}))
            resumed.append(Resume(waiting))
        return resumed

    def report(self, run_id: int) -> dict[str, bool]:
        """How a run stands, for a new scheduler (WorkerState.registration_report):
        seceded, with its resources released (not granted back yet), and asking for them
        back. A run granted its resources but not resumed yet holds them already."""
        if run_id not in self.seceded:
            return {}
        asking = run_id in self.awaiting_grant
        granted = any(w.task.run_id == run_id for w in self.rejoining)
        released = run_id in self.unheld and not granted
        return {"seceded": True, "released": released, "reacquiring": asking}

    def run_over(self, task: WorkerTask) -> tuple[bool, bool]:
        """At the end of a run (WorkerState.free_run): whether it still counted as running,
        and whether it still held its resources; it leaves the books."""
        if task.run_id not in self.seceded:
            return True, True
        self.seceded.discard(task.run_id)
        held = task.run_id not in self.unheld
        self.unheld.discard(task.run_id)
        self.awaiting_grant.pop(task.run_id, None)
        for waiting in list(self.rejoining):
            if waiting.task is task:
                self.rejoining.remove(waiting)
        return False, held


def books(state: WorkerState) -> Books:
    if state.secession is None:
        state.secession = Books()
    found: Books = state.secession
    return found


def secede(state: WorkerState, task: WorkerTask, release: bool) -> list[Any]:
    b = books(state)
    if task.run_id in b.seceded:
        return []
    b.seceded.add(task.run_id)
    state.running -= 1
    release = release and bool(task.shape)
    if release:
        state.ledger.release(task.shape, task.units)
        task.units = {}
        b.unheld.add(task.run_id)
    message = {"op": "secede", "key": task.key, "run_id": task.run_id, "release": release}
    return [Send(message), *state._start()]


def rejoin(state: WorkerState, task: WorkerTask) -> tuple[Rejoin | None, list[Any]]:
    """Ask for the thread (and resources) back; the Rejoin's event is set once granted."""
    b = books(state)
    if task.run_id not in b.seceded:
        return None, []
    waiting = Rejoin(task, granted=task.run_id not in b.unheld)
    if not waiting.granted:
        b.awaiting_grant[task.run_id] = waiting
        return waiting, [Send({"op": "reacquire", "key": task.key, "run_id": task.run_id})]
    b.rejoining.append(waiting)
    return waiting, list(state._start())


def reacquired(state: WorkerState, run_id: int) -> list[Any]:
    """The scheduler gave a seceded run its resources back."""
    b = books(state)
    waiting = b.awaiting_grant.pop(run_id, None)
    if waiting is None:
        return []
    waiting.granted = True
    b.rejoining.append(waiting)
    return list(state._start())


# ------------------------------------------------------------------ the task thread side
_here = threading.local()


def set_running(worker: Worker | None, task: WorkerTask | None) -> None:
    _here.worker = worker
    _here.task = task


def running() -> tuple[Worker, WorkerTask]:
    worker = getattr(_here, "worker", None)
    task = getattr(_here, "task", None)
    if worker is None or task is None:
        raise ValueError(
            "secede(), rejoin(), get_client() and worker_client() work only inside a task "
            "running on an apportion worker"
        )
    return worker, task


def current_key() -> str | None:
    """The key of the task this thread runs, or None outside tasks."""
    task = getattr(_here, "task", None)
    return None if task is None else task.key


def left_pool() -> bool:
    """Whether this task thread seceded (a replacement thread took its place in the pool)."""
    return bool(getattr(_here, "left_pool", False))


def mark_left_pool(value: bool) -> None:
    _here.left_pool = value


class _TaskHost:
    """The worker side of ``secede()``, ``rejoin()`` and ``get_client()`` for the task
    threads of this process (see apportion/core/task_host.py)."""

    def scheduler(self) -> tuple[str, str | None]:
        worker, _ = running()
        return worker.scheduler_address, worker.token

    def secede(self, release_resources: bool) -> None:
        worker, task = running()
        with worker._lock:
            instructions = secede(worker.state, task, release_resources)
        if not instructions:
            return  # seceded already
        if not left_pool():
            mark_left_pool(True)
            worker.add_task_thread()
        worker._loop_call(worker._carry_out, instructions)

    def rejoin(self) -> None:
        worker, task = running()
        with worker._lock:
            waiting, instructions = rejoin(worker.state, task)
        if waiting is None:
            return  # not seceded
        units = task.units
        worker._loop_call(worker._carry_out, instructions)
        waiting.event.wait()
        if task.units != units:  # granted again, maybe other unit indices
            info = context.get_worker()
            if info.task is not None:
                granted = dataclasses.replace(info.task, units=dict(task.units))
                context.set_current(dataclasses.replace(info, task=granted))


set_task_host(_TaskHost())
