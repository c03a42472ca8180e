"""The worker process: runs tasks in threads within its declared resources.

Tasks arrive from the scheduler (``compute``); their dependencies are fetched
from peers; a task starts only when a thread is free *and* the local ledger has
its resources free, whatever the scheduler sent. Results stay here and are
served to peers and clients; small ones also travel back with the completion.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import socket
import threading
import time
from typing import Any

from apportion.worker import output
from apportion.worker.context import TaskInfo, WorkerInfo, set_current
from apportion.worker.local_resources import LocalResources
from tornado.ioloop import PeriodicCallback

from apportion import config
from apportion.aio import background
from apportion.logs import keep_recent_lines
from apportion.protocol import Comm, CommClosedError, Listener, Message, ProtocolError, connect
from apportion.protocol.comm import format_address, parse_address
from apportion.protocol.rpc import ConnectionPool
from apportion.resources import Shape, format_resources, to_shape, validate
from apportion.serialize import (
    FunctionLoadCache,
    dumps_exception,
    dumps_value,
    loads_args,
    loads_value,
)

logger = logging.getLogger("apportion.worker")

# What a task thread hands back: (ok, value, pickled value or exception, traceback).
Outcome = tuple[bool, Any, bytes | None, str]
# A finished run for the loop: the task, its outcome, and whether its thread already told
# the scheduler (see Worker._report).
Done = tuple["LocalTask", Outcome, bool]


class LocalTask:
    __slots__ = (
        "args",
        "cancelled",
        "deps",
        "epoch",
        "fetch_keys",
        "fetched",
        "func",
        "key",
        "notify",
        "output",
        "priority",
        "run_id",
        "shape",
        "start",
        "state",
        "stop",
        "units",
    )

    def __init__(self, message: Message) -> None:
        self.key: str = message["key"]
        self.run_id: int = message["run_id"]
        self.func: bytes = message["func"]
        self.args: bytes = message["args"]
        self.deps: dict[str, list[str]] = message.get("deps") or {}
        self.shape: Shape = to_shape(message.get("resources"))
        self.priority: int = message.get("priority", 0)
        # Clients waiting for the result, told directly when connected here (see _report).
        self.notify: list[str] = message.get("notify") or []
        self.state = "fetching"
        self.cancelled = False
        self.units: dict[str, list[int]] = {}
        # Dependencies not computed here: fetched from peers and reference-counted.
        self.fetch_keys: list[str] = []
        self.epoch = 0
        # When it ran (wall clock) and what it printed: see worker/output.py.
        self.start = self.stop = 0.0
        self.output: output.Capture | list[list[str]] | None = None
        self.fetched = 0


class Worker:
    def __init__(
        self,
        scheduler_address: str,
        name: str | None = None,
        nthreads: int | None = None,
        resources: dict[str, float] | None = None,
        host: str | None = None,
        port: int = 0,
        contact_host: str | None = None,
        token: str | None = None,
        memory_limit: int | None = None,
    ) -> None:
        self.scheduler_address = scheduler_address
        configured = config.get("worker.resources", {}) or {}
        merged = {**configured, **(resources or {})}
        self.resources = validate(merged, what="capacity")
        self.nthreads = int(nthreads or config.get("worker.nthreads") or 1)
        sched_host, _ = parse_address(scheduler_address)
        loopback = sched_host in ("127.0.0.1", "localhost", "::1")
        self.host = host or ("127.0.0.1" if loopback else "0.0.0.0")
        self.port = port
        self.contact_host = contact_host
        self.name = name or ""
        self.token = token
        self.memory_limit = memory_limit
        self.ledger = LocalResources(self.resources)
        self.tasks: dict[int, LocalTask] = {}
        self.ready: list[LocalTask] = []
        self.running = 0
        # Guards the slots: the ready list, the running count, the ledger, and each task's
        # move from ready to running. A task thread takes it to free its slot and start the
        # next ready task itself, without waking the loop in between.
        self._slots = threading.Lock()
        self.data: dict[str, Any] = {}
        # Dependencies fetched from peers, kept while a task here still needs them.
        self.fetched: dict[str, Any] = {}
        self.fetched_refs: dict[str, int] = {}
        self._fetching: dict[str, asyncio.Future[None]] = {}
        self.functions = FunctionLoadCache()
        # Long-lived task threads fed by a queue (cheaper than an executor's futures); their
        # outcomes come back in _done, drained by one loop callback per burst (see _task_thread).
        self._jobs: queue.SimpleQueue[LocalTask | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._done: collections.deque[Done] = collections.deque()
        self._done_lock = threading.Lock()
        # Task threads report to the scheduler under it; a reconnection changes the epoch
        # and forgets the data under it too.
        self._report_lock = threading.Lock()
        self._drain_scheduled = False
        # Messages for the scheduler collected while draining outcomes (see _drain_done).
        self._burst: list[Message] | None = None
        self.peers = ConnectionPool("peer", token)
        # Clients connected here, by id: told of results they wait for without the
        # scheduler's hop (it hears too, and tells only the clients not told).
        self.clients: dict[str, Comm] = {}
        self.listener = Listener(self._serve_peer, token, roles=("peer", "client"))
        self.scheduler: Comm | None = None
        self.address = ""
        self.inline_limit = int(config.get("worker.inline-result-bytes"))
        # Room for the message around a result that must still fit in one frame.
        self.max_result_bytes = int(config.get("comm.max-frame-bytes")) - 4096
        self.finished = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat: PeriodicCallback | None = None
        # Bumped on every reconnection; runs from an earlier epoch report nothing.
        self.epoch = 0
        # Why the worker stopped on its own, when it failed (no scheduler to return to).
        self.failure: str | None = None

    # --------------------------------------------------------------- lifecycle
    async def start(self) -> Worker:
        self._loop = asyncio.get_running_loop()
        output.install()
        keep_recent_lines()
        for i in range(self.nthreads):
            # Daemon: a task still running when the process exits must not keep it alive.
            thread = threading.Thread(
                target=self._task_thread, name=f"apportion-task-{i}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        port = await self.listener.listen_on(self.host, self.port)
        contact = self.contact_host or (
            self.host if self.host != "0.0.0.0" else _route_ip(self.scheduler_address)
        )
        self.address = format_address(contact, port)
        self.name = self.name or self.address
        await self._connect()
        interval = float(config.get("worker.heartbeat-interval")) * 1000
        self._heartbeat = PeriodicCallback(self._send_heartbeat, interval)
        self._heartbeat.start()
        background(self._serve_scheduler())
        return self

    async def _connect(self) -> None:
        """Register with the scheduler, retrying while it is not up (yet, or again).

        Gives up after ``worker.connect-timeout`` seconds; a refusal for a bad token or
        version is final at once.
        """
        hello = {
            "address": self.address,
            "name": self.name,
            "nthreads": self.nthreads,
            "resources": self.resources,
            "memory_limit": self.memory_limit,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        timeout = float(config.get("worker.connect-timeout"))
        deadline = self._loop.time() + timeout
        delay = 0.05
        while True:
            try:
                self.scheduler, _ = await connect(
                    self.scheduler_address, "worker", self.token, hello
                )
                self.scheduler.allow_thread_writes()
                break
            except ConnectionRefusedError as exc:
                # A name still held by our previous (dead) self clears up soon; others don't.
                if "already registered" not in str(exc) or self._loop.time() > deadline:
                    raise
                problem: Exception = exc
            except OSError as exc:
                if self._loop.time() > deadline:
                    raise OSError(
                        f"no scheduler at {self.scheduler_address} after {timeout:g}s: {exc}"
                    ) from None
                problem = exc
            logger.info("waiting for scheduler %s: %s", self.scheduler_address, problem)
            await asyncio.sleep(delay)  # back-off between connection attempts
            delay = min(delay * 2, 2.0)
        logger.info(
            "worker %s connected to %s with %s and %d thread%s",
            self.name if self.name == self.address else f"{self.name} at {self.address}",
            self.scheduler_address,
            format_resources(self.resources) if self.resources else "no resources",
            self.nthreads,
            "" if self.nthreads == 1 else "s",
        )

    async def close(self, reason: str = "closing") -> None:
        if self.finished.is_set():
            return
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self.scheduler is not None and not self.scheduler.closed:
            try:
                await self.scheduler.write([{"op": "goodbye", "reason": reason}])
            except CommClosedError:
                pass
            self.scheduler.close(reason)
        self.listener.close_all()
        self.peers.close()
        for _ in self._threads:
            self._jobs.put(None)  # each thread stops after the runs already handed to it
        self.finished.set()

    def _send_heartbeat(self) -> None:
        self._start_ready()  # books runs reported by their threads while the loop slept
        if self.scheduler is not None and not self.scheduler.closed:
            self.scheduler.send({"op": "heartbeat", **output.units_held(self.tasks.values())})
            output.send_running_output(self.tasks.values(), self.scheduler.send)

    def _send(self, message: Message) -> None:
        if self.scheduler is not None and not self.scheduler.closed:
            if self._burst is not None:
                self._burst.append(message)  # sent as one frame when the drain ends
            else:
                self.scheduler.send(message)

    # ------------------------------------------------------ scheduler messages
    async def _serve_scheduler(self) -> None:
        """Serve scheduler messages; after losing the scheduler, start afresh with a new one."""
        while not self.finished.is_set():
            assert self.scheduler is not None
            reason = await self._read_scheduler(self.scheduler)
            if self.finished.is_set():
                return
            logger.warning("worker %s lost the scheduler (%s); reconnecting", self.name, reason)
            self._forget_everything()
            try:
                await self._connect()
            except OSError as exc:
                logger.error("worker %s stopping: %s", self.name, exc)
                self.failure = str(exc)
                await self.close(str(exc))

    async def _read_scheduler(self, comm: Comm) -> str:
        try:
            await comm.serve(self._on_scheduler_frame)
        except CommClosedError:
            pass
        except Exception as exc:  # a malformed frame or message
            comm.close()
            return f"bad message from scheduler: {exc!r}"
        return "scheduler connection closed"

    def _on_scheduler_frame(self, messages: list[Message]) -> None:
        for message in messages:
            op = message["op"]
            if op == "compute":
                self._on_compute(message)
            elif op == "cancel":
                self._on_cancel(message["run_id"])
            elif op == "free-keys":
                for key in message["keys"]:
                    self.data.pop(key, None)
            elif op == "run":
                background(self._on_run(message))
            elif op == "acquire-data":
                background(self._acquire(message["key"], message["who_has"]))
            elif op == "close":  # retired, its results copied elsewhere: the process ends
                background(self.close(str(message.get("reason", "told to close"))))
            else:
                logger.warning("ignoring unknown scheduler operation %r", op)

    def _forget_everything(self) -> None:
        """A new scheduler knows none of our runs or data: drop them all.

        Running threads cannot be stopped; they keep their resources in the ledger until
        they end, and their results are dropped (their run ids mean nothing any more).
        """
        with self._report_lock:
            self.epoch += 1
            self.data.clear()
        with self._slots:
            self.ready.clear()  # no thread can start any of them now
        for task in list(self.tasks.values()):
            if task.state == "running":
                task.cancelled = True
                del self.tasks[task.run_id]
            else:
                self._drop(task)
        self.fetched.clear()
        self.fetched_refs.clear()

    def _on_compute(self, message: Message) -> None:
        task = LocalTask(message)
        task.epoch = self.epoch
        if not self.ledger.can_ever_fit(task.shape):
            demand = format_resources(dict(task.shape))
            problem = ValueError(
                f"task {task.key!r} needs {demand}, more than worker "
                f"{self.name} declared ({format_resources(self.resources)})"
            )
            self._send(_erred(task, problem))
            return
        self.tasks[task.run_id] = task
        missing = [k for k in task.deps if k not in self.data and k not in self.fetched]
        task.fetch_keys = [k for k in task.deps if k not in self.data]
        for key in task.fetch_keys:
            self.fetched_refs[key] = self.fetched_refs.get(key, 0) + 1
        if missing:
            background(self._gather_deps(task, missing))
        else:
            self._make_ready(task)

    def _on_cancel(self, run_id: int) -> None:
        task = self.tasks.get(run_id)
        if task is None:
            return
        with self._slots:  # a thread may be starting it right now
            running = task.state == "running"
            if running:
                task.cancelled = True  # its thread cannot be interrupted; reported when it ends
            elif task in self.ready:
                self.ready.remove(task)
        if running:
            return
        self._drop(task)
        self._send({"op": "task-released", "key": task.key, "run_id": run_id})
        self._start_ready()

    def _drop(self, task: LocalTask) -> None:
        if self.tasks.get(task.run_id) is task:
            del self.tasks[task.run_id]
        with self._slots:
            if task in self.ready:
                self.ready.remove(task)
        for key in task.fetch_keys:
            refs = self.fetched_refs.get(key, 0) - 1
            if refs <= 0:
                self.fetched_refs.pop(key, None)
                self.fetched.pop(key, None)
            else:
                self.fetched_refs[key] = refs
        task.fetch_keys = []

    # ------------------------------------------------------------ dependencies
    async def _gather_deps(self, task: LocalTask, keys: list[str]) -> None:
        results = await asyncio.gather(
            *(self._fetch(k, task.deps[k]) for k in keys), return_exceptions=True
        )
        if self.tasks.get(task.run_id) is not task:
            return  # cancelled meanwhile, or from before a reconnection
        missing = {k: task.deps[k] for k, r in zip(keys, results, strict=True) if r is not None}
        if missing:
            logger.warning("task %s: could not fetch %s", task.key, sorted(missing))
            self._drop(task)
            self._send(
                {"op": "missing-deps", "key": task.key, "run_id": task.run_id, "missing": missing}
            )
            self._start_ready()
            return
        self._make_ready(task)

    async def _fetch(self, key: str, holders: list[str]) -> None:
        """Fetch one dependency into ``self.fetched``; raises if no holder has it."""
        if key in self.data or key in self.fetched:
            return
        pending = self._fetching.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future = asyncio.get_running_loop().create_future()
        self._fetching[key] = future
        try:
            for holder in holders:
                try:
                    reply = await self.peers.request(holder, {"op": "get-data", "keys": [key]})
                except (OSError, CommClosedError) as exc:
                    logger.info("fetching %s from %s failed: %s", key, holder, exc)
                    continue
                if key in reply.get("data", {}):
                    self.fetched[key] = loads_value(reply["data"][key])
                    future.set_result(None)
                    return
            raise LookupError(f"no holder of {key!r} answered: {holders}")
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            self._fetching.pop(key, None)

    async def _acquire(self, key: str, holders: list[str]) -> None:
        """Keep a copy of a result held elsewhere (its holder is being retired)."""
        epoch = self.epoch
        try:
            await self._fetch(key, holders)
            if key not in self.data:
                # Fetched values are reference-counted for the tasks here; this copy is ours.
                owned = key in self.fetched_refs
                self.data[key] = self.fetched[key] if owned else self.fetched.pop(key)
            reply: Message = {"op": "data-acquired", "key": key}
        except Exception as exc:  # no holder answered, or it was dropped meanwhile
            reply = {"op": "acquire-failed", "key": key, "reason": f"{type(exc).__name__}: {exc}"}
        if epoch == self.epoch:  # the scheduler that asked is still ours
            self._send(reply)

    # --------------------------------------------------------------- execution
    def _make_ready(self, task: LocalTask) -> None:
        with self._slots:
            task.state = "ready"
            self.ready.append(task)
        self._start_ready()

    def _start_ready(self) -> None:
        self._book_done()  # what their threads reported, or could not
        with self._slots:
            while (task := self._take_startable()) is not None:
                self._jobs.put(task)

    def _take_startable(self) -> LocalTask | None:
        """Under ``_slots``: give a free thread the most urgent ready task whose resources
        are free now (taking them), or None."""
        if self.running >= self.nthreads:
            return None
        best: LocalTask | None = None
        for task in self.ready:
            if self.ledger.fits_now(task.shape) and (best is None or task.priority > best.priority):
                best = task
        if best is not None:
            self.ready.remove(best)
            best.units = self.ledger.acquire(best.shape)
            best.state = "running"
            self.running += 1
        return best

    def _finish_and_take_next(self, task: LocalTask) -> LocalTask | None:
        """In a task thread: free its slot and resources, and take the next ready task.
        Others that can start now (what was freed may fit several) go to idle threads."""
        with self._slots:
            self.running -= 1
            self.ledger.release(task.shape, task.units)
            mine = self._take_startable()
            if mine is not None:
                while (other := self._take_startable()) is not None:
                    self._jobs.put(other)
            return mine

    def _resolve(self, key: str) -> Any:
        try:
            return self.data[key]
        except KeyError:
            return self.fetched[key]

    def _task_thread(self) -> None:
        """A task thread: run what _start_ready hands over, and then the next ready task
        while there is one, report each to the scheduler (or, failing that, the loop)."""
        task = self._jobs.get()
        while task is not None:
            outcome = self._execute(task)
            reported = self._report(task, outcome)
            self._done.append((task, outcome, reported))
            following = self._finish_and_take_next(task)
            # Reported: the loop books the run when it next starts tasks (any new one:
            # _start_ready) or at the heartbeat; waking it now would only take the CPU from
            # the scheduler and client. Otherwise the loop must tell the scheduler: wake it,
            # unless a drain is pending already (one wake-up per burst).
            if not reported and self._schedule_drain() is False:
                return  # the event loop is closed: the worker is gone
            task = following if following is not None else self._jobs.get()

    def _schedule_drain(self) -> bool | None:
        """Have the loop drain outcomes soon; False once the loop is closed."""
        with self._done_lock:
            if self._drain_scheduled:
                return None
            self._drain_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain_done)
        except RuntimeError:
            return False
        return True

    def _drain_done(self) -> None:
        # Clear the flag first: an outcome appended after it is either drained below or
        # schedules another drain.
        with self._done_lock:
            self._drain_scheduled = False
        self._burst = []
        try:
            self._start_ready()
        finally:
            burst, self._burst = self._burst, None
        if burst and self.scheduler is not None and not self.scheduler.closed:
            self.scheduler.send_now(burst)  # the whole burst at once, not next tick

    def _book_done(self) -> None:
        """Book the runs whose threads finished (see _task_thread)."""
        while self._done:
            self._on_done(*self._done.popleft())

    def _execute(self, task: LocalTask) -> Outcome:
        """Runs in a task thread: returns (ok, value, pickled, traceback)."""
        context = TaskInfo(task.key, dict(task.shape), task.units)
        task.start = output.begin(task)
        task.fetched = len(task.fetch_keys)  # _drop forgets them before the loop reports
        try:
            value = self._call(task.func, task.args, context)
            payload = dumps_value(value)
            if len(payload) > self.max_result_bytes:
                raise ValueError(
                    f"the result of task {task.key!r} is {len(payload):,} bytes, more than "
                    f"comm.max-frame-bytes allows ({self.max_result_bytes:,}): return smaller "
                    "pieces (split the work) or raise comm.max-frame-bytes everywhere"
                )
            return True, value, payload, ""
        except BaseException as exc:
            data, text = dumps_exception(exc)
            return False, None, data, text
        finally:
            task.output = output.end()
            task.stop = time.time()

    def _report(self, task: LocalTask, outcome: Outcome) -> bool:
        """In the task thread: tell the scheduler at once when the connection is idle,
        rather than waking the loop first (which still does the bookkeeping, _on_done).
        False: nothing was sent, the loop reports."""
        comm = self.scheduler
        if comm is None:
            return False
        ok, value, payload, text = outcome
        assert payload is not None
        with self._report_lock:
            if task.cancelled or task.epoch != self.epoch or comm is not self.scheduler:
                return False
            if ok:
                message = self._finished_message(task, payload)
                # Stored before the scheduler hears of it: a peer may ask for it at once.
                self.data[task.key] = value
                if task.notify and not self.ready and self._jobs.empty():
                    # About to go idle: someone likely waits on this very result. (Busy
                    # workers leave it to the scheduler, which batches for clients.)
                    self._tell_clients(task, message)
            else:
                message = _erred_message(task, payload, text)
            sent = False
            try:
                sent = comm.send_from_thread([message])
            except Exception:
                # The run must still be booked: the loop reports it (or logs why it cannot).
                logger.exception("task thread could not report %s", task.key)
            if ok and not sent and "notified" not in message:
                self.data.pop(task.key, None)  # the loop stores it when it reports (_on_done)
            return sent

    def _tell_clients(self, task: LocalTask, finished: Message) -> None:
        """In the task thread: send the result to its waiting clients connected here, and
        name them in ``finished`` so that the scheduler does not tell them again."""
        direct = {**finished, "who_has": [self.address]}
        del direct["run_id"]
        told = []
        for client in task.notify:
            comm = self.clients.get(client)
            if comm is not None and comm.send_from_thread([direct]):
                told.append(client)
        if told:
            finished["notified"] = told

    def _finished_message(self, task: LocalTask, payload: bytes) -> Message:
        message: Message = {
            "op": "task-finished",
            "key": task.key,
            "run_id": task.run_id,
            "nbytes": len(payload),
        }
        if len(payload) <= self.inline_limit:
            message["data"] = payload
        return _with_report(message, task)

    def _call(self, func: bytes, args: bytes, task: TaskInfo | None) -> Any:
        """Call a pickled function with its arguments, ``get_worker()`` answering meanwhile."""
        set_current(
            WorkerInfo(
                self.name,
                self.address,
                self.nthreads,
                dict(self.resources),
                self.scheduler_address,
                task,
            )
        )
        try:
            call_args, kwargs = loads_args(args, self._resolve)
            return self.functions.loads(func)(*call_args, **kwargs)
        finally:
            set_current(None)

    def _on_done(self, task: LocalTask, outcome: Outcome, reported: bool) -> None:
        # Its thread freed its slot and resources already (_finish_and_take_next).
        if task.epoch != self.epoch:
            return  # a run the current scheduler never heard of
        self._drop(task)
        if reported:
            pass  # its thread told the scheduler (a cancel since crossed it, as on the wire)
        elif task.cancelled:
            self.data.pop(task.key, None)  # kept for clients told of it (see _report)
            self._send({"op": "task-released", "key": task.key, "run_id": task.run_id})
        else:
            ok, value, payload, text = outcome
            assert payload is not None
            if ok:
                self.data[task.key] = value
                self._send(self._finished_message(task, payload))
            else:
                self._send(_erred_message(task, payload, text))

    async def _on_run(self, message: Message) -> None:
        """``client.run``: call a function in this worker process and answer."""

        def call() -> Message:
            try:
                return {"result": dumps_value(self._call(message["func"], message["args"], None))}
            except BaseException as exc:
                data, text = dumps_exception(exc)
                return {"exception": data, "traceback": text}

        reply = await asyncio.get_running_loop().run_in_executor(None, call)
        self._send({"op": "run-result", "id": message["id"], **reply})

    # ------------------------------------------------------------ peer serving
    async def _serve_peer(self, comm: Comm, hello: Message) -> None:
        comm.send({"op": "welcome", "name": self.name})
        client = hello.get("client_id") if hello["role"] == "client" else None
        if isinstance(client, str):
            comm.allow_thread_writes()
            self.clients[client] = comm
        try:
            while True:
                for message in await comm.read():
                    if message["op"] != "get-data":
                        raise ProtocolError(f"unknown peer operation {message['op']!r}")
                    data = {}
                    for key in message["keys"]:
                        if key in self.data:
                            data[key] = dumps_value(self.data[key])
                    comm.send({"op": "data", "id": message.get("id"), "data": data})
        except (CommClosedError, ProtocolError, KeyError, TypeError) as exc:
            if not isinstance(exc, CommClosedError):
                logger.warning("closing peer connection from %s: %r", comm.peer, exc)
        finally:
            if client is not None and self.clients.get(client) is comm:
                del self.clients[client]


def _erred(task: LocalTask, exc: BaseException) -> Message:
    return _erred_message(task, *dumps_exception(exc))


def _erred_message(task: LocalTask, exception: bytes, traceback: str) -> Message:
    message = {
        "op": "task-erred",
        "key": task.key,
        "run_id": task.run_id,
        "exception": exception,
        "traceback": traceback,
    }
    return _with_report(message, task)


def _with_report(message: Message, task: LocalTask) -> Message:
    return output.add_run_report(
        message,
        task.start,
        task.stop,
        task.units,
        task.fetched,
        task.output if isinstance(task.output, list) else None,
    )


def _route_ip(scheduler_address: str) -> str:
    """The local IP this host uses toward the scheduler (no packet is sent)."""
    host, port = parse_address(scheduler_address)
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((socket.gethostbyname(host), port))
        return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())
    finally:
        probe.close()
