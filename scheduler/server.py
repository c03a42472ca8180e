"""The scheduler's network shell: connections in, state machine calls, outbox out."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import socket
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from apportion.scheduler.client_ops import CLIENT_OPS
from apportion.scheduler.coordination import Coordination
from apportion.scheduler.liveness import CHECK_PERIOD, Liveness
from apportion.scheduler.recovery import parse_report
from apportion.scheduler.secession import Secession
from apportion.scheduler.state import SchedulerState
from apportion.scheduler.tenants import DEFAULT_TENANT, TenantShares, tenants_from_config
from apportion.scheduler.worker_ops import WORKER_OPS
from tornado.ioloop import PeriodicCallback
from tornado.netutil import bind_sockets

from apportion import config
from apportion.auth import data_token
from apportion.logs import keep_recent_lines
from apportion.protocol import Comm, CommClosedError, Listener, Message, ProtocolError
from apportion.protocol.comm import format_address, refuse, welcome
from apportion.resources import validate

if TYPE_CHECKING:
    from tornado.httpserver import HTTPServer

logger = logging.getLogger("apportion.scheduler")

# Messages that may wait (DEFER_DELAY seconds at most) for the next message to their
# worker: waking a worker for them costs a busy machine more than the memory they free.
DEFERRABLE_OPS = frozenset({"free-keys"})
DEFER_DELAY = 0.05


class Scheduler:
    def __init__(
        self,
        host: str = "",
        port: int = 8786,
        token: str | None = None,
        http_port: int | None = None,
        validate_every_batch: bool | None = None,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.token = token
        self.http_port = http_port
        self.state = SchedulerState()
        self.secession = Secession(self.state)
        self.coordination = Coordination(
            self.state.send, hold=self._hold_results, release=self.state.handle_release
        )
        # client.upload_file: a run message per file, for workers that join later.
        self.uploads: dict[str, Message] = {}
        self.listener = Listener(self._serve, token, roles=("client", "worker"))
        # Tenants (tenants.py): ConfigError, naming the setting, if they are declared wrong.
        tenants = tenants_from_config(config.get("scheduler.tenants"), token)
        if tenants:
            self.state.use_tenants(TenantShares(tenants))
            self.listener.client_tokens = {t.token: t.name for t in tenants if t.token}
        self.comms: dict[str, Comm] = {}
        self.address = ""
        if validate_every_batch is None:
            validate_every_batch = bool(config.get("scheduler.validate"))
        self.validate_every_batch = validate_every_batch
        self.violations: list[str] = []
        self._runs: dict[int, _BroadcastRun] = {}
        self._run_ids = itertools.count(1)
        # HTTP retire requests waiting for their answer, by the requester name the state uses.
        self._retire_replies: dict[str, asyncio.Future[Message]] = {}
        self._retire_ids = itertools.count(1)
        # Client retire requests (client, id) whose retired workers are then told to close.
        self.close_when_retired: set[tuple[str, Any]] = set()
        # Names of workers about to be stopped on purpose (LocalCluster.kill_worker): their
        # end is logged as planned, not as a crash.
        self.planned_leaves: set[str] = set()
        self._periodic: list[PeriodicCallback] = []
        # Judges silent workers, and the scheduler's own stalls (see liveness.py).
        self.liveness = Liveness()
        self._http: HTTPServer | None = None
        self.stopped = asyncio.Event()

    # --------------------------------------------------------------- lifecycle
    async def start(self) -> Scheduler:
        keep_recent_lines()
        """Listen (``host`` "": on all interfaces) and serve; raises OSError naming the
        port and the flag that chose it when a port cannot be had."""
        with _naming_the_port(self.host, self.requested_port, "--port"):
            port = await self.listener.listen_on(self.host, self.requested_port)
        everywhere = self.host in ("", "0.0.0.0", "::")
        self.address = format_address(_contact_host() if everywhere else self.host, port)
        if self.http_port is not None:
            with _naming_the_port(self.host, self.http_port, "--http-port"):
                sockets = bind_sockets(self.http_port, address=self.host or None)
            # Imported here: tornado.web adds ~35 ms to a start that does not serve HTTP.
            from apportion.scheduler.events import EventLog
            from apportion.scheduler.http_api import status_app
            from apportion.scheduler.http_security import server_limits
            from tornado.httpserver import HTTPServer

            self.state.events = EventLog()  # someone can look: record for the dashboard

            from apportion.protocol import tls

            # With comm.tls.* the HTTP API is TLS too (None: plain HTTP); client
            # certificates are optional there while the token guards every route.
            context = tls.http_server_context(token_protected=self.token is not None)
            self._http = HTTPServer(status_app(self), ssl_options=context, **server_limits())
            self._http.add_sockets(sockets)
            self.http_port = sockets[0].getsockname()[1]
        self._periodic = [
            PeriodicCallback(self._check_timeouts, 200),
            PeriodicCallback(self._check_heartbeats, CHECK_PERIOD * 1000),
        ]
        for callback in self._periodic:
            callback.start()
        if everywhere:
            logger.info(
                "scheduler listening on all interfaces, port %d; workers and clients on "
                "other machines connect to %s (--host chooses the interface)",
                port,
                self.address,
            )
        else:
            logger.info("scheduler listening at %s", self.address)
        return self

    async def close(self) -> None:
        for callback in self._periodic:
            callback.stop()
        self.listener.close_all()
        if self._http is not None:
            self._http.stop()
        self.stopped.set()

    # ------------------------------------------------------------- connections
    async def _serve(self, comm: Comm, hello: Message) -> None:
        if hello["role"] == "worker":
            await self._serve_worker(comm, hello)
        else:
            await self._serve_client(comm, hello)

    async def _serve_worker(self, comm: Comm, hello: Message) -> None:
        try:
            address = str(hello["address"])
            name = str(hello.get("name") or address)
            resources = validate(hello.get("resources") or {}, what="capacity")
            nthreads = int(hello.get("nthreads", 1))
        except (KeyError, TypeError, ValueError) as exc:
            await refuse(comm, f"invalid worker registration: {exc}")
            return
        clash = next(
            (ws for ws in self.state.workers.values() if ws.address == address or ws.name == name),
            None,
        )
        if clash is not None:
            await refuse(
                comm,
                f"a worker named {clash.name!r} at {clash.address} is already "
                "registered; give each worker a unique --name",
            )
            return
        # (shared_host: which processes may map its results, for pushes: scheduler/pushes.py)
        info: dict[str, Any] = {k: hello[k] for k in ("pid", "host", "shared_host") if k in hello}
        comm.send(welcome(comm, scheduler=self.address))
        report, early = None, []
        if hello.get("report"):  # what it holds and runs comes first (see scheduler/recovery.py)
            try:
                early = await comm.read()
                report = parse_report(early.pop(0) if early else None)
            except (CommClosedError, ProtocolError) as exc:
                logger.warning("worker %s (%s) did not register: %s", name, address, exc)
                comm.close(str(exc))
                return
        self.comms[address] = comm
        for upload in self.uploads.values():  # before any task: what tasks may import
            comm.send(upload)
        self.state.add_worker(
            address,
            name,
            nthreads,
            resources,
            hello.get("memory_limit"),
            info,
            report,
            self.secession.adopt,
        )
        if report is not None:
            self.secession.recovered()  # its seceded runs' subtasks may be queued now
        self.flush()
        reason = "connection closed"
        expected = False

        def on_frame(messages: list[Message]) -> None:
            nonlocal reason, expected
            for message in messages:
                op = message["op"]
                if op == "heartbeat":
                    self.state.handle_heartbeat(address, message.get("memory"))
                    if self.state.events is not None:
                        self.state.events.heartbeat(address, message.get("units"))
                    continue
                if op == "goodbye":
                    reason, expected = f"worker left: {message.get('reason')}", True
                    comm.close(reason)
                    break
                worker_op = WORKER_OPS.get(op)
                if worker_op is None:
                    raise ProtocolError(f"unknown worker operation {op!r}")
                worker_op.check(message)
                worker_op.handle(self, address, message)
            self.flush()

        try:
            if early:
                on_frame(early)
            await comm.serve(on_frame)
        except CommClosedError:
            pass
        except (ProtocolError, KeyError, TypeError, ValueError) as exc:
            reason = f"protocol error: {exc!r}"
            logger.warning("closing worker %s (%s): %s", name, address, reason, exc_info=True)
        finally:
            if name in self.planned_leaves:
                self.planned_leaves.discard(name)
                reason, expected = f"stopped on purpose ({reason})", True
            self.comms.pop(address, None)
            comm.close(reason)
            self.secession.worker_lost(address)
            self.state.remove_worker(address, reason, expected)
            for run in list(self._runs.values()):
                self.on_run_result(address, {"id": run.run_id, "lost": True}, run)
            self.flush()

    async def _serve_client(self, comm: Comm, hello: Message) -> None:
        client = str(hello.get("client_id") or f"client-{uuid.uuid4().hex[:12]}")
        if client in self.comms:
            await refuse(comm, f"client id {client!r} is already connected")
            return
        self.comms[client] = comm
        tenant = str(hello.get("tenant", DEFAULT_TENANT))
        self.state.add_client(client, tenant)
        fields: Message = {"client_id": client, "scheduler": self.address, "tenant": tenant}
        if tenant != DEFAULT_TENANT and self.token is not None:
            fields["worker_token"] = data_token(self.token)  # for results, from workers
        comm.send(welcome(comm, **fields))

        def on_frame(messages: list[Message]) -> None:
            for message in messages:
                self._on_client_message(client, comm, message)
            self.flush()

        try:
            await comm.serve(on_frame)
        except CommClosedError:
            pass
        except (ProtocolError, KeyError, TypeError, ValueError) as exc:
            logger.warning("closing client %s: protocol error: %r", client, exc)
            try:
                await comm.write([{"op": "error", "reason": f"protocol error: {exc!r}"}])
            except CommClosedError:
                pass
        finally:
            self.comms.pop(client, None)
            self.close_when_retired = {r for r in self.close_when_retired if r[0] != client}
            comm.close()
            self.coordination.client_left(client)
            self.state.remove_client(client)
            self.flush()

    def _on_client_message(self, client: str, comm: Comm, message: Message) -> None:
        op = CLIENT_OPS.get(message["op"])
        if op is None:
            raise ProtocolError(f"unknown client operation {message['op']!r}")
        op.check(message)
        op.handle(self, client, comm, message)

    def flush(self) -> None:
        if self.validate_every_batch:
            problems = self.state.check_invariants()
            if problems:
                logger.error("scheduler invariants broken: %s", problems)
                self.violations.extend(problems[: 100 - len(self.violations)])
        for dest, messages in self.state.take_outbox().items():
            reply = self._retire_replies.pop(dest, None)
            if reply is not None and not reply.done():
                reply.set_result(messages[-1])
            if self.close_when_retired:
                self._close_retired(dest, messages)
            comm = self.comms.get(dest)
            if comm is None or comm.closed:
                continue
            if all(m["op"] in DEFERRABLE_OPS for m in messages):
                # Only freeing memory: no need to wake that worker now.
                comm.send_later(messages, DEFER_DELAY)
            elif dest in self.state.workers:
                # A worker's messages come from what this one read: nothing more for it is
                # likely this tick, and it starts sooner.
                comm.send_now(messages)
            else:
                # Clients hear of results read from several workers: one frame per tick.
                comm.send_many(messages)

    # Dask's names, for code run on the scheduler (``client.run_on_scheduler(lambda
    # dask_scheduler: len(dask_scheduler.workers))``): the state's records, read only.
    @property
    def workers(self) -> dict[str, Any]:
        """The connected workers by address (name, nthreads, total, used resources, ...)."""
        return self.state.workers

    @property
    def tasks(self) -> dict[str, Any]:
        """The tasks the scheduler knows, by key (state, who_has, ...)."""
        return self.state.tasks

    def _hold_results(self, wanter: str, keys: list[str]) -> None:
        """Keep results on the cluster for ``wanter`` (a client, or the coordination
        primitives holding futures), as a submission of their keys would: the scheduler
        knows each task already, so only the wanter is added."""
        tasks = self.state.tasks
        held = [k for k in keys if k in tasks and tasks[k].func]
        if held:
            self.state.handle_submit(wanter, [{"key": k, "func": b"", "args": b""} for k in held])

    def _close_retired(self, client: str, messages: list[Message]) -> None:
        """Tell the workers a client retired (with ``close``) to close: they are empty."""
        for message in messages:
            if message["op"] != "retire-reply":
                continue
            if (client, message["id"]) not in self.close_when_retired:
                continue
            self.close_when_retired.discard((client, message["id"]))
            retired = set(message.get("retired", ()))
            for ws in list(self.state.workers.values()):
                comm = self.comms.get(ws.address)
                if ws.name in retired and comm is not None and not comm.closed:
                    comm.send({"op": "close", "reason": "retired"})

    # ------------------------------------------------------ client.run broadcast
    def broadcast(self, client: str, reply_id: Any, fields: Message, op: str = "run") -> None:
        """Send ``op`` to every worker; the client gets ``run-reply`` with their answers."""
        run = _BroadcastRun(
            next(self._run_ids), client, reply_id, set(self.comms) & set(self.state.workers)
        )
        self._runs[run.run_id] = run
        for address in run.waiting:
            self.comms[address].send({"op": op, "id": run.run_id, **fields})
        self._maybe_finish_run(run)

    def on_run_result(self, address: str, message: Message, run: Any = None) -> None:
        run = run or self._runs.get(message["id"])
        if run is None or address not in run.waiting:
            return
        run.waiting.discard(address)
        if message.get("lost"):
            run.results[address] = {"error": f"worker {address} left before answering"}
        else:
            run.results[address] = {
                k: message[k] for k in ("result", "exception", "traceback") if k in message
            }
        self._maybe_finish_run(run)

    def _maybe_finish_run(self, run: _BroadcastRun) -> None:
        if run.waiting:
            return
        del self._runs[run.run_id]
        comm = self.comms.get(run.client)
        if comm is not None and not comm.closed:
            comm.send({"op": "run-reply", "id": run.reply_id, "results": run.results})

    async def retire_workers(self, names: list[str], count: int | None) -> dict[str, Any]:
        """Retire workers for the HTTP API; see ``SchedulerState.retire_workers``."""
        requester = f"http-retire-{next(self._retire_ids)}"
        reply: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._retire_replies[requester] = reply
        try:
            self.state.retire_workers(requester, None, names, count)
            self.flush()
            message = await reply
        finally:
            self._retire_replies.pop(requester, None)
        return {"retired": message["retired"], "kept": message["kept"]}

    # ---------------------------------------------------------------- timers
    def _check_timeouts(self) -> None:
        deadline = self.state.next_deadline()
        if deadline is not None and deadline <= self.state.clock():
            recovering = not self.state.recovery.over
            self.state.check_timeouts()
            if recovering and self.state.recovery.over:
                self.secession.recovered()
            self.flush()

    def _check_heartbeats(self) -> None:
        timeout = float(config.get("scheduler.worker-timeout"))
        workers = self.state.workers
        last_seen = {address: ws.last_seen for address, ws in workers.items()}
        verdict = self.liveness.check(self.state.clock(), timeout, last_seen)
        if verdict.note is not None:
            logger.warning("%s", verdict.note)
        for address in verdict.remove:
            comm = self.comms.get(address)
            logger.warning(
                "worker %s silent for %.0fs; removing it", workers[address].name, timeout
            )
            if comm is not None:
                comm.close(f"no heartbeat for {timeout:g}s")


def tune_garbage_collector() -> None:
    """For a process that runs only a scheduler (the ``apportion scheduler`` command).

    Its many long-lived task and worker records make the default collector walk them
    again and again (about a third of placement time): collect young objects far less
    often, and move everything alive at start-up out of the collector's sight.
    """
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


class _BroadcastRun:
    def __init__(self, run_id: int, client: str, reply_id: int, waiting: set[str]) -> None:
        self.run_id = run_id
        self.client = client
        self.reply_id = reply_id
        self.waiting = waiting
        self.results: dict[str, dict[str, Any]] = {}


@contextlib.contextmanager
def _naming_the_port(host: str, port: int, flag: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        where = f"{host}:{port}" if host else f"port {port} on all interfaces"
        raise OSError(
            exc.errno, f"cannot listen on {where} ({flag}): {exc.strerror or exc}"
        ) from None


def _contact_host() -> str:
    """The address other machines can reach this one at, when listening on all interfaces."""
    return config.get("scheduler.contact-host") or _guess_ip()


def _guess_ip() -> str:
    """The address of the interface that routes outward (no packet is sent), else the
    host name's address."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("203.0.113.1", 9))  # a documentation address: only the route matters
        return str(probe.getsockname()[0])
    except OSError:
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
    finally:
        probe.close()
