"""The whole training workload profiled at once: what `perflab profile` measures and prints.

`profile_training(config, plan)` times training steps, times the same step on one batch already on
the device (the ceiling: what the device gives the step with no data path), measures peak memory and
the phase breakdown, counts FLOPs and parameters, traces the top ops, places the layers on the roofline
and diagnoses the bottleneck; `TrainingProfile` holds the answers and derives rates and the
results-file sections from them. `ProfilePlan` says how many steps each part takes.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from perflab import counting, diagnose, env, memory, roofline, timing, tracing, workload
from perflab.phases import Breakdown, measure_phases
from perflab.throughput import Throughput
from perflab.workload import TrainConfig


@dataclass(frozen=True)
class ProfilePlan:
    """How much work each part of a training profile does (steps are optimizer steps)."""

    steps: int = 10  # timed steps for throughput
    warmup: int = 2
    phase_steps: int = 5
    trace: tuple[int, int, int] = (1, 1, 2)  # torch.profiler schedule (wait, warmup, active)
    peak_steps: int = 2
    ceiling_steps: int = 5  # timed steps of the same step on one batch on the device (after `warmup`)

    @classmethod
    def for_steps(cls, steps: int) -> ProfilePlan:
        """A plan around `steps` timed steps: half as many for the phases, a few traced."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
            raise ValueError(f"steps: must be an integer of at least 2, got {steps!r}")
        return cls(steps=steps, warmup=min(2, steps), phase_steps=max(2, steps // 2),
                   trace=(1, 1, min(3, max(1, steps // 4))), peak_steps=2, ceiling_steps=max(2, steps // 2))


@dataclass(frozen=True)
class Ceiling:
    """The run's own training step (model, optimizer, precision, memory format, checkpointing, compile mode,
    accumulation) on one batch already on the device in the model's layout: no loader, no copy, no
    augmentation. What this device gives the step with no data path; the run's throughput is read as a
    share of it."""

    step_time: timing.Measurement
    samples_per_step: int

    @property
    def rate(self) -> Throughput:
        return Throughput(self.step_time.times, self.samples_per_step)

    @property
    def throughput(self) -> float:
        """Samples per second over the wall time of its timed steps, as the run's own figure is counted."""
        return self.rate.samples_per_second


@dataclass(frozen=True)
class TrainingProfile:
    """Everything `perflab profile` measured on one `TrainConfig`; rates and sections are derived."""

    config: TrainConfig
    machine: env.MachineInfo
    step_time: timing.Measurement
    phases: Breakdown
    parameters: int
    flops: counting.FlopCount  # one micro-batch, forward and forward+backward
    memory: memory.MemoryBudget
    peak: memory.PeakMemory | None
    trace: tracing.TraceResult
    peaks: roofline.DevicePeaks
    roofline_dtype: str
    layers: tuple[roofline.LayerPoint, ...]
    gpu_utilization: tracing.UtilizationSamples
    diagnosis: diagnose.Diagnosis
    batches_per_epoch: int | None = None
    ceiling: Ceiling | None = None

    @property
    def samples_per_step(self) -> int:
        return self.config.samples_per_step

    @property
    def rate(self) -> Throughput:
        """The timed steps as a throughput: samples over their wall time, the median step, the stalls."""
        return Throughput(self.step_time.times, self.samples_per_step, self.batches_per_epoch,
                          self.config.num_workers, self.config.persistent_workers)

    @property
    def throughput(self) -> float:
        """Samples per second over the wall time of the timed steps (every stall included)."""
        return self.rate.samples_per_second

    @property
    def ceiling_share(self) -> float | None:
        """The run's throughput as a share of its ceiling (None where the ceiling was not timed)."""
        return self.throughput / self.ceiling.throughput if self.ceiling is not None else None

    def ceiling_line(self) -> str | None:
        """'your pipeline reaches 56% of what this device gives the same step with no data path (...)'."""
        if self.ceiling is None or self.ceiling_share is None:
            return None
        return (f"your pipeline reaches {self.ceiling_share:.0%} of what this device gives the same step with no "
                f"data path ({self.ceiling.throughput:,.1f} samples/s on one batch already on the device, "
                f"{self.ceiling.step_time.n} timed steps)")

    @property
    def flops_per_sample(self) -> tuple[int, int]:
        """(forward, forward+backward) FLOPs per sample."""
        batch = self.config.batch_size
        return self.flops.forward // batch, self.flops.train // batch

    @property
    def flops_per_step(self) -> tuple[int, int]:
        """(forward, forward+backward) FLOPs per optimizer step (all micro-batches)."""
        k = self.config.accumulation_steps
        return self.flops.forward * k, self.flops.train * k

    @property
    def achieved_flops_per_s(self) -> float:
        """FLOP/s over the wall time of the timed steps, like the throughput (MFU's numerator)."""
        return self.flops_per_step[1] * self.step_time.n / self.rate.wall_seconds

    def roofline_section(self) -> dict[str, Any]:
        flops = sum(p.flops for p in self.layers)
        nbytes = sum(p.bytes for p in self.layers)
        return {
            "peak_flops": self.peaks.peak_flops(self.roofline_dtype),
            "peak_bandwidth": self.peaks.bandwidth,
            "source": self.peaks.source,
            "dtype": self.roofline_dtype,
            "layers": [p.to_dict() for p in self.layers],
            "achieved": {"flops_per_s": self.achieved_flops_per_s,
                         "intensity": flops / nbytes if nbytes else 0.0},
        }

    def sections(self) -> dict[str, Any]:
        """The results-file sections (see `perflab.results`)."""
        fwd_sample, train_sample = self.flops_per_sample
        fwd_step, train_step = self.flops_per_step
        budget = dict(self.memory.to_dict())
        if self.peak is not None:
            budget.update(peak=self.peak.peak_bytes, peak_delta=self.peak.delta, peak_method=self.peak.method)
        return {
            "counts": {"parameters": self.parameters, "flops_forward": fwd_sample,
                       "flops_train": train_sample, "flops_forward_per_step": fwd_step,
                       "flops_train_per_step": train_step, "batch_size": self.config.batch_size,
                       "image_size": self.config.image_size},
            "baseline": {"throughput": self.rate.as_stat(),
                         "median_step_throughput": {"median": self.rate.median_samples_per_second,
                                                    "unit": "samples/s", "statistic": "samples / median step"},
                         "step_time": self.step_time.as_stat()},
            "phases": {"before": dict(self.phases.seconds)},
            "memory_budget": budget,
            "roofline": self.roofline_section(),
            "top_ops": self.trace.to_dict(),
            "mfu": {"achieved_flops_per_s": self.achieved_flops_per_s,
                    "peak_flops": self.peaks.peak_flops(self.roofline_dtype)},
            "bottleneck": self.diagnosis.to_dict(),
            **({"ceiling": {"throughput": self.ceiling.rate.as_stat(), "share": self.ceiling_share}}
               if self.ceiling is not None else {}),
        }


def _run_steps(config: dict[str, Any], steps: int) -> None:
    """Build the workload of `config` and run `steps` steps (module-level: a peak-memory child runs it)."""
    work = workload.build(TrainConfig.from_dict(config))
    try:
        for _ in range(steps):
            workload.train_step(work)
    finally:
        work.close()


def _peak_of_training(config: TrainConfig, steps: int) -> memory.PeakMemory:
    """Peak memory of training steps: the allocator on CUDA/MPS (after one warm-up step), a child's RSS on CPU."""
    device = env.pick_device(config.device)
    if device.type == "cpu":
        return memory.peak_memory(_run_steps, device, config.to_dict(), steps)
    work = workload.build(config)
    try:
        workload.train_step(work)
        return memory.peak_memory(lambda: [workload.train_step(work) for _ in range(steps)], device)
    finally:
        work.close()


def _time_steps(work: workload.Workload, plan: ProfilePlan,
                device: torch.device) -> tuple[timing.Measurement, tuple[float, float]]:
    """Seconds per consecutive training step (unsynchronised inside the step, synchronised at its end) and
    the timed window: `time.perf_counter()` at the first timed step's start and after the last one's end
    (GPU utilisation is read over it)."""
    calls = itertools.count()
    start: list[float] = []

    def step() -> None:
        if next(calls) == plan.warmup:  # the first timed call: the warm-up and its sync are behind
            start.append(time.perf_counter())
        workload.train_step(work)

    measured = timing.benchmark(step, warmup=plan.warmup, repeats=plan.steps, device=device, label="train step")
    env.synchronize(device)
    return measured, (start[0], time.perf_counter())


def _time_ceiling(work: workload.Workload, plan: ProfilePlan, device: torch.device) -> Ceiling:
    """The run's own `train_step`, its model (compiled once already), optimizer, autocast and scaler, fed
    its next batch, copied, augmented and in the model's layout once, then again at every step."""
    images, labels, index = work.next_batch()
    images, labels = work.on_device(images, labels)
    fed = dataclasses.replace(work, loader=itertools.repeat((images, labels, index)), augment=None,
                              _batches=None)
    measured = timing.benchmark(lambda: workload.train_step(fed), warmup=plan.warmup,
                                repeats=plan.ceiling_steps, device=device, label="ceiling step")
    return Ceiling(measured, work.config.samples_per_step)


def profile_training(config: TrainConfig, plan: ProfilePlan | None = None, *,
                     trace_path: str | Path | None = None, memory_snapshot_path: str | Path | None = None,
                     peak: bool = True, stage: Callable[[str], None] | None = None) -> TrainingProfile:
    """Measure the training workload of `config`: throughput, phases, counts, memory, top ops, roofline, diagnosis.

    `stage(name)` is called as each part starts (for a progress display).
    """
    plan = plan or ProfilePlan()
    announce = stage or (lambda name: None)
    machine = env.machine_info(config.device)
    device = env.pick_device(config.device)

    announce("throughput")
    work = workload.build(config)
    try:
        with tracing.sample_gpu_utilization(device) as sampled:
            step_time, window = _time_steps(work, plan, device)
        util = sampled.within(*window)  # not the warm-up, nor the ceiling after it
        num_classes, batches_per_epoch = work.num_classes, len(work.loader)
        announce("ceiling")
        ceiling = _time_ceiling(work, plan, device)
    finally:
        work.close()
    del work
    gc.collect()  # nothing of that run stays allocated while the peak is measured

    announce("peak memory")
    measured_peak = _peak_of_training(config, plan.peak_steps) if peak else None

    announce("phases")
    breakdown = measure_phases(config, steps=plan.phase_steps, warmup=1)

    announce("counting")
    model = workload.build_model(config, num_classes)
    x = torch.randn(config.batch_size, 3, config.image_size, config.image_size,
                    generator=torch.Generator().manual_seed(config.seed)).to(device)
    if config.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(num_classes, (config.batch_size,), generator=torch.Generator().manual_seed(0))
    labels = labels.to(device)

    def loss_fn(logits: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, labels)

    # The loop's autocast, so counts and activations are those of training.
    with workload.autocast(config, device):
        flops = counting.count_flops(model, x, backward=True, loss_fn=loss_fn)
    parameters = counting.count_parameters(model)

    with workload.autocast(config, device):
        budget = memory.memory_budget(model, memory.optimizer_name(config), x, loss_fn)

    announce("trace")
    traced = tracing.trace_training(config, schedule=plan.trace, trace_path=trace_path,
                                    memory_snapshot_path=memory_snapshot_path)

    announce("roofline")
    dtype = str(workload.AMP_DTYPES[config.amp_dtype]).removeprefix("torch.") if config.amp_dtype else "float32"
    peaks = roofline.device_peaks(device, dtype)
    # Measured peaks carry one key (float32 becomes 'tf32' on CUDA when TF32 is on).
    peak_key = dtype if dtype in peaks.flops else next(iter(peaks.flops))
    shape = (config.batch_size, 3, config.image_size, config.image_size)
    layers = tuple(roofline.roofline_verdicts(model, shape, peaks, peak_key))

    section = {"peak_flops": peaks.peak_flops(peak_key), "peak_bandwidth": peaks.bandwidth,
               "layers": [p.to_dict() for p in layers]}
    phase_top = {phase: ops[0].name for phase in traced.phase_ops
                 if (ops := traced.top_in_phase(phase, 1))}
    top = traced.top(1)
    verdict = diagnose.diagnose(
        breakdown.seconds, device=device.type, roofline=section, phase_top_ops=phase_top,
        top_op=top[0].name if top else None, gpu_utilization=util.mean, config=config,
        cpu_bf16=machine.cpu_bf16,
    )
    return TrainingProfile(config, machine, step_time, breakdown, parameters, flops, budget, measured_peak,
                           traced, peaks, peak_key, layers, util, verdict, batches_per_epoch, ceiling)


__all__ = ["Ceiling", "ProfilePlan", "TrainingProfile", "profile_training"]
