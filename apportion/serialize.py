"""Turning functions, arguments, results and errors into bytes and back.

Functions travel with cloudpickle. Arguments are pickled with futures replaced
by *persistent ids* (their keys): the client learns the dependencies of a task
for free, wherever the futures hide (lists, dicts, objects), and the worker
substitutes each key by the dependency's value while unpickling.

Values and arguments holding large buffers (numpy arrays, bytearrays, PickleBuffer)
are pickled with protocol 5 *out of band*: the pickle keeps only a small header, and the
buffers themselves travel as they are (see ``Pickled`` and the frames of
``apportion.protocol.frames``), never copied into one bytes object.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import traceback
from collections.abc import Callable
from typing import Any

import cloudpickle
import xxhash

from apportion.errors import RemoteTraceback

_DEP_TAG = "apportion-dep"
_FUNCTION_CACHE_SIZE = 4096
# Buffers smaller than this stay inside the pickle: a frame of their own costs more than
# copying them.
OUT_OF_BAND_MIN_BYTES = 64 * 1024
# Where out-of-band buffers are laid out together (a frame, a shared-memory file), each
# starts at a multiple of this: a cache line, enough for every numpy dtype and for SIMD
# loads (numpy takes an array on a misaligned buffer as "unaligned" and copies it through
# a small buffer in every operation).
BUFFER_ALIGNMENT = 64


def aligned(offset: int) -> int:
    """``offset`` rounded up to where the next out-of-band buffer may start."""
    return -(-offset // BUFFER_ALIGNMENT) * BUFFER_ALIGNMENT


class Pickled:
    """A pickle whose large buffers are kept apart (protocol 5, out of band): ``header``
    is the pickle stream, ``buffers`` the contiguous byte views it refers to, in order.

    Made by ``dumps_value``/``dumps_args`` when a value holds large buffers (the views
    then point into the value itself: nothing is copied), and by the wire protocol on
    receipt (the views then point into the received frame). ``len()`` is the whole size.
    """

    __slots__ = ("buffers", "header", "nbytes")

    def __init__(self, header: bytes, buffers: list[memoryview]) -> None:
        self.header = header
        self.buffers = buffers
        self.nbytes = len(header) + sum(b.nbytes for b in buffers)

    def __len__(self) -> int:
        return self.nbytes

    def parts(self) -> list[bytes | memoryview]:
        return [self.header, *self.buffers]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Pickled):
            return NotImplemented
        return self.header == other.header and self.buffers == other.buffers

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Pickled {self.nbytes} bytes, {len(self.buffers)} out-of-band buffers>"


# What a pickled function, argument tuple or value is: plain bytes, or a Pickled.
Payload = bytes | Pickled


class _OutOfBand:
    """A pickler's ``buffer_callback``: keeps large contiguous buffers apart."""

    __slots__ = ("buffers",)

    def __init__(self) -> None:
        self.buffers: list[memoryview] = []

    def __call__(self, buffer: pickle.PickleBuffer) -> bool:
        try:
            view = buffer.raw()
        except BufferError:  # not contiguous: in band
            return True
        if view.nbytes < OUT_OF_BAND_MIN_BYTES:
            return True
        self.buffers.append(view)
        return False

    def result(self, header: bytes) -> Payload:
        return Pickled(header, self.buffers) if self.buffers else header


def _writable_buffers(buffers: list[memoryview]) -> list[memoryview]:
    """Read-only views (a small frame cut from what the socket delivered) are copied, so
    that arrays rebuilt from them can be written to, as after an in-band pickle."""
    return [memoryview(bytearray(b)) if b.readonly else b for b in buffers]


class SerializationError(TypeError):
    """A function, argument or result could not be pickled."""


class _DependencyIds:
    """Pickler mix-in: futures become persistent ids (their keys), collected as dependencies."""

    def __init__(
        self, file: io.BytesIO, dependency_type: type[Any], out_of_band: _OutOfBand | None
    ) -> None:
        super().__init__(  # type: ignore[call-arg]
            file, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=out_of_band
        )
        self.dependency_type = dependency_type
        self.dependencies: dict[str, None] = {}

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, self.dependency_type):
            key: str = obj.key
            self.dependencies[key] = None
            return (_DEP_TAG, key)
        return None


class _ArgsPickler(_DependencyIds, cloudpickle.Pickler):
    """cloudpickle, for arguments that may hold functions, classes or __main__ objects."""


class _PlainArgsPickler(_DependencyIds, pickle.Pickler):
    """The C pickler with the same persistent ids, for arguments of plain types only."""


# Types that plain pickle writes exactly as cloudpickle does (by value, no references to
# modules that might exist only here, such as __main__).
_PLAIN_TYPES = frozenset({int, float, complex, str, bytes, bool, type(None)})


def _plain_kind(values: Any, dependency_type: type) -> int:
    """0: not all plain; 1: plain, no futures; 2: plain and futures (one level of nesting)."""
    kind = 1
    for value in values:
        t = type(value)
        if t in _PLAIN_TYPES:
            continue
        if t is dependency_type:
            kind = 2
        elif t is tuple or t is list:
            for item in value:
                ti = type(item)
                if ti is dependency_type:
                    kind = 2
                elif ti not in _PLAIN_TYPES:
                    return 0
        else:
            return 0
    return kind


class _ArgsUnpickler(pickle.Unpickler):
    def __init__(
        self, file: io.BytesIO, resolve: Callable[[str], Any], buffers: list[memoryview]
    ) -> None:
        super().__init__(file, buffers=buffers)
        self.resolve = resolve

    def persistent_load(self, pid: Any) -> Any:
        tag, key = pid
        if tag != _DEP_TAG:
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self.resolve(key)


class FunctionPickleCache:
    """Pickles each function object once (``client.map`` of one function is common)."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[Any, bytes]] = {}

    def dumps(self, func: Callable[..., Any]) -> bytes:
        hit = self._cache.get(id(func))
        if hit is not None and hit[0] is func:
            return hit[1]
        try:
            data = cloudpickle.dumps(func, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SerializationError(f"cannot serialize function {func!r}: {exc}") from exc
        if len(self._cache) >= _FUNCTION_CACHE_SIZE:
            self._cache.clear()
        # Holding the function keeps its id from being reused by another object.
        self._cache[id(func)] = (func, data)
        return data


class FunctionLoadCache:
    """Unpickles each distinct function payload once per worker process."""

    def __init__(self) -> None:
        self._cache: dict[bytes, Any] = {}

    def loads(self, data: bytes) -> Any:
        func = self._cache.get(data)
        if func is None:
            func = pickle.loads(data)
            if len(self._cache) >= _FUNCTION_CACHE_SIZE:
                self._cache.clear()
            self._cache[data] = func
        return func


def dumps_args(args: tuple, kwargs: dict, dependency_type: type) -> tuple[Payload, list[str]]:
    """Pickle ``(args, kwargs)``; returns the pickle and the keys of futures inside."""
    # Fast path: arguments of plain types need neither cloudpickle nor its Pickler set-up.
    kind = _plain_kind(args, dependency_type)
    if kind and kwargs:
        kw_kind = _plain_kind(kwargs.values(), dependency_type)
        kind = max(kind, kw_kind) if kw_kind else 0
    if kind == 1:
        return pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL), []
    if kind == 2:  # plain types and futures: no buffers to keep apart
        plain = io.BytesIO()
        plain_pickler = _PlainArgsPickler(plain, dependency_type, None)
        plain_pickler.dump((args, kwargs))
        return plain.getvalue(), list(plain_pickler.dependencies)
    out_of_band = _OutOfBand()
    buffer = io.BytesIO()
    pickler = _ArgsPickler(buffer, dependency_type, out_of_band)
    try:
        pickler.dump((args, kwargs))
    except Exception as exc:
        raise SerializationError(f"cannot serialize task arguments: {exc}") from exc
    return out_of_band.result(buffer.getvalue()), list(pickler.dependencies)


def loads_args(data: Payload, resolve: Callable[[str], Any]) -> tuple[tuple, dict]:
    if isinstance(data, Pickled):
        buffers = _writable_buffers(data.buffers)
        return _ArgsUnpickler(io.BytesIO(data.header), resolve, buffers).load()
    return _ArgsUnpickler(io.BytesIO(data), resolve, []).load()


def dumps_with_references(value: Any, reference_type: type) -> tuple[bytes, list[str]]:
    """Pickle one value into bytes (buffers in band), each ``reference_type`` object inside
    (a future) written as a reference to its key; returns the pickle and those keys."""
    buffer = io.BytesIO()
    pickler = _ArgsPickler(buffer, reference_type, None)
    try:
        pickler.dump(value)
    except Exception as exc:
        raise SerializationError(
            f"cannot serialize value of type {type(value).__name__}: {exc}"
        ) from exc
    return buffer.getvalue(), list(pickler.dependencies)


def loads_with_references(data: bytes, resolve: Callable[[str], Any]) -> Any:
    """A value of ``dumps_with_references``, each reference replaced by ``resolve(key)``."""
    return _ArgsUnpickler(io.BytesIO(data), resolve, []).load()


def dumps_value(value: Any) -> bytes:
    """Pickle a value into one bytes object (buffers in band: for small values, errors,
    and what is hashed)."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        try:
            return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SerializationError(
                f"cannot serialize value of type {type(value).__name__}: {exc}"
            ) from exc


def dumps_data(value: Any) -> Payload:
    """Pickle a value that is sent on (a result): large buffers out of band, as views of
    the value's own memory."""
    if type(value) in _PLAIN_TYPES:  # holds no buffers (most results of small tasks)
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    out_of_band = _OutOfBand()
    try:
        header = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=out_of_band)
    except Exception:
        out_of_band = _OutOfBand()
        try:
            header = cloudpickle.dumps(
                value, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=out_of_band
            )
        except Exception as exc:
            raise SerializationError(
                f"cannot serialize value of type {type(value).__name__}: {exc}"
            ) from exc
    return out_of_band.result(header)


def loads_value(data: Payload) -> Any:
    if isinstance(data, Pickled):
        return pickle.loads(data.header, buffers=_writable_buffers(data.buffers))
    return pickle.loads(data)


def dumps_exception(exc: BaseException) -> tuple[bytes, str]:
    """Pickle an exception raised by a task, with its traceback text for the client."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        data = dumps_value(exc)
        pickle.loads(data)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        data = dumps_value(RuntimeError(f"{type(exc).__name__}: {exc}"))
    return data, text


def loads_exception(data: bytes, text: str) -> BaseException:
    """Rebuild a task's exception with the remote traceback attached as its cause."""
    try:
        exc = loads_value(data)
    except Exception as problem:
        exc = RuntimeError(f"task failed and its exception could not be loaded ({problem})")
    if isinstance(exc, BaseException):
        exc.__cause__ = RemoteTraceback(text)
        return exc
    return RuntimeError(f"task failed with a non-exception {exc!r}")


def tokenize(*parts: Payload, large: bool = False) -> str:
    """A key's token: a hash of ``parts``. BLAKE2b (128 bits) for the usual small pickles;
    xxh3 (128 bits, as ``content_token``) where the caller says they are ``large``: BLAKE2b
    hashes under 1 GB/s, 1.3 ms of a 1 MB argument's 2.4 ms ``submit`` call, xxh3 at
    memory speed. The choice must follow the arguments alone (``large_pickle``), so that
    the same call gives the same key from ``submit`` and from ``map``."""
    digest = xxhash.xxh3_128() if large else hashlib.blake2b(digest_size=16)
    for part in parts:
        if isinstance(part, Pickled):
            for piece in part.parts():
                digest.update(piece)
        else:
            digest.update(part)
    return digest.hexdigest()


def large_pickle(payload: Payload) -> bool:
    """Whether ``payload`` is hashed as large by ``tokenize`` (its buffers were kept out of
    band from this size on too)."""
    return len(payload) >= OUT_OF_BAND_MIN_BYTES


def content_token(payload: Payload) -> str:
    """A hash of a large pickle's bytes (xxh3, 128 bits): the key of a stored argument,
    at memory speed, for payloads too large for ``tokenize``'s cryptographic hash."""
    digest = xxhash.xxh3_128()
    for piece in payload.parts() if isinstance(payload, Pickled) else [payload]:
        digest.update(piece)
    return digest.hexdigest()
