"""Lab 03's hidden checks and the reference answers they compare against; grader-only: the student
bundle leaves this module out.

The hidden test cells of `solutions/lab03_amp` import this module inside their `BEGIN HIDDEN TESTS`
blocks and call the `check_*` functions below with the student's functions: random problems drawn
from a seed, on every device this machine has, AssertionError on the first problem. The contract
they check, and the visible `*_problems` checks they are built on, are in `perflab/labs/lab03.py`.

`python -m perflab.labs.hidden.lab03` rewrites the visible census check's stored expected censuses
(`lab03.CENSUS_FILE`) from the reference census below.
"""

from __future__ import annotations

import collections
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from perflab.labs.lab03 import (
    CENSUS_FILE,
    StepFn,
    _one_thread,
    as_dtype,
    census_case,
    census_inputs,
    census_problems,
    dtype_name,
    low_precision_problems,
    parity_problems,
    scaler_problems,
)

# The problems of the visible census check (`census_problems(dtype_census, 5, dtype)` on the CPU):
# the only ones whose expected census CENSUS_FILE stores.
VISIBLE_CENSUS_CASES: tuple[tuple[int, torch.dtype], ...] = ((5, torch.float32), (5, torch.bfloat16))


def draw_seed() -> int:
    """A fresh seed for a hidden test (printed with any failure, so a failure can be replayed)."""
    return random.SystemRandom().randrange(2**31)


def iter_devices() -> Iterator[str]:
    """The devices the hidden tests check on: the CPU always, and CUDA where there is one."""
    yield "cpu"
    if torch.cuda.is_available():
        yield "cuda"


def _problems_for(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2**31) for _ in range(count)]


# ---------------------------------------------------------------------------------------------
# The reference census


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


@torch.no_grad()
def _expected_census(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                     dtype: torch.dtype) -> dict[str, dict[str, int]]:
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def record(module: nn.Module, inputs: Any, output: Any) -> None:
        tensor = _first_tensor(output)
        if tensor is not None:
            counts[type(module).__name__][dtype_name(tensor.dtype)] += 1

    was_training = model.training
    handles = [m.register_forward_hook(record) for m in model.modules() if not list(m.children())]
    model.eval()
    try:
        with torch.autocast(images.device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = nn.functional.cross_entropy(model(images), labels)
        counts["loss"][dtype_name(loss.dtype)] += 1
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return {name: dict(c) for name, c in counts.items()}


@_one_thread
def expected_census(seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                    resnet: bool = False) -> dict[str, dict[str, int]]:
    """The reference census of one census problem (`lab03.census_inputs`): what `census_problems` expects."""
    model, images, labels, _ = census_inputs(seed, device, resnet)
    return _expected_census(model, images, labels, as_dtype(dtype))


def visible_census() -> dict[str, Any]:
    """CENSUS_FILE's content: the reference census of each visible problem, by `lab03.census_case`."""
    cases = {census_case(seed, dtype): expected_census(seed, dtype) for seed, dtype in VISIBLE_CENSUS_CASES}
    return {"about": "expected dtype_census of the visible census check's problems (small CNNs on the CPU); "
                     "written by the grader's perflab/labs/hidden/lab03.py (write_visible_census)",
            "torch": torch.__version__.split("+")[0], "cases": cases}


def write_visible_census(path: str | Path = CENSUS_FILE) -> Path:
    """Write `visible_census()` to `path` (default: lab03.CENSUS_FILE, shipped beside lab03.py)."""
    path = Path(path)
    path.write_text(json.dumps(visible_census(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# The hidden tests: several random problems per call, failing with the first problem in words


def check_amp_step(step: StepFn, seed: int, *, problems: int = 3) -> None:
    """Random problems: losses within tolerance of FP32 at every precision, never NaN, convolutions and
    linear layers computing in the low dtype, no gradient left behind; on CUDA too where there is one."""
    for device in iter_devices():
        for s in _problems_for(seed, problems):
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                found = parity_problems(step, s, dtype, device=device) or low_precision_problems(step, s, dtype,
                                                                                                 device=device)
                assert not found, found[0]


def check_scaler(step: StepFn, seed: int, *, problems: int = 2) -> None:
    """Random problems: fp16 with a GradScaler scales, unscales, skips overflowing steps, updates the scale."""
    for device in iter_devices():
        for s in _problems_for(seed, problems):
            found = scaler_problems(step, s, device=device)
            assert not found, found[0]


def check_census(census_fn: Callable[..., Any], seed: int, *, problems: int = 3) -> None:
    """Random small CNNs at every precision and ResNet-18 in the low precisions, on every device checked."""
    for device in iter_devices():
        for s in _problems_for(seed, problems):
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                found = census_problems(census_fn, s, dtype, device=device,
                                        expected=expected_census(s, dtype, device=device))
                assert not found, found[0]
        for dtype in (torch.bfloat16, torch.float16):
            found = census_problems(census_fn, seed, dtype, device=device, resnet=True,
                                    expected=expected_census(seed, dtype, device=device, resnet=True))
            assert not found, found[0]


if __name__ == "__main__":
    print(f"wrote {write_visible_census()}")
