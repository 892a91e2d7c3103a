"""`torch.profiler` over the training loop: phase labels, top-op tables, a Chrome/Perfetto trace.

`trace_training(config)` runs the workload under `torch.profiler.profile` with a
`torch.profiler.schedule` (skip `wait` steps, warm up the profiler for `warmup` steps, record
`active` steps). Every phase of `perflab.workload.train_step` is wrapped in a
`torch.profiler.record_function` label (`perflab.phase_timer.PHASES`: data, h2d, augment, forward,
backward, optimizer) by handing the loop a `LabelledTimer`: the loop is not reshaped, the same
`with timer.phase(...)` lines that time the phases also name them in the trace.

What comes back is plain data (`TraceResult`: one `TopOp` row per operator name, the profiler's
own time per phase label, the ops inside each phase), so it can be printed, saved and tested
without the profiler object. On CUDA, `cuda_memory_snapshot` records the allocator's history for
https://pytorch.org/memory_viz, and `sample_gpu_utilization` polls NVML during a run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, record_function

from perflab import env
from perflab.phase_timer import PHASES, PhaseTimer

log = logging.getLogger(__name__)

# Profiler labels that are not operators: the phase labels and the schedule's own step markers.
_STEP_PREFIX = "ProfilerStep"
# NVML reports utilisation over its own sampling window (1/6 s to 1 s depending on the GPU);
# polling faster only repeats values, slower misses short stalls.
NVML_POLL_SECONDS = 0.1
# No mean is stated from fewer samples than this inside the timed window: each NVML reading averages its
# own trailing period (up to 1 s), so with fewer than 5 polls (half a second at NVML_POLL_SECONDS) most of
# what they report is time before the window (the data set's decoding, the warm-up), not the timed steps.
MIN_UTILIZATION_SAMPLES = 5
# Bound on allocator events kept by the CUDA memory history (about 100 MB of host memory).
MEMORY_HISTORY_ENTRIES = 100_000
# Kineto (the profiler's C++ half) writes status lines and, on a CUDA build without a GPU, an
# "ERROR ... gpuGetDeviceCount failed" to the process's stderr, which nbgrader scores as a failed
# cell. Level 6 is above its highest (USDT = 5); it is read once, when the first profile starts.
KINETO_QUIET_LEVEL = "6"


class LabelledTimer(PhaseTimer):
    """A `PhaseTimer` whose phases also open a `record_function` label, so a trace shows them by name.

    With `enabled=False` it only labels (no device syncs, no timing): the trace is not perturbed.
    """

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with record_function(name), super().phase(name):
            yield


@dataclass(frozen=True)
class TopOp:
    """One operator, aggregated over the profiled steps (times are totals over all active steps, seconds)."""

    name: str
    self_cpu_s: float
    total_cpu_s: float
    calls: int
    self_device_s: float | None = None
    self_memory_bytes: int | None = None

    @property
    def self_time_s(self) -> float:
        """Self time on the device when the device was profiled (0 for ops that launch no kernel), else on the CPU."""
        return self.self_device_s if self.self_device_s is not None else self.self_cpu_s

    @property
    def sort_key(self) -> tuple[float, float]:
        """Self time, ties (ops without kernels on a device run) broken by self CPU time."""
        return self.self_time_s, self.self_cpu_s

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {"name": self.name, "self_time_s": self.self_time_s,
                               "self_cpu_s": self.self_cpu_s, "total_cpu_s": self.total_cpu_s,
                               "calls": self.calls}
        if self.self_device_s is not None:
            row["self_device_s"] = self.self_device_s
        if self.self_memory_bytes is not None:
            row["self_memory_bytes"] = self.self_memory_bytes
        return row


@dataclass(frozen=True)
class TraceResult:
    """What one profiled run recorded: every op, the time under each phase label, the ops inside each phase."""

    ops: tuple[TopOp, ...]
    phase_seconds: dict[str, float]
    phase_ops: dict[str, tuple[TopOp, ...]]
    active_steps: int
    device: str
    trace_path: Path | None = None
    memory_snapshot_path: Path | None = None
    phase_labels: tuple[str, ...] = field(default=PHASES)

    def top(self, n: int = 10) -> list[TopOp]:
        """The `n` ops with the most self time (device time on CUDA, CPU time elsewhere)."""
        return sorted(self.ops, key=lambda op: op.sort_key, reverse=True)[:n]

    def top_in_phase(self, phase: str, n: int = 5) -> list[TopOp]:
        """The `n` ops with the most self time inside the `phase` label."""
        return sorted(self.phase_ops.get(phase, ()), key=lambda op: op.sort_key, reverse=True)[:n]

    def per_step(self, phase: str) -> float:
        """Seconds per step the profiler saw under the `phase` label."""
        return self.phase_seconds.get(phase, 0.0) / self.active_steps

    def table(self, n: int = 10) -> str:
        """The top-op table, one op per line, times per step."""
        device_col = any(op.self_device_s is not None for op in self.ops)
        head = f"{'op':<44} {'self ms':>9} {'total ms':>9} {'calls':>6}"
        if device_col:
            head += f" {'self dev ms':>11}"
        lines = [head]
        steps = self.active_steps
        for op in self.top(n):
            line = (f"{_shorten(op.name, 44):<44} {op.self_cpu_s / steps * 1e3:>9.2f} "
                    f"{op.total_cpu_s / steps * 1e3:>9.2f} {op.calls // steps:>6}")
            if device_col:
                line += f" {(op.self_device_s or 0.0) / steps * 1e3:>11.2f}"
            lines.append(line)
        lines.append(f"(per step, over {steps} profiled step{'s' if steps != 1 else ''}; "
                     f"sorted by self {'device' if device_col else 'CPU'} time)")
        return "\n".join(lines)

    def to_dict(self, n: int = 15) -> list[dict[str, Any]]:
        """The `top_ops` section of a results file (times per step)."""
        rows = []
        for op in self.top(n):
            row = op.to_dict()
            for key in ("self_time_s", "self_cpu_s", "total_cpu_s", "self_device_s"):
                if key in row:
                    row[key] = row[key] / self.active_steps
            row["calls"] = op.calls // self.active_steps
            rows.append(row)
        return rows


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _is_label(name: str, labels: Iterable[str]) -> bool:
    return name in labels or name.startswith(_STEP_PREFIX)


def _device_seconds(event: Any) -> float | None:
    value = getattr(event, "self_device_time_total", None)
    if value is None:
        value = getattr(event, "self_cuda_time_total", 0)
    return float(value) / 1e6


def top_ops_from_averages(averages: Iterable[Any], *, labels: Sequence[str] = PHASES,
                          device: bool = False, memory: bool = False) -> tuple[TopOp, ...]:
    """`TopOp` rows from `prof.key_averages()` (microseconds in, seconds out), labels left out."""
    rows = []
    for avg in averages:
        if _is_label(avg.key, labels):
            continue
        rows.append(TopOp(
            name=avg.key,
            self_cpu_s=float(avg.self_cpu_time_total) / 1e6,
            total_cpu_s=float(avg.cpu_time_total) / 1e6,
            calls=int(avg.count),
            self_device_s=_device_seconds(avg) if device else None,
            self_memory_bytes=int(getattr(avg, "self_cpu_memory_usage", 0)) if memory else None,
        ))
    return tuple(rows)


def _ops_by_phase(events: Iterable[Any], labels: Sequence[str], device: bool
                  ) -> tuple[dict[str, float], dict[str, tuple[TopOp, ...]]]:
    """Walk the event tree: total time of each phase label, and the self time of the ops under it."""
    seconds: dict[str, float] = defaultdict(float)
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0.0, 0.0]))
    for event in events:
        if event.name not in labels:
            continue
        seconds[event.name] += float(event.cpu_time_total) / 1e6
        stack = list(event.cpu_children)
        while stack:
            child = stack.pop()
            stack.extend(child.cpu_children)
            if _is_label(child.name, labels):
                continue
            row = acc[event.name][child.name]
            row[0] += float(child.self_cpu_time_total) / 1e6
            row[1] += float(child.cpu_time_total) / 1e6
            row[2] += 1
            row[3] += _device_seconds(child) or 0.0
    ops = {
        phase: tuple(TopOp(name, s, t, int(c), d if device else None)
                     for name, (s, t, c, d) in rows.items())
        for phase, rows in acc.items()
    }
    return dict(seconds), ops


def trace_training(config: Any, steps: int | None = None, schedule: tuple[int, int, int] = (1, 1, 3),
                   *, record_shapes: bool = False, profile_memory: bool = False,
                   trace_path: str | Path | None = None, memory_snapshot_path: str | Path | None = None,
                   progress: bool = False) -> TraceResult:
    """Profile `steps` training steps of `config` with phase labels; export a Chrome trace if asked.

    `schedule` is (wait, warmup, active) in steps; `steps` defaults to their sum and must cover it.
    `trace_path` gets a Chrome/Perfetto JSON trace (open it in chrome://tracing or ui.perfetto.dev).
    `memory_snapshot_path` (CUDA only) gets the allocator history of the profiled steps.
    """
    from perflab import workload

    wait, warmup, active = schedule
    for name, value, low in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"schedule.{name}: must be an integer of at least {low}, got {value!r}")
    cycle = wait + warmup + active
    steps = cycle if steps is None else steps
    if steps < cycle:
        raise ValueError(f"steps: {steps} does not cover the schedule's {cycle} steps (wait+warmup+active)")
    if memory_snapshot_path is not None and config.device_type != "cuda":
        raise ValueError("memory_snapshot_path: the allocator history exists on CUDA only")

    work = workload.build(config)
    on_cuda = work.device.type == "cuda"
    if not on_cuda:
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    captured: dict[str, Any] = {}
    path = Path(trace_path) if trace_path is not None else None

    def ready(prof: torch.profiler.profile) -> None:
        captured["ops"] = top_ops_from_averages(prof.key_averages(), device=on_cuda, memory=profile_memory)
        captured["phases"] = _ops_by_phase(prof.events(), PHASES, on_cuda)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(path))
            log.info("wrote Chrome trace %s", path)

    timer = LabelledTimer(enabled=False)
    iterator: Iterable[int] = range(steps)
    if progress:
        iterator = progress_bar(iterator, desc="trace", unit="step", total=steps)
    snapshot = (cuda_memory_snapshot(memory_snapshot_path) if memory_snapshot_path is not None
                else contextlib.nullcontext())
    try:
        with snapshot, torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=ready,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
        ) as prof:
            for _ in iterator:
                workload.train_step(work, timer)
                env.synchronize(work.device)
                prof.step()
    finally:
        work.close()
    if "ops" not in captured:  # pragma: no cover - the schedule always completes one cycle
        raise RuntimeError("trace_training: the profiler recorded no active step")
    seconds, phase_ops = captured["phases"]
    return TraceResult(
        ops=captured["ops"],
        phase_seconds=seconds,
        phase_ops=phase_ops,
        active_steps=active,
        device=work.device.type,
        trace_path=path,
        memory_snapshot_path=Path(memory_snapshot_path) if memory_snapshot_path else None,
    )


@contextlib.contextmanager
def cuda_memory_snapshot(path: str | Path, max_entries: int = MEMORY_HISTORY_ENTRIES) -> Iterator[Path]:
    """Record the CUDA allocator's history inside the block and dump it to `path` (a pickle for memory_viz)."""
    if not torch.cuda.is_available():
        raise ValueError("memory snapshot: needs a CUDA device (the allocator history is CUDA-only)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        yield path
        torch.cuda.memory._dump_snapshot(str(path))
        log.info("wrote CUDA memory snapshot %s", path)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


@dataclass
class UtilizationSamples:
    """GPU utilisation (0..1) polled through NVML while a block ran; empty where there is no NVML GPU.

    `times` are the `time.perf_counter()` readings at which each sample was asked for; `within(start, end)`
    keeps the samples of a timed window, and `window` says which. `mean` is None with fewer than
    MIN_UTILIZATION_SAMPLES samples. `polled`: NVML was polled (a CUDA device and NVML were there).
    """

    values: list[float] = field(default_factory=list)
    memory_values: list[float] = field(default_factory=list)
    error: str | None = None
    times: list[float] = field(default_factory=list)
    window: tuple[float, float] | None = None
    polled: bool = False

    @property
    def enough(self) -> bool:
        return len(self.values) >= MIN_UTILIZATION_SAMPLES

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.enough else None

    @property
    def memory_mean(self) -> float | None:
        return sum(self.memory_values) / len(self.memory_values) if self.enough and self.memory_values else None

    def within(self, start: float, end: float) -> UtilizationSamples:
        """The samples asked for between `start` and `end` (`time.perf_counter()` readings): a timed window."""
        keep = [i for i, t in enumerate(self.times) if start <= t <= end]
        return UtilizationSamples([self.values[i] for i in keep],
                                  [self.memory_values[i] for i in keep if i < len(self.memory_values)],
                                  self.error, [self.times[i] for i in keep], (start, end), self.polled)

    def describe(self) -> str | None:
        """The profile's line: 'GPU utilisation (NVML, 8 samples over the timed 0.76 s): mean 93%', why no
        figure is stated, or None where nothing was polled (no CUDA device)."""
        if self.error:
            return f"GPU utilisation not sampled: {self.error}"
        if not self.polled:
            return None
        over = f" over the timed {self.window[1] - self.window[0]:.2f} s" if self.window is not None else ""
        if self.mean is not None:
            return f"GPU utilisation (NVML, {len(self.values)} samples{over}): mean {self.mean:.0%}"
        return (f"GPU utilisation not stated: {len(self.values)} NVML sample{'s' if len(self.values) != 1 else ''}"
                f"{over}, fewer than the {MIN_UTILIZATION_SAMPLES} a mean needs (time more steps: --steps)")


@contextlib.contextmanager
def sample_gpu_utilization(device: torch.device | str | None = None,
                           interval: float = NVML_POLL_SECONDS) -> Iterator[UtilizationSamples]:
    """Poll NVML's GPU and memory-controller utilisation in a thread while the block runs (CUDA only), each
    sample timestamped on `time.perf_counter` when it is asked for (`UtilizationSamples.within`)."""
    samples = UtilizationSamples()
    dev = torch.device(device) if device is not None else env.pick_device()
    if dev.type != "cuda":
        yield samples
        return
    try:
        import pynvml

        pynvml.nvmlInit()
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(index))
    except Exception as exc:  # NVML missing or refused (containers, MIG): sampling is best-effort
        samples.error = f"NVML unavailable: {exc}"
        log.warning("GPU utilisation not sampled: %s", samples.error)
        yield samples
        return
    stop = threading.Event()
    samples.polled = True

    def poll() -> None:
        while not stop.is_set():
            asked = time.perf_counter()
            try:
                rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            except Exception as exc:  # pragma: no cover - device lost mid-run
                samples.error = str(exc)
                return
            samples.values.append(rates.gpu / 100.0)
            samples.memory_values.append(rates.memory / 100.0)
            samples.times.append(asked)
            stop.wait(interval)

    thread = threading.Thread(target=poll, name="nvml-poll", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _nvml_index(torch_index: int) -> int:
    """NVML numbers GPUs by PCI order; map torch's index through CUDA_VISIBLE_DEVICES when it is numeric."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [part.strip() for part in visible.split(",") if part.strip()]
    if ids and all(part.isdigit() for part in ids) and torch_index < len(ids):
        return int(ids[torch_index])
    return torch_index


def progress_bar(iterable: Iterable[Any], **kwargs: Any) -> Iterable[Any]:
    """A tqdm bar on stderr, silent in grade mode and when stderr is not a terminal."""
    import sys

    from tqdm.auto import tqdm

    quiet = env.run_mode() == "grade" or not sys.stderr.isatty()
    return tqdm(iterable, disable=quiet, leave=False, file=sys.stderr, **kwargs)

