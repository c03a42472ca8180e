"""What the GPU tests run on workers: small kernels through CuPy, else PyTorch, each on
the CUDA device of the GPU unit its task was granted."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from apportion import get_worker

N = 1 << 20


def library() -> str | None:
    """``"cupy"`` or ``"torch"``, whichever is installed (CuPy first); None for neither."""
    for name in ("cupy", "torch"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


def _units() -> list[int]:
    task = get_worker().task
    assert task is not None
    return list(task.units.get("GPU", []))


def to_device(host: np.ndarray, device: int) -> Any:
    if library() == "cupy":
        import cupy

        with cupy.cuda.Device(device):
            return cupy.asarray(host)
    import torch

    return torch.as_tensor(host, device=f"cuda:{device}")


def device_of(array: Any) -> int:
    if library() == "cupy":
        return int(array.device.id)
    return int(array.device.index)


def to_host(array: Any) -> np.ndarray:
    if library() == "cupy":
        return array.get()  # type: ignore[no-any-return]
    return array.cpu().numpy()  # type: ignore[no-any-return]


def load(i: int) -> np.ndarray:
    return np.arange(N, dtype=np.float64) + i


def process(host: np.ndarray) -> dict[str, Any]:
    """Square and sum on the first granted unit's device; report where and when."""
    units = _units()
    start = time.monotonic()
    total, device = _square_and_sum(host, units[0])
    return {"sum": total, "device": device, "units": units, "start": start, "end": time.monotonic()}


def process_here(host: np.ndarray) -> float:
    """``process``'s kernel on device 0, outside any task (the benchmark's plain loop)."""
    return _square_and_sum(host, 0)[0]


def _square_and_sum(host: np.ndarray, unit: int) -> tuple[float, int]:
    array = to_device(host, unit)
    return float(to_host((array * array).sum())), device_of(array)


def aggregate(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return list(parts)


def make_on_device(value: float) -> Any:
    """A device array on this task's unit, returned as the task's result."""
    return to_device(np.full(N, value), _units()[0])


def make_filled(n: int, value: float) -> Any:
    """A device array of ``n`` float64 values on this task's unit."""
    return to_device(np.full(n, value), _units()[0])


def take_on_device(array: Any) -> dict[str, Any]:
    """Move an array another task made onto this task's unit, and check it."""
    unit = _units()[0]
    here = to_device(to_host(array) if hasattr(array, "device") else array, unit)
    return {"device": device_of(here), "unit": unit, "first": float(to_host(here[:1])[0])}


CHILD = (
    "import os\n"
    "try:\n"
    "    import cupy\n"
    "    count = cupy.cuda.runtime.getDeviceCount()\n"
    "    bus = [cupy.cuda.Device(i).pci_bus_id for i in range(count)]\n"
    "except ImportError:\n"
    "    import torch\n"
    "    count = torch.cuda.device_count()\n"
    "    bus = [str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]\n"
    "print(count, *bus)\n"
)


def identity_of(device: int) -> str:
    if library() == "cupy":
        import cupy

        return str(cupy.cuda.Device(device).pci_bus_id)
    import torch

    return str(torch.cuda.get_device_properties(device).uuid)


def child_sees() -> dict[str, Any]:
    """Start a process with this task's CUDA_VISIBLE_DEVICES: what devices it sees, and
    which devices this task's units are in this process."""
    task = get_worker().task
    assert task is not None
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": task.cuda_visible_devices}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    count, *ids = done.stdout.split()
    return {"count": int(count), "ids": ids, "mine": [identity_of(u) for u in _units()]}
