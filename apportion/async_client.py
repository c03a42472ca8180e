"""The client inside a running event loop (Jupyter, tornado, FastAPI): ``AsyncClient``.

``await Client(address, asynchronous=True)`` (or ``async with``) gives a client whose
waiting calls are coroutines: ``await client.gather(...)``, ``await client.scheduler_info()``,
``await client.close()``; ``await future`` and ``async for future in as_completed(...)``
work with it (and with the synchronous client too). ``submit`` and ``map`` never wait, so
they stay plain calls.

The network I/O stays on the client's own loop thread, as for the synchronous client, so
nothing here ever blocks the caller's loop: each waiting call is bridged to it with
``asyncio.wrap_future``, and results arrive through the futures' callbacks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import TYPE_CHECKING, Any

from apportion.client import Client, _collect_futures, _rebuild

if TYPE_CHECKING:
    from apportion.futures import Future, FutureState


async def wait_state(state: FutureState) -> None:
    """Wait in the running loop until a future's state is done (never blocking it)."""
    if state.is_done():
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    def from_io_thread() -> None:
        loop.call_soon_threadsafe(wake)

    state.add_callback(from_io_thread)
    await done


async def result_of(future: Future) -> Any:
    """``await future``: its result, fetched without blocking the running loop."""
    await wait_state(future._state)
    if future._state.status != "finished":
        raise future._exception()
    client = future.client
    if not future._state.has_value():
        coro = client._fetch([future])
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, client._io.loop))
    return future._state.value()


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
                self._closed = True
                await asyncio.get_running_loop().run_in_executor(None, self._io.stop)
                raise
        return self

    async def __aenter__(self) -> AsyncClient:
        return await self._until_ready()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if not hasattr(self, "id") and not self._closed:
            raise RuntimeError("await the client before using it: client = await Client(...)")
        super()._check_open()

    def _on_io(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """Run ``coro`` on the client's I/O loop; awaitable from the caller's loop."""
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._io.loop))

    # ------------------------------------------------------------ waiting calls
    async def gather(self, futures: Any, errors: str = "raise") -> Any:
        """Results of futures, in the same structure, awaited."""
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
        flat = _collect_futures(futures)
        for future in flat:
            await wait_state(future._state)
        missing = [f for f in flat if f.status == "finished" and not f._state.has_value()]
        if missing:
            await self._on_io(self._fetch(missing))
        skipped = object()

        def resolve(future: Future) -> Any:
            if future.status == "finished":
                return future._state.value()
            if errors == "skip":
                return skipped
            raise future._exception()

        return _rebuild(futures, resolve, skipped)

    async def scheduler_info(self) -> dict[str, Any]:  # type: ignore[override]
        self._check_open()
        reply = dict(await self._on_io(self._request_async({"op": "info"})))
        for field in ("op", "id"):
            reply.pop(field, None)
        return reply

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
        if self._closed:
            return
        if not hasattr(self, "id"):
            self._connecting.cancel()
        loop = asyncio.get_running_loop()
        # Client.close waits on the I/O thread: run it where it blocks no one.
        await loop.run_in_executor(None, super().close)

    def __del__(self) -> None:
        if hasattr(self, "id"):
            super().__del__()
