"""Tests on a real NVIDIA GPU: skipped where ``nvidia-smi`` lists none, or where neither
CuPy nor PyTorch (with CUDA) is installed. Run them on a machine with a GPU:

    .venv/bin/pip install cupy-cuda12x   # or torch
    .venv/bin/python -m pytest tests/gpu -v
"""

from __future__ import annotations

import shutil
import subprocess

import cloudpickle
import pytest

from tests.gpu import kernels

# Workers import nothing from the test tree: ship these functions by value.
cloudpickle.register_pickle_by_value(kernels)


def gpu_names() -> list[str]:
    """The NVIDIA GPUs of this machine, by name ([] without a driver)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


GPUS = gpu_names()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = None
    if not GPUS:
        why = "no NVIDIA GPU here (nvidia-smi lists none)"
    elif kernels.library() is None:
        why = "neither CuPy nor PyTorch with CUDA is installed"
    if why is not None:
        for item in items:
            if "tests/gpu/" in item.nodeid:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def gpus() -> list[str]:
    return GPUS
