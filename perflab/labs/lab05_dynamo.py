"""Lab 5's instruments for torch.compile: count its graphs, read why it recompiled, keep it quiet.

`CountingBackend` records the graphs dynamo hands a backend (graph breaks and recompiles are decided
before any backend runs, so it counts what inductor would see, without compiling); `recompile_reasons`
reads dynamo's failed guards; `quiet` and `quiet_compile_logs` keep compile chatter off stderr, which
would fail a graded cell. The notebook's cells use them through the contract `perflab.labs.lab05`,
which re-exports them; its checks and the grader import them from here.
"""

from __future__ import annotations

import contextlib
import io
import logging
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
