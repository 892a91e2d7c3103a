"""Lab 03's judges and the reference answers they compare against, the answer key among them
(`reference_best`, `calibration_pair`); grader-only: the student bundle and the grading sandbox leave
this module out.

Each judge in `JUDGES` decides one autograded cell from what the lab's probe
(`perflab.labs.lab03.probes.PROBES`) returned: it draws the same problems from the grader's seed, computes
the FP32 references and the expected census here (`perflab.labs.lab03.checks.*_from`), and raises
AssertionError with the student's feedback line on the first problem. AMP_CONFIG's correctness run
and its re-measurement happen here too. A solution notebook's hidden blocks run probe and judge
in-process with `check(grade_id, globals())`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from perflab import env
from perflab.grading.judging import Context, Mark, check_here
from perflab.grading.probing import decode_float
from perflab.labs import lab03, predict
from perflab.labs.lab03 import as_dtype, dtype_name
from perflab.labs.lab03 import census as lab03_census
from perflab.labs.lab03 import checks as lab03_checks
from perflab.labs.lab03.census import CENSUS_FILE, census_case, census_inputs
from perflab.labs.lab03.checks import one_thread
from perflab.workload import TrainConfig

# The problems of the visible census check (`census_problems(dtype_census, 5, dtype)` on the CPU):
# the only ones whose expected census CENSUS_FILE stores.
VISIBLE_CENSUS_CASES: tuple[tuple[int, torch.dtype], ...] = ((5, torch.float32), (5, torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# The answer key: the reference AMP_CONFIG (the student's kit holds the contract, `perflab.labs.lab03`, only)


def reference_best(mode: str | None = None, info: env.MachineInfo | None = None) -> TrainConfig:
    """The reference solution's AMP setting for this machine (what calibration times against the baseline).

    bf16 where the hardware has it (Ampere+ GPUs, AMX or AVX-512-BF16 CPUs), else fp16 on a GPU,
    always with channels_last on a GPU (tensor-core convolutions want NHWC). On a CPU without bf16
    hardware it stays FP32: emulated bf16 only adds casts.
    """
    info = info or env.machine_info()
    base = lab03.baseline_config(mode)
    if info.device == "cuda":
        amp = "bf16" if env.supports_autocast("cuda", torch.bfloat16) else "fp16"
        return base.replace(amp_dtype=amp, channels_last=True)
    if info.device == "mps":
        return base.replace(amp_dtype="fp16")
    if info.cpu_bf16:
        return base.replace(amp_dtype="bf16", channels_last=True)
    return base


def calibration_pair(mode: str = "grade") -> tuple[TrainConfig, TrainConfig]:
    """(baseline, candidate) that `perflab calibrate` times for `lab03.EXPECTATION` on the grading machine:
    the reference AMP_CONFIG of this device (`reference_best`) against the lab's baseline."""
    return lab03.baseline_config(mode), reference_best(mode)


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


@one_thread
def expected_census(seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                    resnet: bool = False) -> dict[str, dict[str, int]]:
    """The reference census of one census problem (`lab03_census.census_inputs`): what `census_problems` expects."""
    model, images, labels, _ = census_inputs(seed, device, resnet)
    return _expected_census(model, images, labels, as_dtype(dtype))


def visible_census() -> dict[str, Any]:
    """CENSUS_FILE's content: the reference census of each visible problem, by `lab03_census.census_case`."""
    cases = {census_case(seed, dtype): expected_census(seed, dtype) for seed, dtype in VISIBLE_CENSUS_CASES}
    return {"about": "expected dtype_census of the visible census check's problems (small CNNs on the CPU); "
                     "written by the grader's perflab/labs/lab03/judges/ (write_visible_census)",
            "torch": torch.__version__.split("+")[0], "cases": cases}


def write_visible_census(path: str | Path = CENSUS_FILE) -> Path:
    """Write `visible_census()` to `path` (default: lab03_census.CENSUS_FILE, shipped beside it)."""
    path = Path(path)
    path.write_text(json.dumps(visible_census(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# The judges


def _first(problems: list[str]) -> None:
    assert not problems, problems[0]


def _step(observed: Any, seed: int, device: str) -> None:
    assert isinstance(observed, Mapping), "no result"
    for dtype in lab03.STEP_DTYPES:
        part = observed.get(dtype_name(dtype))
        assert isinstance(part, Mapping), f"no result at {dtype_name(dtype)}"
        _first(lab03_checks.parity_from(part.get("parity"), seed, dtype, device=device)
               or lab03_checks.low_precision_from(part.get("low"), seed, dtype, device=device))


def judge_step_visible(observed: Any, ctx: Context) -> None:
    _step(observed, lab03.VISIBLE_STEP_SEED, "cpu")


def judge_step_hidden(observed: Any, ctx: Context) -> None:
    for device in lab03.devices():
        runs = observed.get(device)
        seeds = lab03.problems_for(ctx.seed, lab03.HIDDEN_STEP_PROBLEMS)
        assert isinstance(runs, list) and len(runs) == len(seeds), f"no result for every problem on {device}"
        for s, run in zip(seeds, runs, strict=True):
            _step(run, s, device)


def judge_scaler(observed: Any, ctx: Context) -> None:
    _first(lab03_checks.scaler_from(observed.get("visible"), lab03.VISIBLE_SCALER_SEED))
    hidden = observed.get("hidden")
    assert isinstance(hidden, Mapping), "no result for the random problems"
    for device in lab03.devices():
        runs = hidden.get(device)
        seeds = lab03.problems_for(ctx.seed, lab03.HIDDEN_SCALER_PROBLEMS)
        assert isinstance(runs, list) and len(runs) == len(seeds), f"no result for every problem on {device}"
        for s, run in zip(seeds, runs, strict=True):
            _first(lab03_checks.scaler_from(run, s, device=device))


def judge_census_visible(observed: Any, ctx: Context) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        s = lab03.VISIBLE_CENSUS_SEED
        _first(lab03_census.census_from(observed.get(dtype_name(dtype)), s, dtype, expected=expected_census(s, dtype)))


def judge_census_hidden(observed: Any, ctx: Context) -> None:
    for device in lab03.devices():
        part = observed.get(device)
        assert isinstance(part, Mapping), f"no result on {device}"
        seeds = lab03.problems_for(ctx.seed, lab03.HIDDEN_CENSUS_PROBLEMS)
        small = part.get("small")
        assert isinstance(small, list) and len(small) == len(seeds), f"no result for every problem on {device}"
        for s, run in zip(seeds, small, strict=True):
            assert isinstance(run, Mapping), "no result"
            for dtype in lab03.STEP_DTYPES:
                _first(lab03_census.census_from(run.get(dtype_name(dtype)), s, dtype, device=device,
                                                expected=expected_census(s, dtype, device=device)))
        resnet = part.get("resnet")
        assert isinstance(resnet, Mapping), "no result for ResNet-18"
        for dtype in lab03.LOW_PRECISION:
            _first(lab03_census.census_from(resnet.get(dtype_name(dtype)), ctx.seed, dtype, device=device, resnet=True,
                                            expected=expected_census(ctx.seed, dtype, device=device, resnet=True)))


def exported_config(observed: Any) -> TrainConfig:
    """AMP_CONFIG as the notebook exported it, rebuilt here from its fields."""
    assert isinstance(observed, Mapping), "AMP_CONFIG could not be read"
    if observed.get("config") is None:
        raise AssertionError(f"AMP_CONFIG: expected a perflab.workload.TrainConfig, got {observed.get('type')}")
    try:
        return TrainConfig.from_dict(dict(observed["config"]))
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"AMP_CONFIG is not a valid TrainConfig: {exc}") from None


def _claim(observed: Mapping[str, Any]) -> float | None:
    claim = decode_float(observed.get("claim"))
    return claim if claim is not None and math.isfinite(claim) and claim > 0 else None


def judge_config(observed: Any, ctx: Context) -> None:
    config = exported_config(observed)
    _first(lab03.config_problems(config, ctx.mode) or lab03_checks.config_parity_problems(config, ctx.mode))
    assert _claim(observed) is not None, (f"CLAIM: a positive number (your measured speedup), got "
                                          f"{observed.get('claim')!r}")
    measured_at_home(config, ctx)
    not_contradicted(config, observed, ctx)


def candidate_knobs(name: str) -> tuple[str | None, bool]:
    """(amp_dtype, channels_last) of a setting named as `lab03.candidate_configs` names them."""
    words = name.split()
    dtype = None if words[:1] == ["fp32"] else (words[0] if words else None)
    return dtype, "channels_last" in words[1:]


def measured_at_home(config: TrainConfig, ctx: Context) -> None:
    """AMP_CONFIG must be a setting the notebook's own comparison measured at home (or the baseline, kept
    after measuring): a setting typed in from elsewhere earns the re-measurement's points only."""
    from perflab.labs import homework

    if ctx.measured_at_home is None:  # no submission was read: a solution checking itself, the kit's tests
        return
    setting = (config.amp_dtype, config.channels_last)
    baseline = lab03.baseline_config(ctx.mode)
    for key in homework.keys_of(ctx.measured_at_home, "lab03.compare_precisions"):
        names = key.get("names") if isinstance(key, Mapping) else None
        if not isinstance(names, list):
            continue
        if setting == (baseline.amp_dtype, baseline.channels_last):
            return
        if any(candidate_knobs(name) == setting for name in names if isinstance(name, str)):
            return
    described = f"{config.amp_dtype or 'fp32'}{' with channels_last' if config.channels_last else ''}"
    raise AssertionError(homework.unmeasured_note("AMP_CONFIG", described, ctx.measured_at_home))


def remeasured(config: TrainConfig, observed: Mapping[str, Any], ctx: Context) -> tuple[Any, Any]:
    """The grader's re-measurement of AMP_CONFIG (verdict, expectation), taken once per submission: the
    verified cell grades it, the decision cell holds the home record against it."""
    from perflab.labs import common

    def measure() -> tuple[Any, Any]:
        s = lab03.sizes(ctx.mode)
        return common.verify_against_bar(lab03.baseline_config(ctx.mode), config,
                                         lab03.expectation_name(config.device_type), claim=_claim(observed),
                                         max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds, decision=True)

    return ctx.remembered(("lab03.remeasured", json.dumps(config.to_dict(), sort_keys=True), _claim(observed)),
                          measure)


def recorded_comparisons(config: TrainConfig, ctx: Context) -> list[tuple[float, Any]]:
    """(the CI's low end, where it was made) of every home comparison of AMP_CONFIG's setting that says where
    it was made (`homework.stamp`); a malformed one is left out."""
    from perflab.labs import homework

    setting = (config.amp_dtype, config.channels_last)
    found = []
    for entry in ctx.measured_at_home or ():
        value = entry.get("value")
        if entry.get("kind") != "lab03.compare_precisions" or not isinstance(value, Mapping):
            continue
        for name, recorded in value.items():
            if isinstance(name, str) and candidate_knobs(name) == setting and isinstance(recorded, Mapping) \
                    and isinstance(recorded.get("where"), Mapping):
                try:
                    found.append((homework.comparison_from(recorded).ci().low, recorded["where"]))
                except (TypeError, ValueError, KeyError):
                    continue
    return found


def not_contradicted(config: TrainConfig, observed: Mapping[str, Any], ctx: Context) -> None:
    """Suspicious (0 points, flagged) where the home comparison AMP_CONFIG was decided from, made on this
    machine and workload, reads faster than the grader's re-measurement allows (`homework.contradicted`):
    a record typed in, or one that outlived its code, earns nothing."""
    from perflab.labs import homework

    if ctx.measured_at_home is None or config == lab03.baseline_config(ctx.mode):
        return
    homework.hold_against(recorded_comparisons(config, ctx), lambda: remeasured(config, observed, ctx),
                          lab03.baseline_config(ctx.mode), "AMP_CONFIG")


def judge_verified(observed: Any, ctx: Context) -> Mark:
    from perflab.labs import common

    config = exported_config(observed)
    _first(lab03.config_problems(config, ctx.mode))
    verdict, expectation = remeasured(config, observed, ctx)
    return dataclasses.replace(common.mark_of(verdict, expectation), decision={"config": config.to_dict()})


JUDGES = {
    "test_amp_step_visible": judge_step_visible,
    "test_amp_step_hidden": judge_step_hidden,
    "test_amp_step_scaler": judge_scaler,
    "test_census_visible": judge_census_visible,
    "test_census_hidden": judge_census_hidden,
    "test_amp_config": judge_config,
    "test_amp_verified": judge_verified,
    **{f"test_predict_{key}": predict.judger(name, why) for key, (name, why) in lab03.PREDICTIONS.items()},
}


def check(grade_id: str, namespace: Mapping[str, Any], seed: int = 0) -> None:
    """A solution notebook's hidden block: this cell's probe and judge, in this process."""
    check_here(lab03.LAB, grade_id, namespace, seed)


if __name__ == "__main__":
    print(f"wrote {write_visible_census()}")
