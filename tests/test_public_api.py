"""The package's face: what `from perflab import ...` gives, and that importing it stays cheap."""

from __future__ import annotations

import subprocess
import sys

import perflab


def test_the_public_names_are_the_documented_objects() -> None:
    from perflab import (
        Profiler,
        TrainConfig,
        benchmark,
        compare,
        profiler,
        timing,
        verify,
        workload,
    )
    from perflab.verify import protocol

    assert Profiler is profiler.Profiler and TrainConfig is workload.TrainConfig
    assert benchmark is timing.benchmark and compare is timing.compare
    assert callable(verify) and verify.load_expectation is perflab.load_expectation
    assert set(perflab.__all__) <= set(dir(perflab))
    for name in perflab.__all__:
        assert getattr(perflab, name) is not None, name
    assert protocol.verify.__name__ == "verify"


def test_calling_the_verify_package_runs_the_protocol() -> None:
    from perflab import TrainConfig, verify

    def runner(*args, **kwargs):
        raise AssertionError("an unchanged configuration is not timed")

    v = verify(TrainConfig(), TrainConfig(), expectation=1.1, runner=runner)
    assert (v.outcome, v.code) == ("fail", "no_change")


def test_import_perflab_does_not_import_torch() -> None:
    code = "import sys, perflab; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_unknown_name_is_an_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'Turbo'"):
        perflab.Turbo  # noqa: B018
