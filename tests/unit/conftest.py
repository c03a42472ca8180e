from __future__ import annotations

from collections.abc import Iterator

import pytest

from apportion import config


@pytest.fixture(autouse=True)
def restore_config() -> Iterator[None]:
    """Whatever a test does to the global configuration is undone afterwards."""
    with config.set({}):
        yield
