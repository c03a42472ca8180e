"""The user's handle on a cluster: submit work, gather results.

``Client`` and ``AsyncClient`` are facades over a ``Session`` (apportion/session.py: the
connection, requests, the read loop, reconnecting) and a ``FutureTable``
(apportion/future_table.py: the states of the client's keys and fetching their results).
All network I/O runs on the session's event-loop thread; public methods are synchronous
and thread-safe. Submissions are queued and flushed to the scheduler once per loop tick, so
``submit`` in a loop costs little.

``AsyncClient`` (``Client(..., asynchronous=True)``) is the client inside a running event
loop (Jupyter, tornado, FastAPI): ``await Client(address, asynchronous=True)`` (or ``async
with``) gives a client whose waiting calls are coroutines: ``await client.gather(...)``,
``await client.scheduler_info()``, ``await client.close()``; ``await future`` and ``async
for future in as_completed(...)`` work with it (and with the synchronous client too).
``submit`` and ``map`` never wait, so they stay plain calls. The network I/O stays on the
session's loop thread, so nothing ever blocks the caller's loop: each waiting call is
bridged to it with ``asyncio.wrap_future``, and results arrive through the futures'
callbacks.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import inspect
import itertools
import logging
import time
import warnings
import weakref
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping, Sequence
from typing import Any

from apportion import actor_host, cluster_ops, config, datasets
from apportion.aio import background
from apportion.annotations import check_timeout
from apportion.annotations import current as current_annotations
from apportion.auth import token_from_environment
from apportion.cluster_base import REPR_TIMEOUT
from apportion.core.context import current_task_key
from apportion.core.stored import stored_argument
from apportion.dask_default import on_client_created
from apportion.dask_default import restore as restore_dask_default
from apportion.data import (
    BROADCAST_TIMEOUT,
    copy_to_every_worker,
    identity,
    scatter_keys,
    shaped_like,
)
from apportion.errors import FrameTooLargeError, SchedulerConnectionError
from apportion.future_table import FutureTable
from apportion.futures import (
    PIECE_ARGS_MAX_BYTES,
    PIECE_ROWS,
    Future,
    FutureState,
    MapPiece,
    blocking_wait,
    collect_futures,
    states_of,
)
from apportion.lineage import failed as failed_lineage
from apportion.local import LocalCluster
from apportion.logs import line_count, recent_lines, show_task_output
from apportion.memory_limit import format_size
from apportion.placement_group import PlacementGroup, group_option
from apportion.progress import progress
from apportion.protocol import CommClosedError, Message
from apportion.reprs import client_text, dashboard_link, summarise, summary_html
from apportion.resources import format_resources, validate
from apportion.restrictions import worker_restriction
from apportion.serialize import (
    OUT_OF_BAND_MIN_BYTES,
    Payload,
    content_token,
    dumps_args,
    dumps_data,
    large_pickle,
    tokenize,
)
from apportion.session import (
    Session,
    split_submission,
    submission_bytes,
    task_bytes_limit,
    too_large,
)
from apportion.stored_args import (
    KeptArgument,
    WorkerView,
    argument_value,
    choose_holder,
    large_arguments,
    replace,
)

logger = logging.getLogger("apportion.client")


class NoWorkerWarning(UserWarning):
    """Tasks wait because no connected worker has the resources they demand."""


class QuotaWarning(UserWarning):
    """Tasks wait because their tenant holds its quota (``scheduler.tenants.<name>.quota``)."""


class WorkerPausedWarning(UserWarning):
    """A worker's memory passed its pause threshold: it starts no new task until it falls
    back (``worker.memory.pause``). Warned once each time a worker pauses."""


def warn_worker_paused(message: Message) -> None:
    """The scheduler's notice that a worker paused (``worker-paused``), as a warning."""
    rss, limit = message.get("rss"), message.get("limit")
    memory = f"{format_size(rss)} of its {format_size(limit)} limit" if rss and limit else ""
    warnings.warn(
        f"worker {message['worker']} ({message['address']}) paused: its memory "
        f"({memory or 'unknown'}) passed its pause threshold; it starts no new task until "
        "its memory falls back (spill, or release results)",
        WorkerPausedWarning,
        stacklevel=1,
    )


# The latest client made in this process (what objects made without ``client=`` use:
# apportion/default_client.py). Weak: being the latest is no reason to live on.
_latest: weakref.ref[Client] | None = None


def latest_client() -> Client | None:
    """The latest client made in this process, if it still exists."""
    return _latest() if _latest is not None else None


class _ClientType(type):
    """``Client(..., asynchronous=True)`` constructs an ``AsyncClient`` (Dask's spelling)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("asynchronous") and not cls.asynchronous:  # type: ignore[attr-defined]
            cls = AsyncClient
        return super().__call__(*args, **kwargs)


# Tasks of one map() sent per message: a huge map reaches the scheduler in pieces it can
# start on, instead of one message it reads and handles whole before placing any.
MAP_SUBMIT_BATCH = PIECE_ROWS


def _demand(options: dict[str, Any]) -> bytes:
    """The part of a pure key that the task's placement makes: the same call placed
    differently is another task."""
    demand = repr(
        (
            sorted(options["resources"].items()),
            options["workers"],
            options.get("allow_other_workers", False),
        )
        if "workers" in options
        else sorted(options["resources"].items())
    ).encode()
    if "placement_group" in options:  # another group is another task
        demand += repr((options["placement_group"], options.get("bundle_index"))).encode()
    return demand


class Client(metaclass=_ClientType):
    """Connect to a scheduler: ``Client("tcp://host:8786")`` or ``Client(cluster)``;
    ``Client(..., asynchronous=True)``: an ``AsyncClient`` (see the module's docstring)."""

    # Dask accepts a client object as ``scheduler=`` when it is not asynchronous.
    asynchronous = False

    def __init__(
        self,
        address: Any = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        asynchronous: bool = False,
        **cluster_kwargs: Any,
    ) -> None:
        """``asynchronous=True`` makes the call construct an ``AsyncClient`` (see
        _ClientType): the class, not this argument, decides how the client waits.

        With no address (and no ``client.scheduler-address`` set), or with LocalCluster's
        arguments (``n_workers=``, ``threads_per_worker=``, ``memory_limit=``, ...), the
        client starts a ``LocalCluster`` of its own, closed with the client, as Dask's does."""
        # Set first: close() and __del__ read it even when connecting fails.
        self._own_cluster: LocalCluster | None = None
        if address is None and not cluster_kwargs:
            address = config.get("client.scheduler-address")
        if cluster_kwargs and address is not None:
            raise TypeError(
                f"Client({address!r}, ...) connects to a running scheduler: LocalCluster's "
                f"arguments {sorted(cluster_kwargs)} apply only to Client() with no address"
            )
        if address is None:
            address = self._own_cluster = LocalCluster(**cluster_kwargs)
        self.cluster = None
        if not isinstance(address, str):
            self.cluster = address
            token = token or getattr(address, "token", None)
            address = address.scheduler_address
        token = token if token is not None else token_from_environment()
        self.session = Session(address, token, self.cluster)
        self.future_table = FutureTable(self.session, self)
        # The table's, by short names: the submission path reads them for every task.
        self._states = self.future_table.states
        self._lock = self.session.lock
        self._functions = self.session.functions
        # Large arguments this client put on workers, by key: the worker holding each.
        self._stored_on: dict[str, str] = {}
        # Their pickles' sizes (an argument of a size stored before is hashed before
        # it is sent: it may be a repeat).
        self._stored_bytes: dict[str, int] = {}
        # Their values, kept until the tasks that took them are done: put on another
        # worker if their holder is lost first (see apportion/stored_args.py).
        self._kept: dict[str, KeptArgument] = {}
        # The workers, for choosing where those go (described again now and then).
        self._worker_view = WorkerView()
        self._warned: set[tuple] = set()
        self.session.on("no-worker", self._on_no_worker)
        self.session.on("worker-paused", warn_worker_paused)
        self.session.on("task-output", show_task_output)
        self.session.on("over-quota", _warn_over_quota)
        if self.asynchronous:  # connected when awaited, without blocking the caller's loop
            self.session.not_ready = "await the client before using it: client = await Client(...)"
            self._connecting = self.session.connect_in_background(timeout)
            return
        try:
            self.id = self.session.connect(timeout)
        except BaseException:
            if self._own_cluster is not None:
                self._own_cluster.close()
            raise
        # Closed before the clusters of this process stop at exit, so that it does not
        # take their going for a lost scheduler (and say so while reconnecting).
        atexit.register(self.session.close)
        on_client_created(self)
        global _latest
        _latest = weakref.ref(self)

    @property
    def scheduler_address(self) -> str:
        """The scheduler's address (a new one after reconnecting to a moved scheduler)."""
        return self.session.address

    @property
    def token(self) -> str | None:
        return self.session.token

    @property
    def tenant(self) -> str:
        """The tenant this client belongs to: the one whose token it presented
        (``scheduler.tenants``); ``"default"`` with the cluster's token (docs/sharing.md)."""
        return self.session.tenant

    # ------------------------------------------------------------- submission
    def submit(
        self,
        func: Callable[..., Any],
        *args: Any,
        key: str | None = None,
        pure: bool = True,
        retries: int | None = None,
        priority: int | None = None,
        resources: dict[str, float] | None = None,
        workers: str | Iterable[str] | None = None,
        allow_other_workers: bool = False,
        placement_group: PlacementGroup | None = None,
        bundle_index: int | None = None,
        actor: bool = False,
        task_timeout: float | None = None,
        **kwargs: Any,
    ) -> Future:
        """Run ``func(*args, **kwargs)`` on a worker with ``resources`` free; with
        ``workers`` (names or addresses) only on one of those, or preferring them when
        ``allow_other_workers``; with ``placement_group`` in one of its bundles
        (``bundle_index``, else any that fits), out of the bundle's resources.
        ``task_timeout``: seconds a run may take; past it the run fails with
        ``TaskTimeoutError`` (retried if ``retries`` are left) and its worker process is
        replaced, freeing what it held (``annotate(timeout=...)`` sets it for a block).
        ``actor=True``: ``func`` is a class, made on a worker and kept there; the result is
        a proxy of it (apportion/actors.py)."""
        if actor:
            func, args, kwargs = actor_host.create, (func, args, kwargs), {}
            pure = False
        options = self._options(
            resources, retries, priority, workers, allow_other_workers, task_timeout
        )
        options.update(self._group_options(placement_group, bundle_index))
        spec, future = self._prepare(func, args, kwargs, key, pure, options)
        if spec is not None:
            self._enqueue([spec])
        return future

    def map(
        self,
        func: Callable[..., Any],
        *iterables: Iterable[Any],
        key: str | list[str] | None = None,
        pure: bool = True,
        retries: int | None = None,
        priority: int | None = None,
        resources: dict[str, float] | None = None,
        workers: str | Iterable[str] | None = None,
        allow_other_workers: bool = False,
        placement_group: PlacementGroup | None = None,
        bundle_index: int | None = None,
        task_timeout: float | None = None,
        **kwargs: Any,
    ) -> list[Future]:
        """Submit ``func`` over zipped iterables; one future per element."""
        options = self._options(
            resources, retries, priority, workers, allow_other_workers, task_timeout
        )
        options.update(self._group_options(placement_group, bundle_index))
        if not isinstance(key, list):
            # Prepared and sent a piece at a time (the scheduler places the first tasks,
            # and workers run them, while the rest is prepared), never all rows at once.
            prefix = key if isinstance(key, str) else None
            rows = zip(*iterables, strict=False)
            futures: list[Future] = []
            while piece := list(itertools.islice(rows, MAP_SUBMIT_BATCH)):
                specs, made = self._prepare_rows(func, piece, kwargs, pure, options, prefix)
                futures += made
                del made
                self._enqueue(specs)
            return futures
        every = list(zip(*iterables, strict=False))
        if len(key) != len(every):
            raise ValueError(f"map got {len(key)} keys for {len(every)} inputs")
        specs, futures = [], []
        limit = task_bytes_limit(self.session.peer_max_frame)
        for row, explicit in zip(every, key, strict=True):
            spec, future = self._prepare(func, row, kwargs, explicit, pure, options, limit=limit)
            futures.append(future)
            if spec is not None:
                specs.append(spec)
                if len(specs) == MAP_SUBMIT_BATCH:
                    # Sent while the rest is prepared: the scheduler places the first tasks
                    # (and workers run them) meanwhile, and less waits encoded at once.
                    self._enqueue(specs)
                    specs = []
        self._enqueue(specs)
        return futures

    def _prepare_rows(
        self,
        func: Callable[..., Any],
        rows: list[tuple],
        kwargs: dict,
        pure: bool,
        options: dict[str, Any],
        prefix: str | None,
    ) -> tuple[list[Message], list[Future]]:
        """A piece of a map: the messages to send and a future per row, as ``_prepare``
        makes them one at a time (the same keys), with what the rows share worked out
        once and the futures made under one lock. The lineage a row's future keeps is its
        row of the piece's ``MapPiece`` (``submitted_with``). A row with a large argument
        (to store on a worker) goes through ``_prepare``."""
        self.session.check_open()
        if not callable(func):
            raise TypeError(f"first argument must be callable, got {type(func).__name__}")
        func_bytes = self._functions.dumps(func)
        limit = task_bytes_limit(self.session.peer_max_frame)
        room = limit - len(func_bytes)  # for the arguments
        name = prefix or getattr(func, "__name__", type(func).__name__)
        # tokenize(func_bytes, args, demand), with the function's bytes hashed once.
        hashed = hashlib.blake2b(func_bytes, digest_size=16) if pure else None
        demand = _demand(options) if pure else b""
        table = self.future_table
        kwargs = dict(kwargs)
        prepared: list[tuple[str, Any, list[str]] | Future] = []
        specs: list[Message] = []
        for row in rows:
            args_bytes, deps = dumps_args(row, kwargs, Future)
            if not isinstance(args_bytes, bytes) or len(args_bytes) >= OUT_OF_BAND_MIN_BYTES:
                spec, future = self._prepare(func, row, kwargs, None, pure, options, prefix, limit)
                if spec is not None:
                    specs.append(spec)
                prepared.append(future)
                continue
            if hashed is not None:
                digest = hashed.copy()
                digest.update(args_bytes)
                digest.update(demand)
                key = f"{name}-{digest.hexdigest()}"
            else:
                key = f"{name}-{table.unique_token()}"
            if deps or len(args_bytes) > room:  # else nothing to refuse: no call per row
                self._check_task(key, deps, len(func_bytes) + len(args_bytes), limit)
            prepared.append((key, args_bytes, deps))
        # What every task of the piece is sent with besides its key and arguments.
        shared = {"func": func_bytes, **options}
        if not options["resources"]:
            del shared["resources"]
        parent = current_task_key()
        if parent is not None:  # (_enqueue sets it on what is sent; this is the lineage)
            shared["parent"] = parent
        # The rows that keep their lineage in the piece, and their arguments.
        piece = MapPiece(shared)
        piece_states: list[FutureState] = []
        piece_args: list[bytes] = []
        futures: list[Future] = []
        with self._lock:
            states = self._states
            for entry in prepared:
                if isinstance(entry, Future):
                    futures.append(entry)
                    continue
                key, args_bytes, deps = entry
                known = states.get(key)
                if known is None or known.status == "cancelled":
                    state = states[key] = FutureState(key)
                    spec = {"key": key, **shared, "args": args_bytes}
                    if deps or len(args_bytes) > PIECE_ARGS_MAX_BYTES:
                        if deps:
                            spec["deps"] = tuple(deps)
                            state.deps = list(filter(None, map(states.get, deps)))
                        state.spec = spec  # (rare in a map: kept whole)
                    else:
                        piece_states.append(state)
                        piece_args.append(args_bytes)
                    specs.append(spec)
                else:
                    state = known
                state.refs += 1
                futures.append(Future.counted(key, self, state))
            piece.keep(piece_states, piece_args)
        return specs, futures

    def _check_task(self, key: str, deps: Iterable[str], nbytes: int, limit: int) -> None:
        """Refuse a task that names itself among its inputs, or whose function and arguments
        (``nbytes``) would not fit the scheduler's frames (``limit``)."""
        if key in deps:
            raise ValueError(
                f"task {key!r} would depend on itself: one of its arguments is the future "
                f"of key {key!r}; give the new task another key"
            )
        if nbytes > limit:
            raise FrameTooLargeError(
                too_large(f"task {key!r}", nbytes, self.session.peer_max_frame)
            )

    def _options(
        self,
        resources: Any,
        retries: Any,
        priority: Any,
        workers: Any = None,
        allow_other_workers: Any = False,
        timeout: Any = None,
    ) -> dict[str, Any]:
        annotations = current_annotations()
        resources = annotations.get("resources") if resources is None else resources
        retries = annotations.get("retries", 0) if retries is None else retries
        priority = annotations.get("priority", 0) if priority is None else priority
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, got {retries!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an integer, got {priority!r}")
        # Zero retries and priority are left out: the scheduler's defaults, and every
        # future's lineage keeps its task's message (smaller with fewer entries).
        options: dict[str, Any] = {"resources": validate(resources)}
        if retries:
            options["retries"] = retries
        if priority:
            options["priority"] = priority
        timeout = check_timeout(annotations.get("timeout") if timeout is None else timeout)
        if timeout is not None:
            options["timeout"] = timeout
        if workers is not None:
            options.update(worker_restriction(workers, allow_other_workers))
        return options

    @staticmethod
    def _group_options(group: Any, bundle_index: Any) -> dict[str, Any]:
        """The placement group and bundle of the tasks (``annotate`` may name them)."""
        if group is None:
            annotations = current_annotations()
            group = annotations.get("placement_group")
            if bundle_index is None:
                bundle_index = annotations.get("bundle_index")
        return group_option(group, bundle_index)

    def placement_group(
        self, bundles: Sequence[Mapping[str, float]], strategy: str = "pack"
    ) -> PlacementGroup:
        """Reserve ``bundles`` (resource maps) together on workers chosen by ``strategy``
        (``pack``, ``spread``, ``strict_pack``, ``strict_spread``): all at once or none.
        Returns at once; ``.ready(timeout)`` waits until they are held (docs/sharing.md)."""
        return PlacementGroup(self.session, bundles, strategy)

    def _prepare(
        self,
        func: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        key: str | None,
        pure: bool,
        options: dict[str, Any],
        prefix: str | None = None,
        limit: int | None = None,
    ) -> tuple[Message | None, Future]:
        self.session.check_open()
        if not callable(func):
            raise TypeError(f"first argument must be callable, got {type(func).__name__}")
        func_bytes = self._functions.dumps(func)
        args_bytes, deps = dumps_args(tuple(args), dict(kwargs), Future)
        arguments: tuple[Future, ...] = ()
        kept: dict[str, Any] | None = None
        if len(args_bytes) >= OUT_OF_BAND_MIN_BYTES:
            threshold = int(config.get("client.store-argument-bytes"))
            stored = self._store_arguments(args, kwargs, options, pure, threshold)
            if stored is not None:
                args, kwargs, arguments, kept = stored
                args_bytes, deps = dumps_args(tuple(args), dict(kwargs), Future)
        if key is None:
            name = prefix or getattr(func, "__name__", type(func).__name__)
            if pure:
                large = large_pickle(args_bytes)
                token = tokenize(func_bytes, args_bytes, _demand(options), large=large)
            else:  # (impure keys: a counter, no uuid4 per task)
                token = self.future_table.unique_token()
            key = f"{name}-{token}"
        elif not isinstance(key, str):
            raise TypeError(f"key must be a string, got {key!r}")
        if limit is None:
            limit = task_bytes_limit(self.session.peer_max_frame)
        self._check_task(key, deps, len(func_bytes) + len(args_bytes), limit)
        # Kept as the future's lineage: made of values the garbage collector can stop
        # tracking (a tuple of keys, no empty dict), so that the kept specs cost it nothing.
        spec = {"key": key, "func": func_bytes, "args": args_bytes, **options}
        if deps:
            spec["deps"] = tuple(deps)
        if not options["resources"]:
            del spec["resources"]
        with self._lock:
            states = self._states
            known = states.get(key)
            fresh = known is None or known.status == "cancelled"
            if fresh:
                # The lineage a new scheduler needs after a restart (apportion/lineage.py).
                state = states[key] = FutureState(key)
                state.spec = spec
                if arguments:
                    state.arguments = arguments
                if deps:
                    state.deps = list(filter(None, map(states.get, deps)))  # at C speed
            else:
                state = known  # type: ignore[assignment]
        if kept:
            self._keep(kept, key, state, options)
        future = Future(key, self, state)
        return (spec if fresh else None), future

    def _store_arguments(
        self, args: Any, kwargs: dict, options: dict[str, Any], pure: bool, threshold: int
    ) -> tuple[tuple, dict, tuple[Future, ...], dict[str, Any]] | None:
        """Put the arguments pickling to ``threshold`` bytes or more on a worker that can
        run the task, each as a future of its own (apportion/stored_args.py); returns the
        arguments with those futures in their place, and their values by key (to keep
        until the task is done). None: they go with the task (none
        is that large, no connected worker could run the task, called on the I/O thread,
        which cannot wait for the transfer, or by an AsyncClient, whose caller's event
        loop must not wait for it either)."""
        if self.asynchronous or self.session.in_io_thread():
            return None
        found = large_arguments(tuple(args), dict(kwargs), threshold, Future)
        if not found:
            return None
        view = self._described_workers()
        with self._lock:
            holder = choose_holder(view.workers, options["resources"], options)
            if holder is not None:
                view.chose(holder, sum(len(payload) for _, _, payload in found))
        if holder is None:
            return None
        futures: dict[int | str, Future] = {}
        values: dict[str, Any] = {}
        for position, value, payload in found:
            try:
                key, known = self._put_argument(holder, value, payload, pure)
            except (OSError, CommClosedError) as exc:
                logger.info(
                    "could not store an argument on %s, sending it with the task: %s", holder, exc
                )
                with self._lock:
                    view.unreachable(holder)
                return None
            values[key] = value
            if known is not None:
                futures[position] = Future(key, self, known)  # stored already: once is enough
                continue
            with self._lock:
                if not self._stored_on:  # the first: the table tells of its release
                    self.future_table.on_forget = self._forget_stored
                self._stored_on[key] = holder
                self._stored_bytes[key] = len(payload)
            take = self._options({}, 0, options.get("priority", 0), holder)
            take["stored"] = len(payload)  # held there at once (scheduler/stored_arguments.py)
            spec, future = self._prepare(stored_argument, (key,), {}, key, True, take)
            if spec is not None:
                self._enqueue([spec])  # before the task that depends on it
            futures[position] = future
        new_args, new_kwargs = replace(tuple(args), dict(kwargs), futures)
        return new_args, new_kwargs, tuple(futures.values()), values

    def _described_workers(self) -> WorkerView:
        """The view of the workers to choose a holder from: described again first when it
        is old, or in the background when it is no longer fresh (stored_args.WorkerView)."""
        view = self._worker_view
        now = time.monotonic()
        with self._lock:
            due = view.due(now)
            view.refreshing |= due == "refresh"
        if due == "wait":
            workers = self.session.request({"op": "info"})["workers"]
            with self._lock:
                view.describe(workers, now)
        elif due == "refresh":
            describing = self._describe_workers(now)
            try:
                self.session.start(describing)
            except RuntimeError:  # the loop is closed: this client is closing
                describing.close()
                with self._lock:
                    view.refreshing = False
        return view

    async def _describe_workers(self, now: float) -> None:
        try:
            workers = (await self.session.request_async({"op": "info"}))["workers"]
        except (OSError, CommClosedError, SchedulerConnectionError, RuntimeError) as exc:
            logger.debug("could not describe the workers again: %s", exc)
            return
        finally:
            with self._lock:
                self._worker_view.refreshing = False
        with self._lock:
            self._worker_view.describe(workers, now)

    def _put_argument(
        self, holder: str, value: Any, payload: Payload, pure: bool
    ) -> tuple[str, FutureState | None]:
        """Put one large argument on ``holder``: its key, and the state of that key when
        this client has it stored already (then nothing is sent). Raises OSError or
        CommClosedError when the worker could not store it.

        A pure argument's key is a hash of its bytes. It is computed while the bytes
        travel, under a name of their own that the worker replaces by the key once known
        (the hash lets go of the GIL, the loop thread sends meanwhile): the hash costs a
        tenth of a transfer's time on one host. When an argument of the same size is
        stored already, it is hashed first instead, so that a repeat is not sent again."""
        kind = type(value).__name__
        if not pure:
            key = f"{kind}-{self.future_table.unique_token()}"
            self.session.run(self._put(holder, key, payload))
            return key, None
        with self._lock:
            same_size = len(payload) in self._stored_bytes.values()
        if same_size:
            key = f"{kind}-{content_token(payload)}"
            known = self.future_table.known(key)
            if known is None:
                self.session.run(self._put(holder, key, payload))
            return key, known
        upload = f"upload-{self.future_table.unique_token()}"
        sending = self.session.start(self._put(holder, upload, payload))
        try:
            key = f"{kind}-{content_token(payload)}"
        finally:
            sending.result()
        known = self.future_table.known(key)
        if known is not None:  # stored by another thread meanwhile
            self.session.call_soon(self._drop_stored, upload, holder)
        else:
            self.session.run(self._name_stored(holder, upload, key))
        return key, known

    def _forget_stored(self, key: str, state: FutureState | None) -> None:
        """A key was released (with the lock held): a stored argument whose task has not
        taken it yet is dropped from its worker."""
        holder = self._stored_on.pop(key, None)
        self._stored_bytes.pop(key, None)
        if holder is not None and state is not None and state.status == "pending":
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self.session.call_soon(self._drop_stored, key, holder)

    def _keep(
        self, values: dict[str, Any], taker: str, state: FutureState, options: dict[str, Any]
    ) -> None:
        """Keep stored arguments (values by key) until the task ``taker`` is done."""
        restriction: dict[str, Any] = {
            k: options[k] for k in ("workers", "allow_other_workers") if k in options
        }
        with self._lock:
            for key, value in values.items():
                kept = self._kept.get(key)
                if kept is None:
                    kept = self._kept[key] = KeptArgument(value, options["resources"], restriction)
                kept.takers.add(taker)
        state.add_callback(lambda: self._taken(taker, list(values)))

    def _taken(self, taker: str, keys: list[str]) -> None:
        """The task ``taker`` is done: the stored arguments no other task waits for are
        no longer kept here (their workers still hold them while their futures live)."""
        with self._lock:
            for key in keys:
                kept = self._kept.get(key)
                if kept is not None:
                    kept.takers.discard(taker)
                    if not kept.takers:
                        del self._kept[key]

    def _restore_lost(self, message: Message) -> Message:
        """On the loop: the scheduler found no worker for these keys. Those of stored
        arguments lost with their worker are put on another one; returns the notice
        without them (the others are the user's to hear of)."""
        keys = message["keys"]
        lost = [key for key in keys if key in self._kept]
        for key in lost:
            background(self._restore(key))
        return {**message, "keys": [key for key in keys if key not in lost]}

    async def _restore(self, key: str) -> None:
        """Put a stored argument whose holder was lost on another worker that could run
        the tasks waiting for it, and have the scheduler take it from there; with no such
        worker connected, its task carries the value itself (through the scheduler, as a
        task's small arguments do), so that it runs on any worker."""
        with self._lock:
            kept = self._kept.get(key)
            state = self._states.get(key)
            lost = self._stored_on.get(key)
        if kept is None or state is None or state.spec is None:
            return
        try:
            workers = (await self.session.request_async({"op": "info"}))["workers"]
            workers.pop(lost, None)
            holder = choose_holder(workers, kept.demand, kept.options)
            if holder is not None:
                try:
                    await self._put(holder, key, dumps_data(kept.value))
                except (OSError, CommClosedError) as exc:
                    logger.info("could not store %r again on %s: %s", key, holder, exc)
                    holder = None
            spec = self._restored_spec(state.spec, kept.value, holder)
            reply = await self.session.request_async({"op": "restore-argument", "task": spec})
        except (OSError, CommClosedError, SchedulerConnectionError, RuntimeError) as exc:
            # (RuntimeError: this client was closed meanwhile)
            logger.warning("could not restore the lost argument %r: %s", key, exc)
            return
        if not reply.get("restored"):  # it no longer waits for a worker (its holder is back)
            if holder is not None:
                self._drop_stored(key, holder)
            return
        logger.info("argument %r, lost with worker %s, restored on %s", key, lost, holder)
        with self._lock:
            state.spec = spec  # lineage, should the scheduler restart
            if holder is not None:
                self._stored_on[key] = holder
            else:
                self._stored_on.pop(key, None)

    def _restored_spec(self, spec: Message, value: Any, holder: str | None) -> Message:
        """The task of a stored argument taken from ``holder``, or with no holder,
        carrying its value."""
        dropped = ("workers", "allow_other_workers", "stored")  # (run as a task now)
        spec = {k: v for k, v in spec.items() if k not in dropped}
        if holder is not None:
            spec.update(worker_restriction(holder, False))
        else:
            spec["func"] = self._functions.dumps(argument_value)
            spec["args"] = dumps_args((value,), {}, Future)[0]
        return spec

    async def _put(self, address: str, key: str, payload: Payload) -> None:
        reply = await self.session.workers.request(
            address, {"op": "put-data", "key": key, "data": payload}
        )
        if reply.get("op") != "stored":
            raise OSError(f"worker {address} did not store {key!r}: {reply!r}")

    async def _name_stored(self, address: str, upload: str, key: str) -> None:
        reply = await self.session.workers.request(
            address, {"op": "name-data", "upload": upload, "key": key}
        )
        if reply.get("op") != "named":  # the connection it came through ended meanwhile
            raise OSError(f"worker {address} no longer holds the argument put as {upload!r}")

    def _drop_stored(self, key: str, holder: str) -> None:
        """On the loop: a stored argument's future was released before its task took it."""
        self.session.workers.send_if_open(holder, {"op": "drop-data", "keys": [key]})

    def _enqueue(self, specs: list[Message]) -> None:
        """Post tasks as ``submit`` messages each well within comm.max-frame-bytes (the
        connection splits a batch of messages into frames, never one message)."""
        if not specs:
            return
        # Submitted by a task (get_client() on a worker): the scheduler knows its parent.
        parent = current_task_key()
        if parent is not None:
            for spec in specs:  # kept with the lineage, for a new scheduler (lineage.py)
                spec["parent"] = parent
        budget = task_bytes_limit(self.session.peer_max_frame) // 2
        if submission_bytes(specs) <= budget:  # the usual case, measured at C speed
            batches = [specs]
        else:
            batches = split_submission(specs, budget)
        post = self.session.post
        for batch in batches:
            message: Message = {"op": "submit", "tasks": batch}
            if parent is not None:
                message["parent"] = parent
            post(message)

    # ---------------------------------------------------------------- results
    def gather(self, futures: Any, errors: str = "raise") -> Any:
        """Results of futures, in the same structure (a future, list, tuple, dict, nesting)."""
        if all(f.done() for f in collect_futures(futures)):
            return self.future_table.gather(futures, errors)
        with blocking_wait():  # inside a task: its thread is given back meanwhile
            return self.future_table.gather(futures, errors)

    def cancel(self, futures: Iterable[Future], force: bool = False) -> None:
        """Cancel tasks (and what depends on them); their futures raise CancelledError.

        A running task's thread cannot be stopped: it keeps its resources until it returns.
        With ``force``, the worker processes running them are replaced instead (their
        nanny, ``LocalCluster`` or ``apportion worker --nworkers``, starts them afresh):
        the resources are free at once, and those workers' other runs and results are
        made again elsewhere, as when a worker dies."""
        keys = [f.key for f in collect_futures(futures)]
        message: Message = {"op": "cancel", "keys": keys}
        if force:
            message["force"] = True
        self.session.post(message)

    # ----------------------------------------------------------- cluster-wide
    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Call ``func`` in every worker process; returns ``{worker_address: result}``."""
        return cluster_ops.run_on_workers(self.session, self._functions.dumps(func), args, kwargs)

    def scheduler_info(self) -> dict[str, Any]:
        """Workers (name, resources, used_resources, ...), task counts, waiting demands."""
        reply = self.session.request({"op": "info"})
        for field in ("op", "id"):
            reply.pop(field, None)
        return reply

    # Observability (apportion/progress.py, apportion/logs.py, apportion/reprs.py).
    def get_scheduler_logs(self, n: int | None = None) -> list[str]:
        """The scheduler's last ``n`` log lines (default: all it keeps), oldest first."""
        return list(self.session.request({"op": "logs", "n": line_count(n)})["lines"])

    def get_worker_logs(self, n: int | None = None) -> dict[str, list[str]]:
        """Each worker's last ``n`` log lines, by worker name."""
        names = {a: w["name"] for a, w in self.scheduler_info()["workers"].items()}
        lines = self.run(recent_lines, line_count(n))
        return {names.get(address, address): kept for address, kept in lines.items()}

    @property
    def dashboard_link(self) -> str | None:
        """The dashboard, signed in with the token; None if the scheduler serves no HTTP."""
        return dashboard_link(
            self.scheduler_address, self.scheduler_info()["http_port"], self.token
        )

    def progress(self, *futures: Any, **kwargs: Any) -> Any:
        """Progress bars for futures: see ``apportion.progress``."""
        return progress(*futures, **kwargs)

    def _repr_html_(self) -> str:
        info = self.scheduler_info()
        link = dashboard_link(self.scheduler_address, info["http_port"], self.token)
        return summary_html(f"Client {self.id}", self.scheduler_address, link, info)

    def check_invariants(self) -> list[str]:
        """Ask the scheduler to verify its resource accounting; [] when consistent."""
        return list(self.session.request({"op": "info", "check": True})["problems"])

    def retire_workers(
        self, names: Iterable[str], count: int | None = None, close_workers: bool = True
    ) -> dict[str, Any]:
        """Take up to ``count`` (default: all) of the named workers out of service, gracefully.

        Idle workers are chosen first. They get no new work; their running tasks finish
        and every result still needed that only they hold is copied to a worker staying
        in service. Returns ``{"retired": [names now safe to stop], "kept": {name:
        reason}}`` once that is done, or after ``scheduler.retire-timeout`` seconds; a
        kept worker is back in service. Unknown names raise ValueError. The retired
        workers then close (their processes exit), unless ``close_workers=False``.
        """
        if isinstance(names, str):
            raise TypeError(f"names must be a list of worker names, not one string {names!r}")
        names = list(names)
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"worker names must be strings, got {names!r}")
        if count is not None and (type(count) is not int or count < 0):
            raise ValueError(f"count must be an int >= 0 or None (all named), got {count!r}")
        request = {"op": "retire", "names": names, "count": count, "close": close_workers}
        reply = self.session.request(request, timeout=None)
        if "error" in reply:
            raise ValueError(reply["error"])
        return {"retired": list(reply["retired"]), "kept": dict(reply["kept"])}

    def wait_for_workers(self, n: int = 1, timeout: float | None = None) -> None:
        """Block until at least ``n`` workers are connected."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while True:
            count = len(self.scheduler_info()["workers"])
            if count >= n:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"only {count} of {n} workers connected after {timeout}s")
            time.sleep(min(delay, 0.25))  # polling the scheduler, backing off
            delay *= 2

    def story(self, key: str) -> list[dict[str, Any]]:
        """What the scheduler recorded of ``key``'s task, oldest first: each change of its
        state as ``{"time": ..., "from": ..., "to": ..., "reason": ...}`` (time: the
        scheduler's wall clock, seconds since the epoch)."""
        return list(self.session.request({"op": "story", "key": key})["story"])

    # ------------------------------------------ more of Dask's API (apportion/cluster_ops.py)
    def set_resources(self, worker: str, resources: dict[str, float]) -> dict[str, float]:
        """Give a worker (name or address) new resource totals at runtime: new placements
        follow them; runs under way keep what they hold."""
        return cluster_ops.set_resources(self.session, worker, resources)

    def run_on_scheduler(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``func(*args, **kwargs)`` in the scheduler process; see cluster_ops."""
        return cluster_ops.run_on_scheduler(self.session, func, *args, **kwargs)

    def upload_file(self, filename: str) -> dict[str, str]:
        """Make a local .py/.zip/.egg/.whl file importable on every worker, now and later."""
        return cluster_ops.upload_file(self.session, filename)

    def restart(self, timeout: float = 60.0) -> Client:
        """Forget every task (their futures, in every client, raise CancelledError) and
        restart every worker, returning once they are all back."""
        cluster_ops.restart(self.session, timeout)
        return self

    def get_task_stream(self, start: float | None = None) -> list[dict[str, Any]]:
        """The runs that ended since ``start`` (wall clock), oldest first."""
        return cluster_ops.get_task_stream(self.session, start)

    # ------------------------------------------------- Dask collections (apportion[dask])
    def get(
        self,
        dsk: Any,
        keys: Any,
        workers: str | list[str] | None = None,
        allow_other_workers: bool = False,
        resources: dict[str, float] | None = None,
        retries: int | None = None,
        priority: int | None = None,
        sync: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Dask's scheduler function: ``dask.compute(x, scheduler=client.get)``. The options
        apply to every task of the graph (a layer's own annotations win); ``sync=False``
        gives futures instead of results."""
        from apportion import dask_client

        options = dask_client.graph_options(
            resources, workers, allow_other_workers, retries, priority
        )
        return dask_client.get(self.future_table, dsk, keys, options, sync)

    def compute(
        self,
        collections: Any,
        sync: bool = False,
        optimize_graph: bool = True,
        workers: str | list[str] | None = None,
        allow_other_workers: bool = False,
        resources: dict[str, float] | None = None,
        retries: int | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """Start computing Dask collections: a future per collection (list in, list out);
        ``sync=True``: their results. The options apply to every task of the graphs (a
        layer's own annotations win)."""
        from apportion import dask_client

        options = dask_client.graph_options(
            resources, workers, allow_other_workers, retries, priority
        )
        futures = dask_client.compute(self.future_table, collections, optimize_graph, options)
        return self.gather(futures) if sync else futures

    def persist(
        self,
        collections: Any,
        optimize_graph: bool = True,
        workers: str | list[str] | None = None,
        allow_other_workers: bool = False,
        resources: dict[str, float] | None = None,
        retries: int | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """The same Dask collections, backed by futures of their chunks on the cluster. The
        options apply to every task of the graphs (a layer's own annotations win)."""
        from apportion import dask_client

        options = dask_client.graph_options(
            resources, workers, allow_other_workers, retries, priority
        )
        return dask_client.persist(self.future_table, collections, optimize_graph, options)

    def as_default(self) -> Any:
        """Make this client Dask's default scheduler (also usable as a ``with`` block)."""
        from apportion.dask_default import DefaultScheduler

        return DefaultScheduler(self)

    def scatter(self, data: Any, broadcast: bool = False) -> Any:
        """Futures of local data: a list gives a list, a dict a dict (same keys), else one.

        Each value travels with a task through the scheduler to one worker (so it is bound
        by ``comm.max-frame-bytes``); its key is a hash of the value, so scattering equal
        data twice gives the same future. Tasks on other workers fetch it from that worker
        when they need it; with ``broadcast=True`` every worker in service holds a copy
        before ``scatter`` returns (workers joining later fetch it when they need it)."""
        values, keys = scatter_keys(data)
        futures = self.map(identity, values, key=keys)
        if broadcast:
            copy_to_every_worker(self.session, futures, BROADCAST_TIMEOUT)
        return shaped_like(data, futures)

    # ------------------------------------ published datasets (apportion/datasets.py)
    def publish_dataset(
        self, *args: Any, name: str | None = None, override: bool = False, **kwargs: Any
    ) -> None:
        """Publish values for other clients under names: ``publish_dataset(df, name="x")``
        or ``publish_dataset(x=df)``; futures inside (a persisted collection's chunks)
        stay on the cluster while published. A name taken raises unless ``override``."""
        if args:
            if name is None:
                raise TypeError(
                    "publish_dataset(value, ...) needs name=: the name to publish it as"
                )
            if len(args) != 1:
                raise TypeError(f"publish_dataset takes one value with name=, got {len(args)}")
            kwargs[name] = args[0]
        elif name is not None:
            raise TypeError("name= names a value given as the first argument; none was given")
        datasets.publish(self.future_table, kwargs, override)

    def get_dataset(
        self, name: str, default: Any = datasets._NO_DEFAULT, timeout: float | None = None
    ) -> Any:
        """The dataset published as ``name`` (KeyError, or ``default``, if there is none;
        with ``timeout``, waiting up to that long for it to be published)."""
        return datasets.get(self.future_table, name, default, timeout)

    def list_datasets(self) -> list[str]:
        """The names of the published datasets."""
        return datasets.names(self.future_table)

    def unpublish_dataset(self, name: str) -> None:
        """Remove a published dataset (KeyError if there is none of that name)."""
        datasets.unpublish(self.future_table, name)

    @property
    def datasets(self) -> datasets.Datasets:
        """The published datasets as a dictionary."""
        return datasets.Datasets(self.future_table)

    def retry(self, futures: Iterable[Future]) -> None:
        """Run failed tasks again (with their failed dependencies): ``future.retry()``.

        The scheduler forgets each failed task (this client lets go of it) and is given
        it again as first submitted."""
        again = failed_lineage(states_of(collect_futures(futures)))
        if not again:
            return
        for state in again:
            state.restart()
        keys = [state.key for state in again]
        with self._lock:
            lineage_only = [key for key in keys if key not in self._states]
        self.session.post({"op": "release", "keys": keys})
        self.session.post({"op": "submit", "tasks": [state.spec for state in again]})
        if lineage_only:
            self.session.post({"op": "release", "keys": lineage_only})

    def sync(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``func(*args, **kwargs)`` and, if it is a coroutine, run it to its result
        on the client's event loop (as Dask's ``Client.sync``)."""
        result = func(*args, **kwargs)
        if inspect.isawaitable(result):
            return self.session.run(_awaited(result))
        return result

    # ------------------------------------------------------- scheduler events
    def _on_no_worker(self, message: Message) -> None:
        if self._kept:
            message = self._restore_lost(message)
        if message["keys"]:
            self._warn_no_worker(message)

    def _warn_no_worker(self, message: Message) -> None:
        shape = tuple(sorted(message["resources"].items()))
        if shape in self._warned:
            return
        self._warned.add(shape)
        need = format_resources(message["resources"])
        text = (
            f"{len(message['keys'])} task(s) need {need}, which no connected worker has: "
            f"{message['why']}"
            if message["resources"]
            else f"{len(message['keys'])} task(s) wait: {message['why']}"
        )
        warnings.warn(text, NoWorkerWarning, stacklevel=1)  # once: a filter silences it all

    # -------------------------------------------------------------- lifecycle
    def close(self) -> None:
        if not self.session.closed:
            restore_dask_default(self)
            self.session.close()
            atexit.unregister(self.session.close)
        if self._own_cluster is not None:  # Client() started it: it ends with the client
            self._own_cluster.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A finalizer may run on any thread, even another client's I/O thread: never wait
        # here (close() would).
        session = getattr(self, "session", None)
        if session is not None:
            session.kill()
            atexit.unregister(session.close)

    def __repr__(self) -> str:
        """Workers, threads, memory and resources, as the scheduler reports them now."""
        info = None
        if hasattr(self, "id") and not self.session.closed and not self.asynchronous:
            with contextlib.suppress(Exception):  # a repr shows what it can
                info = self.session.request({"op": "info"}, timeout=REPR_TIMEOUT)
        summary = None if info is None else summarise(info["workers"])
        link = (
            ""
            if info is None
            else dashboard_link(self.scheduler_address, info["http_port"], self.token)
        )
        return client_text(getattr(self, "id", "?"), self.scheduler_address, summary, link or "")


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class AsyncClient(Client):
    """A client for code running in an event loop; see the module's docstring."""

    asynchronous = True

    def __await__(self) -> Generator[Any, None, AsyncClient]:
        return self._until_ready().__await__()

    async def _until_ready(self) -> AsyncClient:
        if not hasattr(self, "id"):
            try:
                self.id = await asyncio.wrap_future(self._connecting)
            except BaseException:
                self.session.closed = True
                await asyncio.get_running_loop().run_in_executor(None, self.session.stop_thread)
                raise
            self.session.not_ready = None
        return self

    async def __aenter__(self) -> AsyncClient:
        return await self._until_ready()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def sync(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(*args, **kwargs)`` as it is: a coroutine for the caller to await in its
        own loop (as Dask's asynchronous ``Client.sync``)."""
        return func(*args, **kwargs)

    async def _on_io(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the session's loop; awaited from the caller's loop."""
        return await asyncio.wrap_future(self.session.start(coro))

    # ------------------------------------------------------------ waiting calls
    async def gather(self, futures: Any, errors: str = "raise") -> Any:
        """Results of futures, in the same structure, awaited."""
        return await self.future_table.gather_async(futures, errors)

    async def scheduler_info(self) -> dict[str, Any]:  # type: ignore[override]
        self.session.check_open()
        reply = dict(await self._on_io(self.session.request_async({"op": "info"})))
        for field in ("op", "id"):
            reply.pop(field, None)
        return reply

    async def story(self, key: str) -> list[dict[str, Any]]:  # type: ignore[override]
        """What the scheduler recorded of ``key``'s task (see ``Client.story``), awaited."""
        self.session.check_open()
        reply = await self._on_io(self.session.request_async({"op": "story", "key": key}))
        return list(reply["story"])

    async def wait_for_workers(self, n: int = 1, timeout: float | None = None) -> None:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = 0.01
        while True:
            count = len((await self.scheduler_info())["workers"])
            if count >= n:
                return
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"only {count} of {n} workers connected after {timeout}s")
            await asyncio.sleep(min(delay, 0.25))  # polling the scheduler, backing off
            delay *= 2

    async def close(self) -> None:  # type: ignore[override]
        """Disconnect (awaited); the client's I/O thread stops."""
        if self.session.closed:
            return
        if not hasattr(self, "id"):
            self._connecting.cancel()
        loop = asyncio.get_running_loop()
        # Client.close waits on the I/O thread: run it where it blocks no one.
        await loop.run_in_executor(None, super().close)

    def __del__(self) -> None:
        if hasattr(self, "id"):
            super().__del__()


def _warn_over_quota(message: Message) -> None:
    """The scheduler says (once per client and tenant) that tasks wait over a quota."""
    tenant, quota = message["tenant"], format_resources(message["quota"])
    warnings.warn(
        f"tasks of tenant {tenant!r} wait: it holds its quota ({quota}) and they start as "
        f"its running tasks end (scheduler.tenants.{tenant}.quota)",
        QuotaWarning,
        stacklevel=1,
    )
