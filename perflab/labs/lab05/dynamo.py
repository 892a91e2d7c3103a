"""Lab 5's instruments for torch.compile: count its graphs, read why it recompiled, keep it quiet,
time a compile in a fresh process with Inductor's caches warm or cold.

`CountingBackend` records the graphs dynamo hands a backend (graph breaks and recompiles are decided
before any backend runs, so it counts what inductor would see, without compiling); `recompile_reasons`
reads dynamo's failed guards; `quiet` and `quiet_compile_logs` keep compile chatter off stderr, which
would fail a graded cell. The notebook's cells use them through the contract `perflab.labs.lab05`,
which re-exports them; its checks and the grader import them from here.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

# Loggers that write compile chatter straight to stderr (which scores a graded cell 0): dynamo's
# graph-break warnings, inductor's notes, and "No CUDA runtime is found" from the C++ toolchain probe.
NOISY_LOGGERS = ("torch._dynamo", "torch._inductor", "torch.utils.cpp_extension", "torch.fx.experimental.symbolic_shapes")


@dataclass
class CountingBackend:
    """A torch.compile backend that runs graphs eagerly and records each graph dynamo hands it.

    Graph breaks and recompiles are decided by dynamo before any backend runs, so counting with this
    cheap backend gives the counts inductor would see, in a fraction of the time.
    """

    graphs: list[list[Any]] = field(default_factory=list)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs.append([tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in example_inputs])
        return gm.forward

    @property
    def count(self) -> int:
        return len(self.graphs)


def recompile_reasons() -> list[str]:
    """Why dynamo recompiled since the last `torch._dynamo.reset()`: each failed guard, in words."""
    from torch._dynamo import utils

    failures = getattr(utils, "guard_failures", {})
    return [f"{code.co_name}: {reason}" for code, reasons in failures.items() for reason in reasons]


def quiet_compile_logs() -> None:
    """Keep compile chatter (graph-break warnings, toolchain probes) off stderr: graded cells stay clean.

    Graph breaks are found with `torch._dynamo.explain` and recompiles with `recompile_reasons()`
    instead, which report them as data.
    """
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    with contextlib.suppress(Exception):
        torch._logging.set_logs(dynamo=logging.ERROR, inductor=logging.ERROR)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No warnings, compile logs or printed lines from the code inside (stdout is swallowed)."""
    quiet_compile_logs()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


# Inductor keeps what it compiled on disk (FX graphs, kernels, autotuning), so a compile in a new
# process on a machine that compiled the same code before is far cheaper than the first one ever was.
# This variable turns every such cache off for one process: what a first run on a fresh machine pays.
COLD_CACHE_ENV = "TORCHINDUCTOR_FORCE_DISABLE_CACHES"
# A fresh process that has not answered by then is stuck, not compiling.
FRESH_PROCESS_TIMEOUT_S = 900.0

_FIRST_CALLS = """
import json, os, sys, time
from perflab.labs import lab05
from perflab.labs.lab05 import dynamo as lab05_dynamo
args = json.loads(sys.argv[1])
with lab05_dynamo.quiet():
    step = lab05.small_step(0, args["compile_mode"], **args["kwargs"])
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        step()  # returns the loss as a float: the device has finished the step
        seconds.append(time.perf_counter() - start)
caches_off = os.environ.get(lab05_dynamo.COLD_CACHE_ENV) == "1"
print(json.dumps({"first": seconds[0], "second": seconds[1], "caches_off": float(caches_off)}))
"""


def first_calls_in_fresh_process(compile_mode: str | None, step_kwargs: dict[str, Any], *,
                                 cold: bool) -> dict[str, float]:
    """Seconds of the first and second call of `lab05.small_step(0, compile_mode, **step_kwargs)` in a new
    interpreter: {"first", "second", "caches_off" (1.0 or 0.0)}. `cold` turns Inductor's on-disk caches off there (COLD_CACHE_ENV);
    otherwise they are whatever this machine's earlier compiles left. RuntimeError with the child's last
    line when it fails."""
    env = {k: v for k, v in os.environ.items() if k != COLD_CACHE_ENV}
    if cold:
        env[COLD_CACHE_ENV] = "1"
    args = json.dumps({"compile_mode": compile_mode, "kwargs": step_kwargs})
    try:
        run = subprocess.run([sys.executable, "-c", _FIRST_CALLS, args], capture_output=True, text=True, env=env,
                             timeout=FRESH_PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the fresh process did not finish within {FRESH_PROCESS_TIMEOUT_S:.0f} s") from None
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the fresh process failed (exit {run.returncode}): {last}")
    return {k: float(v) for k, v in json.loads(lines[-1]).items()}
