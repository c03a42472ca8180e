"""A client's way back to its scheduler after losing the connection.

The client keeps its futures pending and retries, with back-off, the address it was given
(a host name is resolved again on every try: on Kubernetes the scheduler Service's name,
never the address of a pod that is gone; a cluster object such as KubeCluster is asked for
the scheduler's address again on every try). The new scheduler first hears of everything the
client still wants, with the lineage to compute it (apportion/lineage.py); then what was
submitted or released meanwhile. After ``client.reconnect-timeout`` seconds without a
scheduler, pending futures fail with SchedulerConnectionError.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from apportion import config
from apportion.aio import background
from apportion.coordination import restored_messages
from apportion.errors import SchedulerConnectionError
from apportion.lineage import re_registration
from apportion.protocol import Comm, CommClosedError, Message, connect

if TYPE_CHECKING:
    from apportion.client import Client

logger = logging.getLogger("apportion.client")

FIRST_DELAY = 0.05  # seconds before the second try; doubled after each failure
MAX_DELAY = 2.0


async def reconnect(client: Client, reason: str) -> None:
    """Reconnect ``client`` (on its event loop) after ``reason``, or fail its futures."""
    timeout = float(config.get("client.reconnect-timeout"))
    logger.warning(
        "%s; reconnecting for up to %gs (client.reconnect-timeout), futures stay pending",
        reason,
        timeout,
    )
    client._connected.clear()
    # A request's reply is lost with the connection: its caller hears so now.
    for reply in client._requests.values():
        if not reply.done():
            reply.set_exception(SchedulerConnectionError(f"{reason}; no reply came"))
    client._requests.clear()
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout
    delay = FIRST_DELAY
    problem = reason
    while not client._closed:
        left = deadline - loop.time()
        if left <= 0:
            client._on_lost(
                f"{reason}; no scheduler answered at {client.scheduler_address} for "
                f"{timeout:g}s (client.reconnect-timeout); last try: {problem}"
            )
            client._connected.set()  # waiting requests wake, and fail
            return
        try:
            address = await _current_address(client)
            comm, _ = await connect(
                address,
                "client",
                client.token,
                {"client_id": client.id},
                timeout=min(left, float(config.get("comm.connect-timeout"))),
            )
        except ConnectionRefusedError as exc:
            # A wrong token stays wrong; our id still known to the scheduler does not.
            if "already connected" not in str(exc):
                client._on_lost(f"{reason}; reconnecting failed: {exc}")
                client._connected.set()
                return
            problem = str(exc)
        except OSError as exc:  # ConnectionError from a cluster object too
            problem = str(exc)
        else:
            client.scheduler_address = address
            if client._closed:
                comm.close()
                return
            try:
                count = _resume(client, comm)
            except CommClosedError as exc:  # that scheduler is gone already: try again
                problem = str(exc)
                await asyncio.sleep(delay)
                continue
            except Exception as exc:  # a bug here must not leave futures pending for good
                logger.exception("re-registering with the new scheduler failed")
                comm.close()
                client._on_lost(f"{reason}; re-registering with the new scheduler failed: {exc!r}")
                client._connected.set()
                return
            logger.warning(
                "reconnected to scheduler %s after %.1fs; re-registered %d tasks",
                client.scheduler_address,
                loop.time() - started,
                count,
            )
            return
        await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
        delay = min(delay * 2, MAX_DELAY)


async def _current_address(client: Client) -> str:
    """The address to try now: a cluster object (KubeCluster) is asked again each time, as
    a new scheduler pod has a new address; a plain address is resolved again by connect."""
    cluster = client.cluster
    if cluster is None:
        return client.scheduler_address
    loop = asyncio.get_running_loop()
    try:
        # It may ask the Kubernetes API: off the event loop.
        return str(await loop.run_in_executor(None, lambda: cluster.scheduler_address))
    except OSError:
        raise
    except Exception as exc:  # the API unreachable for a while, say: one more failed try
        raise OSError(f"cannot look up the scheduler's address: {exc}") from exc


def _resume(client: Client, comm: Comm) -> int:
    """Re-register what the client wants on a new connection, then use it."""
    from apportion.client import split_submission

    with client._lock:
        specs, lineage_only = re_registration(list(client._states.values()))
    messages: list[Message] = [
        {"op": "submit", "tasks": batch, "recover": True}
        for batch in split_submission(specs, client._limit() // 2)
        if batch
    ]
    if lineage_only:  # registered for their dependents' sake only
        messages.append({"op": "release", "keys": lineage_only, "recover": True})
    messages.extend(restored_messages(client))  # its leases and events (coordination.py)
    if messages:
        comm.send_now(messages)  # before anything this client sends from now on
    comm.allow_thread_writes()
    client._comm = comm
    client._flush()  # what was submitted or released meanwhile
    background(client._read_loop(comm))
    client._connected.set()
    return len(specs)
