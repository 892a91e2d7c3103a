"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_data() -> Path:
    """The tiny synthetic set, built once into its default place (reused, after verifying, on later runs)."""
    from perflab import dataset

    return dataset.build("tiny", progress=False)
