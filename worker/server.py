"""The worker process: the edge around the worker's state machine (worker/state.py).

What to run, fetch, hold and report is decided there, from the scheduler's messages,
fetch outcomes and ends of runs; this module carries out its instructions: task threads
run tasks, peers are asked for inputs, results are served to peers and clients, and
reports go to the scheduler (from a task thread at once when the connection is idle).
One lock guards the state machine (its rule is written in Worker.__init__).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import threading
import time
from typing import Any

from apportion.worker import memory, output, readiness, secession, spill, stored, transfers, uploads
from apportion.worker.state import (
    AwaitPush,
    Execute,
    Fetch,
    Instruction,
    Resume,
    Send,
    TellClients,
    WorkerState,
    WorkerTask,
    erred_message,
)
from tornado.ioloop import PeriodicCallback

from apportion import config, shared_memory
from apportion.aio import background
from apportion.auth import data_token
from apportion.backoff import QuietRetries
from apportion.core.context import TaskInfo, WorkerInfo, set_current
from apportion.core.task_host import close_clients, worker_started
from apportion.errors import InputLoadError, Reschedule, TaskTimeoutError
from apportion.logs import keep_recent_lines
from apportion.memory_limit import format_size, parse_memory_limit
from apportion.protocol import Comm, CommClosedError, Listener, Message, ProtocolError, connect
from apportion.protocol.comm import (
    UNREACHABLE_AFTER_HEARTBEATS,
    format_address,
    parse_address,
    welcome,
)
from apportion.protocol.rpc import ConnectionPool
from apportion.resources import format_resources, validate
from apportion.serialize import (
    FunctionLoadCache,
    Payload,
    Pickled,
    dumps_data,
    dumps_exception,
    dumps_value,
    loads_args,
    loads_value,
)

logger = logging.getLogger("apportion.worker")

# Tasks are unpickled one at a time in this process: unpickling imports the modules a task
# names, and task threads importing a package at once (dask.dataframe, whose modules import
# each other) fail with a partially initialized module or Python's import deadlock error.
# Dask does the same by deserializing on one thread. Re-entrant: an object being unpickled
# may unpickle another.
_unpickling = threading.RLock()

# What a task thread hands back: (ok, value, pickled value or exception, traceback).
Outcome = tuple[bool, Any, Payload, str]


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
        memory_limit: int | float | str | None = None,
    ) -> None:
        self.scheduler_address = scheduler_address
        configured = config.get("worker.resources", {}) or {}
        merged = {**configured, **(resources or {})}
        advertised = validate(merged, what="capacity")
        self.nthreads = int(nthreads or config.get("worker.nthreads") or 1)
        sched_host, _ = parse_address(scheduler_address)
        loopback = sched_host in ("127.0.0.1", "localhost", "::1")
        self.host = host or ("127.0.0.1" if loopback else "0.0.0.0")
        self.port = port
        self.contact_host = contact_host
        self.name = name or ""
        self.token = token
        # Bytes (None: unbounded); "auto" here is the whole machine: a supervisor starting
        # several workers divides it among them before (apportion/memory_limit.py).
        self.memory_limit = parse_memory_limit(memory_limit)
        self.memory_thresholds = memory.Thresholds.from_config()
        self.inline_limit = int(config.get("worker.inline-result-bytes"))
        # Results held here; spilled to disk under memory pressure (worker/spill.py).
        self.data: spill.SpillBuffer | None = None
        target = self.memory_thresholds.target
        self._target_bytes = (
            int(target * self.memory_limit) if target and self.memory_limit else 1 << 62
        )
        # Below this, no run's result has anything spilled (the cheap test after each run).
        self._lowest_goal = memory.spill_goal(self._target_bytes, self._target_bytes)
        if self.memory_limit is not None:
            directory = config.get("worker.memory.spill-directory")
            self.data = spill.SpillBuffer(
                spill.new_spill_directory(directory), target=self._target_bytes
            )
        self._memory_stop = threading.Event()
        # One measure-and-spill at a time (the monitor's thread, task threads after a run):
        # each decides on a measure taken after the other's spill, not both on one.
        self._spilling = threading.Lock()
        # Writes results out after runs on a thread of its own (worker/spill.py): a task
        # thread starts its next task while the older result is written.
        self._spill_writer = (
            spill.SpillWriter(self.data, self._spilling, after=self._resume_if_room)
            if self.data is not None
            else None
        )
        # Seconds task threads spilled results themselves (the writer counts its waits),
        # and seconds paused (counted with self._lock held).
        self.spill_wait_seconds = 0.0
        self.paused_seconds = 0.0
        self._paused_since: float | None = None
        # What the worker runs, holds and fetches: a pure state machine (worker/state.py).
        # THE LOCK RULE: self.state is read and changed only with self._lock held, by the
        # event loop and by task threads alike; the instructions it returns are carried
        # out after releasing it. The lock also guards _unsent, _drain_scheduled and _wakes.
        self.state = WorkerState(
            self.nthreads, advertised, self.name, self.inline_limit, data=self.data
        )
        self._lock = threading.Lock()
        self.functions = FunctionLoadCache()
        # Long-lived task threads fed by a queue (cheaper than an executor's futures).
        self._jobs: queue.SimpleQueue[WorkerTask | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        # Messages task threads could not write themselves, with their epoch; the loop
        # sends them in one frame per burst (one wake-up per burst, see _hand_to_loop).
        self._unsent: list[Message] = []
        self._drain_scheduled = False
        # Seceded runs' threads waiting in rejoin(), by run id: set by Resume.
        self._wakes: dict[int, threading.Event] = {}
        self.peers = ConnectionPool("peer", token)
        # Clients connected here, by id: told of results they wait for without the
        # scheduler's hop (it hears too, and tells only the clients not told).
        self.clients: dict[str, Comm] = {}
        self.listener = Listener(self._serve_peer, token, roles=("peer", "client"))
        if token is not None:  # clients of a tenant fetch results with the data token
            self.listener.client_tokens[data_token(token)] = "data"
        # Large arguments clients put here for their tasks (worker/stored.py).
        self.stored = stored.StoredArguments()
        # Large results in shared memory, for peers on this host (apportion/shared_memory.py).
        self.shared = shared_memory.SharedResults(bool(config.get("worker.shared-memory")))
        self.scheduler: Comm | None = None
        self.address = ""
        # Room for the message around a result that must still fit in one frame.
        self.max_result_bytes = int(config.get("comm.max-frame-bytes")) - 4096
        self.finished = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat: PeriodicCallback | None = None
        # Why the worker stopped on its own, when it failed (no scheduler to return to).
        self.failure: str | None = None
        self._heartbeat_interval = 1.0  # worker.heartbeat-interval, read at start
        self.readiness = readiness.Readiness()  # GET /ready: connected to the scheduler?

    @property
    def resources(self) -> dict[str, float]:
        """What this worker advertises (``client.set_resources`` changes it)."""
        return self.state.resources

    # --------------------------------------------------------------- lifecycle
    async def start(self) -> Worker:
        self._loop = asyncio.get_running_loop()
        worker_started()
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
        self.name = self.state.name = self.name or self.address
        stored.stores[self.address] = self.stored
        self.readiness.start(contact)
        await self._connect()
        self._heartbeat_interval = float(config.get("worker.heartbeat-interval"))
        self._heartbeat = PeriodicCallback(self._send_heartbeat, self._heartbeat_interval * 1000)
        self._heartbeat.start()
        if self.memory_limit is not None:
            threading.Thread(
                target=self._watch_memory, name="apportion-memory", daemon=True
            ).start()
        background(self._serve_scheduler())
        return self

    async def _connect(self) -> None:
        """Register with the scheduler, retrying while it is not up (yet, or again).

        Gives up after ``worker.connect-timeout`` seconds; a refusal for a bad token or
        version is final at once.
        """
        hello = {
            "report": True,  # our first message says what we hold and run (see below)
            "address": self.address,
            "name": self.name,
            "nthreads": self.nthreads,
            "resources": self.resources,
            "memory_limit": self.memory_limit,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            # Which processes may map our results (empty: none): for the scheduler's pushes.
            "shared_host": self.shared.host,
        }
        timeout = float(config.get("worker.connect-timeout"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.05
        started, reports = loop.time(), QuietRetries()
        while True:
            try:
                comm, _ = await connect(self.scheduler_address, "worker", self.token, hello)
                self._register(comm)
                break
            except ConnectionRefusedError as exc:
                # A name still held by our previous (dead) self clears up soon; others don't.
                if "already registered" not in str(exc) or loop.time() > deadline:
                    raise
                problem: Exception = exc
            except OSError as exc:
                if loop.time() > deadline:
                    raise OSError(
                        f"no scheduler at {self.scheduler_address} after {timeout:g}s: {exc}"
                    ) from None
                problem = exc
            if reports.due(loop.time() - started):
                logger.info(
                    "waiting for scheduler %s (%.0fs so far): %s",
                    self.scheduler_address,
                    loop.time() - started,
                    problem,
                )
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

    def _register(self, comm: Comm) -> None:
        """Tell a new scheduler what is held and running here, before any report of a run
        (under the lock, so no task thread writes to it first), then use it."""
        with self._lock:
            report = self.state.registration_report()
            comm.send_now([report])
            comm.allow_thread_writes()
            self.scheduler = comm
        self.readiness.connected()
        with self._lock:
            if self.state.paused:  # a new scheduler places nothing here while paused
                comm.send({"op": "worker-status", "status": "paused"})
        if report["held"] or report["running"]:
            logger.info(
                "worker %s reported %d held results and %d running tasks",
                self.name,
                len(report["held"]),
                len(report["running"]),
            )
        self._drain_unsent()  # what ended meanwhile, written for this connection

    async def close(self, reason: str = "closing") -> None:
        if self.finished.is_set():
            return
        if self._heartbeat is not None:
            self._heartbeat.stop()
        await asyncio.get_running_loop().run_in_executor(None, close_clients)
        if self.scheduler is not None and not self.scheduler.closed:
            try:
                await self.scheduler.write([{"op": "goodbye", "reason": reason}])
            except CommClosedError:
                pass
            self.scheduler.close(reason)
        self.listener.close_all()
        self.readiness.close()
        self.peers.close()
        if stored.stores.get(self.address) is self.stored:
            del stored.stores[self.address]
        for _ in self._threads:
            self._jobs.put(None)  # each thread stops after the runs already handed to it
        self._memory_stop.set()
        if self._spill_writer is not None:
            self._spill_writer.stop()
        if self.data is not None:
            self.data.close()  # the spill directory goes with the worker
        self.finished.set()

    def _send_heartbeat(self) -> None:
        scheduler = self.scheduler
        if scheduler is not None and not scheduler.closed:
            # Bytes to it unacknowledged for several beats: it is unreachable (a partition,
            # its host gone), not busy; the connection is given up and made again.
            silent = scheduler.seconds_unanswered()
            if silent > UNREACHABLE_AFTER_HEARTBEATS * self._heartbeat_interval:
                logger.warning(
                    "scheduler unreachable: nothing sent to it acknowledged for %.1fs; "
                    "reconnecting",
                    silent,
                )
                scheduler.close(f"unreachable: nothing acknowledged for {silent:.1f}s")
                return
        if self.scheduler is not None and not self.scheduler.closed:
            with self._lock:
                tasks = list(self.state.tasks.values())
            beat = {"op": "heartbeat", **output.units_held(tasks)}
            if self.memory_limit is not None:
                beat["memory"] = self.memory_report()
            self.scheduler.send(beat)
            output.send_running_output(tasks, self.scheduler.send)

    # ------------------------------------------------------------------- memory
    def _watch_memory(self) -> None:
        """The memory monitor's thread (a thread: it acts while the event loop is busy)."""
        interval = float(config.get("worker.memory.monitor-interval"))
        while not self._memory_stop.wait(interval):
            try:
                self.check_memory()
            except Exception:
                logger.exception("worker %s: memory check failed", self.name)

    def check_memory(self) -> None:
        """Measure, then spill, pause, resume or terminate as worker/memory.py decides."""
        data, limit = self.data, self.memory_limit
        if data is None or limit is None:
            return
        paused = self.state.paused  # (a read of a bool: the lock is taken to change it)
        with self._spilling:
            rss = memory.process_memory()
            decision = memory.decide(limit, rss, data.fast_bytes, paused, self.memory_thresholds)
            if decision.terminate:
                self._terminate(rss, limit)
            if decision.spill:
                freed = data.evict(decision.spill)
                logger.debug("worker %s spilled %d bytes of results", self.name, freed)
        if decision.paused != paused:
            # Measured again after spilling: spilling may have been enough.
            rss = memory.process_memory()
            decision = memory.decide(limit, rss, data.fast_bytes, paused, self.memory_thresholds)
            if decision.paused == paused:
                return
            with self._lock:
                measured = {"rss": rss, "limit": limit}
                instructions = self.state.memory_pressure(decision.paused, measured)
                if instructions:
                    self._count_pause(decision.paused)
            if instructions:
                logger.warning(
                    "worker %s %s: process memory %s of its %s limit",
                    self.name,
                    "paused (runs no new task)" if decision.paused else "resumed",
                    format_size(rss),
                    format_size(limit),
                )
                self._loop_call(self._carry_out, instructions)

    def spill_after_run(self, key: str) -> None:
        """After a run (in its task thread), with its result ``key`` stored: results are
        spilled by their sizes, as a result is stored (Dask's spill buffer does the same),
        by the spill writer's thread, down to the target less room for one more such
        result (``memory.spill_goal``). The task thread starts its next task while the
        older result is written; it waits only while the results are beyond the target
        itself, so memory peaks where it did when the task thread wrote them itself. The
        process's own measure is the monitor's, as the backstop (``check_memory``): it
        counts the interpreter and the runs' own memory besides the results, so spilling
        on it after each run brought results below their target in bursts of several
        writes before a task could start."""
        data, writer = self.data, self._spill_writer
        if data is None:
            return
        goal = memory.spill_goal(self._target_bytes, data.weights.get(key, 0))
        if data.fast_bytes <= goal:
            return
        if writer is None or writer.stopped:  # (the worker is closing)
            self.spill_to_target()
            return
        writer.spill_to(goal)
        writer.wait_below(self._target_bytes)

    def spill_to_target(self) -> None:
        """Spill the results held in memory beyond ``target``, by their sizes, in this
        thread."""
        data = self.data
        if data is None:
            return
        started = time.perf_counter()
        with self._spilling:
            excess = memory.beyond_target(self._target_bytes, data.fast_bytes)
            if excess:
                freed = data.evict(excess)
                logger.debug("worker %s spilled %d bytes of results", self.name, freed)
            self.spill_wait_seconds += time.perf_counter() - started

    def _resume_if_room(self) -> None:
        """After the spill writer's writes: a paused worker measures again at once, and
        resumes if they brought it back under its pause threshold (not at the monitor's
        next look)."""
        if self.state.paused:
            self.check_memory()

    def _count_pause(self, paused: bool) -> None:
        """The worker paused or resumed now (self._lock held)."""
        now = time.perf_counter()
        if paused:
            self._paused_since = now
        elif self._paused_since is not None:
            self.paused_seconds += now - self._paused_since
            self._paused_since = None

    def _paused_seconds_now(self) -> float:
        with self._lock:
            since = self._paused_since
            return self.paused_seconds + (time.perf_counter() - since if since is not None else 0.0)

    def _terminate(self, rss: int, limit: int) -> None:
        """Past the terminate threshold: exit at once, unannounced, as a crash, so that the
        supervisor (--nworkers, LocalCluster) starts a fresh worker and the scheduler
        recomputes what this one held."""
        logger.error(
            "worker %s exits: process memory %s passed %.0f%% of its %s limit",
            self.name,
            format_size(rss),
            100 * (self.memory_thresholds.terminate or 1),
            format_size(limit),
        )
        if self.data is not None:
            self.data.close()
        logging.shutdown()
        os._exit(1)

    def memory_report(self) -> dict[str, Any]:
        """What the scheduler shows of this worker's memory (heartbeats)."""
        data, limit = self.data, self.memory_limit
        rss = memory.process_memory()
        report: dict[str, Any] = {
            "limit": limit,
            "rss": rss,
            "paused": self.state.paused,
            "nearly_full": memory.nearly_full(limit, rss, self.memory_thresholds),
        }
        if data is not None:
            report.update(
                managed=data.fast_bytes,
                spilled_bytes=data.spilled_bytes,
                spilled_keys=len(data.slow),
                spilled_count=data.spilled_count,
                spilled_total=data.spilled_total,
                unspilled_count=data.unspilled_count,
                unspilled_total=data.unspilled_total,
                spill_write_seconds=data.write_seconds,
                spill_wait_seconds=self.spill_wait_seconds
                + (self._spill_writer.waited_seconds if self._spill_writer else 0.0),
                paused_seconds=self._paused_seconds_now(),
            )
        return report

    def add_task_thread(self) -> None:
        """One more task thread (a task seceded: its thread left the pool)."""
        thread = threading.Thread(
            target=self._task_thread, name=f"apportion-task-{len(self._threads)}", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def _loop_call(self, callback: Any, *args: Any) -> None:
        """Run ``callback(*args)`` on the event loop (from a task thread)."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the loop is closed: the worker is gone

    def _send(self, message: Message) -> None:
        if self.scheduler is not None and not self.scheduler.closed:
            self.scheduler.send(message)

    # ------------------------------------------------------ scheduler messages
    async def _serve_scheduler(self) -> None:
        """Serve scheduler messages; after losing the scheduler, start afresh with a new one."""
        while not self.finished.is_set():
            assert self.scheduler is not None
            reason = await self._read_scheduler(self.scheduler)
            if self.finished.is_set():
                return
            logger.warning(
                "worker %s lost the scheduler (%s); reconnecting, keeping its results and runs",
                self.name,
                reason,
            )
            self._scheduler_lost()
            self.readiness.lost(reason)
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
                inline = message.get("inline")
                inputs = _load_inline(inline) if inline else None
                with self._lock:
                    instructions = self.state.compute(message, inputs)
            elif op == "cancel":
                with self._lock:
                    instructions = self.state.cancel(message["run_id"])
            elif op == "free-keys":
                with self._lock:
                    self.state.free_keys(message["keys"])
                continue
            elif op == "acquire-data":
                with self._lock:
                    instructions = self.state.acquire(message["key"], message["who_has"])
            elif op == "restart":  # client.restart(): exit to be started afresh by the nanny
                why = message.get("reason") or "client.restart()"
                self.failure = f"restarting, as asked ({why})"
                background(self.close("restarting"))
                continue
            elif op == "upload-file":  # before the tasks sent after it (worker/uploads.py)
                self._send(uploads.reply_to(message))
                continue
            elif op == "set-resources":  # client.set_resources: new totals from now on
                resources = validate(message["resources"], what="capacity")
                with self._lock:
                    instructions = self.state.set_resources(resources)
            elif op == "reacquired":  # a seceded run's resources are its own again
                with self._lock:
                    instructions = self.state.reacquired(message["run_id"])
            elif op == "run":
                background(self._on_run(message))
                continue
            elif op == "worker-left":  # removed by the scheduler: fetches from it end
                self.peers.drop(message["address"])
                with self._lock:  # and what it was to push here is fetched elsewhere
                    instructions = self.state.pusher_left(message["address"])
            elif op == "adopt-stored":  # a client's stored argument is a result from now on
                self._adopt_stored(message["key"], message.get("nbytes", 0))
                continue
            elif op == "push-data":  # a task taking this result was sent to a peer
                self._push(message)
                continue
            elif op == "close":  # retired, its results copied elsewhere: the process ends
                background(self.close(str(message.get("reason", "told to close"))))
                continue
            else:
                logger.warning("ignoring unknown scheduler operation %r", op)
                continue
            if instructions:
                self._carry_out(instructions)

    def _scheduler_lost(self) -> None:
        """Messages written for the lost scheduler go with it (see WorkerState.scheduler_lost)."""
        with self._lock:
            self.state.scheduler_lost()
            self._unsent.clear()
            self._drain_scheduled = False

    # ------------------------------------------------------------ instructions
    def _carry_out(self, instructions: list[Instruction]) -> None:
        """On the event loop: do what the state machine asked for."""
        for instruction in instructions:
            if isinstance(instruction, Execute):
                self._jobs.put(instruction.task)
            elif isinstance(instruction, Resume):
                self._wake(instruction.task)
            elif isinstance(instruction, Send):
                self._send(instruction.message)
            elif isinstance(instruction, Fetch):
                background(self._fetch(instruction))
            elif isinstance(instruction, AwaitPush):
                assert self._loop is not None
                self._loop.call_later(instruction.seconds, self._push_overdue, instruction)
            else:  # the Send of the same message follows
                self._tell_clients(instruction)

    async def _fetch(self, fetch: Fetch) -> None:
        """Get one result from the first of its holders that answers (see
        ``_load_arrived`` for one that arrives but does not load)."""
        problems = []
        for holder in fetch.holders:
            asked = time.perf_counter()
            try:
                payload, segment = await self._get_from(holder, fetch.key)
            except Exception as exc:  # unreachable, or gone
                logger.info("fetching %s from %s failed: %r", fetch.key, holder, exc)
                problems.append(f"{holder}: {exc!r}")
                continue
            if payload is None:
                problems.append(f"{holder} does not hold it")
                continue
            if segment is None:  # over TCP: the transfer alone, as this worker saw it
                transfers.count_fetch(len(payload), time.perf_counter() - asked)
            self._load_arrived(fetch, holder, payload, segment, pushed=False)
            return
        logger.warning("could not fetch %s: %s", fetch.key, "; ".join(problems))
        reason = f"LookupError: no holder of {fetch.key!r} answered: {problems}"
        with self._lock:
            instructions = self.state.fetch_failed(fetch.key, fetch.epoch, reason)
        self._carry_out(instructions)

    def _load_arrived(
        self,
        fetch: Fetch,
        holder: str,
        payload: Payload,
        segment: shared_memory.Segment | None,
        pushed: bool,
    ) -> None:
        """Load an input that arrived from ``holder`` (fetched, or ``pushed`` by it) and
        hand it to the state machine. One that does not load fails the tasks waiting for
        it here: its bytes are the same from every holder and after a recomputation."""
        size = len(payload)
        try:
            value = loads_value(payload)
        except Exception as exc:
            del payload, segment
            self._unloadable(fetch, holder, exc)
            return
        del payload
        if segment is not None:  # this replica can be shared in turn
            self.shared.hold(fetch.key, segment, value)
        with self._lock:
            if pushed:
                instructions = self.state.pushed(fetch.key, value, size)
            else:
                instructions = self.state.fetched(fetch.key, value, fetch.epoch, size)
        del value
        self._carry_out(instructions)

    def _unloadable(self, fetch: Fetch, holder: str, exc: Exception) -> None:
        logger.warning("%s from %s does not load here: %r", fetch.key, holder, exc)
        error = InputLoadError(
            f"the input {fetch.key!r}, fetched from {holder}, does not load on worker "
            f"{self.address}: {exc!r} (a task's result must load on the worker of each "
            "task that takes it: are the modules it needs installed there?)"
        )
        error.__cause__ = exc  # (its traceback, in the text the client shows)
        exception, text = dumps_exception(error)
        with self._lock:
            instructions = self.state.fetch_unloadable(fetch.key, fetch.epoch, exception, text)
        self._carry_out(instructions)

    # ------------------------------------------------------------------ pushes
    # A result sent to a peer unasked, as the scheduler sends that peer a task taking it
    # (scheduler/pushes.py): the reply its request would have had, without the request.
    def _push(self, message: Message) -> None:
        key, to = message["key"], message["to"]
        request: Message = {"keys": [key]}
        if message.get("host"):  # the receiver's: a peer of this host maps shared memory
            request["host"] = message["host"]
        reply = self._data_reply(request)
        del reply["id"]
        if key in reply["data"] or key in reply.get("shared", ()):
            reply["op"] = "pushed-data"
            reply["sent"] = [shared_memory.host_identity(), time.perf_counter()]
        else:  # freed here meanwhile: the receiver fetches it from another holder
            reply = {"op": "push-failed"}
        reply["key"], reply["from"] = key, self.address
        background(self._push_to(to, reply))

    async def _push_to(self, address: str, message: Message) -> None:
        """Send ``message`` to the peer at ``address``, connecting first if need be (a
        peer that cannot be reached is left to its own wait: see ``_push_overdue``)."""
        await self.peers.open(address)
        self.peers.send_if_open(address, message)

    def _take_push(self, message: Message) -> None:
        """A result a peer pushed here (``pushed-data``), or its word that it will not
        (``push-failed``)."""
        key, pusher = message["key"], message["from"]
        payloads, segments, _ = shared_memory.read_data_reply(message)
        payload = payloads.get(key)
        if payload is None:  # not held there, or its shared copy does not map here
            with self._lock:
                instructions = self.state.push_missed(key, pusher)
            self._carry_out(instructions)
            return
        segment = segments.get(key)
        clock, sent = message.get("sent") or ("", 0.0)
        if segment is None and clock and clock == shared_memory.host_identity():
            # (one clock for the processes of a host: from the push to its arrival here)
            transfers.count_fetch(len(payload), time.perf_counter() - sent)
        fetch = Fetch(key, [pusher], self.state.epoch)
        self._load_arrived(fetch, pusher, payload, segment, pushed=True)

    def _push_overdue(self, waited: AwaitPush) -> None:
        with self._lock:
            instructions = self.state.push_missed(waited.key, waited.pusher, waited.serial)
        if instructions:
            logger.info(
                "%s, pushed by %s, not here after %.1fs: fetching it",
                waited.key,
                waited.pusher,
                waited.seconds,
            )
            self._carry_out(instructions)

    async def _get_from(
        self, holder: str, key: str
    ) -> tuple[Payload | None, shared_memory.Segment | None]:
        """``key``'s pickle from ``holder`` (None: not held there): mapped from shared
        memory when the holder is on this host and has it there, else over TCP."""
        payloads, segments = await shared_memory.get_data(
            lambda message: self.peers.request(holder, message),
            [key],
            self.shared.host if self.shared.enabled else "",
        )
        return payloads.get(key), segments.get(key)

    # --------------------------------------------------------------- execution
    def _task_thread(self) -> None:
        """A task thread: run what it is handed, book the run in the state machine, tell
        the scheduler itself when the connection is idle (no wake-up of the loop), and run
        the next task the state machine starts, while there is one."""
        task = self._jobs.get()
        while task is not None:
            ok, value, payload, text = self._execute(task)
            with self._lock:
                busy = not self._jobs.empty() or bool(self.state.ready)
                report = self.state.report_run(task, ok, value, payload, text, busy=busy)
                epoch, comm = self.state.epoch, self.scheduler
            # The result belongs to the state now (or to nobody): this thread must not keep
            # it, nor its pickled copy, alive while it waits for the next task.
            del value, payload
            messages: list[Message] = []
            for instruction in report:
                if isinstance(instruction, TellClients):
                    self._tell_clients(instruction)
                else:
                    assert isinstance(instruction, Send)
                    messages.append(instruction.message)
            del report
            # Reported before the slot is booked free: the scheduler's next task for this
            # worker is on its way sooner. With more work here already, the loop sends the
            # reports of the runs that end before it gets to them in one frame.
            if messages and not self._send_from_thread(comm, messages, epoch, busy):
                return  # the event loop is closed: the worker is gone
            del messages
            data = self.data
            if data is not None and data.fast_bytes > self._lowest_goal:
                # Results near or beyond the target: spilled now (in the background, this
                # thread waiting only for room), not at the monitor's next look.
                self.spill_after_run(task.key)
            with self._lock:
                starts = self.state.free_run(task)
            task = None
            others = [start for start in starts if not isinstance(start, Execute)]
            if others:  # seceded runs resuming
                self._loop_call(self._carry_out, others)
            extra = secession.left_pool()  # this thread seceded: another took its place
            for start in starts:
                if not isinstance(start, Execute):
                    continue
                if task is None and not extra:
                    task = start.task  # this thread runs it next
                else:
                    self._jobs.put(start.task)
            del starts, others
            if extra:
                secession.mark_left_pool(False)
                return
            if task is None:
                task = self._jobs.get()

    # ---------------------------------------------------------------- secession
    def secede_run(self, task: WorkerTask, release: bool) -> None:
        """In ``task``'s own thread (``secede()``): the thread leaves the pool, so one more
        thread takes its place there; it ends with the run."""
        with self._lock:
            instructions = self.state.secede(task, release)
        if not instructions:
            return  # seceded already
        if not secession.left_pool():
            secession.mark_left_pool(True)
            self.add_task_thread()
        self._loop_call(self._carry_out, instructions)

    def rejoin_run(self, task: WorkerTask) -> None:
        """In ``task``'s own thread (``rejoin()``): returns once the run has a thread (and
        its resources) again; ``get_worker()`` then names the units it holds now."""
        units = task.units
        wake: threading.Event | None = None
        with self._lock:
            instructions = self.state.rejoin(task)
            resumed = [i for i in instructions if isinstance(i, Resume) and i.task is task]
            if resumed:  # at once: nothing to wait for
                instructions.remove(resumed[0])
            else:  # registered with the state's answer, so no Resume can come before
                wake = self._wakes[task.run_id] = threading.Event()
        if instructions:
            self._loop_call(self._carry_out, instructions)
        if wake is not None:
            wake.wait()
        if task.units != units:  # granted again, maybe other unit indices
            set_current(self._worker_info(self._task_info(task)))

    def _wake(self, task: WorkerTask) -> None:
        with self._lock:
            wake = self._wakes.pop(task.run_id, None)
        if wake is not None:
            wake.set()

    def _send_from_thread(
        self, comm: Comm | None, messages: list[Message], epoch: int, busy: bool = False
    ) -> bool:
        """In a task thread: write to the scheduler at once when the connection is idle
        and nothing else is to run here (``busy``), else hand the messages to the loop
        (which sends what gathered by then at once: a frame for many short runs, instead
        of a write each). False once the loop is closed."""
        if comm is not None and not busy:
            try:
                if comm.send_from_thread(messages):
                    return True
            except Exception:
                logger.exception("task thread could not report %s", messages)
        with self._lock:
            if epoch != self.state.epoch:
                return True  # for a scheduler that is gone
            self._unsent.extend(messages)
            if self._drain_scheduled:
                return True
            self._drain_scheduled = True
        assert self._loop is not None  # set in start(), before any task thread runs a task
        try:
            self._loop.call_soon_threadsafe(self._drain_unsent)
        except RuntimeError:
            return False
        return True

    def _drain_unsent(self) -> None:
        with self._lock:
            comm = self.scheduler
            if comm is None or comm.closed:
                return  # kept for the next connection (see _register)
            burst, self._unsent = self._unsent, []
            self._drain_scheduled = False
        if burst:
            comm.send_now(burst)  # the whole burst at once, not next tick

    def _execute(self, task: WorkerTask) -> Outcome:
        """Runs in a task thread: returns (ok, value, pickled value or exception, traceback)."""
        context = self._task_info(task)
        task.start = output.begin(task)
        if task.timeout is not None:
            self._loop_call(self._arm_timeout, task)
        secession.set_running(self, task)
        try:
            value = self._call(task.func, task.args, context)
            payload = dumps_data(value)
            if len(payload) > self.max_result_bytes:
                raise ValueError(
                    f"the result of task {task.key!r} is {len(payload):,} bytes, more than "
                    f"comm.max-frame-bytes allows ({self.max_result_bytes:,}): return smaller "
                    "pieces (split the work) or raise comm.max-frame-bytes everywhere"
                )
            if type(payload) is Pickled and self.shared.wanted(payload):
                value = self._share(task, value, payload)
            return True, value, payload, ""
        except Reschedule as exc:  # placed again: reported as given back (worker/state.py)
            return False, exc, b"", ""
        except BaseException as exc:
            data, text = dumps_exception(exc)
            return False, None, data, text
        finally:
            secession.set_running(None, None)
            task.output = output.end()
            task.stop = time.time()

    # ----------------------------------------------------------------- timeouts
    def _arm_timeout(self, task: WorkerTask) -> None:
        """On the event loop: the run of ``task`` is failed if it still runs when its
        timeout (counted from the run's start) passes."""
        assert self._loop is not None and task.timeout is not None
        left = task.start + task.timeout - time.time()
        self._loop.call_later(max(left, 0.0), self._run_timed_out, task)

    def _run_timed_out(self, task: WorkerTask) -> None:
        if task.stop or self.finished.is_set():
            return  # the run ended in time (or the worker is closing anyway)
        # A thread cannot be interrupted: the run is reported failed, then this process
        # ends so that its supervisor starts it afresh, as ``client.cancel(force=True)``
        # does; the scheduler reads the failure first (same connection), so the run is
        # not placed again as lost with the worker, unless it has retries left.
        problem = TaskTimeoutError(
            f"task {task.key!r} ran past its timeout of {task.timeout:g} s on worker "
            f"{self.name} (attempt {task.attempt}); its worker process was replaced to "
            "stop it and free what it held"
        )
        task.stop = time.time()
        reason = f"task {task.key!r} ran past its timeout"
        self._send({"op": "worker-status", "status": "closing", "reason": reason})
        self._send(erred_message(task, *dumps_exception(problem)))
        logger.warning("task %s ran past its timeout of %g s: restarting", task.key, task.timeout)
        self.failure = f"restarting: {reason}"
        background(self.close("restarting"))

    def _share(self, task: WorkerTask, value: Any, payload: Payload) -> Any:
        """In a task thread: put a large result in shared memory, for peers on this host,
        and return what to hold: the value rebuilt on that memory (the task's own copy
        is then freed), or ``value`` itself where that cannot be done.

        A client's stored argument stays where it is: the task it was stored for runs
        here, so a copy would only cost (worker/stored.py)."""
        assert isinstance(payload, Pickled)
        if self.functions.loads(task.func) is stored.stored_argument:
            return value
        exported = shared_memory.export(payload)
        if exported is None:
            return value
        shared_payload, segment = exported
        del exported
        try:
            shared_value = loads_value(shared_payload)
        except Exception:
            logger.exception("result of %s not loadable from shared memory", task.key)
            return value
        del shared_payload
        if not segment.alive:  # rebuilt as a copy (a bytearray...): nothing to share
            return value
        self.shared.hold(task.key, segment, shared_value)
        return shared_value

    def _tell_clients(self, tell: TellClients) -> None:
        """Send a result to its waiting clients connected here, and name them in the
        scheduler's message so that the scheduler does not tell them again."""
        finished = tell.message
        direct = {**finished, "who_has": [self.address]}
        del direct["run_id"]
        told = []
        for client in tell.clients:
            comm = self.clients.get(client)
            if comm is not None and comm.send_from_thread([direct]):
                told.append(client)
        if told:
            finished["notified"] = told

    def _resolve(self, key: str) -> Any:
        # A task's inputs stay held while it runs (see WorkerState.needed).
        with self._lock:
            return self.state.data[key]

    def _call(self, func: bytes, args: bytes, task: TaskInfo | None) -> Any:
        """Call a pickled function with its arguments, ``get_worker()`` answering meanwhile."""
        set_current(self._worker_info(task))
        try:
            with _unpickling:
                call_args, kwargs = loads_args(args, self._resolve)
                function = self.functions.loads(func)
            return function(*call_args, **kwargs)
        finally:
            set_current(None)

    def _worker_info(self, task: TaskInfo | None) -> WorkerInfo:
        """What ``get_worker()`` answers in this thread (``task``: the run it runs)."""
        return WorkerInfo(
            self.name,
            self.address,
            self.nthreads,
            dict(self.resources),
            self.scheduler_address,
            task,
        )

    @staticmethod
    def _task_info(task: WorkerTask) -> TaskInfo:
        return TaskInfo(task.key, dict(task.shape), task.units, task.attempt)

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
        comm.send(welcome(comm, name=self.name))
        client = hello.get("client_id") if hello["role"] == "client" else None
        if isinstance(client, str):
            comm.allow_thread_writes()
            self.clients[client] = comm
        try:
            while True:
                messages = await comm.read()
                for message in messages:
                    op = message["op"]
                    if op == "get-data":
                        comm.send(self._data_reply(message))
                    elif op == "put-data" and hello["role"] == "client":
                        self._store(comm, message)
                    elif op == "name-data" and hello["role"] == "client":
                        self._name_stored(comm, message)
                    elif op == "drop-data" and hello["role"] == "client":
                        self.stored.drop(message["keys"])
                    elif op in ("pushed-data", "push-failed") and hello["role"] == "peer":
                        self._take_push(message)
                    else:
                        raise ProtocolError(f"unknown {hello['role']} operation {op!r}")
                # The replies leave now, not on the loop's next tick: the peer waits on them.
                comm.flush()
                # Not kept while waiting for the next frame: a stored argument's frame is
                # freed once its value is.
                del messages, message
        except (CommClosedError, ProtocolError, KeyError, TypeError) as exc:
            if not isinstance(exc, CommClosedError):
                logger.warning("closing peer connection from %s: %r", comm.peer, exc)
        finally:
            self.stored.drop_from(comm)
            if client is not None and self.clients.get(client) is comm:
                del self.clients[client]

    def _store(self, comm: Comm, message: Message) -> None:
        """A client's large argument, kept until its task takes it (worker/stored.py).
        Loaded as views of the received frame: not copied."""
        key = message["key"]
        if not isinstance(key, str):
            raise TypeError(f"put-data needs a string key, got {key!r}")
        self.stored.put(key, loads_value(message["data"]), owner=comm)
        comm.send({"op": "stored", "id": message.get("id"), "key": key})

    def _adopt_stored(self, key: str, nbytes: int) -> None:
        """Hold a client's stored argument as the result of its key, as the scheduler
        counts it already (scheduler/stored_arguments.py). Gone (its client's connection
        here ended): a task taking it misses it here, and the scheduler makes it again."""
        try:
            value = self.stored.take(key)
        except LookupError as exc:
            logger.info("%s", exc)
            return
        with self._lock:
            self.state.adopt(key, value, nbytes)

    def _name_stored(self, comm: Comm, message: Message) -> None:
        """Give a client's stored argument, put under a name of its own, its key."""
        upload, key = message["upload"], message["key"]
        if not isinstance(upload, str) or not isinstance(key, str):
            raise TypeError(f"name-data needs string names, got {upload!r} and {key!r}")
        named = self.stored.rename(upload, key)
        comm.send({"op": "named" if named else "not-stored", "id": message.get("id"), "key": key})

    def _data_reply(self, request: Message) -> Message:
        """Results for a peer or client. Pickled here and not kept: the reply leaves this
        frame as it returns, so no pickled copy outlives the sending."""
        with self._lock:
            held = self.state.data
            values = {key: held[key] for key in request["keys"] if key in held}
        reply: Message = {"op": "data", "id": request.get("id")}
        if "host" in request and self.shared.asked_by(request["host"]):
            # A peer on this host: it maps what is in shared memory (apportion/shared_memory.py).
            shared = {}
            for key in list(values):
                described = self.shared.describe(key, values[key])
                if described is not None:
                    shared[key] = described
                    del values[key]
            if shared:
                reply["shared"] = shared
                shared_memory.count("served", len(shared))
        reply["data"] = {key: dumps_data(value) for key, value in values.items()}
        return reply


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


def _load_inline(inline: dict[str, bytes]) -> dict[str, tuple[Any, int]]:
    """The inputs that came with a task, loaded, each with its pickled size. One that does
    not load here is left out: it is fetched from its holder then, and fails the task
    with the error a fetched copy gives."""
    loaded = {}
    with _unpickling:
        for key, payload in inline.items():
            try:
                loaded[key] = (loads_value(payload), len(payload))
            except Exception:
                logger.debug("the inline input %s does not load here", key, exc_info=True)
    return loaded
