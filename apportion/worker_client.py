"""Tasks that submit tasks: ``get_client()``, ``worker_client()``, ``secede()``, ``rejoin()``.

Inside a task, ``get_client()`` returns a client of the worker's scheduler (one per worker
process, shared by its tasks). A task that waits for work it submitted should not sit on a
thread meanwhile: ``secede()`` gives its thread back to the worker, which runs another task
in its place, and ``rejoin()`` takes a thread again (waiting for one to come free).

Resources (what differs from Dask on purpose): a seceded task **keeps its resources**
(its GPU stays its own while it waits), unless it releases them, ``secede(
release_resources=True)`` or ``worker_client(release_resources=True)``: then they are free
for other tasks, its own subtasks typically, and ``rejoin()`` waits until they are granted
back (before any queued task; ``get_worker().task.units`` then names the units it holds
now, which may be other ones). A subtask that could only ever run on resources its waiting
ancestors kept fails with ``ResourceDeadlockError`` instead of waiting forever.

>>> def fib(n):
...     if n < 2:
...         return n
...     with worker_client() as client:
...         a, b = client.submit(fib, n - 1), client.submit(fib, n - 2)
...         return a.result() + b.result()
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from apportion.client import Client
from apportion.core import task_host
from apportion.core.context import current_task_key
from apportion.futures import set_blocking_wait

_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


def get_client() -> Client:
    """The client of the scheduler of the worker running this task (made on first use)."""
    address, token = task_host.task_host().scheduler()
    with _clients_lock:
        client = _clients.get(address)
        if client is None or client.session.closed or client.session.lost:
            client = Client(address, token=token)
            _clients[address] = client
        return client


def close_clients() -> None:
    """Close the clients tasks made here (the worker process is stopping): what they
    still wanted is released before the worker leaves."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()


task_host.on_close_clients(close_clients)


# Whether this task thread is seceded (by secede(), worker_client(), or a wait below).
_thread = threading.local()


def secede(release_resources: bool = False) -> None:
    """Give this task's thread back to the worker (another task may start in its place);
    with ``release_resources`` its resources too, until ``rejoin()``."""
    task_host.task_host().secede(release_resources)
    _thread.seceded = True


def rejoin() -> None:
    """Take a thread again (and released resources), waiting until they are free."""
    task_host.task_host().rejoin()
    _thread.seceded = False


@contextmanager
def _seceded_while_waiting() -> Iterator[None]:
    """A task waiting for futures (``future.result()``, ``client.gather``, ``wait``) gives
    its thread back meanwhile, as if it had seceded, and takes one again after: a task that
    gathers what it submitted (``get_client()`` without ``secede()``, as Dask's examples
    do) cannot hold the thread its subtasks need. Outside tasks, or seceded already, it
    changes nothing."""
    if current_task_key() is None or getattr(_thread, "seceded", False):
        yield
        return
    secede()
    try:
        yield
    finally:
        rejoin()


set_blocking_wait(_seceded_while_waiting)


@contextmanager
def worker_client(release_resources: bool = False) -> Iterator[Client]:
    """``get_client()`` for the block, seceded meanwhile (see the module's docstring)."""
    client = get_client()
    secede(release_resources=release_resources)
    try:
        yield client
    finally:
        rejoin()
