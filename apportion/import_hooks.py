"""Run code once a module is imported, whenever that happens (after a client exists, say),
without importing it now: Dask's dataframes and joblib are large, optional, and imported
by the user's program when it needs them."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then()`` once module ``name`` has been executed by its ordinary loader."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module
        then = self.then

        def exec_module(module: Any) -> None:
            execute(module)
            then()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_import(name: str, then: Callable[[], None]) -> None:
    """Call ``then()`` now if module ``name`` is imported, else right after it is."""
    if name in sys.modules:
        then()
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))
