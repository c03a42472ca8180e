"""A worker's memory limit, as Dask users write it, turned into bytes.

Accepted (``--memory-limit``, ``worker.memory-limit``, ``LocalCluster(memory_limit=...)``):

- ``None``, ``0``, ``"0"``, ``"none"``: no limit;
- an int of bytes (``4_000_000_000``), or a number above 1 (``4e9``);
- a size with a unit: ``"4GB"`` (powers of 1000), ``"4GiB"`` (powers of 1024), ``"512 MiB"``,
  ``"1.5GB"``, ``"4e9"``;
- a fraction of the machine: a number in (0, 1], as a number or a string (``0.5``, ``"0.5"``);
- ``"auto"``: the machine's memory, or its container's (cgroup v1 or v2) limit when lower,
  divided among the worker processes started together (``--nworkers``).

"The machine" is the smaller of physical memory and the cgroup limit: a fraction of a pod
is a fraction of what the pod may use.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "pb": 1000**5,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_NO_LIMIT = frozenset({"", "0", "none", "null", "false"})

# Where a container's memory limit is written: cgroup v2, then v1. A v1 "no limit" is a
# huge number (the largest page-aligned int64), v2 says "max".
CGROUP_LIMIT_FILES: tuple[str, ...] = (
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)


def parse_size(text: str | int | float) -> int:
    """Bytes in ``text``: ``"4GB"`` (1000-based), ``"4GiB"`` (1024-based), ``"4e9"``, ``4096``.

    Raises ValueError naming the value for anything else (a negative size, an unknown unit).
    """
    if isinstance(text, bool):
        raise ValueError(f"a memory size must be bytes or a size such as '4GiB', got {text!r}")
    if isinstance(text, (int, float)):
        number, unit = float(text), ""
    else:
        match = _SIZE.match(text)
        if match is None:
            raise ValueError(
                f"not a memory size: {text!r} (write bytes, or a number and a unit: "
                "'4GB', '4GiB', '512MiB')"
            )
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit not in _UNITS:
            raise ValueError(
                f"unknown unit {match.group(2)!r} in memory size {text!r} (known: B, kB, MB, "
                "GB, TB, KiB, MiB, GiB, TiB)"
            )
    if number < 0:
        raise ValueError(f"a memory size cannot be negative, got {text!r}")
    return int(number * _UNITS[unit])


def parse_memory_limit(
    value: str | int | float | None,
    nworkers: int = 1,
    total: int | None = None,
) -> int | None:
    """The memory limit of one worker in bytes, or None for no limit.

    ``nworkers``: the worker processes sharing the machine (``"auto"`` divides among them);
    ``total``: the machine's memory (default: ``available_memory()``), for ``"auto"`` and
    fractions. Raises ValueError, naming the value and what is accepted, for anything else.
    """
    if nworkers < 1:
        raise ValueError(f"nworkers must be at least 1, got {nworkers}")
    if value is None or value is False:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _NO_LIMIT:
            return None
        if text == "auto":
            return max(1, (total or available_memory()) // nworkers)
        try:
            number: float | None = float(text)
        except ValueError:
            number = None
        if number is None:
            return parse_size(value) or None
        value = number
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"memory limit must be bytes, a size ('4GiB', '4GB'), a fraction of the machine "
            f"(0.5) or 'auto', got {value!r}"
        )
    if value < 0:
        raise ValueError(f"memory limit cannot be negative, got {value!r}")
    if value == 0:
        return None
    if isinstance(value, float) and value <= 1:
        # A fraction of the machine (Dask's convention): 1.0 is all of it, 1 is one byte.
        return max(1, int((total or available_memory()) * value))
    return int(value)


def available_memory(cgroup_files: tuple[str, ...] = CGROUP_LIMIT_FILES) -> int:
    """The memory this process may use: physical memory, or its cgroup's limit when lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = cgroup_limit(cgroup_files)
    return min(physical, limit) if limit else physical


def cgroup_limit(files: tuple[str, ...] = CGROUP_LIMIT_FILES) -> int | None:
    """The container's memory limit (the first of ``files`` that says one), None if none."""
    for name in files:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None  # v2: no limit
        try:
            limit = int(text)
        except ValueError:
            continue
        # v1 says "no limit" with a number near 2**63: anything above 2**60 is none.
        return limit if 0 < limit < 2**60 else None
    return None


def format_size(nbytes: int | None) -> str:
    """``nbytes`` for people: ``'1.00 GiB'``; ``'no limit'`` for None."""
    if nbytes is None:
        return "no limit"
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
