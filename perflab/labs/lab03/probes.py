"""Lab 3's probes: what the grader reads from a notebook (perflab.grading.probing).

Each autograded cell's probe runs the student's functions on problems drawn from the grader's seed
(`perflab.labs.lab03.problems_for`) and returns what they did, as data (`lab03_checks.observe_*`,
`lab03_census.observe_census`); the grader-only judges (perflab/labs/lab03/judges/) draw the same
problems, compute the FP32 references and the expected census, and decide (`*_from`).
"""

from __future__ import annotations

from typing import Any

import torch

from perflab.grading.probing import encode
from perflab.labs import predict
from perflab.labs.lab03 import (
    HIDDEN_CENSUS_PROBLEMS,
    HIDDEN_SCALER_PROBLEMS,
    HIDDEN_STEP_PROBLEMS,
    LOW_PRECISION,
    PREDICTIONS,
    STEP_DTYPES,
    VISIBLE_CENSUS_SEED,
    VISIBLE_SCALER_SEED,
    VISIBLE_STEP_SEED,
    StepFn,
    devices,
    dtype_name,
    problems_for,
)
from perflab.labs.lab03.census import observe_census
from perflab.labs.lab03.checks import observe_low_precision, observe_parity, observe_scaler
from perflab.workload import TrainConfig


def _step_observations(step: StepFn, seed: int, device: str) -> dict[str, Any]:
    return {dtype_name(d): {"parity": observe_parity(step, seed, d, device=device),
                            "low": observe_low_precision(step, seed, d, device=device)} for d in STEP_DTYPES}


def _probe_step_visible(answers: Any, seed: int) -> dict[str, Any]:
    return _step_observations(answers["amp_train_step"], VISIBLE_STEP_SEED, "cpu")


def _probe_step_hidden(answers: Any, seed: int) -> dict[str, Any]:
    step = answers["amp_train_step"]
    return {device: [_step_observations(step, s, device) for s in problems_for(seed, HIDDEN_STEP_PROBLEMS)]
            for device in devices()}


def _probe_scaler(answers: Any, seed: int) -> dict[str, Any]:
    step = answers["amp_train_step"]
    return {"visible": observe_scaler(step, VISIBLE_SCALER_SEED),
            "hidden": {device: [observe_scaler(step, s, device=device)
                                for s in problems_for(seed, HIDDEN_SCALER_PROBLEMS)] for device in devices()}}


def _probe_census_visible(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["dtype_census"]
    return {dtype_name(d): observe_census(fn, VISIBLE_CENSUS_SEED, d) for d in (torch.float32, torch.bfloat16)}


def _probe_census_hidden(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["dtype_census"]
    out: dict[str, Any] = {}
    for device in devices():
        out[device] = {"small": [{dtype_name(d): observe_census(fn, s, d, device=device) for d in STEP_DTYPES}
                                 for s in problems_for(seed, HIDDEN_CENSUS_PROBLEMS)],
                       "resnet": {dtype_name(d): observe_census(fn, seed, d, device=device, resnet=True)
                                  for d in LOW_PRECISION}}
    return out


def _probe_config(answers: Any, seed: int) -> dict[str, Any]:
    config = answers["AMP_CONFIG"]
    return {"type": type(config).__name__, "config": config.to_dict() if isinstance(config, TrainConfig) else None,
            "claim": encode(answers.get("CLAIM"))}


PROBES = {
    "test_amp_step_visible": _probe_step_visible,
    "test_amp_step_hidden": _probe_step_hidden,
    "test_amp_step_scaler": _probe_scaler,
    "test_census_visible": _probe_census_visible,
    "test_census_hidden": _probe_census_hidden,
    "test_amp_config": _probe_config,
    "test_amp_verified": _probe_config,
    **{f"test_predict_{key}": predict.prober(name, why) for key, (name, why) in PREDICTIONS.items()},
}
