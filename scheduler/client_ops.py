"""Client requests beyond tasks, for the scheduler's network shell: ``set-resources``,
``run-on-scheduler``, ``upload-file``, ``task-stream``, ``restart``, ``restore-argument``
(and ``coord``, the coordination primitives). Each handler answers
``{"op": "reply", "id": ...}``, with ``error`` when refused.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from apportion.scheduler.restart import forget_all_tasks
from apportion.scheduler.stored_arguments import restore_argument
from apportion.scheduler.validation import check_submit
from apportion.scheduler.worker_resources import set_resources

from apportion.aio import background
from apportion.protocol import Comm, Message
from apportion.resources import validate
from apportion.serialize import dumps_exception, dumps_value, loads_args, loads_value

if TYPE_CHECKING:
    from apportion.scheduler.server import Scheduler

logger = logging.getLogger("apportion.scheduler")

Handler = Callable[[str, Comm, Message], None]


def client_ops(server: Scheduler) -> dict[str, Handler]:
    def reply(comm: Comm, message: Message, **fields: Any) -> None:
        comm.send({"op": "reply", "id": message["id"], **fields})

    def on_set_resources(client: str, comm: Comm, message: Message) -> None:
        worker = str(message.get("worker"))
        state = server.state
        ws = state.workers.get(worker) or next(
            (w for w in state.workers.values() if w.name == worker), None
        )
        if ws is None:
            known = sorted(w.name for w in state.workers.values())
            reply(comm, message, error=f"no worker named {worker!r} (connected: {known})")
            return
        try:
            resources = validate(message.get("resources"), what="capacity")
        except (TypeError, ValueError) as exc:
            reply(comm, message, error=str(exc))
            return
        set_resources(state, ws, resources)
        reply(comm, message, worker=ws.name, resources=dict(ws.total))

    def on_run_on_scheduler(client: str, comm: Comm, message: Message) -> None:
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
                reply(comm, message, result=dumps_value(result))
            except BaseException as exc:
                data, text = dumps_exception(exc)
                reply(comm, message, exception=data, traceback=text)
            server._flush()

        background(run())

    def on_upload_file(client: str, comm: Comm, message: Message) -> None:
        filename, data = message.get("filename"), message.get("data")
        if not isinstance(filename, str) or not isinstance(data, bytes):
            reply(comm, message, error="'upload-file' needs 'filename' (str) and 'data' (bytes)")
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

    def on_task_stream(client: str, comm: Comm, message: Message) -> None:
        from apportion.scheduler.events import EventLog

        state = server.state
        if state.events is None:  # recorded from the first request on (no dashboard)
            state.events = EventLog()
        since = float(message.get("since") or 0)
        runs = [run._asdict() for run in state.events.recent_runs(100_000) if run.stop >= since]
        reply(comm, message, runs=runs)

    def on_restart(client: str, comm: Comm, message: Message) -> None:
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
                    reply(comm, message, workers=names)
                    return
                if asyncio.get_running_loop().time() > deadline:
                    reply(
                        comm,
                        message,
                        error=f"workers {missing} did not come back within {timeout:g}s of "
                        "the restart (is a nanny running them? a worker started alone "
                        "by `apportion worker` without one stays down)",
                    )
                    return
                await asyncio.sleep(0.05)  # polling the registrations, on the loop

        server._flush()
        background(wait_for_workers())

    def on_coord(client: str, comm: Comm, message: Message) -> None:
        server.coordination.handle(client, message)

    def on_restore_argument(client: str, comm: Comm, message: Message) -> None:
        (spec,) = check_submit({"tasks": [message.get("task")]})  # stored_arguments.py
        reply(comm, message, restored=restore_argument(server.state, client, spec))

    return {
        "set-resources": on_set_resources,
        "run-on-scheduler": on_run_on_scheduler,
        "upload-file": on_upload_file,
        "task-stream": on_task_stream,
        "coord": on_coord,
        "restart": on_restart,
        "restore-argument": on_restore_argument,
    }


def _no_futures(key: str) -> Any:
    raise ValueError(f"run_on_scheduler takes no futures as arguments (got one of {key!r})")


__all__ = ["client_ops"]
