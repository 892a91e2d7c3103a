"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_data() -> Path:
    """The tiny synthetic set, built once into its default place (reused, after verifying, on later runs)."""
    from perflab import dataset

    return dataset.build("tiny", progress=False)


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 - pytest's hook signature
    """A test skipped without a CUDA device is a GPU test: marked `gpu`, so that `pytest -m gpu` (and the
    GPU check, bench/gpu_check.py) runs exactly those."""
    for item in items:
        if any("CUDA" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.gpu)
