"""FrameBuffer: a large frame's pages are made in bulk just ahead of what arrived, by a
thread of the frame's own for large ones; MapRecycler: a smaller frame takes the map of
one whose values are gone."""

from __future__ import annotations

import ctypes
import errno
import gc
import os
import time
from collections.abc import Callable

import pytest

from apportion.protocol import pages
from apportion.protocol import reader as reader_module
from apportion.protocol.frames import HEADER_BYTES, ProtocolError, decode, encode
from apportion.protocol.pages import MAX_WINDOW, MIN_WINDOW, FrameBuffer, MapRecycler
from apportion.protocol.reader import FrameReader


@pytest.fixture
def between_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames of every size make their pages between reads, as small ones do."""
    monkeypatch.setattr(pages, "THREAD_FROM", 1 << 62)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


def _write_into_made_pages(buffer: FrameBuffer, data: bytes) -> None:
    """Write the whole buffer as a connection would, but only ever into pages already
    made (so that what the test checks does not depend on which thread was faster)."""
    filled = 0
    while filled < buffer.length:
        room = buffer.room(filled)
        assert filled < room <= buffer.length
        # Never far ahead of what arrived: as much again, from one step to AHEAD, plus the
        # step being made.
        assert buffer.ready <= filled + max(pages.STEP, min(pages.AHEAD, filled)) + pages.STEP
        _wait_for(lambda at=filled: buffer.ready > at, "the thread to make the next pages")
        end = min(buffer.ready, filled + len(data))
        buffer.map[filled:end] = data[: end - filled]
        filled = end
    buffer.room(filled)


@pytest.mark.usefixtures("between_reads")
def test_pages_are_made_ahead_of_the_bytes_and_never_far_ahead_between_reads() -> None:
    length = 200 * MIN_WINDOW + 12_345
    buffer = FrameBuffer(length)
    filled, made = 0, []
    while filled < length:
        ready = buffer.room(filled)
        assert filled < ready <= length
        # Memory follows what arrived: at most twice it, plus one small window.
        assert ready <= max(2 * filled, filled + MAX_WINDOW) + MIN_WINDOW
        made.append(ready)
        step = min(ready, length) - filled
        buffer.map[filled : filled + step] = os.urandom(1) * step
        filled += step
    assert made == sorted(made) and made[-1] == length
    assert len(set(made)) < 40  # in windows, not page by page


def test_a_frame_fed_in_odd_chunks_across_many_windows_arrives_intact() -> None:
    data = os.urandom(1 << 16) * 100  # 6.5 MB
    stream = encode([{"op": "big", "data": data}]) + encode([{"op": "after"}])
    reader = FrameReader(max_frame=1 << 26)
    for start in range(0, len(stream), 300_007):
        reader.feed(stream[start : start + 300_007])
    frames = []
    while reader.frames:
        frames.append(decode(reader.pop()))
    assert frames == [[{"op": "big", "data": data}], [{"op": "after"}]]


def test_reading_straight_into_the_room_fills_the_frame() -> None:
    data = os.urandom(1 << 16) * 40
    stream = encode([{"op": "big", "data": data}])
    reader = FrameReader(max_frame=1 << 26)
    reader.feed(stream[:1000])
    position = 1000
    while reader.large is not None:
        room = reader.large_room()
        count = min(len(room), 777_777, len(stream) - position)
        room[:count] = stream[position : position + count]
        position += count
        reader.large_written(count)
    assert decode(reader.pop()) == [{"op": "big", "data": data}]


def _huge_pages_on() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as setting:
            return "[never]" not in setting.read()
    except OSError:
        return False


def _mapping_of(buffer: FrameBuffer, offset: int = 0) -> dict[str, str]:
    """The fields /proc/self/smaps gives for the mapping holding byte ``offset`` of
    ``buffer``."""
    address = pages._address_of(buffer.map) + offset
    fields: dict[str, str] = {}
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                start, end = (int(part, 16) for part in head[0].split("-"))
                inside = start <= address < end
                if inside:
                    fields["name"] = head[5] if len(head) > 5 else ""
            elif inside and len(head) >= 2:
                fields[head[0].rstrip(":")] = head[1]
    return fields


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc only")
@pytest.mark.usefixtures("between_reads")
def test_frames_are_received_into_private_memory_in_huge_pages_where_the_system_has_them() -> None:
    # A shared anonymous map (mmap.mmap(-1, n)'s default) lives in shared memory: it gets
    # no huge pages, and its pages were measured at 4x the kernel time to make.
    length = 64 << 20
    buffer = FrameBuffer(length)
    filled = 0
    while filled < length:
        filled = buffer.room(filled)
    buffer.map[:] = b"\x01" * length
    mapping = _mapping_of(buffer)
    assert mapping["name"] == "", mapping  # not "/dev/zero (deleted)": a shared map
    # (Its pages may span several mappings: the ones turned to small pages are others.)
    assert int(mapping["Anonymous"]) > 0, mapping
    if _huge_pages_on():  # (how many it gets depends on the free huge pages it finds)
        assert mapping["THPeligible"] == "1", mapping


def test_huge_pages_are_asked_for_while_they_come_faster_than_small_ones() -> None:
    window = 32 << 20
    assert pages.huge_pages_pay(window, window / 7e9)  # hot huge pages
    assert not pages.huge_pages_pay(window, window / 0.55e9)  # taken back by a VM's host
    assert pages.huge_pages_pay(pages.HUGE_PAGE, pages.HUGE_PAGE / 2e9)  # a hot probe
    # A frame's thread judges by its CPU time, where small pages come at 2.1-3.5 GB/s:
    # huge pages slower than that cost more CPU time.
    on_thread = pages.SLOW_HUGE_PAGES_ON_THREAD
    assert not pages.huge_pages_pay(window, window / 1.9e9, on_thread)
    assert pages.huge_pages_pay(pages.HUGE_PAGE, pages.HUGE_PAGE / 2.2e9, on_thread)
    assert not pages.huge_pages_pay(pages.HUGE_PAGE, pages.HUGE_PAGE / 0.5e9)
    assert pages.huge_pages_pay(MIN_WINDOW, 1.0)  # less than a huge page: nothing to judge


@pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps") or not _huge_pages_on(), reason="Linux's THP only"
)
@pytest.mark.usefixtures("between_reads")
@pytest.mark.parametrize("pay", [True, False])
def test_slow_huge_pages_turn_the_rest_of_the_frame_to_small_pages(
    pay: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "huge_pages_pay", lambda *judged: pay)
    length = 96 << 20
    buffer = FrameBuffer(length)
    assert buffer.thread is None
    data = os.urandom(1 << 20)
    filled = 0
    while filled < length:
        ready = buffer.room(filled)
        while filled < ready:
            step = min(len(data), ready - filled)
            buffer.map[filled : filled + step] = data[:step]
            filled += step
    assert buffer.huge is pay
    # Turned to small pages after the first window of huge pages (1 MiB, 1 MiB, 2 MiB...)
    # and past the probe of one huge page at the start of each window after it.
    assert _mapping_of(buffer, length - 1)["THPeligible"] == ("1" if pay else "0")
    assert bytes(buffer.map[length - len(data) : length]) == data[: len(data)]


def test_a_thread_makes_a_large_frames_pages_ahead_of_the_bytes_and_ends_with_them() -> None:
    length = 64 << 20
    buffer = FrameBuffer(length)
    assert buffer.thread is not None and buffer.thread.name == "apportion-pages"
    # Before any byte arrived, and without being asked again, the first step is made.
    _wait_for(lambda: buffer.ready >= pages.STEP, "the first step of pages")
    data = os.urandom(1 << 20)
    _write_into_made_pages(buffer, data)
    assert buffer.ready == length
    buffer.thread.join(timeout=30)
    assert not buffer.thread.is_alive()
    assert bytes(buffer.map[length - len(data) :]) == data
    if os.path.exists("/proc/self/smaps"):
        mapping = _mapping_of(buffer)
        assert mapping["name"] == "" and int(mapping["Anonymous"]) > 0, mapping


@pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps") or not _huge_pages_on(), reason="Linux's THP only"
)
@pytest.mark.parametrize("pay", [True, False])
def test_a_frames_thread_makes_huge_pages_while_they_come_fast_else_small_ones(
    pay: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Huge pages cost the receiver a fault and a zeroing per 2 MiB instead of 512 of each
    # (40-45 ms of CPU time less per 100 MB); made slowly (memory a virtual machine's
    # host took back), small ones come faster.
    monkeypatch.setattr(pages, "huge_pages_pay", lambda *judged: pay)
    length = 3 * pages.THREAD_PROBE_EVERY // 2
    buffer = FrameBuffer(length)
    assert buffer.thread is not None
    _write_into_made_pages(buffer, os.urandom(1 << 20))
    buffer.thread.join(timeout=30)
    assert buffer.huge is pay
    # Past the probe that starts the frame (a whole first step of slow huge pages cost
    # several times more), and past the probe at the start of the second stretch, the
    # pages are small ones once huge ones came slowly.
    for offset in (pages.HUGE_PAGE + 1, pages.STEP + 1, length - 1):
        assert _mapping_of(buffer, offset)["THPeligible"] == ("1" if pay else "0"), offset


def test_a_frames_thread_judges_its_pages_by_the_cpu_time_it_spent_on_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Judged by the wall clock, pages made while other processes held the CPU looked
    # slow, and turned the rest of the frame to small pages, which cost more CPU time.
    # (Both clocks are played: a second of wall clock, a microsecond of CPU time, per call.)
    ticks = {"wall": 0.0, "cpu": 0.0}

    def wall() -> float:
        ticks["wall"] += 1.0
        return ticks["wall"]

    def cpu() -> float:
        ticks["cpu"] += 1e-6
        return ticks["cpu"]

    monkeypatch.setattr(time, "perf_counter", wall)
    monkeypatch.setattr(time, "thread_time", cpu)
    buffer = FrameBuffer(pages.THREAD_FROM)
    assert buffer.thread is not None
    _write_into_made_pages(buffer, os.urandom(1 << 20))
    buffer.thread.join(timeout=30)
    assert buffer.huge, "pages made in little CPU time turned the frame to small pages"


def test_a_stopped_or_dropped_frame_ends_its_thread() -> None:
    stopped = FrameBuffer(256 << 20)
    assert stopped.thread is not None
    stopped.stop()
    stopped.thread.join(timeout=30)
    assert not stopped.thread.is_alive()
    assert stopped.ready < stopped.length  # (it made no more than a step or two)

    dropped = FrameBuffer(256 << 20)
    thread = dropped.thread
    assert thread is not None
    _wait_for(lambda frame=dropped: frame.ready >= pages.STEP, "the first step of pages")
    del dropped
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_no_memory_for_the_pages_fails_the_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    # (The system cannot be brought to refuse memory safely here: its answer is played.)
    def no_memory(address: int, size: int, advice: int) -> int:
        ctypes.set_errno(errno.ENOMEM)
        return -1

    monkeypatch.setattr(pages, "_libc_madvise", lambda: no_memory)
    monkeypatch.setattr(pages, "THREAD_FROM", 4 << 20)
    data = os.urandom(1 << 16) * 200  # 13 MB: its frame has a thread
    stream = encode([{"op": "big", "data": data}])
    reader = FrameReader(max_frame=1 << 26)
    reader.feed(stream[:HEADER_BYTES])  # (no byte of the frame yet: no page asked for)
    large = reader.large
    assert large is not None and large.thread is not None
    large.thread.join(timeout=30)
    with pytest.raises(ProtocolError, match="no memory for the pages of a frame"):
        reader.large_room()
    assert reader.large is None  # dropped: never touched again


def test_a_frame_takes_the_map_of_one_whose_values_are_gone_pages_made() -> None:
    recycler = MapRecycler(budget=8 << 20)
    first = recycler.frame_buffer(1_000_000)
    first.room(0)  # (its pages made, as when its bytes arrived)
    first_map = id(first.map)
    value = memoryview(first.map)[:1_000_000]  # a value received into it, still alive
    del first
    busy = recycler.frame_buffer(1_000_000)
    assert id(busy.map) != first_map and recycler.reused == 0
    del busy
    too_small = recycler.frame_buffer(700_000)  # more than a quarter smaller: a map of its own
    assert id(too_small.map) != first_map
    del value
    again = recycler.frame_buffer(900_000)
    assert id(again.map) == first_map and recycler.reused == 1
    assert again.room(0) == again.length == 900_000  # nothing to make, nothing past the frame


def test_the_maps_watched_for_reuse_stay_within_their_budget() -> None:
    recycler = MapRecycler(budget=3 << 20)
    alive = [memoryview(recycler.frame_buffer(1 << 20).map) for _ in range(5)]
    assert recycler.watched_bytes() == 3 << 20  # the others go with their values
    del alive
    for _ in range(5):  # free ones are taken again or pushed out: never more than the budget
        recycler.frame_buffer(1 << 20)
        recycler.frame_buffer(2 << 20)
        assert recycler.watched_bytes() <= 3 << 20
    assert recycler.frame_buffer(pages.THREAD_FROM).map is not None  # never watched
    assert recycler.watched_bytes() <= 3 << 20


def test_a_frame_received_into_a_larger_map_taken_again_is_exactly_its_own_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reader_module, "RECYCLER", MapRecycler())
    sizes = [1_000_000, 950_000, 1_000_000]
    for size in sizes:
        data = os.urandom(size)
        reader = FrameReader(max_frame=1 << 26)
        stream = encode([{"op": "big", "data": data}]) + encode([{"op": "after"}])
        reader.feed(stream[:1000])  # the frame's start: the rest goes into its own map
        reader.feed(stream[1000:])
        assert decode(reader.pop()) == [{"op": "big", "data": data}]
        assert decode(reader.pop()) == [{"op": "after"}]
    assert reader_module.RECYCLER.reused == 2
