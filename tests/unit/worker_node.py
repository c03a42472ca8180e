"""A pure, in-memory driver for the worker's state machine (worker/state.py).

``Node`` plays the worker's edge: it records the instructions, "runs" the tasks handed to
threads only when a test says so, plays the task threads' ``secede()`` and ``rejoin()``,
and checks the state machine's books after every event, against a ledger of its own: the
resources in use are exactly those of the runs in threads that did not give them back.
"""

from __future__ import annotations

import pickle
from typing import Any

from apportion.worker.state import (
    AwaitPush,
    Execute,
    Fetch,
    Instruction,
    Resume,
    Send,
    TellClients,
    WorkerState,
)

from apportion.serialize import dumps_exception

Message = dict[str, Any]


class Node:
    def __init__(
        self,
        nthreads: int = 1,
        resources: dict[str, float] | None = None,
        inline: int = 100,
        story_length: int = 10_000,
    ) -> None:
        self.state = WorkerState(
            nthreads, resources or {}, "w", inline_limit=inline, story_length=story_length
        )
        self.running: dict[str, Any] = {}  # key -> WorkerTask handed to a thread
        self.started: list[str] = []  # keys, in the order they were handed to threads
        self.sent: list[Message] = []
        self.fetches: list[Fetch] = []
        self.awaited: list[AwaitPush] = []  # pushes the scheduler announced
        self.told: list[tuple[list[str], Message]] = []
        # As the task threads see it: runs whose threads left the pool (until resumed),
        # those of them that gave their resources back, those blocked in rejoin(), and the
        # runs woken there, in order.
        self.seceded: set[str] = set()
        self.released: set[str] = set()
        self.waiting: set[str] = set()
        self.resumed: list[str] = []

    def apply(self, instructions: list[Instruction]) -> list[Instruction]:
        starting = []
        for instruction in instructions:
            if isinstance(instruction, Execute):
                task = instruction.task
                assert task.key not in self.running, f"{task.key} started twice"
                self.running[task.key] = task
                self.started.append(task.key)
                starting.append(task)
            elif isinstance(instruction, Send):
                message = instruction.message
                self.sent.append(message)
                if message["op"] == "secede":
                    self.seceded.add(message["key"])
                    if message["release"]:
                        self.released.add(message["key"])
            elif isinstance(instruction, Fetch):
                self.fetches.append(instruction)
            elif isinstance(instruction, AwaitPush):
                self.awaited.append(instruction)
            elif isinstance(instruction, TellClients):
                self.told.append((instruction.clients, instruction.message))
            elif isinstance(instruction, Resume):
                key = instruction.task.key
                assert key in self.waiting, f"{key} resumed but not waiting in rejoin()"
                self.waiting.discard(key)
                self.seceded.discard(key)
                if key in self.released:
                    self.released.discard(key)
                    starting.append(instruction.task)
                self.resumed.append(key)
        problems = self.state.check_invariants()
        assert problems == [], problems
        # Independent ledger: the resources in use are exactly those of the runs in threads
        # that hold them; what starts fits the totals (set_resources may lower them below
        # what runs hold already).
        for name, total in self.state.resources.items():
            held = sum(
                dict(t.shape).get(name, 0)
                for key, t in self.running.items()
                if key not in self.released
            )
            assert abs(self.state.ledger.used[name] - held) < 1e-9, (name, held)
            if any(name in dict(t.shape) for t in starting):
                assert held <= total + 1e-9, (name, held, total)
        assert len(self.running) - len(self.seceded) <= self.state.nthreads
        return instructions

    # ------------------------------------------------------------------ events
    def compute(
        self,
        key: str,
        run_id: int | None = None,
        inputs: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        """The scheduler's ``compute``; ``inputs``: values sent along with it (inline)."""
        message = {"key": key, "run_id": run_id or run_id_of(key), "func": b"f", "args": b"a"}
        inline = None
        if inputs is not None:
            inline = {k: (value, len(pickle.dumps(value))) for k, value in inputs.items()}
        self.apply(self.state.compute({**message, **fields}, inline))

    def finish(self, key: str, value: Any = None, *, busy: bool = False) -> list[Instruction]:
        task = self._end(key)
        payload = pickle.dumps(value if value is not None else key)
        return self.end(task, True, value or key, payload, "", busy)

    def err(self, key: str) -> None:
        task = self._end(key)
        data, text = dumps_exception(ValueError(f"{key} failed"))
        self.end(task, False, None, data, text)

    def _end(self, key: str) -> Any:
        assert key not in self.waiting, f"{key} is blocked in rejoin(): it cannot end"
        self.seceded.discard(key)
        self.released.discard(key)
        return self.running.pop(key)

    def end(
        self, task: Any, ok: bool, value: Any, payload: bytes, text: str, busy: bool = False
    ) -> list[Instruction]:
        """As a task thread does: report the run, then free its slot (whose next task, if
        any, comes first in what is returned: that thread runs it)."""
        report = self.state.report_run(task, ok, value, payload, text, busy)
        return self.apply(self.state.free_run(task) + report)

    def fetched(self, key: str, value: Any = "fetched", epoch: int | None = None) -> None:
        when = self.state.epoch if epoch is None else epoch
        self.apply(self.state.fetched(key, value, when))

    def fetch_failed(self, key: str) -> None:
        self.apply(self.state.fetch_failed(key, self.state.epoch, "no holder answered"))

    def secede(self, key: str, release: bool = False) -> list[Instruction]:
        """``secede()`` in the run of ``key``."""
        return self.apply(self.state.secede(self.running[key], release))

    def rejoin(self, key: str) -> list[Instruction]:
        """``rejoin()`` in the run of ``key``: its thread blocks until resumed."""
        self.waiting.add(key)
        return self.apply(self.state.rejoin(self.running[key]))

    def reacquired(self, key: str) -> list[Instruction]:
        """The scheduler grants the seceded run of ``key`` its resources back."""
        return self.apply(self.state.reacquired(self.running[key].run_id))

    def set_resources(self, resources: dict[str, float]) -> list[Instruction]:
        return self.apply(self.state.set_resources(resources))

    def ops(self, op: str) -> list[Message]:
        return [m for m in self.sent if m["op"] == op]


def run_id_of(key: str) -> int:
    """A distinct run id per key (as the scheduler would send)."""
    return int.from_bytes(key.encode(), "big")
