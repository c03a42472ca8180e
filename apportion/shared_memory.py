"""Large results shared through memory, not TCP, between the processes of one host
(workers, and a client gathering from them).

When a task's result pickles to ``SHARED_MIN_BYTES`` or more of out-of-band buffers
(numpy arrays and the like), and a process of this host has asked its worker for data
before (else nobody here would map it), the worker writes those buffers once into an anonymous
shared-memory file (``memfd_create``, sealed against any change), and holds the value
rebuilt as a view of that file: the private copy the task made is freed, so the result
still lives once in memory. A peer on the same host asking for the result gets a
description of the file instead of its bytes (``describe``), opens it through
``/proc/<pid>/fd/<fd>`` of the holder and maps it (``open_described``): no byte crosses
a socket, and the peer's array is a view of the same physical pages. A client on the
same host gathers the same way (``get_data``), keeping only the mapping.

Why a memfd and not a file in /dev/shm: its lifetime is the kernel's reference count.
It lives while the holder keeps its descriptor open or anyone maps it, and vanishes
with the last of them, also when a process is SIGKILLed: there is never a name to
leak or to sweep. The holder's descriptor is closed when its mapping is collected
(``weakref.finalize``), i.e. when the value is no longer held by anyone: released
means freed. A peer keeps its own mapping (and descriptor, so that it can share its
replica in turn), so the holder freeing or dying never pulls the data from under it.

Nothing can change the data once written: the file is sealed (no write, grow or
shrink), and every mapping is private (copy-on-write), so a task writing to its
input changes its own copy only, as after a transfer over TCP.

Same host means same kernel (boot id) and same process-id namespace (``host_identity``):
then ``/proc/<pid>`` of the holder is the holder. Pods of one Kubernetes node have
different pid namespaces and fall back to TCP; so does anything that fails on the way
(no memfd, /proc not readable, memory exhausted while writing the file: the private
value stays held, nothing is lost).
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import resource
import secrets
import sys
import threading
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from apportion.serialize import Payload, Pickled, aligned

logger = logging.getLogger("apportion.shared_memory")

# Below this, a result's buffers travel over TCP: writing them to a file of their own
# and mapping it on the other side costs more than sending them.
SHARED_MIN_BYTES = 1 << 20
# The file starts with a random token, checked by whoever maps it: a descriptor number
# reused for another file between the description and the opening is never taken for it.
_TOKEN_BYTES = 16
_SEALS = (
    getattr(fcntl, "F_SEAL_SEAL", 1)
    | getattr(fcntl, "F_SEAL_SHRINK", 2)
    | getattr(fcntl, "F_SEAL_GROW", 4)
    | getattr(fcntl, "F_SEAL_WRITE", 8)
)
_WRITE_CHUNK = 1 << 26
# Python's mmap keeps a descriptor of its own on the file (a duplicate) unless told not
# to (3.13): so before 3.13 a shared result costs its holder two descriptors, a client's
# gathered array one.
_UNTRACKED: dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}

# What moved how, in this process (for tests and for whoever wonders): results written
# to shared memory ("exported"), served to a peer as a description ("served"), mapped
# from a peer ("mapped"), and descriptions that could not be used ("fallbacks").
counters: Counter[str] = Counter()
_counters_lock = threading.Lock()


def count(what: str, n: int = 1) -> None:
    with _counters_lock:
        counters[what] += n


def host_identity() -> str:
    """Which kernel and pid namespace this process lives in: two processes with the same
    identity can open each other's descriptors through /proc. Empty when unknown (then
    nothing is shared)."""
    global _identity
    if _identity is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as boot:
                boot_id = boot.read().strip()
            namespace = os.readlink("/proc/self/ns/pid")
            _identity = f"{boot_id}/{namespace}" if boot_id else ""
        except OSError:
            _identity = ""
    return _identity


_identity: str | None = None
# Turned off for the whole process by ``switch``: the data benchmark calls it in each
# worker (benchmarks/workloads.py, share_memory_here) to time TCP beside shared memory.
_switched_off = False


def switch(on: bool) -> None:
    """Share (or not) from now on, for every worker of this process; what is already in
    shared memory stays there, and goes over TCP while sharing is off."""
    global _switched_off
    _switched_off = not on


def _layout(payload: Pickled) -> tuple[list[tuple[int, int]], int]:
    """Where each buffer goes in the file, and the file's size."""
    spans = []
    offset = aligned(_TOKEN_BYTES)
    for buffer in payload.buffers:
        spans.append((offset, buffer.nbytes))
        offset = aligned(offset + buffer.nbytes)
    return spans, max(offset, _TOKEN_BYTES)


class Segment:
    """A held result's shared-memory file, as a peer needs to find, check and read it.

    Holds the mapping only weakly: the segment lives as long as the value built on it
    (a value's arrays hold views of the mapping, which holds the file).
    """

    __slots__ = ("_closer", "fd", "header", "size", "spans", "token")

    def __init__(
        self,
        fd: int,
        mapping: mmap.mmap,
        token: bytes,
        header: bytes,
        spans: list[tuple[int, int]],
        size: int,
    ) -> None:
        self.fd = fd
        self.token = token
        self.header = header
        self.spans = spans
        self.size = size
        # The descriptor goes when the last view of the mapping does (the value is freed).
        self._closer = weakref.finalize(mapping, os.close, fd)

    @property
    def alive(self) -> bool:
        return self._closer.alive

    def close_descriptor(self) -> None:
        """Keep only the mapping (a reader that never shares it on): the file lives as
        long as the mapping does."""
        self._closer()

    def describe(self) -> list[Any]:
        """What a peer on this host needs to map it (see ``open_described``)."""
        return [os.getpid(), self.fd, self.token, self.size, self.header, self.spans]


def _map(
    fd: int, size: int, token: bytes, header: bytes, spans: list[tuple[int, int]]
) -> tuple[Pickled, Segment]:
    """Map ``fd`` privately (copy-on-write: writable arrays, the file never changes) and
    cut the buffers of ``header``'s pickle out of it."""
    mapping = mmap.mmap(
        fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE, **_UNTRACKED
    )
    segment = Segment(fd, mapping, token, header, spans, size)
    view = memoryview(mapping)
    buffers = [view[offset : offset + length] for offset, length in spans]
    return Pickled(header, buffers), segment


def export(payload: Pickled) -> tuple[Pickled, Segment] | None:
    """Write ``payload``'s buffers into a new sealed shared-memory file; returns the same
    pickle with its buffers as views of that file (load it, and hold the value it gives
    in place of the original), and the segment. None when it cannot be done (no memfd,
    no memory left: ``payload`` is then used as it is)."""
    spans, size = _layout(payload)
    token = secrets.token_bytes(_TOKEN_BYTES)
    try:
        fd = os.memfd_create("apportion-result", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (OSError, AttributeError) as exc:
        _fallback(f"no memfd: {exc!r}")
        return None
    try:
        _write_all(fd, token, 0)
        for (offset, _), buffer in zip(spans, payload.buffers, strict=True):
            _write_all(fd, buffer, offset)
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        result = _map(fd, size, token, payload.header, spans)
    except (OSError, ValueError) as exc:
        os.close(fd)
        _fallback(f"writing {size:,} bytes to shared memory failed: {exc!r}")
        return None
    count("exported")
    return result


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done : done + _WRITE_CHUNK], offset + done)


def open_described(description: Any) -> tuple[Pickled, Segment] | None:
    """Map a segment a peer on this host described (``Segment.describe``); None when it
    cannot be used (gone meanwhile, not readable from here): ask for the bytes then."""
    try:
        pid, fd, token, size, header, spans = description
        spans = [(int(offset), int(length)) for offset, length in spans]
        own = os.open(f"/proc/{int(pid)}/fd/{int(fd)}", os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError, TypeError) as exc:
        _fallback(f"cannot open a peer's shared result: {exc!r}")
        return None
    try:
        if os.fstat(own).st_size != size or any(o + n > size for o, n in spans):
            raise ValueError("not the size described")
        if os.pread(own, _TOKEN_BYTES, 0) != token:
            raise ValueError("not the file described (its descriptor was reused)")
        result = _map(own, size, token, header, spans)
    except (OSError, ValueError, TypeError) as exc:
        os.close(own)
        _fallback(f"cannot map a peer's shared result: {exc!r}")
        return None
    count("mapped")
    return result


async def get_data(
    request: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]], keys: list[str], host: str
) -> tuple[dict[str, Payload], dict[str, Segment]]:
    """Ask a holder (``request`` sends a message to it and returns its reply) for the
    pickles of ``keys``: mapped from shared memory what it has there when ``host`` (this
    process's ``host_identity``; empty: no sharing) is its host too, the rest (and what
    cannot be mapped after all) as bytes. Returns the pickles by key (absent: not held
    there) and the segments of those mapped."""
    reply = await request(data_request(keys, host))
    payloads, segments, unmapped = read_data_reply(reply)
    if unmapped:
        again = await request(data_request(unmapped, ""))
        payloads.update(again.get("data") or {})
    return payloads, segments


def data_request(keys: list[str], host: str) -> dict[str, Any]:
    """The request of ``get_data`` (``host``: see there)."""
    message: dict[str, Any] = {"op": "get-data", "keys": keys}
    if host:
        message["host"] = host
    return message


def read_data_reply(
    reply: dict[str, Any],
) -> tuple[dict[str, Payload], dict[str, Segment], list[str]]:
    """A holder's answer to ``data_request``: the pickles by key (those it described in
    shared memory mapped), their segments, and the keys it described that could not be
    mapped (to ask for as bytes)."""
    payloads: dict[str, Payload] = dict(reply.get("data") or {})
    segments: dict[str, Segment] = {}
    unmapped = []
    for key, described in (reply.get("shared") or {}).items():
        opened = open_described(described)
        if opened is None:
            unmapped.append(key)
        else:
            payloads[key], segments[key] = opened
    return payloads, segments, unmapped


def _fallback(reason: str) -> None:
    count("fallbacks")
    logger.info("shared memory not used (%s): sending over TCP instead", reason)


class SharedResults:
    """The segments of the results this worker holds, by key (each lives while its value
    does; an entry whose value is gone describes nothing)."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled and bool(host_identity())
        self.host = host_identity() if self._enabled else ""
        # key -> its segment, and the id of the value held on it (a key computed again
        # later holds another value: the old segment no longer describes it).
        self._segments: dict[str, tuple[Segment, int]] = {}
        self._lock = threading.Lock()
        # Whether a process of this host (a peer, a client) asked here for data: until
        # then nobody would map a result, and writing it to shared memory would only cost
        # (a worker alone on its host, as in a Kubernetes pod of its own, never pays).
        self.asked_from_host = False
        if self._enabled:
            _raise_descriptor_limit()

    @property
    def enabled(self) -> bool:
        return self._enabled and not _switched_off

    def wanted(self, payload: Any) -> bool:
        return (
            self.asked_from_host
            and self.enabled
            and isinstance(payload, Pickled)
            and payload.nbytes - len(payload.header) >= SHARED_MIN_BYTES
        )

    def hold(self, key: str, segment: Segment, value: Any) -> None:
        """``key`` is held from now on as ``value``, built on ``segment``."""
        with self._lock:
            self._segments[key] = (segment, id(value))
            if len(self._segments) % 64 == 0:  # drop the entries of freed values now and then
                self._segments = {k: e for k, e in self._segments.items() if e[0].alive}

    def asked_by(self, host: Any) -> bool:
        """Whether a request from ``host`` comes from this host (and sharing is on);
        from the first one on, large results go to shared memory."""
        if host != self.host or not self.enabled:
            return False
        self.asked_from_host = True
        return True

    def describe(self, key: str, value: Any) -> list[Any] | None:
        """How a peer on this host maps ``key`` held as ``value``; None if it is not in
        shared memory."""
        with self._lock:
            entry = self._segments.get(key)
        if entry is None or entry[1] != id(value) or not entry[0].alive:
            return None
        return entry[0].describe()


def _raise_descriptor_limit() -> None:
    """Each shared result held costs descriptors: allow as many as the system lets us."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            pass  # the usual limit then: a result that finds none left goes over TCP
