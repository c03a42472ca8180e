"""How this installation was built: whether the scheduler runs compiled (see setup.py)."""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from types import ModuleType

# The modules a build with APPORTION_COMPILE=1 compiles (setup.py reads this list): the
# scheduler's pure state machine, and its event log (per-run work while a dashboard is open).
COMPILED_MODULES = [
    "apportion.resources",
    "apportion.scheduler.adoption",
    "apportion.scheduler.events",
    "apportion.scheduler.model",
    "apportion.scheduler.placement",
    "apportion.scheduler.prefetch",
    "apportion.scheduler.recovery",
    "apportion.scheduler.retirement",
    "apportion.scheduler.small_results",
    "apportion.scheduler.state",
]


def is_native(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a native extension (a mypyc-compiled .so)."""
    return (module.__file__ or "").endswith(tuple(EXTENSION_SUFFIXES))


def scheduler_compiled() -> bool:
    """Whether the scheduler's state machine is the mypyc-compiled build: a wheel built
    with ``APPORTION_COMPILE=1``; False for the pure-Python modules (editable installs)."""
    from apportion.scheduler import state

    return is_native(state)
