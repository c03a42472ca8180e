"""The event loop every process runs: uvloop's where installed, unless configured away."""

from __future__ import annotations

import asyncio

import pytest

from apportion import aio, config


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_comm_event_loop_asyncio_gives_asyncios_own_loop() -> None:
    with config.set({"comm.event-loop": "asyncio"}):
        assert issubclass(aio.run(_loop_type()), asyncio.BaseEventLoop)


def test_uvloop_is_the_default_where_installed() -> None:
    uvloop = pytest.importorskip("uvloop")
    assert aio.run(_loop_type()) is uvloop.Loop


def test_run_cancels_what_main_left_running() -> None:
    left: list[asyncio.Task] = []

    async def main() -> int:
        left.append(asyncio.ensure_future(asyncio.Event().wait()))
        return 7

    assert aio.run(main()) == 7
    assert left[0].cancelled()
