"""Lab 1's probes: what the grader reads from the student's notebook, one per autograded cell.

Each probe runs the student's functions on the cases of `perflab.labs.lab01.checks` drawn from the
grader's seed and returns the raw outputs, as data; the grader-only `perflab/labs/lab01/judges/`
judges them. The mystery pipeline's probes are `perflab.labs.lab01.mystery`'s.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from perflab.grading.probing import encode, outcome
from perflab.labs.lab01 import lab_config, preprocess_leaky, random_batch, reset_leak
from perflab.labs.lab01 import mystery as lab01_mystery
from perflab.labs.lab01.checks import (
    TIMER_BAD_ARGS,
    VISIBLE_BOTTLENECK,
    VISIBLE_ROOFLINE,
    VISIBLE_TIMER,
    bottleneck_cases,
    build_conv,
    build_flops_models,
    build_linear,
    build_memory_model,
    conv_bytes_cases,
    counting_cases,
    lab_layers,
    memory_cases,
    model_flops_case,
    observe_leaks,
    observe_preprocess,
    observe_profile_training,
    observe_timer,
    observe_verdict_grid,
    profile_active_steps,
    quiet_call,
    roofline_cases,
    timer_cases,
    trace_names,
    visible_memory_net,
)


def _probe_timer_visible(answers: Any, seed: int) -> dict[str, Any]:
    return observe_timer(answers["time_callable"], VISIBLE_TIMER)


def _probe_timer_hidden(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["time_callable"]
    cases = [observe_timer(fn, case) for case in timer_cases(seed)]
    bad = [outcome(fn, lambda: None, **args) for args in TIMER_BAD_ARGS]
    plain = outcome(fn, lambda: sum(range(100)), warmup=1, repeats=3)
    return {"cases": cases, "bad": bad, "plain": plain}


def _probe_counting_visible(answers: Any, seed: int) -> dict[str, Any]:
    from perflab import workload

    stem = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
    fc = nn.Linear(512, 1000)
    resnet = workload.build_model(workload.TrainConfig(model="resnet18", device="cpu"), num_classes=1000)  # the judge's count
    return {"conv_flops": quiet_call(answers["conv2d_flops"], stem, (1, 3, 224, 224)),
            "conv_params": quiet_call(answers["conv2d_params"], stem),
            "linear_flops": quiet_call(answers["linear_flops"], fc, (8, 512)),
            "linear_params": quiet_call(answers["linear_params"], fc),
            "model_flops": quiet_call(answers["model_forward_flops"], resnet, (1, 3, 224, 224))}


def _probe_counting_layers(answers: Any, seed: int) -> dict[str, Any]:
    cases = counting_cases(seed)
    conv_flops, linear_flops = answers["conv2d_flops"], answers["linear_flops"]
    conv_params, linear_params = answers["conv2d_params"], answers["linear_params"]
    return {"conv_flops": [quiet_call(conv_flops, *build_conv(s)) for s in cases["convs"]],
            "linear_flops": [quiet_call(linear_flops, *build_linear(s)) for s in cases["linears"]],
            "conv_params": [quiet_call(conv_params, build_conv(s)[0]) for s in cases["param_convs"]],
            "linear_params": [quiet_call(linear_params, build_linear(s)[0]) for s in cases["param_linears"]]}


def _probe_counting_model(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["model_forward_flops"]
    case = model_flops_case(seed)
    return [quiet_call(fn, model, tuple(case["shape"])) for model in build_flops_models(case)]


def _probe_memory_visible(answers: Any, seed: int) -> dict[str, Any]:
    torch.manual_seed(0)
    return quiet_call(answers["training_memory_budget"], visible_memory_net(), "adam", (2, 3, 4, 4))


def _probe_memory_hidden(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["training_memory_budget"]
    out = []
    for case in memory_cases(seed):
        model = build_memory_model(case)
        torch.manual_seed(case["torch_seed"])
        out.append(quiet_call(fn, model, case["optimizer"], tuple(case["shape"])))
    return out


def _probe_leak_visible(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["find_leak"]
    got = outcome(fn, preprocess_leaky, lambda: random_batch(0, n=4, size=16), calls=20)
    reset_leak()
    return got


def _probe_leak_hidden(answers: Any, seed: int) -> list[dict[str, Any]]:
    return observe_leaks(answers["find_leak"], seed)


def _probe_preprocess(answers: Any, seed: int) -> dict[str, Any]:
    return observe_preprocess(answers["preprocess_fixed"], seed)


def _probe_trace_visible(answers: Any, seed: int) -> dict[str, Any]:
    return {"active": encode(answers["ACTIVE"]), "names": trace_names(answers["TRACE"])}


def _probe_profile_hidden(answers: Any, seed: int) -> dict[str, Any]:
    return observe_profile_training(answers["profile_training"], lab_config(), profile_active_steps(seed))


def _probe_roofline_visible(answers: Any, seed: int) -> dict[str, Any]:
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
    verdict = answers["roofline_verdict"]
    return {"bytes": quiet_call(answers["conv2d_bytes"], conv, (1, 64, 56, 56)),
            "verdicts": [quiet_call(verdict, *args) for args in VISIBLE_ROOFLINE]}


def _probe_roofline_hidden(answers: Any, seed: int) -> dict[str, Any]:
    conv_bytes, verdict = answers["conv2d_bytes"], answers["roofline_verdict"]
    return {"bytes": [quiet_call(conv_bytes, *build_conv(spec), size) for spec, size in conv_bytes_cases(seed)],
            "verdicts": [quiet_call(verdict, *args) for args in roofline_cases(seed)]}


def _probe_bottleneck_visible(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["bottleneck_verdict"]
    return [quiet_call(fn, *args) for args in VISIBLE_BOTTLENECK]


def _probe_bottleneck_rule(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["bottleneck_verdict"]
    return [quiet_call(fn, *args) for args in bottleneck_cases(seed)]


def _probe_bottleneck_here(answers: Any, seed: int) -> dict[str, Any]:
    return observe_verdict_grid(answers["bottleneck_verdict"], lab_layers(lab_config()))


PROBES = {
    "time_callable_visible": _probe_timer_visible,
    "time_callable_hidden": _probe_timer_hidden,
    "counting_visible": _probe_counting_visible,
    "counting_hidden_layers": _probe_counting_layers,
    "counting_hidden_model": _probe_counting_model,
    "memory_budget_visible": _probe_memory_visible,
    "memory_budget_hidden": _probe_memory_hidden,
    "find_leak_visible": _probe_leak_visible,
    "find_leak_hidden": _probe_leak_hidden,
    "preprocess_fixed_check": _probe_preprocess,
    "profile_training_visible": _probe_trace_visible,
    "profile_training_hidden": _probe_profile_hidden,
    "roofline_visible": _probe_roofline_visible,
    "roofline_hidden": _probe_roofline_hidden,
    "bottleneck_visible": _probe_bottleneck_visible,
    "bottleneck_rule_hidden": _probe_bottleneck_rule,
    "bottleneck_here": _probe_bottleneck_here,
    **lab01_mystery.PROBES,
}
