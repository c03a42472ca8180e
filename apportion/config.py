"""Configuration: defaults < YAML files < environment < ``config.set`` (< explicit arguments).

Keys are dotted paths (``"worker.resources.GPU"``). Environment variables use
``APPORTION_`` and double underscores between levels:
``APPORTION_WORKER__RESOURCES__GPU=2`` sets ``worker.resources.GPU`` to ``2``.
Path segments are case-insensitive except resource names, which keep their case.

``set`` works as a plain call and as a context manager that restores on exit::

    apportion.config.set({"worker.resources.GPU": 2})
    with apportion.config.set({"scheduler.no-worker-timeout": 5}):
        ...
"""

from __future__ import annotations

import ast
import copy
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV_PREFIX = "APPORTION_"
# LocalCluster hands the spawning process's whole configuration to its children through this.
INHERITED_ENV = "APPORTION_INTERNAL_INHERIT_CONFIG"
_CASE_KEPT_UNDER = ("worker", "resources")

DEFAULTS: dict[str, Any] = {
    "scheduler": {
        # Seconds a task may wait for a worker that could ever run it; None waits forever.
        "no-worker-timeout": None,
        # Tasks handed to a worker beyond its thread count, to hide the round trip.
        "worker-prefetch": 1,
        # A task that was running on this many dead workers is marked erred.
        "allowed-failures": 3,
        "worker-timeout": 30.0,
        # Seconds a retire request waits for results to be copied off the retiring workers;
        # workers not done by then stay in service.
        "retire-timeout": 30.0,
        "http-port": None,
        # Check resource accounting after every batch of messages (slow; for tests).
        "validate": False,
    },
    "worker": {
        "resources": {},
        "nthreads": None,
        "heartbeat-interval": 1.0,
        # How long a worker keeps trying to reach a scheduler that is not (yet) there.
        "connect-timeout": 300.0,
        # Results up to this many bytes travel with the completion message.
        "inline-result-bytes": 64 * 1024,
    },
    "client": {
        # Connect to the workers holding results, which then tell this client of results
        # it waits for themselves: one hop fewer than through the scheduler.
        "direct-results": True,
        # Print what tasks print (stdout, stderr, warnings) here, prefixed with the worker.
        "forward-output": True,
    },
    "comm": {
        "max-frame-bytes": 1 << 30,
        "connect-timeout": 10.0,
        # "uvloop" (where installed; faster I/O and wake-ups) or "asyncio".
        "event-loop": "uvloop",
    },
}

_lock = threading.RLock()
_config: dict[str, Any] = {}


def _split(key: str) -> list[str]:
    parts = [p for p in key.split(".") if p]
    if not parts:
        raise ValueError(f"empty configuration key {key!r}")
    return _canonical(parts)


def _canonical(parts: list[str]) -> list[str]:
    out: list[str] = []
    for i, part in enumerate(parts):
        keep_case = tuple(out[:2]) == _CASE_KEPT_UNDER and i == 2
        out.append(part if keep_case else part.lower().replace("_", "-"))
    return out


def _merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(dict(value)) if isinstance(value, Mapping) else value


def _nest(path: list[str], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cursor = out
    for part in path[:-1]:
        cursor = cursor.setdefault(part, {})
    cursor[path[-1]] = value
    return out


def _parse_env_value(raw: str) -> Any:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        lowered = raw.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        if lowered in ("none", "null"):
            return None
        return raw


def _from_files(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    paths: list[Path] = []
    home = Path(environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "apportion"
    if home.is_dir():
        paths += sorted(home.glob("*.yaml")) + sorted(home.glob("*.yml"))
    if environ.get("APPORTION_CONFIG"):
        paths.append(Path(environ["APPORTION_CONFIG"]))
    if paths:
        import yaml  # here, not at the top: it adds ~30 ms to every process's start

    for path in paths:
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, Mapping):
            raise ValueError(f"configuration file {path} must hold a mapping, not {loaded!r}")
        _merge(out, _canonical_tree(loaded))
    return out


def _canonical_tree(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = _canonical([*prefix, str(key)])
        name = path[-1]
        out[name] = _canonical_tree(value, tuple(path)) if isinstance(value, Mapping) else value
    return out


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name == INHERITED_ENV or "__" not in name:
            continue
        parts = [p for p in name[len(ENV_PREFIX) :].split("__") if p]
        _merge(out, _nest(_canonical(parts), _parse_env_value(raw)))
    return out


def refresh(environ: Mapping[str, str] | None = None) -> None:
    """Rebuild the configuration from defaults, files, inherited config and environment."""
    environ = os.environ if environ is None else environ
    fresh = copy.deepcopy(DEFAULTS)
    _merge(fresh, _from_files(environ))
    if environ.get(INHERITED_ENV):
        _merge(fresh, json.loads(environ[INHERITED_ENV]))
    _merge(fresh, _from_env(environ))
    with _lock:
        _config.clear()
        _config.update(fresh)


def get(key: str, default: Any = ...) -> Any:
    cursor: Any = _config
    for part in _split(key):
        if not isinstance(cursor, Mapping) or part not in cursor:
            if default is ...:
                raise KeyError(f"no configuration value for {key!r}")
            return default
        cursor = cursor[part]
    return copy.deepcopy(cursor)


def snapshot() -> dict[str, Any]:
    with _lock:
        return copy.deepcopy(_config)


class set:
    """Set configuration values; undone on exit when used as a context manager."""

    def __init__(self, values: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        updates = dict(values or {})
        updates.update({k.replace("__", "."): v for k, v in kwargs.items()})
        with _lock:
            self._saved = copy.deepcopy(_config)
            for key, value in updates.items():
                _merge(_config, _nest(_split(key), value))

    def __enter__(self) -> set:
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _config.clear()
            _config.update(self._saved)


refresh()
