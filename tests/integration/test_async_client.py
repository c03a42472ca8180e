"""The client inside a running event loop, on real processes: ``asynchronous=True``."""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

import pytest

from apportion import Client, LocalCluster, as_completed
from apportion.aio import run
from apportion.client import AsyncClient
from tests.integration.tasks import inc, wait_for_file


def test_async_with_submit_await_gather_and_async_for(seed_cluster: LocalCluster) -> None:
    async def main() -> dict[str, Any]:
        async with Client(seed_cluster, asynchronous=True) as client:
            assert isinstance(client, AsyncClient) and client.asynchronous
            one = client.submit(inc, 1)
            many = client.map(inc, range(10))
            seen = []
            async for future in as_completed(many):
                seen.append(await future)
            pairs = [r async for _, r in as_completed(client.map(inc, [5, 6]), with_results=True)]
            info = await client.scheduler_info()
            return {
                "one": await one,
                "gathered": await client.gather(many),
                "dict": await client.gather({"a": one}),
                "seen": sorted(seen),
                "pairs": sorted(pairs),
                "workers": len(info["workers"]),
            }

    assert run(main()) == {
        "one": 2,
        "gathered": list(range(1, 11)),
        "dict": {"a": 2},
        "seen": list(range(1, 11)),
        "pairs": [6, 7],
        "workers": 3,
    }


def test_waiting_on_results_never_blocks_the_callers_event_loop(
    seed_cluster: LocalCluster,
) -> None:
    # The task finishes only once another coroutine of the same loop creates its file:
    # if awaiting its result blocked the loop, this would never end.
    path = os.path.join(tempfile.mkdtemp(), "go")

    async def release_later() -> None:
        await asyncio.sleep(0)
        open(path, "w").close()

    async def main() -> str:
        client = await Client(seed_cluster, asynchronous=True)
        try:
            future = client.submit(wait_for_file, path, pure=False)
            results = await asyncio.wait_for(
                asyncio.gather(client.gather([future]), release_later()), timeout=60
            )
            return str(results[0][0])
        finally:
            await client.close()

    assert run(main()) == path


def test_await_future_raises_the_tasks_error(seed_cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(seed_cluster, asynchronous=True) as client:
            with pytest.raises(ZeroDivisionError):
                await client.submit(divmod, 1, 0)

    run(main())


def test_an_async_client_used_before_it_is_awaited_says_so(seed_cluster: LocalCluster) -> None:
    async def main() -> None:
        client = Client(seed_cluster, asynchronous=True)
        with pytest.raises(RuntimeError, match="await the client before using it"):
            client.submit(inc, 1)
        await client
        assert await client.submit(inc, 41) == 42
        await client.close()

    run(main())


def test_await_future_works_with_the_synchronous_client_too(client: Client) -> None:
    future = client.submit(inc, 9)

    async def main() -> int:
        return int(await future)

    assert run(main()) == 10


def test_a_large_argument_from_an_async_client_never_blocks_its_loop(
    seed_cluster: LocalCluster,
) -> None:
    # A synchronous client puts a large argument on a worker first and waits for it; an
    # async client's submit must return at once, so the argument goes with the task.
    payload = b"x" * (4 << 20)

    async def main() -> tuple[int, dict[str, str]]:
        async with Client(seed_cluster, asynchronous=True) as client:
            future = client.submit(len, payload)
            return await future, dict(client._stored_on)

    assert run(main()) == (len(payload), {})
