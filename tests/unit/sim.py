"""A pure, in-memory driver for ``SchedulerState``: plays the workers and the client.

It answers the scheduler's outbox the way real workers would (runs stay outstanding
until the test reports them over) and keeps its *own* ledger of what each worker is
running, so the tests check the scheduler's accounting against an independent record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apportion.scheduler.state import SchedulerState

from apportion import config
from apportion.serialize import dumps_exception, loads_value

Message = dict[str, Any]


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Sim:
    def __init__(
        self, settings: dict[str, Any] | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        self.clock = clock or FakeClock()
        # A scheduler that is not recovering from a restart unless a test says so (no
        # notices are held back for workers coming back).
        with config.set({"scheduler.recovery-wait": 0.0, **(settings or {})}):
            self.state = SchedulerState(clock=self.clock)
        self.worker_addresses: set[str] = set()
        # address -> run_id -> compute message, for runs the worker has not reported over.
        self.runs: dict[str, dict[int, Message]] = {}
        # Every compute message ever sent, in order, as (address, message).
        self.computes: list[tuple[str, Message]] = []
        self.cancels: dict[str, list[int]] = {}
        self.freed: dict[str, list[str]] = {}
        # Every acquire-data message ever sent, in order, as (address, message).
        self.acquires: list[tuple[str, Message]] = []
        # Seceded runs given their resources back, as (address, run_id).
        self.reacquired: list[tuple[str, int]] = []
        # Workers each worker was told the scheduler removed (fetches from them end).
        self.left: dict[str, list[str]] = {}
        # New totals sent to workers (client.set_resources), as (address, resources).
        self.resized: list[tuple[str, dict[str, float]]] = []
        self.to_clients: dict[str, list[Message]] = {}
        # Every push-data message ever sent, in order, as (pusher's address, message).
        self.pushes: list[tuple[str, Message]] = []
        # Stored arguments each worker was told to hold as results (stored_arguments.py).
        self.adopted: dict[str, list[str]] = {}

    # ------------------------------------------------------------------ plumbing
    def step(self) -> dict[str, list[Message]]:
        """Drain the outbox into the fake workers and clients; check invariants."""
        out = self.state.take_outbox()
        for dest, messages in out.items():
            if dest in self.worker_addresses:
                for msg in messages:
                    self._to_worker(dest, msg)
            else:
                self.to_clients.setdefault(dest, []).extend(messages)
        self.assert_consistent()
        return out

    def _to_worker(self, address: str, msg: Message) -> None:
        op = msg["op"]
        if op == "compute":
            assert msg["run_id"] not in self.runs[address], "run id reused"
            # Results sent along are the task's own inputs, each in memory.
            for dep in msg.get("inline", ()):
                assert dep in msg["deps"] and self.state.tasks[dep].state == "memory", dep
            self.runs[address][msg["run_id"]] = msg
            self.computes.append((address, msg))
        elif op == "cancel":
            self.cancels.setdefault(address, []).append(msg["run_id"])
        elif op == "free-keys":
            self.freed.setdefault(address, []).extend(msg["keys"])
        elif op == "acquire-data":
            self.acquires.append((address, msg))
        elif op == "reacquired":
            self.reacquired.append((address, msg["run_id"]))
        elif op == "set-resources":
            self.resized.append((address, msg["resources"]))
        elif op == "worker-left":
            self.left.setdefault(address, []).append(msg["address"])
        elif op == "push-data":
            self.pushes.append((address, msg))
        elif op == "adopt-stored":
            self.adopted.setdefault(address, []).append(msg["key"])
        else:  # pragma: no cover - a new op the tests do not know yet
            raise AssertionError(f"unexpected message to worker {address}: {msg}")

    def assert_consistent(self) -> None:
        problems = self.state.check_invariants()
        assert problems == [], problems
        # Independent ledger: what the scheduler counts as used on each live worker is
        # exactly the sum of the demands of the runs that worker has not reported over.
        adjusted = self.state.adjusted  # seceded runs, resources set (adjustments.py)
        for address, ws in self.state.workers.items():
            expected: dict[str, float] = dict.fromkeys(ws.total, 0)
            for run_id, msg in self.runs[address].items():
                if adjusted is not None and run_id in adjusted.unheld_runs:
                    continue  # seceded, its resources given back (scheduler/secession.py)
                for name, amount in msg.get("resources", {}).items():
                    expected[name] = expected.get(name, 0) + amount
            for name in set(expected) | set(ws.used):
                assert abs(ws.used.get(name, 0) - expected.get(name, 0)) < 1e-9, (
                    f"{address}: {name} used {ws.used.get(name, 0)}, "
                    f"outstanding runs hold {expected.get(name, 0)}"
                )
                # (Over its total only when set below what its runs hold: set_resources.)
                assert ws.used.get(name, 0) <= ws.total.get(name, 0) + 1e-9 or (
                    adjusted is not None and ws in adjusted.shrunk
                )
            # Beyond its slots only for more urgent tasks (see _outranked_worker).
            priorities = {msg.get("priority", 0) for msg in self.runs[address].values()}
            stopped = ws.retiring or ws.paused  # (slots 0: no new work)
            assert stopped or len(self.runs[address]) <= ws.slots or len(priorities) > 1

    # ------------------------------------------------------------------ stimuli
    def add_client(self, client: str = "c") -> None:
        self.state.add_client(client)
        self.step()

    def add_worker(
        self, address: str, resources: dict[str, float] | None = None, nthreads: int = 1
    ) -> None:
        self.worker_addresses.add(address)
        self.runs[address] = {}
        self.state.add_worker(address, address, nthreads, dict(resources or {}))
        self.step()

    def remove_worker(self, address: str, expected: bool = False) -> None:
        self.state.remove_worker(address, expected=expected)
        self.runs[address] = {}
        self.step()

    def submit(
        self,
        key: str,
        deps: list[str] | tuple[str, ...] = (),
        resources: dict[str, float] | None = None,
        priority: int = 0,
        retries: int = 0,
        client: str = "c",
    ) -> None:
        self.submit_many([task(key, deps, resources, priority, retries)], client)

    def submit_many(self, specs: list[Message], client: str = "c") -> None:
        self.state.handle_submit(client, specs)
        self.step()

    def release(self, *keys: str, client: str = "c") -> None:
        self.state.handle_release(client, list(keys))
        self.step()

    def cancel(self, *keys: str, client: str = "c") -> None:
        self.state.handle_cancel(client, list(keys))
        self.step()

    def run_of(self, key: str) -> tuple[str, int]:
        """The (worker, run_id) of the latest outstanding run of ``key``."""
        for address, msg in reversed(self.computes):
            if msg["key"] == key and msg["run_id"] in self.runs[address]:
                return address, msg["run_id"]
        raise AssertionError(f"no outstanding run of {key!r}; runs: {self.outstanding()}")

    def outstanding(self) -> list[str]:
        return sorted(msg["key"] for runs in self.runs.values() for msg in runs.values())

    def finish(
        self,
        key: str,
        nbytes: int = 8,
        run: tuple[str, int] | None = None,
        data: bytes | None = None,
        seconds: float | None = None,
    ) -> None:
        """The worker reports the run over; ``data``: the result's pickle, when small;
        ``seconds``: how long it ran (left out of the report when None)."""
        address, run_id = run or self.run_of(key)
        del self.runs[address][run_id]
        report: Message = {"run_id": run_id, "nbytes": nbytes}
        if data is not None:
            report["data"] = data
        if seconds is not None:
            report["start"], report["stop"] = 1000.0, 1000.0 + seconds
        self.state.handle_task_finished(address, report)
        self.step()

    def err(
        self, key: str, exc: BaseException | None = None, run: tuple[str, int] | None = None
    ) -> None:
        address, run_id = run or self.run_of(key)
        del self.runs[address][run_id]
        data, text = dumps_exception(exc or ValueError(f"{key} failed"))
        self.state.handle_task_erred(
            address, {"run_id": run_id, "exception": data, "traceback": text}
        )
        self.step()

    def released(self, key: str, run: tuple[str, int] | None = None) -> None:
        """The worker confirms it dropped a run (after a cancel, or when shutting down)."""
        address, run_id = run or self.run_of(key)
        del self.runs[address][run_id]
        self.state.handle_task_released(address, {"run_id": run_id})
        self.step()

    def retire(self, *names: str, count: int | None = None, requester: str = "ops") -> list[str]:
        chosen = self.state.retire_workers(requester, len(self.to_clients), list(names), count)
        self.step()
        return chosen

    def acquired(self, address: str, key: str) -> None:
        """A worker reports that it copied ``key`` from a peer, as asked."""
        self.state.handle_data_acquired(address, {"key": key})
        self.step()

    def acquire_failed(self, address: str, key: str, reason: str = "no holder answered") -> None:
        self.state.handle_acquire_failed(address, {"key": key, "reason": reason})
        self.step()

    # ------------------------------------------------------------------ queries
    def states(self) -> dict[str, str]:
        return {key: ts.state for key, ts in self.state.tasks.items()}

    def used(self, address: str) -> dict[str, float]:
        return dict(self.state.workers[address].used)

    def computed_keys(self, address: str | None = None) -> list[str]:
        return [m["key"] for a, m in self.computes if address is None or a == address]

    def client_ops(self, key: str, client: str = "c") -> list[str]:
        return [m["op"] for m in self.to_clients.get(client, []) if m.get("key") == key]

    def client_messages(self, op: str, client: str = "c") -> list[Message]:
        return [m for m in self.to_clients.get(client, []) if m["op"] == op]

    def retire_reply(self, requester: str = "ops") -> Message | None:
        """The answer to the latest retire request of ``requester`` (None while pending)."""
        replies = self.client_messages("retire-reply", requester)
        return {k: replies[-1][k] for k in ("retired", "kept")} if replies else None

    def error_of(self, key: str, client: str = "c") -> BaseException:
        erred = [m for m in self.client_messages("task-erred", client) if m["key"] == key]
        assert erred, f"client was not told that {key!r} erred: {self.to_clients.get(client)}"
        return loads_value(erred[-1]["exception"])


def task(
    key: str,
    deps: list[str] | tuple[str, ...] = (),
    resources: dict[str, float] | None = None,
    priority: int = 0,
    retries: int = 0,
) -> Message:
    spec: Message = {
        "key": key,
        "func": b"func-" + key.encode(),
        "args": b"args",
        "deps": list(deps),
        "priority": priority,
        "retries": retries,
    }
    if resources:
        spec["resources"] = resources
    return spec
