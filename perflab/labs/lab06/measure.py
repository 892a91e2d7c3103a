"""Lab 6's measurements: what the notebook times and counts on the way to FINAL.

Screening one change (`screen`), timing the ablation chain in interleaved rounds (`measure_chain`; with
each kept change left out beside it, `measure_ablation`),
the `baseline` results section from block times (`step_stat`), the short fixed-seed training run
behind the accuracy gate (`measure_accuracy`) and model FLOPs utilisation (`mfu`). The notebook uses
them; the grader-only judges run `measure_accuracy` on the exported FINAL. Imports the contract
`perflab.labs.lab06`, never the reverse. The memory model is `perflab.labs.lab06.memory`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from perflab import env, stats
from perflab.labs.lab06 import CI_SEED, QUANTILE, LabSizes, baseline_config, sizes
from perflab.timing import PRIME_CALLS, interleaved_blocks
from perflab.workload import AMP_DTYPES, TrainConfig

# Every timed block of the ablation and the screening is primed by one untimed step of its own
# configuration (perflab.timing.interleaved_blocks says why): without it, an A/A test favoured its copy.
PRIME_STEPS = PRIME_CALLS


def _timed_blocks(configs: Sequence[TrainConfig], rounds: int, block_steps: int, warmup: int,
                  desc: str) -> tuple[list[list[float]], Any]:
    """Build each configuration, warm it up, and time `interleaved_blocks` of their training steps.

    With loader workers, each block is primed and lengthened to time the loader's sustained pace
    (`perflab.verify.pace`: on a GPU a short block reads the batches queued while the others ran); its
    seconds are then scaled back to `block_steps` steps, so every block time keeps that meaning."""
    from perflab import workload
    from perflab.labs import common
    from perflab.verify import pace

    queue = max(pace.queued_batches(c.num_workers, c.prefetch_factor) for c in configs)
    timed_steps = max(block_steps, pace.min_block_steps(queue))
    prime = max(PRIME_STEPS, pace.lead_in(queue))

    works = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for config in configs:
                work = workload.build(config)
                works.append(work)
                for _ in range(warmup):
                    workload.train_step(work)
                env.synchronize(work.device)
            steps = [lambda w=work: workload.train_step(w) for work in works]
            times = interleaved_blocks(steps, rounds, timed_steps, prime=prime,
                                       sync=lambda i: env.synchronize(works[i].device),
                                       progress=lambda it: common.progress(it, desc=desc))
            scale = block_steps / timed_steps
            return [[t * scale for t in row] for row in times], works[0].device
        finally:
            for work in works:
                work.close()


def screen(current: TrainConfig, candidate: TrainConfig, s: LabSizes | None = None, *,
           warmup: int = 2) -> Any:
    """Time `candidate` against `current` in interleaved primed blocks (`interleaved_blocks`): a
    `perflab.timing.Comparison` (A = current, B = candidate; `.speedup`, `.ci()`)."""
    from perflab import timing
    from perflab.labs import homework

    s = s or sizes()

    def timed(blocks: int, warm: int) -> Any:
        (a, b), device = _timed_blocks([current, candidate], blocks, s.block_steps, warm, "screening")
        return timing.Comparison(tuple(a), tuple(b), s.block_steps, labels=("kept so far", "with the change"),
                                 device=str(device), threads=env.set_threads(None), warmup=warm,
                                 quantile=QUANTILE)

    changes = homework.change_groups(current, candidate)
    return homework.measured("lab06.screen", {"changes": changes}, lambda: timed(s.screen_blocks, warmup),
                             quick=lambda: timed(homework.QUICK_BLOCKS, 1), encode=homework.comparison_value,
                             decode=homework.comparison_from, what=f"screening of {', '.join(changes) or 'nothing'}")


def measure_chain(chain: Sequence[tuple[str, TrainConfig]], s: LabSizes | None = None, *,
                  warmup: int = 2) -> dict[str, list[float]]:
    """Block times of every configuration of `chain`, timed in interleaved primed rounds.

    Each round times one block (`s.block_steps` training steps ended by a device sync, after
    PRIME_STEPS untimed ones) of every configuration, starting at a different one each round, so that
    all of them share the machine's drift and block i of any two are paired. Returns {name: [seconds of
    each block]} in chain order.
    """
    from perflab.labs import homework

    s = s or sizes()
    names = [name for name, _ in chain]
    if len(set(names)) != len(names):
        raise ValueError(f"chain: names must be unique, got {names}")
    configs = [config for _, config in chain]

    def timed(blocks: int, warm: int) -> dict[str, list[float]]:
        times, _ = _timed_blocks(configs, blocks, s.block_steps, warm, "ablation rounds")
        return dict(zip(names, times, strict=True))

    def decode(value: Any) -> dict[str, list[float]]:
        times = {name: [float(t) for t in value[name]] for name in names}
        if len({len(t) for t in times.values()}) != 1 or any(not (t > 0) for row in times.values() for t in row):
            raise ValueError("chain record: block times of unequal length or not positive")
        return times

    key = {"names": names, "changes": [homework.change_groups(a, b) for a, b in zip(configs, configs[1:], strict=False)]}
    return homework.measured("lab06.chain", key, lambda: timed(s.chain_blocks, warmup),
                             quick=lambda: timed(homework.QUICK_BLOCKS, 1), encode=dict, decode=decode,
                             what="ablation rounds")


def measure_ablation(chain: Sequence[tuple[str, TrainConfig]], s: LabSizes | None = None, *,
                     leave_out: Sequence[str] = (), warmup: int = 2) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """The ablation and the leave-one-out in one set of interleaved primed rounds (as `measure_chain`).

    Returns the block times of every configuration of `chain` ({name: [seconds of each block]}, in chain
    order), and for each change named in `leave_out` a `perflab.timing.Comparison` of FINAL (the chain's
    last configuration, B) against FINAL without that change (A, `lab06.without`), paired by round. A
    configuration is timed once for every question that needs it: FINAL without its last change is the
    configuration before it, so k kept changes time 2k configurations, where k screenings beside the
    chain timed 3k + 1.
    """
    from perflab import timing
    from perflab.labs import homework
    from perflab.labs.lab06 import without

    s = s or sizes()
    names = [name for name, _ in chain]
    if len(set(names)) != len(names):
        raise ValueError(f"chain: names must be unique, got {names}")
    configs = [config for _, config in chain]
    left_out: dict[str, int] = {}
    for name in leave_out:
        config = without(chain, name, mode=s.mode)
        if config not in configs:
            configs.append(config)
        left_out[name] = configs.index(config)

    def timed(blocks: int, warm: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
        times, device = _timed_blocks(configs, blocks, s.block_steps, warm, "ablation rounds")
        final = tuple(times[len(chain) - 1])
        comparisons = {name: timing.Comparison(tuple(times[i]), final, s.block_steps,
                                               labels=(f"FINAL without {name}", "FINAL"), device=str(device),
                                               threads=env.set_threads(None), warmup=warm, quantile=QUANTILE)
                       for name, i in left_out.items()}
        return dict(zip(names, times[:len(chain)], strict=True)), comparisons

    def encode(result: tuple[dict[str, list[float]], dict[str, Any]]) -> dict[str, Any]:
        return {"times": result[0], "left_out": {k: homework.comparison_value(c) for k, c in result[1].items()},
                "block_steps": s.block_steps,
                "where": homework.stamp(baseline_config(s.mode))}  # whether the grader may hold it against its own

    def decode(value: Any) -> tuple[dict[str, list[float]], dict[str, Any]]:
        times = {name: [float(t) for t in value["times"][name]] for name in names}
        if len({len(t) for t in times.values()}) != 1 or any(not (t > 0) for row in times.values() for t in row):
            raise ValueError("ablation record: block times of unequal length or not positive")
        return times, {name: homework.comparison_from(value["left_out"][name]) for name in left_out}

    key = {"names": names, "changes": [homework.change_groups(a, b) for a, b in zip(configs, configs[1:len(chain)], strict=False)],
           "leave_out": list(left_out)}
    return homework.measured("lab06.ablation", key, lambda: timed(s.chain_blocks, warmup),
                             quick=lambda: timed(homework.QUICK_BLOCKS, 1), encode=encode, decode=decode,
                             what="ablation rounds")


def step_stat(block_times: Sequence[float], block_steps: int, batch_size: int) -> dict[str, Any]:
    """The `baseline` results section from block times: step time and throughput with 95% CIs."""
    per_step = np.asarray(block_times, dtype=float) / block_steps
    ci = stats.bootstrap_ci(per_step, stats.quantile_of(QUANTILE), seed=CI_SEED)
    return {"step_time": {"median": ci.estimate, "ci": [ci.low, ci.high], "unit": "s",
                          "statistic": f"p{QUANTILE * 100:.0f} of blocks", "samples": per_step.tolist()},
            "throughput": {"median": batch_size / ci.estimate, "ci": [batch_size / ci.high, batch_size / ci.low],
                           "unit": "img/s", "statistic": "batch size / step_time",
                           "samples": (batch_size / per_step).tolist()}}


def measure_accuracy(baseline: TrainConfig, final: TrainConfig, steps: int,
                     image_size: int | None = None) -> dict[str, Any]:
    """Train each configuration `steps` fixed-seed steps from the same initial model (at `image_size`, if
    given, for both), then evaluate both on the evaluation images (perflab.workload.evaluate)."""
    from perflab.labs import homework

    def decode(value: Any) -> dict[str, Any]:
        out = {k: float(value[k]) for k in ("baseline", "final", "baseline_loss", "final_loss")}
        return {**out, "steps": int(value["steps"]), "n_eval": int(value["n_eval"])}

    return homework.measured("lab06.accuracy", {"changes": homework.change_groups(baseline, final)},
                             lambda: accuracy_run(baseline, final, steps, image_size),
                             quick=lambda: accuracy_run(baseline, final, min(steps, homework.QUICK_STEPS), image_size),
                             encode=dict, decode=decode, what="accuracy run")


def accuracy_run(baseline: TrainConfig, final: TrainConfig, steps: int, image_size: int | None = None) -> dict[str, Any]:
    """`measure_accuracy` itself, never recorded or replayed: what the grader's own judge runs."""
    from perflab import dataset

    if image_size is not None:
        baseline, final = baseline.replace(image_size=image_size), final.replace(image_size=image_size)
    out: dict[str, Any] = {"steps": steps}
    for key, config in (("baseline", baseline), ("final", final)):
        out[key], out[f"{key}_loss"] = trained_accuracy(config, steps)
    out["n_eval"] = len(dataset.load(baseline.data, image_size=baseline.image_size, train=False))
    return out


@functools.lru_cache(maxsize=8)
def trained_accuracy(config: TrainConfig, steps: int) -> tuple[float, float]:
    """(evaluation accuracy, last training loss) of `config` after `steps` fixed-seed steps. Kept per
    process: the grader trains the same baseline for every lab 6 submission (about 23 s of a 2-core CPU
    at grade sizes), and a seeded run on one machine gives the same figures every time."""
    from perflab import workload

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        work = workload.build(config)
        try:
            losses = [workload.train_step(work)[0] for _ in range(steps)]
            return float(workload.evaluate(work)), float(losses[-1])
        finally:
            work.close()


def mfu(config: TrainConfig, step_seconds: float) -> dict[str, Any]:
    """The `mfu` results section: FLOPs of one training step of `config` over `step_seconds`, against the
    device's peak at the step's compute dtype (spec sheet for known GPUs, else measured)."""
    import torch
    from torch.nn import functional as F

    from perflab import counting, roofline, workload

    device = env.pick_device(config.device)
    model = workload.build_model(config.replace(checkpoint_stages=0, channels_last=False), 10)
    images = torch.randn(config.batch_size, 3, config.image_size, config.image_size, device=device)
    labels = torch.randint(0, 10, (config.batch_size,), device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flops = counting.count_flops(model, images, backward=True,
                                     loss_fn=lambda logits: F.cross_entropy(logits, labels)).train
        dtype = AMP_DTYPES[config.amp_dtype] if config.amp_dtype else torch.float32
        peaks = roofline.device_peaks(device, dtype)
    try:
        peak = peaks.peak_flops(dtype)
    except ValueError:  # a spec sheet without this dtype: the fastest it lists is the honest ceiling
        peak = max(peaks.flops.values())
    return {"achieved_flops_per_s": flops / step_seconds, "peak_flops": float(peak),
            "flops_per_step": int(flops), "step_seconds": step_seconds,
            "dtype": str(dtype).removeprefix("torch."), "peak_source": str(getattr(peaks, "source", ""))}
