"""Make ``benchmarks`` importable in worker processes without putting the repository root
on ``PYTHONPATH`` (the root holds directories, such as ``operator/``, that would shadow
standard-library modules in every child interpreter)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


@functools.cache
def import_dir() -> str:
    """A private directory holding only a ``benchmarks`` symlink to this package."""
    where = Path(tempfile.mkdtemp(prefix="apportion-bench-path-"))
    link = where / "benchmarks"
    link.symlink_to(PACKAGE, target_is_directory=True)
    atexit.register(_remove, link)
    return str(where)


def _remove(link: Path) -> None:
    with contextlib.suppress(OSError):
        link.unlink()  # the symlink only, never its target
        link.parent.rmdir()


def child_pythonpath(existing: str | None = None) -> str:
    """``PYTHONPATH`` for child processes: the import directory first, then ``existing``."""
    return os.pathsep.join(filter(None, [import_dir(), existing]))
