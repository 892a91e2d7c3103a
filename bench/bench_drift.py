"""How far an honest candidate's losses drift from its baseline's over the steps the verifier times.

    python bench/bench_drift.py [--ids alice bob carol dave erin] [--steps 132]

The verifier holds student code to the baseline's loss at every step both sides ran
(`perflab.verify.tolerance.STUDENT_TRAJECTORY_RTOL`). This measures, on the verifier's thread count:

1. each id's planted mystery pipeline against its reference fix (every bug removed), step for step;
2. lab 4's plain training run against the same run with every stage checkpointed (student code);
3. the same mystery pipelines against cheating fixes (forward only after the gate, every other update
   skipped, the optimizer frozen after warm-up), to show the margin the tolerance leaves.

`--steps` defaults to the most a verification can time: the gate's steps plus MAX_PAIRS blocks of the
block size the pipeline's step time gives (lab 1's graded sizes: 2 steps a block on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from typing import Any

Step = Callable[[], tuple[Any, Any]]


def _losses(step: Step, steps: int) -> list[float]:
    return [float(step()[0]) for _ in range(steps)]


def max_rel(a: list[float], b: list[float]) -> tuple[float, int]:
    """The largest |a-b|/|a| over the steps, and the step (1-based) it happened at."""
    worst, at = 0.0, 0
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        rel = abs(x - y) / max(abs(x), 1e-12)
        if rel > worst:
            worst, at = rel, k + 1
    return worst, at


def mystery_cheat(student: str, data: str, how: str, warm: int = 4) -> Step:
    """The reference fix of `student`'s pipeline, cheating after `warm` steps as `how` says."""
    import torch

    from perflab.labs.lab01.judges import mystery_truth

    trainer = mystery_truth.pipeline(student, bugs=()).module().Trainer(0, data)
    count = [0]
    honest = trainer.step

    def step() -> tuple[Any, Any]:
        count[0] += 1
        if count[0] <= warm:
            return honest()
        if how == "skip_every_other" and count[0] % 2:
            return honest()
        if how == "frozen_optimizer":
            for group in trainer.optimizer.param_groups:
                group["lr"] = 0.0
            return honest()
        images, labels, indices = trainer.next_batch()
        with torch.no_grad():
            loss = trainer.criterion(trainer.model(images), labels)
        return loss, indices.tolist()

    return step


def checkpoint_stages(model: Any, stages: Any) -> Any:
    """Every stage under non-reentrant activation checkpointing (lab 4's task, done plainly)."""
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class Stage(nn.Module):
        def __init__(self, stage: nn.Module) -> None:
            super().__init__()
            self.stage = stage

        def forward(self, x: Any) -> Any:
            return checkpoint(self.stage, x, use_reentrant=False)

    for name in stages:
        setattr(model, name, Stage(getattr(model, name)))
    return model


def lab4_drift(device: str, steps: int, mode: str = "grade") -> tuple[float, int]:
    """Lab 4's plain training run against the same run with every stage checkpointed, at `mode`'s lab 4
    workload on `device`: the largest relative loss difference and its step (bench/gpu_check.py runs it
    on a GPU, where cuDNN's reductions need not be deterministic)."""
    from perflab.labs import lab04

    config = lab04.baseline_config(mode).replace(device=device)
    plain = _losses(lab04.checkpointed_step(0, config.to_dict(), lambda m, s: m, lab04.GRADED_STAGES), steps)
    ckpt = _losses(lab04.checkpointed_step(0, config.to_dict(), checkpoint_stages, lab04.GRADED_STAGES), steps)
    return max_rel(plain, ckpt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", nargs="+", default=["alice", "bob", "carol", "dave", "erin"])
    parser.add_argument("--steps", type=int, default=132)
    parser.add_argument("--cheats", action="store_true", help="also measure the cheating fixes")
    parser.add_argument("--device", default="cpu", help="where lab 4's runs train (the mystery pipeline is CPU only)")
    args = parser.parse_args(argv)

    import torch

    from perflab import mystery
    from perflab.labs.lab01.judges import mystery_truth
    from perflab.verify.protocol import VERIFY_THREADS

    torch.set_num_threads(VERIFY_THREADS)
    data = mystery.sizes_for()[0]
    n = args.steps
    print(f"{n} steps each, torch threads {VERIFY_THREADS}; max |relative loss difference| (at step)")
    worst = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for student in args.ids:
            planted = _losses(mystery.planted_step(0, student, data=data), n)
            fixed = _losses(mystery_truth.pipeline(student, bugs=()).module().make_step(0, data), n)
            rel, at = max_rel(planted, fixed)
            worst = max(worst, rel)
            bugs = ", ".join(p.key for p in mystery_truth.truth(student).planted)
            print(f"  mystery {student:8s} ({bugs}): honest fix {rel:.3g} (step {at})", flush=True)
            if args.cheats:
                for how in ("forward_only", "skip_every_other", "frozen_optimizer"):
                    cheat = _losses(mystery_cheat(student, data, how), n)
                    crel, cat = max_rel(planted, cheat)
                    print(f"      cheat {how:18s} {crel:.3g} (step {cat})", flush=True)
        rel, at = lab4_drift(args.device, n)
        worst = max(worst, rel)
        print(f"  lab 4 checkpointed vs plain on {args.device}: {rel:.3g} (step {at})")
    print(f"largest honest drift: {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
