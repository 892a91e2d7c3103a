"""The machine in front of us: device choice, synchronisation, and a description stored with every measurement."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from perflab import course
from perflab.course import DATA_ENV as DATA_ENV  # the names the kit reads them by
from perflab.course import DEFAULT_MODEL as DEFAULT_MODEL
from perflab.course import MODEL_ENV as MODEL_ENV

DEVICE_KINDS = ("cuda", "mps", "cpu")

# CPU flags that change what mixed precision can give (bf16 matmuls in hardware).
_BF16_CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16")


# The device a grading job is graded for, set by the grader in every process of the job (the notebook's
# kernel, the judges' re-measurements, the sandboxed programs): `pick_device()` then answers it, or stops
# with the reason where it cannot start, instead of quietly choosing another device.
DEVICE_ENV = "PERFLAB_DEVICE"


class DeviceUnavailable(RuntimeError):
    """The device this process was told to run on ($PERFLAB_DEVICE) cannot start here."""


def assigned_device() -> str | None:
    """The device kind $PERFLAB_DEVICE assigns this process (None where it is unset)."""
    value = os.environ.get(DEVICE_ENV, "").strip().lower()
    if not value:
        return None
    if value not in DEVICE_KINDS:
        raise ValueError(f"{DEVICE_ENV}: {value!r} is not one of {', '.join(DEVICE_KINDS)}")
    return value


@contextlib.contextmanager
def assigned(kind: str | None) -> Iterator[None]:
    """Inside this block, this process runs on `kind` ($PERFLAB_DEVICE; None leaves it as it is): the
    grader's own judges grade for the device its jobs are graded for."""
    if kind is None or os.environ.get(DEVICE_ENV) == kind:  # (pool threads of one run assign the same kind)
        yield
        return
    if kind not in DEVICE_KINDS:
        raise ValueError(f"device: {kind!r} is not one of {', '.join(DEVICE_KINDS)}")
    before = os.environ.get(DEVICE_ENV)
    os.environ[DEVICE_ENV] = kind
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DEVICE_ENV, None)
        else:
            os.environ[DEVICE_ENV] = before


def cuda_problem() -> str | None:
    """Why CUDA cannot start in this process (the driver's own message), or None where it can."""
    if torch.cuda.is_available():
        return None
    try:
        torch.cuda.init()
    except Exception as exc:  # the driver's message: no GPU, an address-space limit, a broken install
        return f"{type(exc).__name__}: {exc}".strip()[:400]
    return "torch sees no CUDA device (CUDA_VISIBLE_DEVICES={!r})".format(os.environ.get("CUDA_VISIBLE_DEVICES"))


def pick_device(preferred: str | None = None) -> torch.device:
    """The device to run on: `preferred` if given (and available), else the device $PERFLAB_DEVICE assigns
    (DeviceUnavailable where it cannot start: never a quiet fall back to another), else CUDA, then MPS,
    then CPU."""
    if not preferred:
        assigned = assigned_device()
        if assigned == "cuda" and (why := cuda_problem()):
            raise DeviceUnavailable(f"this run is graded for CUDA ({DEVICE_ENV}=cuda) but CUDA cannot start "
                                    f"here: {why}")
        if assigned == "mps" and not _mps_available():
            raise DeviceUnavailable(f"this run is graded for MPS ({DEVICE_ENV}=mps) but MPS is not available here")
        if assigned:
            return torch.device(assigned)
    if preferred:
        try:
            kind = torch.device(preferred).type
        except RuntimeError:
            kind = preferred
        if kind not in DEVICE_KINDS:
            raise ValueError(f"device: {preferred!r} is not one of {', '.join(DEVICE_KINDS)}")
        if kind == "cuda" and not torch.cuda.is_available():
            raise ValueError("device: 'cuda' was asked for but no CUDA device is visible")
        if kind == "mps" and not _mps_available():
            raise ValueError("device: 'mps' was asked for but this machine has no MPS device")
        return torch.device(preferred)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def synchronize(device: torch.device | str) -> None:
    """Wait for queued work on `device` to finish (a no-op on CPU)."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags from /proc/cpuinfo (empty where unavailable, e.g. macOS)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class MachineInfo:
    """What produced a number: stored beside every measurement so results from different machines never mix silently."""

    device: str
    device_name: str
    hardware_class: str
    cpu_model: str
    cpu_count: int
    cpu_bf16: bool
    threads: int
    gpu_memory_bytes: int | None
    python: str
    torch: str
    torchvision: str
    cuda: str | None
    cudnn: int | None
    tf32_matmul: bool
    tf32_cudnn: bool
    cudnn_benchmark: bool
    platform: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachineInfo:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def describe(self) -> str:
        """A few lines for a terminal or a notebook."""
        lines = [
            f"device        {self.device} ({self.device_name})",
            f"class         {self.hardware_class}",
            f"cpu           {self.cpu_model}, {self.cpu_count} cores, torch threads {self.threads}, "
            f"bf16 in hardware: {'yes' if self.cpu_bf16 else 'no'}",
            f"software      python {self.python}, torch {self.torch}, torchvision {self.torchvision}"
            + (f", CUDA {self.cuda}, cuDNN {self.cudnn}" if self.cuda else ""),
            f"settings      TF32 matmul {self.tf32_matmul}, TF32 cuDNN {self.tf32_cudnn}, "
            f"cudnn.benchmark {self.cudnn_benchmark}",
        ]
        if self.gpu_memory_bytes:
            lines.insert(1, f"gpu memory    {self.gpu_memory_bytes / 2**30:.1f} GiB")
        return "\n".join(lines)


def hardware_class(device: torch.device, name: str, bf16: bool) -> str:
    """A short stable key for calibrated expectations: a GPU model, MPS, or a CPU with/without bf16 hardware."""
    if device.type == "cuda":
        return "cuda-" + "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    if device.type == "mps":
        return "mps"
    return "cpu-bf16" if bf16 else "cpu"


def machine_info(device: torch.device | str | None = None) -> MachineInfo:
    """Describe this machine and the torch settings that change numbers."""
    dev = pick_device(str(device) if device is not None else None)
    flags = cpu_flags()
    bf16 = any(flag in flags for flag in _BF16_CPU_FLAGS)
    cpu_name = cpu_model()
    gpu_mem = None
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        name, gpu_mem = props.name, int(props.total_memory)
    elif dev.type == "mps":
        name = "Apple MPS"
    else:
        name = cpu_name
    try:
        import torchvision

        tv_version = torchvision.__version__
    except ImportError:  # pragma: no cover - torchvision is a pinned dependency
        tv_version = "missing"
    return MachineInfo(
        device=dev.type,
        device_name=name,
        hardware_class=hardware_class(dev, name, bf16),
        cpu_model=cpu_name,
        cpu_count=usable_cores(),
        cpu_bf16=bf16,
        threads=torch.get_num_threads(),
        gpu_memory_bytes=gpu_mem,
        python=sys.version.split()[0],
        torch=torch.__version__,
        torchvision=tv_version,
        cuda=torch.version.cuda if torch.cuda.is_available() else None,
        cudnn=torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
        tf32_cudnn=bool(torch.backends.cudnn.allow_tf32),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        platform=platform.platform(),
    )


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity where the OS keeps one (a grading job pinned to 2
    cores of a large host has 2), else every core; at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def set_threads(n: int | None) -> int:
    """Fix torch's intra-op thread count (None keeps it) and return the count in force."""
    if n is not None:
        if n < 1:
            raise ValueError(f"threads: must be at least 1, got {n}")
        torch.set_num_threads(n)
    return torch.get_num_threads()


def supports_autocast(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch.autocast can run `dtype` on this device type here."""
    if dtype == torch.float32:
        return True
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return False
        if dtype == torch.bfloat16:
            return torch.cuda.is_bf16_supported()
        return dtype == torch.float16
    if device_type == "mps":
        return dtype in (torch.float16, torch.bfloat16) and _mps_available()
    if device_type == "cpu":
        # CPU autocast runs bf16 everywhere (emulated without AMX/AVX-512-BF16) and fp16 from torch 2.x;
        # fp16 on CPU is slow and not what the labs teach, so only bf16 counts as supported.
        return dtype == torch.bfloat16
    return False


# ---------------------------------------------------------------------------------------------
# Run modes: how big a lab's work is (see docs/DESIGN.md, "How the labs run").

MODES = ("tiny", "laptop", "full", "grade")


@dataclass(frozen=True)
class ModeSizes:
    """The sizes a mode gives a lab: which data set, image side, batch, and how many steps to time."""

    mode: str
    data: str
    image_size: int
    batch_size: int
    steps: int


_MODE_SIZES = {
    "tiny": ModeSizes("tiny", data="tiny", image_size=32, batch_size=8, steps=3),
    "laptop": ModeSizes("laptop", data="small", image_size=64, batch_size=32, steps=20),
    "full": ModeSizes("full", data="full", image_size=224, batch_size=128, steps=100),
    "grade": ModeSizes("grade", data="tiny", image_size=32, batch_size=8, steps=3),
}


# The course's model and data set: its course file's (`perflab.course`), $PERFLAB_MODEL and $PERFLAB_DATA
# overriding it; read here and nowhere else, passed on to every sandbox of a grading run (`COURSE_ENV`). A
# data set replaces that of every mode and lab (their image side and batch stay the mode's).
COURSE_ENV = (MODEL_ENV, DATA_ENV)


def course_model() -> str:
    """The course's model: $PERFLAB_MODEL, else the course file's, else DEFAULT_MODEL."""
    return course.model()


def course_data() -> str | None:
    """The course's data set (a size, or a folder made absolute so that every process of a grading job reads
    the same one), or None where the modes choose it."""
    return course.data()


def run_mode() -> str:
    """The mode in force: PERFLAB_MODE, else 'grade' under nbgrader autograde, else 'full' on a GPU, else 'laptop'."""
    mode = os.environ.get("PERFLAB_MODE", "").strip().lower()
    if mode:
        if mode not in MODES:
            raise ValueError(f"PERFLAB_MODE: {mode!r} is not one of {', '.join(MODES)}")
        return mode
    if os.environ.get("NBGRADER_EXECUTION") == "autograde":
        return "grade"
    assigned = assigned_device()
    if assigned:
        return "full" if assigned == "cuda" else "laptop"
    return "full" if torch.cuda.is_available() else "laptop"


# Grade and laptop mode's workload (data, image side, batch) per lab and device kind is the lab's own,
# declared in its manifest (`perflab.labs.registry`), where that lab's technique shows on that device
# (docs/DESIGN.md, "Workloads where the lesson is true"); a lab or device not listed runs at the base
# sizes above.
#
# CPU, measured on a 2-core AVX-512-BF16 CPU, ResNet-18 training steps: at 32 px, batch 8, framework
# overhead hides everything (bf16 0.99x, channels_last 0.82x); at 64 px, batch 32, bf16 autocast gains
# 1.6x on the verifier's one thread (1.4x on two), about 0.2 s a step, so a verification stays well under
# a minute. Lab 2 trains on the photo set, whose photograph-sized JPEGs cost 1.8 ms each to decode and
# crop: at 32 px, batch 16, a third of the step is loading, and 2 loader workers beside the verifier's one
# training thread gain 1.39x (on the small set's 80 px JPEGs, with two training threads, workers only
# cost time: 0.87-0.91x). `perflab calibrate` measures each lab's pair at these same sizes.
#
# CUDA, from an H100 80GB (docs/DESIGN.md has the table): at 224 px, batch 128, the fp32 baseline with no
# loader workers waits on its loader 84% of its 340 ms step, so lab 2 keeps that starved baseline (4
# workers: 12.8x) and every other lab starts fed (a manifest's `fed`, `baseline_loader`: since an H200's
# 8 workers fed FP32 but not bf16, the set kept decoded on the device), where bf16 and channels_last give
# 2.2x and checkpointing saves 40% of the activations (2.84 GB to 1.71 GB). Labs 3-6 train on the full set
# there: 78 batches of 128 an epoch, not 7 as on the small set. In laptop mode on a GPU (where full mode is
# the default) a lab runs the short version of full: the small set at 128 px.
LAB_MODES = ("grade", "laptop")


def _lab(lab: str | None) -> Any:
    """`lab`'s manifest (None for none); read lazily: the labs' contracts import this module."""
    from perflab.labs import registry

    return registry.manifest(lab) if lab is not None else None


# Loader workers that feed a GPU where workers load (gpu-check's and bench_loader's ceiling, the decoding
# of a set kept on the device): the H100's 16 cores fed FP32 at 224 px, batch 128 with 8, and one core
# stays with the training process. Not enough for bf16: an H200's 8 workers decoded about 4,000 images a second, half
# of what bf16 with channels_last trains, so the fed labs keep their data on the device instead.
FED_WORKERS = 8


# Set to 1, the fed labs start fed on any device and in any mode: how the kit's own tests run a GPU's
# device-resident data path (the set decoded into memory, augmented by `DeviceAugment`) on a CPU.
FED_ENV = "PERFLAB_FED_BASELINE"


def baseline_loader(lab: str | None, device: str | None = None, mode: str | None = None) -> dict[str, Any]:
    """The loader knobs (`TrainConfig` fields) of `lab`'s baseline on `device` (a device type; default the
    best here): on CUDA, labs whose manifest says `fed` start fed, the training set decoded once into GPU memory and
    augmented there (`data_on_device`, `gpu_augment`), so that no loader sets the pace of what they time,
    on 16 cores or on Colab's 2; everywhere else, and in tiny mode, the plain loader ({})."""
    fed = lab is not None and _lab(lab).fed
    if os.environ.get(FED_ENV) == "1" and fed:  # the kit's own tests: a GPU's path on any device
        return {"data_on_device": True, "gpu_augment": True}
    kind = str(device or pick_device().type).split(":")[0]
    if kind != "cuda" or not fed or (mode or run_mode()) == "tiny":
        return {}
    return {"data_on_device": True, "gpu_augment": True}


def fed_workers() -> int:
    """Loader workers that feed a GPU here: FED_WORKERS, leaving a core to the training process."""
    return max(1, min(FED_WORKERS, usable_cores() - 1))


def mode_sizes(mode: str | None = None, lab: str | None = None, device: str | None = None) -> ModeSizes:
    """The sizes of `mode` (default: the mode in force); in grade and laptop mode, `lab`'s own workload
    on `device` (a device type; default: the best device here) where its manifest lists one; the course's
    data set ($PERFLAB_DATA) wherever one is set."""
    mode = mode or run_mode()
    if mode not in _MODE_SIZES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    sizes = _MODE_SIZES[mode]
    if mode in LAB_MODES and lab is not None:
        kind = device or pick_device().type
        own = _lab(lab).workload(mode, str(kind).split(":")[0])
        if own is not None:
            data, image_size, batch_size = own
            sizes = ModeSizes(mode, data=data, image_size=image_size, batch_size=batch_size, steps=sizes.steps)
    data = course_data()
    return sizes if data is None else dataclasses.replace(sizes, data=data)
