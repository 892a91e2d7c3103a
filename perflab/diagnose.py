"""The bottleneck verdict of `perflab profile`: a pure function of measurements already taken.

`diagnose(phases, ...)` reads the per-step phase breakdown, the roofline section (peaks and
per-layer FLOPs/bytes/verdicts), the top ops inside each phase, GPU utilisation sampled through
NVML (CUDA only) and the knobs in force, and answers in four parts: the bottleneck type, the
component (the phase that costs most), the operation (the top op inside it), and the next
optimisation to try with the lab that teaches it. Nothing here measures, so every rule can be
tested on synthetic numbers, and a saved results file can be diagnosed again later
(`diagnose_results`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from perflab.labs import registry

DATA = "data loading"
COPY = "host-device copy"
AUGMENT = "augmentation on the device"
COMPUTE = "compute"
MEMORY = "memory bandwidth"
VERDICTS = (DATA, COPY, AUGMENT, COMPUTE, MEMORY)

# With the device synchronised at phase edges, the data phase is time the model waits for the
# loader. Beyond 30% of the step, overlapping the loader (workers, prefetch) is a larger gain
# than any speed-up of the model itself can give, so the loader is the bottleneck.
DATA_BOUND_SHARE = 0.30
# A synchronous copy taking a fifth of the step is what pinned, non-blocking copies remove;
# below that, overlapping it wins less than the compute-side optimisations.
COPY_BOUND_SHARE = 0.20
# The augmentation on the device is elementwise work and one resampling of the batch: a few passes over
# memory against the model's many. A fifth of the step is several times what it should cost (0.2 ms of an
# H200's 20 ms bf16 step at batch 128), as much as a copy that pinning would hide.
AUGMENT_BOUND_SHARE = 0.20
# A GPU busy less than half of the time is starved: then even a moderate data share is the cause.
LOW_GPU_UTILIZATION = 0.50
STARVED_DATA_SHARE = 0.15
# When layers that the roofline calls memory-bound take at least half of the roofline-estimated
# time of the model, bandwidth, not arithmetic, limits the compute phases.
MEMORY_BOUND_TIME_SHARE = 0.50
COMPUTE_PHASES = ("forward", "backward", "optimizer")

# The labs by key ("labNN") and title, from their manifests; a next step names what it teaches (one of
# these topics), and the lab whose manifest lists that topic among its `hints` is the one it points to.
LABS = {lab.key: lab.title for lab in registry.manifests()}
LOADING = "data loading"
PRECISION = "mixed precision"
LAYOUT = "memory format"
CHECKPOINTING = "checkpointing"
COMPILING = "compile"
ABLATION = "ablation"


def lab_teaching(topic: str) -> str:
    """The key of the first lab whose manifest lists `topic` among its hints ("" where none does)."""
    return next((lab.key for lab in registry.manifests() if topic in lab.hints), "")


def _taught(next_step: Callable[..., tuple[str, str]]) -> Callable[..., tuple[str, str]]:
    """`next_step` returning (step, the lab that teaches it) instead of (step, topic)."""
    @functools.wraps(next_step)
    def wrapper(*args: Any, **kwargs: Any) -> tuple[str, str]:
        step, topic = next_step(*args, **kwargs)
        return step, lab_teaching(topic)
    return wrapper


@dataclass(frozen=True)
class Diagnosis:
    """The verdict, where it lives, why we think so, and what to try next."""

    verdict: str
    component: str
    operation: str
    reason: str
    next_step: str
    lab: str
    evidence: tuple[str, ...] = ()
    # Inputs kept with the verdict so a saved results file can be diagnosed again.
    gpu_utilization: float | None = None
    phase_top_ops: Mapping[str, str] = field(default_factory=dict)

    @property
    def lab_title(self) -> str:
        return LABS.get(self.lab, self.lab)

    def describe(self) -> str:
        lines = [
            f"bottleneck    {self.verdict}",
            f"component     {self.component}",
            f"operation     {self.operation}",
            f"why           {self.reason}",
        ]
        lines += [f"              - {item}" for item in self.evidence]
        lines += [f"next          {self.next_step}", f"lab           {self.lab_title}"]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The `bottleneck` section of a results file."""
        return {"verdict": self.verdict, "reason": self.reason, "component": self.component,
                "operation": self.operation, "next_step": self.next_step, "lab": self.lab,
                "evidence": list(self.evidence), "phase_top_ops": dict(self.phase_top_ops),
                **({"gpu_utilization": self.gpu_utilization} if self.gpu_utilization is not None else {})}


def _get(row: Any, key: str, default: Any = None) -> Any:
    if isinstance(row, Mapping):
        return row.get(key, default)
    return getattr(row, key, default)


def memory_bound_time_share(roofline: Mapping[str, Any] | None) -> float | None:
    """Share of the roofline-estimated time (max of FLOPs/peak and bytes/bandwidth per layer) spent in memory-bound layers."""
    if not roofline or not roofline.get("layers"):
        return None
    peak_flops, peak_bw = float(roofline["peak_flops"]), float(roofline["peak_bandwidth"])
    if peak_flops <= 0 or peak_bw <= 0:
        return None
    total = memory = 0.0
    for layer in roofline["layers"]:
        flops, nbytes = float(_get(layer, "flops", 0.0)), float(_get(layer, "bytes", 0.0))
        estimate = max(flops / peak_flops, nbytes / peak_bw)
        total += estimate
        verdict = str(_get(layer, "verdict", ""))
        if verdict:
            is_memory = "memory" in verdict.lower()
        else:  # no verdict stored: the ridge point decides
            is_memory = flops / max(nbytes, 1.0) < peak_flops / peak_bw
        if is_memory:
            memory += estimate
    return memory / total if total > 0 else None


def diagnose(phases: Mapping[str, float], *, device: str = "cpu", roofline: Mapping[str, Any] | None = None,
             phase_top_ops: Mapping[str, str] | None = None, top_op: str | None = None,
             gpu_utilization: float | None = None, config: Any = None,
             cpu_bf16: bool = False) -> Diagnosis:
    """The bottleneck of a training step from its measurements.

    `phases`: seconds per step by phase (`perflab.phase_timer.PHASES`: data, h2d, augment, forward, backward,
    optimizer; a file written before augment was timed apart has its time in h2d).
    `roofline`: the results section {"peak_flops", "peak_bandwidth", "layers": [{flops, bytes, verdict}]}.
    `phase_top_ops`: the op with most self time inside each phase; `top_op`: the top op overall.
    `gpu_utilization`: mean NVML utilisation in [0, 1] during the run (CUDA only).
    `config`: the `TrainConfig` (or its dict) in force, to pick a next step that is not already taken.
    """
    found = _diagnose(phases, device, roofline, phase_top_ops or {}, top_op, gpu_utilization,
                      _knobs(config), cpu_bf16)
    return replace(found, gpu_utilization=gpu_utilization, phase_top_ops=dict(phase_top_ops or {}))


def _diagnose(phases: Mapping[str, float], device: str, roofline: Mapping[str, Any] | None,
              phase_top_ops: Mapping[str, str], top_op: str | None, gpu_utilization: float | None,
              knobs: Mapping[str, Any], cpu_bf16: bool) -> Diagnosis:
    seconds = {name: float(value) for name, value in phases.items() if value is not None}
    if any(value < 0 for value in seconds.values()):
        raise ValueError("phases: seconds per phase cannot be negative")
    total = sum(seconds.values())
    if total <= 0:
        raise ValueError("phases: no time measured (every phase is zero); time at least one step")
    share = {name: value / total for name, value in seconds.items()}
    evidence = [
        "step time by phase: " + ", ".join(f"{name} {share[name]:.0%}" for name in seconds),
    ]
    starved = gpu_utilization is not None and gpu_utilization < LOW_GPU_UTILIZATION
    if gpu_utilization is not None:
        evidence.append(f"GPU utilisation during the run: {gpu_utilization:.0%} (NVML)")

    data, copy, augment = share.get("data", 0.0), share.get("h2d", 0.0), share.get("augment", 0.0)
    input_bound = None
    if data >= DATA_BOUND_SHARE or (starved and data >= STARVED_DATA_SHARE):
        input_bound = "data"
    if copy >= COPY_BOUND_SHARE and copy > data:
        input_bound = "h2d"
    if augment >= AUGMENT_BOUND_SHARE and augment > max(data, copy):
        input_bound = "augment"
    if input_bound is not None:
        component = input_bound
        operation = phase_top_ops.get(component) or top_op or "unknown (not traced)"
        if component == "data":
            why = (f"the step waits for the loader {data:.0%} of the time"
                   + (f" while the GPU is busy only {gpu_utilization:.0%}" if starved else ""))
            step, lab = _next_for_data(knobs, device)
            return Diagnosis(DATA, component, operation, why, step, lab, tuple(evidence))
        if component == "augment":
            why = f"augmenting the batch on the device takes {augment:.0%} of the step"
            step, lab = _next_for_augment(knobs)
            return Diagnosis(AUGMENT, component, operation, why, step, lab, tuple(evidence))
        why = f"host-to-device copies take {copy:.0%} of the step"
        step, lab = _next_for_copy(knobs)
        return Diagnosis(COPY, component, operation, why, step, lab, tuple(evidence))

    component = max(COMPUTE_PHASES, key=lambda name: seconds.get(name, 0.0))
    operation = phase_top_ops.get(component) or top_op or "unknown (not traced)"
    memory_share = memory_bound_time_share(roofline)
    if memory_share is not None:
        evidence.append(f"memory-bound layers hold {memory_share:.0%} of the roofline-estimated model time")
    if component == "optimizer":
        why = (f"the optimizer step ({share[component]:.0%} of the step) is elementwise updates of every "
               "parameter: it moves bytes, it does little arithmetic")
        step, lab = _next_for_memory(knobs, device, cpu_bf16, optimizer=True)
        return Diagnosis(MEMORY, component, operation, why, step, lab, tuple(evidence))
    if memory_share is not None and memory_share >= MEMORY_BOUND_TIME_SHARE:
        why = (f"{component} takes {share[component]:.0%} of the step and most of the model's estimated "
               "time is in layers below the roofline's ridge point")
        step, lab = _next_for_memory(knobs, device, cpu_bf16, optimizer=False)
        return Diagnosis(MEMORY, component, operation, why, step, lab, tuple(evidence))
    why = f"{component} takes {share[component]:.0%} of the step"
    why += (" and the layers that cost most are compute-bound on the roofline" if memory_share is not None
            else " (no roofline measured: compute assumed)")
    if starved:
        why += "; the GPU is often idle, so launch overhead matters too"
    step, lab = _next_for_compute(knobs, device, cpu_bf16, starved)
    return Diagnosis(COMPUTE, component, operation, why, step, lab, tuple(evidence))


def _knobs(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    return dict(config)


@_taught
def _next_for_data(knobs: Mapping[str, Any], device: str) -> tuple[str, str]:
    if knobs.get("data_on_device"):
        return ("the set is already decoded on the device: the wait is the gather and the first epoch's "
                "decoding; time more steps, past the first", LOADING)
    if not knobs.get("num_workers"):
        return ("decode and augment in DataLoader worker processes: --num-workers N (N about the core "
                "count) with --persistent-workers, so loading overlaps the model", LOADING)
    if device == "cuda" and not knobs.get("gpu_augment"):
        return ("move augmentation onto the GPU (--gpu-augment, kornia) and decode JPEGs there "
                "(torchvision.io.decode_jpeg on CUDA)", LOADING)
    if not knobs.get("prefetch_factor") or knobs.get("prefetch_factor", 0) < 4:
        return ("keep more batches in flight: --prefetch-factor 4, and more workers if cores are idle",
                LOADING)
    return ("the CPU cannot decode faster: smaller stored JPEGs, cached decoded tensors, or more cores",
            LOADING)


@_taught
def _next_for_copy(knobs: Mapping[str, Any]) -> tuple[str, str]:
    if knobs.get("data_on_device"):
        return ("nothing is copied per step with the set on the device: a results file written before the "
                "augmentation was timed apart counts it here; profile again to see it as the augment phase",
                LOADING)
    if not knobs.get("pin_memory"):
        return ("--pin-memory: page-locked batches let the non_blocking copies overlap compute", LOADING)
    return ("copy uint8 images and normalise on the device (--gpu-augment): a quarter of the bytes",
            LOADING)


@_taught
def _next_for_augment(knobs: Mapping[str, Any]) -> tuple[str, str]:
    if not knobs.get("gpu_augment"):
        return ("this phase is only the conversion to --channels-last: convert the model's input once, or "
                "leave the input as it comes (the first convolution takes either)", LAYOUT)
    return ("augment the whole batch with batched tensor ops (one resampling for every image's crop and flip, "
            "the colour jitter as per-image factors), never image by image: perflab.workload.DeviceAugment "
            "does, and a custom augmentation should too", LOADING)


def _amp_helps(device: str, cpu_bf16: bool) -> bool:
    return device in ("cuda", "mps") or cpu_bf16


@_taught
def _next_for_compute(knobs: Mapping[str, Any], device: str, cpu_bf16: bool, starved: bool
                      ) -> tuple[str, str]:
    if starved and not knobs.get("compile_mode") and device == "cuda":
        return ("--compile-mode reduce-overhead: CUDA graphs remove the per-kernel launch cost", COMPILING)
    if not knobs.get("amp_dtype") and _amp_helps(device, cpu_bf16):
        dtype = "bf16" if device != "cuda" else "bf16 (fp16 with GradScaler on pre-Ampere GPUs)"
        return (f"mixed precision: --amp-dtype {dtype} with --channels-last, so the convolutions run "
                "on tensor cores / bf16 units", PRECISION)
    if not knobs.get("compile_mode"):
        return ("--compile-mode default: fuse the elementwise work around the convolutions", COMPILING)
    return ("the model already runs near what this device computes: remaining gains come from "
            "fewer FLOPs or more devices; check the cumulative ablation", ABLATION)


@_taught
def _next_for_memory(knobs: Mapping[str, Any], device: str, cpu_bf16: bool, *, optimizer: bool
                     ) -> tuple[str, str]:
    if optimizer and knobs.get("accumulation_steps", 1) == 1:
        return ("amortise the update: --accumulation-steps N (one optimizer step per N micro-batches), "
                "or a larger batch made to fit with --checkpoint-stages", CHECKPOINTING)
    if not knobs.get("channels_last") and device != "mps":
        return ("--channels-last: NHWC activations spare the layout conversions around each convolution",
                LAYOUT)
    if not knobs.get("compile_mode"):
        return ("--compile-mode default: fuse BatchNorm, ReLU and the residual adds into fewer passes "
                "over memory", COMPILING)
    if not knobs.get("amp_dtype") and _amp_helps(device, cpu_bf16):
        return ("--amp-dtype bf16: half the bytes per activation", PRECISION)
    return ("the step moves as many bytes as this device can: look at the cumulative ablation for "
            "what is left", ABLATION)


def diagnose_results(doc: Mapping[str, Any]) -> Diagnosis:
    """Diagnose a saved results document (`perflab.results.load`) from its phases, roofline and top ops."""
    sections = doc.get("sections", {})
    phases = sections.get("phases", {}).get("before")
    if not phases:
        raise ValueError("sections.phases.before: missing; the diagnosis needs the phase breakdown")
    top = sections.get("top_ops") or []
    extras = sections.get("bottleneck", {}) or {}
    machine = doc.get("machine", {})
    return diagnose(
        phases,
        device=machine.get("device", "cpu"),
        roofline=sections.get("roofline"),
        phase_top_ops=extras.get("phase_top_ops"),
        top_op=top[0]["name"] if top else None,
        gpu_utilization=extras.get("gpu_utilization"),
        config=doc.get("config"),
        cpu_bf16=bool(machine.get("cpu_bf16", False)),
    )

