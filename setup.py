"""The optional mypyc build of the scheduler's pure state machine; pyproject.toml declares
everything else.

With ``APPORTION_COMPILE=1`` a wheel build (``pip install .``, ``python -m build``) compiles
the modules in COMPILED with mypyc, the way black and mypy ship their wheels. The .py files
stay in the wheel and remain the source of truth; Python imports the compiled module in
their place. Without the variable the build is pure Python, and mypy is not needed::

    pip install "setuptools>=77" wheel mypy
    APPORTION_COMPILE=1 pip install --no-build-isolation .

(``APPORTION_COMPILE=1 pip install .`` works too: the isolated build environment then gets
mypy as well.) Editable installs never compile: build_ext would put the .so files into the
source tree, where they would shadow every later edit of the .py files.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from setuptools import setup


def _compiled_modules() -> list[str]:
    """apportion/build_info.py's COMPILED_MODULES, read without importing apportion (whose
    dependencies a build environment does not have)."""
    spec = importlib.util.spec_from_file_location("build_info", "apportion/build_info.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.COMPILED_MODULES)


COMPILED = _compiled_modules()
# Where their packages' sources live (as [tool.setuptools.package-dir] in pyproject.toml).
PACKAGE_DIRS = {"apportion": "apportion", "apportion/scheduler": "scheduler"}
BUILD = Path("build").resolve()
# mypyc names a module after its path, so it compiles copies laid out as they are imported.
STAGE = BUILD / "mypyc-src"


def compiling() -> bool:
    """APPORTION_COMPILE=1 and a wheel is being built (setuptools' build_wheel runs
    ``setup.py bdist_wheel``; an editable install runs ``editable_wheel`` instead)."""
    if os.environ.get("APPORTION_COMPILE") != "1":
        return False
    if "bdist_wheel" in sys.argv:
        return True
    if "editable_wheel" in sys.argv or "develop" in sys.argv:
        print("APPORTION_COMPILE=1 ignored: editable installs stay pure Python", file=sys.stderr)
    return False


def stage() -> list[str]:
    """Copy the packages to STAGE as they are imported; return the compiled modules' paths
    relative to STAGE."""
    shutil.rmtree(STAGE, ignore_errors=True)
    for package, source in PACKAGE_DIRS.items():
        shutil.copytree(source, STAGE / package, ignore=shutil.ignore_patterns("__pycache__"))
    return [str(Path(*module.split(".")).with_suffix(".py")) for module in COMPILED]


def extensions() -> list[Any]:
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit(
            "APPORTION_COMPILE=1 needs mypy at build time: pip install mypy, then "
            "APPORTION_COMPILE=1 pip install --no-build-isolation ."
        )
    # A .so that an earlier build left in build/lib.* would land in this wheel too.
    for old in BUILD.glob("lib.*"):
        shutil.rmtree(old)
    copies = stage()
    options = [
        # Only the compiled modules must type-check; mypy reads the others for their types.
        "--follow-imports=silent",
        "--cache-dir",
        str(BUILD / "mypy-cache"),  # not .mypy_cache/ in the source tree
    ]
    # Inside STAGE mypy sees the staged copies only, not the source tree (where scheduler/
    # is not apportion/scheduler/), and compiled tracebacks name apportion/scheduler/state.py.
    here = os.getcwd()
    os.chdir(STAGE)
    try:
        return mypycify([*options, *copies], target_dir=str(BUILD))
    finally:
        os.chdir(here)


if os.environ.get("APPORTION_COMPILE") == "1":
    setup(
        # setuptools' get_requires_for_build_wheel hook reports setup_requires, so an
        # isolated build (pip install . without --no-build-isolation) installs mypy too.
        setup_requires=["mypy"],
        ext_modules=extensions() if compiling() else [],
    )
else:
    setup()
