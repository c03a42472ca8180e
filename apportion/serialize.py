"""Turning functions, arguments, results and errors into bytes and back.

Functions travel with cloudpickle. Arguments are pickled with futures replaced
by *persistent ids* (their keys): the client learns the dependencies of a task
for free, wherever the futures hide (lists, dicts, objects), and the worker
substitutes each key by the dependency's value while unpickling.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import traceback
from collections.abc import Callable
from typing import Any

import cloudpickle

from apportion.errors import RemoteTraceback

_DEP_TAG = "apportion-dep"
_FUNCTION_CACHE_SIZE = 4096


class SerializationError(TypeError):
    """A function, argument or result could not be pickled."""


class _DependencyIds:
    """Pickler mix-in: futures become persistent ids (their keys), collected as dependencies."""

    def __init__(self, file: io.BytesIO, dependency_type: type[Any]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[call-arg]
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
    def __init__(self, file: io.BytesIO, resolve: Callable[[str], Any]) -> None:
        super().__init__(file)
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


def dumps_args(args: tuple, kwargs: dict, dependency_type: type) -> tuple[bytes, list[str]]:
    """Pickle ``(args, kwargs)``; returns the bytes and the keys of futures inside."""
    # Fast path: arguments of plain types need neither cloudpickle nor its Pickler set-up.
    kind = _plain_kind(args, dependency_type)
    if kind and kwargs:
        kw_kind = _plain_kind(kwargs.values(), dependency_type)
        kind = max(kind, kw_kind) if kw_kind else 0
    if kind == 1:
        return pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL), []
    if kind == 2:
        plain = io.BytesIO()
        plain_pickler = _PlainArgsPickler(plain, dependency_type)
        plain_pickler.dump((args, kwargs))
        return plain.getvalue(), list(plain_pickler.dependencies)
    buffer = io.BytesIO()
    pickler = _ArgsPickler(buffer, dependency_type)
    try:
        pickler.dump((args, kwargs))
    except Exception as exc:
        raise SerializationError(f"cannot serialize task arguments: {exc}") from exc
    return buffer.getvalue(), list(pickler.dependencies)


def loads_args(data: bytes, resolve: Callable[[str], Any]) -> tuple[tuple, dict]:
    return _ArgsUnpickler(io.BytesIO(data), resolve).load()


def dumps_value(value: Any) -> bytes:
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        try:
            return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SerializationError(
                f"cannot serialize value of type {type(value).__name__}: {exc}"
            ) from exc


def loads_value(data: bytes) -> Any:
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


def tokenize(*parts: bytes) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part)
    return digest.hexdigest()
