"""Bytes a piece of work leaves allocated, measured with tracemalloc."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from typing import Any


def retained_bytes(action: Callable[[], Any]) -> int:
    """Memory still allocated after ``action`` ran (garbage collected before and after)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    action()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before
