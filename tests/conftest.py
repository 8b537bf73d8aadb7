"""Shared pytest configuration.

Tests marked ``gpu`` need a CUDA device: they are skipped unless ``tvm.cuda(0).exist``,
so a plain ``pytest`` on a CPU-only machine runs everything else and skips them cleanly.
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def _cuda_available() -> bool:
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:  # no CUDA runtime in this TVM build, driver missing, ...
        return False


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (tvm.cuda(0).exist is False)")
    for item in gpu_items:
        item.add_marker(skip)
