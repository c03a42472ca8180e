"""Configuration: defaults < YAML files < environment < ``config.set`` (< explicit arguments).

Every key is declared in ``apportion.config_schema`` (type, default, meaning); an unknown
key or a value of the wrong type, from any source, raises ConfigError naming the key, its
source and the closest known key. The configuration is read on first use, so that a bad
environment variable is reported where it matters, not at import.

Keys are dotted paths (``"worker.resources.GPU"``). Environment variables use
``APPORTION_`` and double underscores between levels:
``APPORTION_WORKER__RESOURCES__GPU=2`` sets ``worker.resources.GPU`` to ``2``.
Path segments are case-insensitive except resource names, which keep their case. A few
settings also honour the variable an older release read (``Setting.legacy_env``, e.g.
``APPORTION_CONTACT_HOST``); their own variable wins when both are set.

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

from apportion import config_schema
from apportion.errors import ConfigError

ENV_PREFIX = config_schema.ENV_PREFIX
# LocalCluster hands the spawning process's whole configuration to its children through this.
INHERITED_ENV = "APPORTION_INTERNAL_INHERIT_CONFIG"
_CASE_KEPT_UNDER = ("worker", "resources")

DEFAULTS: dict[str, Any] = config_schema.defaults()

_lock = threading.RLock()
_config: dict[str, Any] = {}
_loaded = False
# get_immutable's values, cleared whenever the configuration changes (under _lock).
_immutable: dict[str, Any] = {}


def _split(key: str) -> list[str]:
    parts = [p for p in key.split(".") if p]
    if not parts:
        raise ValueError(f"empty configuration key {key!r}")
    return _canonical(parts)


def _canonical(parts: list[str]) -> list[str]:
    out: list[str] = []
    for i, part in enumerate(parts):
        keep_case = (tuple(out[:2]) == _CASE_KEPT_UNDER and i == 2) or (
            # a tenant's name, and the resources of its quota
            tuple(out[:2]) == ("scheduler", "tenants")
            and (i == 2 or (i == 4 and out[3] == "quota"))
        )
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
        named = str(path) == environ.get("APPORTION_CONFIG")
        loaded = _read_file(path, yaml, named)
        tree = _canonical_tree(loaded)
        config_schema.check_tree(tree, f"file {path}")
        _merge(out, tree)
    return out


def _read_file(path: Path, yaml: Any, named: bool) -> Mapping[str, Any]:
    """A configuration file's mapping; ConfigError, in one line naming the file, when it
    cannot be read, is not YAML, or holds something else than a mapping."""
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        by = " (named by $APPORTION_CONFIG)" if named else ""
        raise ConfigError(
            f"configuration file {path}{by} cannot be read: {exc.strerror or exc}",
            key="",
            source=f"file {path}",
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(
            f"configuration file {path} is not valid YAML{where}: {problem}",
            key="",
            source=f"file {path}",
        ) from None
    if not isinstance(loaded, Mapping):
        raise ConfigError(
            f"configuration file {path} must hold a mapping (key: value), "
            f"not a {type(loaded).__name__}",
            key="",
            source=f"file {path}",
        )
    return loaded


def _canonical_tree(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = _canonical([*prefix, str(key)])
        name = path[-1]
        out[name] = _canonical_tree(value, tuple(path)) if isinstance(value, Mapping) else value
    return out


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # Older names first, so that a setting's own variable wins when both are set.
    for setting in config_schema.SETTINGS:
        if setting.legacy_env and setting.legacy_env in environ:
            path = _split(setting.key)
            _merge(out, _env_tree(setting.legacy_env, environ[setting.legacy_env], path))
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name == INHERITED_ENV or "__" not in name:
            continue
        path = _canonical([p for p in name[len(ENV_PREFIX) :].split("__") if p])
        _merge(out, _env_tree(name, raw, path))
    return out


def _env_tree(name: str, raw: str, path: list[str]) -> dict[str, Any]:
    setting = config_schema.BY_KEY.get(".".join(path))
    # A string setting takes the text as it is ("123" stays a string).
    value = raw if setting and setting.kind == "string" else _parse_env_value(raw)
    tree = _nest(path, value)
    config_schema.check_tree(tree, f"environment variable {name}")
    return tree


def refresh(environ: Mapping[str, str] | None = None) -> None:
    """Rebuild the configuration from defaults, files, environment and inherited config.

    The inherited configuration (LocalCluster's, for its processes) is the whole of the
    parent's, environment and ``config.set`` included, so it comes last: what the parent
    set wins over the environment in its children too, as it does in the parent.
    """
    global _loaded
    environ = os.environ if environ is None else environ
    fresh = copy.deepcopy(DEFAULTS)
    _merge(fresh, _from_files(environ))
    _merge(fresh, _from_env(environ))
    if environ.get(INHERITED_ENV):
        _merge(fresh, json.loads(environ[INHERITED_ENV]))
    with _lock:
        _config.clear()
        _config.update(fresh)
        _immutable.clear()
        _loaded = True


def _ensure_loaded() -> None:
    if not _loaded:
        with _lock:
            if not _loaded:
                refresh()


def check() -> None:
    """Read the configuration now; raises ConfigError for an unknown key or a bad value."""
    _ensure_loaded()


def get(key: str, default: Any = ...) -> Any:
    _ensure_loaded()
    cursor: Any = _config
    for part in _split(key):
        if not isinstance(cursor, Mapping) or part not in cursor:
            if default is ...:
                raise KeyError(f"no configuration value for {key!r}")
            return default
        cursor = cursor[part]
    return copy.deepcopy(cursor)


def get_immutable(key: str) -> Any:
    """``get(key)`` for a value never changed in place (a number, a string, a flag), at
    the cost of a dict lookup: for hot paths (``Client.submit`` read the frame limit at
    a few microseconds a call, a tenth of its own cost)."""
    try:
        return _immutable[key]
    except KeyError:
        with _lock:  # not filled with a value a concurrent ``set`` has just replaced
            value = _immutable[key] = get(key)
            return value


def snapshot() -> dict[str, Any]:
    _ensure_loaded()
    with _lock:
        return copy.deepcopy(_config)


class set:
    """Set configuration values; undone on exit when used as a context manager."""

    def __init__(self, values: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        updates = dict(values or {})
        updates.update({k.replace("__", "."): v for k, v in kwargs.items()})
        trees = [_nest(_split(key), value) for key, value in updates.items()]
        for tree in trees:
            config_schema.check_tree(tree, "config.set")
        _ensure_loaded()
        with _lock:
            self._saved = copy.deepcopy(_config)
            for tree in trees:
                _merge(_config, tree)
            _immutable.clear()

    def __enter__(self) -> set:
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _config.clear()
            _config.update(self._saved)
            _immutable.clear()
