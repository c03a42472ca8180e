"""Every operation a client may ask of the scheduler, in one registry: ``CLIENT_OPS`` maps
an ``op`` to a ``ClientOp``, a check of the message (raising ProtocolError: the message is
rejected whole, never half-applied) and a handler carrying it out on the network shell.
Requests with an ``id`` are answered with that id; the newer ones as ``{"op": "reply",
"id": ...}``, with ``error`` when refused.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from apportion.scheduler.replication import replicate
from apportion.scheduler.restart import forget_all_tasks
from apportion.scheduler.stored_arguments import restore_argument
from apportion.scheduler.validation import (
    check_id,
    check_key,
    check_keys,
    check_lines,
    check_parent,
    check_placement_group,
    check_retire,
    check_submit,
)
from apportion.scheduler.worker_resources import set_resources

from apportion.aio import background
from apportion.logs import recent_lines
from apportion.protocol import Comm, Message, ProtocolError
from apportion.resources import validate
from apportion.serialize import dumps_exception, dumps_value, loads_args, loads_value

if TYPE_CHECKING:
    from apportion.scheduler.shell import SchedulerShell
    from apportion.scheduler.state import SchedulerState

logger = logging.getLogger("apportion.scheduler")

Check = Callable[[Message], object]
Handler = Callable[["SchedulerShell", str, Comm, Message], None]


class ClientOp(NamedTuple):
    check: Check  # raises ProtocolError for a malformed message; its result is unused
    handle: Handler


def _reply(comm: Comm, message: Message, **fields: Any) -> None:
    comm.send({"op": "reply", "id": message["id"], **fields})


# ------------------------------------------------------------------- tasks
def _check_submit(message: Message) -> None:
    check_submit(message)  # normalizes the tasks' resources in place
    if "parent" in message:
        check_parent(message)


def on_submit(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    tasks = message["tasks"]
    server.state.handle_submit(client, tasks, bool(message.get("recover")))
    if "parent" in message:  # submitted by a task (secession.py)
        server.secession.spawned(message["parent"], [t["key"] for t in tasks])
    elif message.get("recover"):  # each with its parent, if a task submitted it
        server.secession.respawned(tasks)


def on_release(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    if message.get("recover"):  # lineage only, after a restart
        server.state.release_after_recovery(client, message["keys"])
    else:
        server.state.handle_release(client, message["keys"])


def on_cancel(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    keys = message["keys"]
    cancelled = keys + server.secession.descendants(keys)
    # force: a thread cannot be stopped, so the worker processes running these are
    # replaced (their nanny starts them afresh); their loss frees what they held.
    hosts = running_on(server.state, cancelled) if message.get("force") else {}
    server.state.handle_cancel(client, cancelled)
    for address, running in hosts.items():
        worker = server.comms.get(address)
        if worker is not None and not worker.closed:
            logger.warning("replacing worker %s: it runs %s, cancelled by force", address, running)
            worker.send({"op": "restart", "reason": f"replaced: it ran {running}, cancelled"})


def running_on(state: SchedulerState, keys: list[str]) -> dict[str, list[str]]:
    """The workers running any of ``keys`` now, each with those keys."""
    hosts: dict[str, list[str]] = {}
    for key in keys:
        ts = state.tasks.get(key)
        if ts is not None and ts.state == "processing" and ts.processing_on is not None:
            hosts.setdefault(ts.processing_on.address, []).append(key)
    return hosts


def on_story(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    """The changes of state of one task still kept, oldest first (none for a key unknown)."""
    _reply(comm, message, story=server.state.story(message["key"]))


# ------------------------------------------------------------------ cluster
def on_info(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    reply: dict[str, Any] = server.state.info()
    reply.update(address=server.address, id=message["id"], op="info-reply")
    reply["http_port"] = server.http_port
    if message.get("check"):
        reply["problems"] = server.violations + server.state.check_invariants()
    comm.send(reply)


def on_run(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    server.broadcast(client, message["id"], {"func": message["func"], "args": message["args"]})


def on_replicate(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    reply = replicate(server.state, message["keys"])
    comm.send({"op": "replicate-reply", "id": message["id"], **reply})


def on_retire(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    names, count = check_retire(message)
    if message.get("close"):
        server.close_when_retired.add((client, message["id"]))
    try:
        server.state.retire_workers(client, message["id"], names, count)
    except ValueError as exc:  # unknown names: the caller's mistake, not the protocol's
        comm.send({"op": "retire-reply", "id": message["id"], "error": str(exc)})


def on_expect_leave(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    server.planned_leaves.add(str(message["name"]))
    comm.send({"op": "expect-leave-reply", "id": message["id"]})


def on_logs(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    lines = recent_lines(message.get("n"))
    comm.send({"op": "logs-reply", "id": message["id"], "lines": lines})


def on_close(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    comm.close("client closed")


def on_set_resources(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    worker = str(message.get("worker"))
    state = server.state
    ws = state.workers.get(worker) or next(
        (w for w in state.workers.values() if w.name == worker), None
    )
    if ws is None:
        known = sorted(w.name for w in state.workers.values())
        _reply(comm, message, error=f"no worker named {worker!r} (connected: {known})")
        return
    try:
        resources = validate(message.get("resources"), what="capacity")
    except (TypeError, ValueError) as exc:
        _reply(comm, message, error=str(exc))
        return
    set_resources(state, ws, resources)
    _reply(comm, message, worker=ws.name, resources=dict(ws.total))


def on_run_on_scheduler(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    async def run() -> None:
        try:
            func = loads_value(message["func"])
            args, kwargs = loads_args(message["args"], _no_futures)
            parameters = inspect.signature(func).parameters
            if "dask_scheduler" in parameters:
                kwargs["dask_scheduler"] = server
            elif "scheduler" in parameters:
                kwargs["scheduler"] = server
            result = func(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            _reply(comm, message, result=dumps_value(result))
        except BaseException as exc:
            data, text = dumps_exception(exc)
            _reply(comm, message, exception=data, traceback=text)
        server.flush()

    background(run())


def on_upload_file(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    filename, data = message.get("filename"), message.get("data")
    if not isinstance(filename, str) or not isinstance(data, bytes):
        _reply(comm, message, error="'upload-file' needs 'filename' (str) and 'data' (bytes)")
        return
    # Kept for workers that join later (nobody waits for their answer: id 0), then
    # sent to those connected now, answered as client.run is.
    server.uploads[filename] = {
        "op": "upload-file",
        "id": 0,
        "filename": filename,
        "data": data,
    }
    server.broadcast(client, message["id"], {"filename": filename, "data": data}, "upload-file")


def on_task_stream(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    from apportion.scheduler.events import EventLog

    state = server.state
    if state.events is None:  # recorded from the first request on (no dashboard)
        state.events = EventLog()
    since = float(message.get("since") or 0)
    runs = [run._asdict() for run in state.events.recent_runs(100_000) if run.stop >= since]
    _reply(comm, message, runs=runs)


def on_restart(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    state = server.state
    names = sorted(ws.name for ws in state.workers.values())
    old = set(state.workers)
    cancelled = forget_all_tasks(state, "the cluster was restarted (client.restart())")
    for address in old:
        worker = server.comms.get(address)
        if worker is not None and not worker.closed:
            worker.send({"op": "restart"})
    logger.info("restart: %d tasks forgotten, workers %s restarting", cancelled, names)
    timeout = float(message.get("timeout") or 60)

    async def wait_for_workers() -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            back = {ws.name for ws in state.workers.values() if ws.address not in old}
            missing = [name for name in names if name not in back]
            if not missing:
                _reply(comm, message, workers=names)
                return
            if asyncio.get_running_loop().time() > deadline:
                _reply(
                    comm,
                    message,
                    error=f"workers {missing} did not come back within {timeout:g}s of "
                    "the restart (is a nanny running them? a worker started alone "
                    "by `apportion worker` without one stays down)",
                )
                return
            await asyncio.sleep(0.05)  # polling the registrations, on the loop

    server.flush()
    background(wait_for_workers())


def on_coord(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    server.coordination.handle(client, message)


# --------------------------------------------------------- placement groups
def on_placement_group(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    """Make a placement group (placement_groups.py); answered at once, ready or not."""
    groups = server.state.placement_groups()
    try:
        groups.create(client, message["group"], message["bundles"], message["strategy"])
    except ValueError as exc:
        _reply(comm, message, error=str(exc))
        return
    _reply(comm, message)


def on_placement_group_ready(
    server: SchedulerShell, client: str, comm: Comm, message: Message
) -> None:
    """Answered once the group is ready (``wait``, the default), or at once with its state."""
    server.state.placement_groups().wait_ready(
        client,
        message["group"],
        message["id"],
        bool(message.get("wait", True)),
        server.state.clock(),
    )


def on_remove_placement_group(
    server: SchedulerShell, client: str, comm: Comm, message: Message
) -> None:
    server.state.placement_groups().remove(message["group"])
    _reply(comm, message)


def _check_restore_argument(message: Message) -> None:
    check_submit({"tasks": [message.get("task")]})  # stored_arguments.py


def on_restore_argument(server: SchedulerShell, client: str, comm: Comm, message: Message) -> None:
    spec = message["task"]
    _reply(comm, message, restored=restore_argument(server.state, client, spec))


def _check_force(message: Message) -> None:
    if not isinstance(message.get("force", False), bool):
        raise ProtocolError(f"'cancel' takes 'force' as true or false, got {message['force']!r}")


def _check_logs(message: Message) -> None:
    check_lines(message.get("n"))


def _checks(*checks: Check) -> Check:
    """One check making each of ``checks`` in turn."""

    def check(message: Message) -> None:
        for each in checks:
            each(message)

    return check


def _no_check(message: Message) -> None:
    """Operations whose handler reads only optional fields, or answers the problem itself."""


CLIENT_OPS: dict[str, ClientOp] = {
    "submit": ClientOp(_check_submit, on_submit),
    "release": ClientOp(check_keys, on_release),
    "cancel": ClientOp(_checks(check_keys, _check_force), on_cancel),
    "story": ClientOp(_checks(check_id, check_key), on_story),
    "info": ClientOp(check_id, on_info),
    "run": ClientOp(check_id, on_run),
    "replicate": ClientOp(_checks(check_id, check_keys), on_replicate),
    "retire": ClientOp(_checks(check_id, check_retire), on_retire),
    "expect-leave": ClientOp(check_id, on_expect_leave),
    "logs": ClientOp(_checks(check_id, _check_logs), on_logs),
    "close": ClientOp(_no_check, on_close),
    "set-resources": ClientOp(check_id, on_set_resources),
    "run-on-scheduler": ClientOp(check_id, on_run_on_scheduler),
    "upload-file": ClientOp(check_id, on_upload_file),
    "task-stream": ClientOp(check_id, on_task_stream),
    "coord": ClientOp(check_id, on_coord),
    "restart": ClientOp(check_id, on_restart),
    "placement-group": ClientOp(_checks(check_id, check_placement_group), on_placement_group),
    "placement-group-ready": ClientOp(
        _checks(check_id, check_placement_group), on_placement_group_ready
    ),
    "remove-placement-group": ClientOp(
        _checks(check_id, check_placement_group), on_remove_placement_group
    ),
    "restore-argument": ClientOp(_checks(check_id, _check_restore_argument), on_restore_argument),
}


def _no_futures(key: str) -> Any:
    raise ValueError(f"run_on_scheduler takes no futures as arguments (got one of {key!r})")


__all__ = ["CLIENT_OPS", "ClientOp"]
