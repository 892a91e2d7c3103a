"""Lab 3's census check: does `dtype_census` count every leaf module call and the loss by dtype?

The census problems (`census_case`, `census_inputs`: a seed's small CNN of `lab03_checks.Problem`, or
ResNet-18), the expected censuses of the visible check stored beside this module (`CENSUS_FILE`,
`stored_census`, written by the grader-only `perflab/labs/lab03/judges/`), what the student's census
did (`observe_census`) and what is wrong with it (`census_from`), with the visible check the notebook's
test cell calls (`census_problems`). Imports the contract `perflab.labs.lab03`, never the reverse.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from perflab.labs.lab03 import as_dtype, dtype_name
from perflab.labs.lab03.checks import Problem, one_thread

# The expected censuses of the visible census check (small CNNs only), keyed by `census_case`:
# written by the grader-only perflab/labs/lab03/judges/ (`write_visible_census`) from its reference.
CENSUS_FILE = Path(__file__).with_name("census.json")


def _plain(census: Any) -> dict[str, dict[str, int]]:
    if not isinstance(census, Mapping):
        raise TypeError(f"dtype_census returned {type(census).__name__}; return a dict of dicts")
    out = {}
    for name, inner in census.items():
        if not isinstance(inner, Mapping):
            raise TypeError(f"dtype_census()[{name!r}] is {type(inner).__name__}; expected a dict of dtype name -> count")
        out[str(name)] = {str(k): int(v) for k, v in inner.items() if int(v)}
    return out


def census_case(seed: int, dtype: str | torch.dtype, device: str = "cpu", resnet: bool = False) -> str:
    """The key of one census problem in CENSUS_FILE, e.g. "seed=5 dtype=bfloat16 device=cpu"."""
    model = "resnet18 " if resnet else ""
    return f"{model}seed={seed} dtype={dtype_name(as_dtype(dtype))} device={device}"


def census_inputs(seed: int, device: str = "cpu", resnet: bool = False
                  ) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    """(model, images, labels, description) of one census problem: the seed's small CNN and its first
    batch, or ResNet-18 (`resnet=True`) on that batch resized to 32x32. The model is in train mode."""
    problem = Problem.draw(seed, device)
    images, labels = problem.batch(0)
    if not resnet:
        return problem.model(), images, labels, problem.describe()
    from perflab.workload import network

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = network("resnet18", problem.classes).to(device)
    images = nn.functional.interpolate(images, size=(32, 32))
    return model.train(), images, labels, f"ResNet-18 on {problem.batch_size} images of 32x32"


def stored_census(case: str, path: str | Path | None = None) -> dict[str, dict[str, int]]:
    """The expected census of `case` (a `census_case` key) stored in CENSUS_FILE (or `path`)."""
    path = Path(path) if path is not None else CENSUS_FILE
    cases = json.loads(path.read_text(encoding="utf-8"))["cases"]
    if case not in cases:
        raise ValueError(f"no stored census for {case!r}; {path.name} holds {', '.join(map(repr, sorted(cases)))}. "
                         "Other problems need their expected census passed as expected= (the hidden checks "
                         "pass their own)")
    return {str(name): {str(d): int(n) for d, n in inner.items()} for name, inner in cases[case].items()}


@one_thread
def observe_census(census_fn: Callable[..., Any], seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                   resnet: bool = False) -> dict[str, Any]:
    """`census_fn` on one census problem (`census_inputs`), as data: the census it returned, and the state
    it left the model in (mode, hooks, changed weights and buffers, gradients)."""
    dtype = as_dtype(dtype)
    model, images, labels, _ = census_inputs(seed, device, resnet)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = _plain(census_fn(model, images, labels, dtype=dtype))
        except Exception as exc:
            return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"census": got, "training": model.training,
            "hooks_left": [name or "the model" for name, m in model.named_modules()
                           if m._forward_hooks or m._forward_pre_hooks],
            "changed": [k for k, v in model.state_dict().items() if not torch.equal(v, state[k])],
            "grads": any(p.grad is not None for p in model.parameters())}


def census_from(observed: Any, seed: int, dtype: str | torch.dtype, *, device: str = "cpu", resnet: bool = False,
                expected: Mapping[str, Mapping[str, int]] | None = None) -> list[str]:
    """What is wrong with `observe_census`'s data against the `expected` census (default: the stored one)."""
    dtype = as_dtype(dtype)
    if expected is None:
        expected = stored_census(census_case(seed, dtype, device, resnet))
    expected = {str(name): {str(d): int(n) for d, n in inner.items() if int(n)} for name, inner in expected.items()}
    problem = Problem.draw(seed, device)
    where = (f"ResNet-18 on {problem.batch_size} images of 32x32" if resnet else problem.describe())
    where = f"{where}, dtype {dtype_name(dtype)}"
    if not isinstance(observed, Mapping) or "census" not in observed:
        raised = observed.get("raised", "no result") if isinstance(observed, Mapping) else "no result"
        message = observed.get("message", "") if isinstance(observed, Mapping) else ""
        return [f"{where}: dtype_census raised {raised}: {message}" if raised != "TypeError" else f"{where}: {message}"]
    try:
        got = _plain(observed["census"])
    except (TypeError, ValueError) as exc:
        return [f"{where}: {exc}"]
    problems = []
    if got != expected:
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        wrong = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected {', '.join(extra)}")
        for k in wrong[:3]:
            parts.append(f"{k}: {got[k]} instead of {expected[k]}")
        problems.append(f"{where}: census differs ({'; '.join(parts)})")
    if observed.get("training") is not True:
        problems.append(f"{where}: the model was in train mode and is left in eval mode; restore its mode")
    leftover = observed.get("hooks_left")
    if not isinstance(leftover, list) or leftover:
        problems.append(f"{where}: hooks are still registered on {', '.join(map(str, (leftover or ['?'])[:3]))}; "
                        "remove every handle (handle.remove()) in a finally block")
    changed = observed.get("changed")
    if not isinstance(changed, list) or changed:
        problems.append(f"{where}: the census changed {', '.join(map(str, (changed or ['?'])[:3]))}; run the pass in "
                        "eval mode under torch.no_grad()")
    if observed.get("grads") is not False:
        problems.append(f"{where}: the census left gradients; run it under torch.no_grad()")
    return problems


def census_problems(census_fn: Callable[..., Any], seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                    resnet: bool = False, expected: Mapping[str, Mapping[str, int]] | None = None) -> list[str]:
    """Does `census_fn` count every leaf module call and the loss by dtype, leaving the model as it was?

    The model is the seed's small CNN, or ResNet-18 (`resnet=True`) on 32x32 images of the seed's batch
    (`census_inputs`). The census is compared with `expected`, by default the one stored for this
    problem beside this module (`stored_census`; a ValueError names the stored problems when it has none).
    """
    if expected is None:
        expected = stored_census(census_case(seed, as_dtype(dtype), device, resnet))
    return census_from(observe_census(census_fn, seed, dtype, device=device, resnet=resnet), seed, dtype,
                       device=device, resnet=resnet, expected=expected)
