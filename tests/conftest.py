from __future__ import annotations

import jax
import pytest


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU visible to JAX; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
