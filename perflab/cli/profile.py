"""`perflab profile [knobs…]`: profile the ResNet-18 training workload and diagnose its bottleneck.

Every `TrainConfig` field is a flag, generated from the dataclass so the two cannot drift
(`batch_size` is `--batch-size N`, booleans are `--flag/--no-flag`, optional fields accept
`none`). `--size` picks the data set and the mode's image size, batch and step count; any knob
given overrides it. The measurements are `perflab.training_profile.profile_training`; this
module parses, prints and saves.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perflab.cli import UserError

if TYPE_CHECKING:
    from perflab.training_profile import ProfilePlan, TrainingProfile

# --size -> the run mode whose sizes it takes (docs/DESIGN.md, "How the labs run").
SIZES = {"tiny": "tiny", "small": "laptop", "photo": "laptop", "full": "full"}
# Steps timed for throughput when --steps is not given. Small: about a minute on a 2-core laptop
# for the whole profile (a 64 px step of 32 images takes about half a second there).
DEFAULT_STEPS = {"tiny": 3, "laptop": 10, "full": 50, "grade": 3}

# Fields whose default comes from --size rather than from TrainConfig.
_FROM_SIZE = ("data", "image_size", "batch_size")
_HELP = {
    "data": "data set: tiny, small, photo, full, an ImageFolder path or cifar10:PATH",
    "batch_size": "images per micro-batch",
    "image_size": "side of the square training crop, at least 32",
    "num_workers": "DataLoader worker processes (0: load in the training process)",
    "pin_memory": "page-locked batches for non-blocking host-to-device copies (CUDA)",
    "persistent_workers": "keep workers alive across epochs",
    "prefetch_factor": "batches each worker keeps in flight",
    "gpu_augment": "augment on the device (the batch's crop, flip and colour jitter in batched tensor ops)",
    "data_on_device": "decode the training set once into device memory and gather each batch there (needs "
                      "--gpu-augment and no workers)",
    "amp_dtype": "autocast dtype: bf16 or fp16",
    "channels_last": "NHWC memory format for model and inputs",
    "checkpoint_stages": "the first N ResNet stages (0-4) run under activation checkpointing",
    "accumulation_steps": "micro-batches per optimizer step",
    "compile_mode": "torch.compile mode: default, reduce-overhead or max-autotune",
    "device": "cuda, mps or cpu (default: the best available)",
    "threads": "torch intra-op CPU threads",
}


def _knob_fields() -> list[tuple[str, type, bool, Any]]:
    """(name, base type, optional, default) of every TrainConfig field."""
    from perflab.workload import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    out = []
    for f in dataclasses.fields(TrainConfig):
        hint = hints[f.name]
        args = typing.get_args(hint)
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
        base = next(a for a in args if a is not type(None)) if optional else hint
        out.append((f.name, base, optional, f.default))
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="profile ResNet-18 training with any knob set and diagnose the bottleneck",
        description="Measure throughput (with its CI) and its share of the ceiling (the same step on one batch "
                    "already on the device), the per-step phases, parameters, FLOPs, the "
                    "memory budget, the top ops, roofline verdicts per layer, and diagnose the bottleneck.",
    )
    p.add_argument("--size", default=None, metavar="tiny|small|photo|full|PATH",
                   help="data set and sizes: tiny (tests), small (laptop: image and batch of the laptop "
                        "mode), photo (photograph-sized JPEGs, laptop sizes), full (GPU), or a folder (an ImageFolder, with this machine's mode sizes); "
                        "default: from the run mode")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps timed for throughput (phases get half, the trace a few)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write a results file")
    p.add_argument("--trace", type=Path, default=None, metavar="FILE",
                   help="write a Chrome/Perfetto trace (open in ui.perfetto.dev)")
    p.add_argument("--memory-snapshot", type=Path, default=None, metavar="FILE",
                   help="CUDA only: dump the allocator history of the traced steps (pytorch.org/memory_viz)")
    p.add_argument("--no-peak", action="store_true",
                   help="skip the peak-memory run (on CPU it starts a child process)")
    knobs = p.add_argument_group("training knobs (every TrainConfig field)")
    for name, base, optional, default in _knob_fields():
        flags = ["--" + name.replace("_", "-")]
        text = _HELP.get(name, f"TrainConfig.{name}")
        shown = "from --size" if name in _FROM_SIZE else default
        if base is bool:
            knobs.add_argument(*flags, dest=f"knob_{name}", action=argparse.BooleanOptionalAction,
                               default=None, help=f"{text} (default {shown})")
        else:
            metavar = {int: "N", float: "X"}.get(base, "VALUE")
            knobs.add_argument(*flags, dest=f"knob_{name}", default=None, metavar=metavar,
                               help=f"{text} (default {shown}{'; none to unset' if optional else ''})")
    p.set_defaults(func=run)


def _convert(name: str, base: type, optional: bool, text: str) -> Any:
    """A flag's text as the field's type; ValueError naming the field."""
    if optional and text.strip().lower() == "none":
        return None
    if base is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name}: expected an integer, got {text!r}") from None
    if base is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{name}: expected a number, got {text!r}") from None
    return text


def config_from_args(args: argparse.Namespace) -> tuple[Any, str]:
    """The TrainConfig the flags describe and the run mode its sizes came from."""
    from perflab import env
    from perflab.workload import TrainConfig

    size = args.size
    if size is None:
        mode = env.run_mode()
        data = env.mode_sizes(mode).data
    elif size in SIZES:
        mode, data = SIZES[size], size
    else:
        if not Path(size).expanduser().is_dir():
            raise UserError(f"--size: {size!r} is not tiny, small, photo, full or an existing folder")
        mode, data = env.run_mode(), str(Path(size).expanduser())
    sizes = env.mode_sizes(mode)
    values: dict[str, Any] = {"data": data, "image_size": sizes.image_size, "batch_size": sizes.batch_size}
    for name, base, optional, _ in _knob_fields():
        given = getattr(args, f"knob_{name}")
        if given is None:
            continue
        values[name] = given if base is bool else _convert(name, base, optional, given)
    return TrainConfig(**values), mode


def _check_data(config: Any) -> None:
    from perflab import dataset

    if config.data in SIZES:
        dataset.data_root(config.data)  # FileNotFoundError naming the folder and the build command
    elif not config.data.startswith("cifar10:") and not Path(config.data).expanduser().exists():
        raise FileNotFoundError(f"{config.data}: no such data folder (--data or --size)")


def run(args: argparse.Namespace) -> int:
    from perflab import tracing, training_profile

    config, mode = config_from_args(args)
    steps = args.steps if args.steps is not None else DEFAULT_STEPS[mode]
    plan = training_profile.ProfilePlan.for_steps(steps)
    if args.memory_snapshot is not None and config.device_type != "cuda":
        raise UserError("--memory-snapshot: the allocator history exists on CUDA only")
    _check_data(config)

    stages = ["throughput", "ceiling", "peak memory", "phases", "counting", "trace", "roofline"]
    bar = tracing.progress_bar(None, total=len(stages), desc="profile", unit="part")
    seen: list[str] = []

    def stage(name: str) -> None:
        if seen:
            bar.update(1)
        seen.append(name)
        bar.set_description(f"profile: {name}")

    try:
        result = training_profile.profile_training(config, plan, trace_path=args.trace,
                                                   memory_snapshot_path=args.memory_snapshot,
                                                   peak=not args.no_peak, stage=stage)
        bar.update(1)
    finally:
        bar.close()
    print(render(result, plan))
    if args.json is not None:
        from perflab import results

        path = results.save(args.json, "profile", result.sections(), config=config, machine=result.machine)
        print(f"\nresults written to {path}")
    return 0


def _section(title: str) -> str:
    return f"\n== {title} " + "=" * max(3, 70 - len(title))


def render(result: TrainingProfile, plan: ProfilePlan) -> str:
    """The profile as text, in sections, for a terminal."""
    from perflab import counting, memory, roofline
    from perflab.stats import format_time

    cfg = result.config
    lines = [f"perflab profile: ResNet-18 training on {cfg.data!r}, {cfg.image_size} px, "
             f"batch {cfg.batch_size}" + (f" x {cfg.accumulation_steps} accumulated" if cfg.accumulation_steps > 1 else "")]
    changed = {k: v for k, v in cfg.to_dict().items()
               if v != type(cfg).__dataclass_fields__[k].default and k not in ("data", "image_size", "batch_size")}
    if changed:
        lines.append("knobs: " + ", ".join(f"{k}={v}" for k, v in changed.items()))

    lines += [_section("machine"), result.machine.describe()]

    m = result.step_time
    lines += [_section("throughput (samples over the wall time of the timed steps)"), *result.rate.describe(),
              f"step time median {format_time(m.median)}, IQR {format_time(m.iqr)}, "
              f"{m.n} timed steps after {m.warmup} warm-up ({cfg.samples_per_step} samples per step)"]
    lines += [f"WARNING: {w}" for w in m.warnings]
    if (ceiling := result.ceiling_line()) is not None:
        lines.append(ceiling)
    if (util := result.gpu_utilization.describe()) is not None:
        lines.append(util)

    lines += [_section(f"phases (per step, device-synchronised, {result.phases.steps} steps)"),
              result.phases.table()]

    fwd_sample, train_sample = result.flops_per_sample
    fwd_step, train_step = result.flops_per_step
    param_bytes = result.memory.parameters
    lines += [_section("parameters"), f"{result.parameters:,} ({memory.format_bytes(param_bytes)})"]
    lines += [_section("FLOPs (FlopCounterMode, 2 per multiply-add)"),
              f"{'':<18}{'per sample':>14}{'per step':>14}",
              f"{'forward':<18}{counting.format_count(fwd_sample, 'FLOP'):>14}{counting.format_count(fwd_step, 'FLOP'):>14}",
              f"{'forward+backward':<18}{counting.format_count(train_sample, 'FLOP'):>14}"
              f"{counting.format_count(train_step, 'FLOP'):>14}",
              f"achieved {counting.format_count(result.achieved_flops_per_s, 'FLOP/s')} "
              "(forward+backward per step over the wall time of the timed steps)"]
    if cfg.checkpoint_stages:
        lines.append("(forward+backward includes the forward recomputed by checkpointing)")

    lines += [_section("memory budget (one micro-batch)"), result.memory.table()]
    if result.peak is not None:
        lines.append(str(result.peak))

    lines += [_section("top ops (torch.profiler)"), result.trace.table(10)]
    if result.trace.trace_path is not None:
        lines.append(f"Chrome/Perfetto trace: {result.trace.trace_path}")
    if result.trace.memory_snapshot_path is not None:
        lines.append(f"CUDA memory snapshot: {result.trace.memory_snapshot_path}")

    peak = result.peaks.peak_flops(result.roofline_dtype)
    lines += [_section("roofline (conv and linear layers)"),
              f"device peaks ({result.peaks.source}, {result.roofline_dtype}): "
              f"{counting.format_count(peak, 'FLOP/s')}, {counting.format_count(result.peaks.bandwidth, 'B/s')}, "
              f"ridge {peak / result.peaks.bandwidth:.1f} FLOP/B",
              roofline.verdict_table(result.layers),
              f"achieved {result.achieved_flops_per_s / peak:.1%} of the peak over the whole step"]
    if result.achieved_flops_per_s > peak:
        lines.append("WARNING: the step ran faster than the measured peak: the machine was busy while the "
                     "peaks were measured, so the verdicts are unreliable; profile again on a quiet machine.")

    lines += [_section("diagnosis"), result.diagnosis.describe()]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    from perflab.cli import main

    sys.exit(main(["profile", *sys.argv[1:]]))
