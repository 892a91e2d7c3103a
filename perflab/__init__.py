"""perflab: the reference profiler behind the course kit.

    from perflab import Profiler, TrainConfig, benchmark, compare, verify

    m = benchmark(lambda: model(x), device="cpu")          # a Measurement: median, IQR, CI, raw samples
    c = compare(step_a, step_b)                              # a Comparison: paired A/B, ratio CI, verdict
    Profiler().quick_profile(model, (1, 3, 224, 224))        # the teaching facade (parameters, FLOPs, memory, ...)
    verdict = verify(TrainConfig(), TrainConfig(amp_dtype="bf16"), expectation=1.1)   # the grading protocol

Everything else lives in one module each (`perflab.env`, `timing`, `counting`, `memory`, `roofline`,
`workload`, `phases`, `tracing`, `results`, `report`, `grading`; see docs/DESIGN.md). Names are imported
on first use, so `import perflab` stays cheap (no torch) for the processes that only need its files.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# The public face: name -> the module that defines it.
_EXPORTS = {
    "Profiler": "perflab.profiler",
    "TrainConfig": "perflab.workload",
    "benchmark": "perflab.timing",
    "compare": "perflab.timing",
    "Measurement": "perflab.timing",
    "Comparison": "perflab.timing",
    "Verdict": "perflab.verify",
    "load_expectation": "perflab.verify",
}

__all__ = ["__version__", "verify", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name == "verify":  # the subpackage, callable as its `verify` function (see perflab/verify/__init__.py)
        return importlib.import_module("perflab.verify")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'perflab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
