"""What the verifier can time: the one contract a lab's exported candidate follows, and perflab's references.

The contract (a lab states it once and exports a module file that follows it)::

    # candidate.py -- written from the notebook with %%writefile, or with export_functions()
    DTYPE = "fp32"   # optional: the lowest precision the step computes in (fp32, tf32, bf16, fp16);
                     # it sets how far the losses may stray from the reference's

    def make_step(seed: int) -> Callable[[], tuple[float, list[int]]]:
        '''Build everything (model, data, optimizer) from `seed` and return `step`.

        Each call of `step()` runs ONE optimizer step, synchronously, and returns
        (loss, indices): that step's loss (a float or a 0-d tensor) and the dataset indices
        of the samples it consumed, in order.
        '''

The verifier calls `make_step` once, then `step()` repeatedly: a few fixed-seed steps to warm up and
check correctness against the reference (same losses within a tolerance, same indices), then
interleaved timed blocks. The baseline is always one of perflab's references below, never code
from the notebook: a lab that exports its own baseline has it ignored.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

StepFn = Callable[[], tuple[Any, Any]]
Factory = Callable[..., StepFn]

DTYPES = ("fp32", "tf32", "bf16", "fp16")
DEFAULT_FACTORY = "make_step"
# Name the candidate module is imported under in the child (never a name perflab itself uses).
CANDIDATE_MODULE = "perflab_candidate"


class CandidateError(ValueError):
    """A candidate that does not follow the contract: the message says what is missing."""


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a perflab reference factory, or a factory in an exported module file.

    kind      "reference" (target "perflab.module:function") or "module" (target: a .py file path)
    factory   the function in the module file (kind "module"); the contract's `make_step` by default
    kwargs    JSON-able keyword arguments passed to the factory after `seed`
    dtype     the precision it computes in (sets the loss tolerance); a module's DTYPE overrides it
    """

    kind: str
    target: str
    factory: str = DEFAULT_FACTORY
    kwargs: dict[str, Any] = field(default_factory=dict)
    dtype: str = "fp32"
    label: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("reference", "module"):
            raise ValueError(f"kind: {self.kind!r} is not 'reference' or 'module'")
        if self.kind == "reference" and not (self.target.startswith("perflab.") and ":" in self.target):
            raise ValueError(f"target: a reference must be 'perflab.module:function', got {self.target!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")

    @classmethod
    def reference(cls, target: str, *, dtype: str = "fp32", label: str = "", **kwargs: Any) -> Side:
        return cls("reference", target, kwargs=kwargs, dtype=dtype, label=label or target.split(":")[-1])

    @classmethod
    def module(cls, path: str | os.PathLike[str], factory: str = DEFAULT_FACTORY, *, label: str = "",
               **kwargs: Any) -> Side:
        path = Path(path).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"candidate module {path} does not exist (export it from the notebook first)")
        return cls("module", str(path), factory=factory, kwargs=kwargs, label=label or path.stem)

    @classmethod
    def from_config(cls, config: Any, *, label: str = "") -> Side:
        """A `TrainConfig` run through perflab's own training loop."""
        amp = config.amp_dtype
        return cls("reference", "perflab.verify.candidates:config_step", kwargs={"config": config.to_dict()},
                   dtype=amp if amp in DTYPES else "fp32", label=label or _config_label(config))

    @property
    def is_student_code(self) -> bool:
        return self.kind == "module"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Side:
        return cls(**data)


def _config_label(config: Any) -> str:
    from perflab.workload import TrainConfig

    default = TrainConfig()
    changed = [f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
               if getattr(config, f.name) != getattr(default, f.name)]
    return "TrainConfig(" + ", ".join(changed) + ")"


def load_factory(side: Side) -> Factory:
    """Import the factory `side` names (a module file is executed: only ever do this in the child)."""
    if side.kind == "reference":
        module_name, _, func = side.target.partition(":")
        module = importlib.import_module(module_name)
        factory = getattr(module, func, None)
        if not callable(factory):
            raise CandidateError(f"{side.target}: no such reference function")
        return factory
    return _load_module_factory(Path(side.target), side.factory)


def import_file(path: str | os.PathLike[str], module_name: str) -> Any:
    """Execute a Python file as the module `module_name` (registered in sys.modules) and return it."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise CandidateError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _load_module_factory(path: Path, name: str) -> Factory:
    module = import_file(path, CANDIDATE_MODULE)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CandidateError(f"{path.name}: defines no function {name}(seed) (the lab's contract needs it)")
    return factory


def module_dtype(default: str) -> str:
    """The DTYPE the imported candidate module declares (the contract's optional constant)."""
    module = sys.modules.get(CANDIDATE_MODULE)
    dtype = getattr(module, "DTYPE", default) if module is not None else default
    if dtype not in DTYPES:
        raise CandidateError(f"DTYPE: {dtype!r} is not one of {', '.join(DTYPES)}")
    return dtype


def export_functions(path: str | os.PathLike[str], *objects: Any, header: str = "") -> Path:
    """Write the source of functions/classes (e.g. `make_step` and its helpers) into a module file.

    For a notebook that prefers this over `%%writefile`: `header` holds the imports they need.
    """
    parts = [header.rstrip() + "\n"] if header else []
    for obj in objects:
        try:
            parts.append(inspect.getsource(obj))
        except (OSError, TypeError) as exc:
            raise ValueError(f"export_functions: cannot read the source of {obj!r} ({exc})") from exc
    path = Path(path)
    path.write_text("\n\n".join(parts))
    return path


# ---------------------------------------------------------------------------------------------
# perflab's references


def config_step(seed: int, config: dict[str, Any]) -> StepFn:
    """The contract for a `TrainConfig`: perflab's training loop, the verifier's seed applied."""
    from perflab import workload

    cfg = workload.TrainConfig.from_dict(config).replace(seed=seed)
    work = workload.build(cfg)

    def step() -> tuple[float, list[int]]:
        return workload.train_step(work)

    step.work = work  # type: ignore[attr-defined]
    return step


def toy_step(seed: int, repeats: int = 10, batch: int = 64, features: int = 256, samples: int = 2048,
             lr: float = 0.05, threads: int | None = None) -> StepFn:
    """A known amount of work: linear regression by SGD whose gradient is computed `repeats` times a step.

    Every repeat computes the same gradient from the same inputs, so the losses do not depend on
    `repeats` and the work, and so the time, scales with it: `repeats=10` against `repeats=8` is a
    true 1.25x speedup (less the small fixed cost of the update). The bench and the tests use it to
    know the right answer.
    """
    import torch

    if repeats < 1:
        raise ValueError(f"repeats: must be at least 1, got {repeats}")
    if threads is not None:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=gen)
    w_true = torch.randn(features, features, generator=gen) / math.sqrt(features)
    # Per-sample scales spread over two orders of magnitude: a batch's loss then depends strongly on
    # which samples it holds, so a candidate that trains on fewer of them shows it in its first loss.
    scale = torch.exp(1.5 * torch.randn(samples, 1, generator=gen))
    y = (x @ w_true) * scale + 0.1 * torch.randn(samples, features, generator=gen)
    w = torch.zeros(features, features)
    state = {"epoch": 0, "pos": samples, "order": torch.empty(0, dtype=torch.long)}

    def next_indices() -> torch.Tensor:
        if state["pos"] + batch > samples:
            order_gen = torch.Generator().manual_seed(seed * 1_000_003 + state["epoch"])
            state["order"] = torch.randperm(samples, generator=order_gen)
            state["epoch"] += 1
            state["pos"] = 0
        idx = state["order"][state["pos"]: state["pos"] + batch]
        state["pos"] += batch
        return idx

    def step() -> tuple[float, list[int]]:
        idx = next_indices()
        xb, yb = x[idx], y[idx]
        for _ in range(repeats):
            err = xb @ w - yb
            grad = xb.T @ err * (2.0 / (batch * features))
        loss = float((err * err).mean())
        w.sub_(grad, alpha=lr)
        return loss, idx.tolist()

    return step
