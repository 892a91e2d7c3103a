"""The one device a grading run grades for: decided once, by the grader, and read by everything else.

    decide(gpus, backend)        the run's `GradingDevice` (kind, the GPUs its pool slots get, a line)
    slot_gpu(device, index)      pool slot `index`'s CUDA_VISIBLE_DEVICES entry ("" hides every GPU)
    job_limits(limits, kind)     a job's sandbox limits on that device (no address-space cap on CUDA)

Before, the grader's process, the job's notebook, the data-set builder and the judges each chose a
device for themselves (`env.pick_device()`): on a GPU server whose sandbox capped address space, CUDA
could not start in the graded notebook, which quietly ran on the CPU, while the judges re-measured on
the GPU and blamed the student for the mismatch. Now the grader decides the kind once, carries it to
every process of a job as $PERFLAB_DEVICE (`env.DEVICE_ENV`), and a process that cannot start it stops
with the driver's reason (`env.DeviceUnavailable`), which the grader records as the machine's fault.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from perflab.grading import sandbox


@dataclass(frozen=True)
class GradingDevice:
    """What a grading run grades for: the device kind, and how many GPUs its pool gives out (one a job)."""

    kind: str  # cuda | mps | cpu
    gpus: int  # GPUs the local pool hands out, one per job (0 on a CPU or MPS run)
    note: str = ""  # one line for the instructor where the choice is not the obvious one

    def line(self) -> str:
        what = f"grading for cuda: {self.gpus} GPU(s), one per job" if self.kind == "cuda" else f"grading for {self.kind}"
        return what + (f" ({self.note})" if self.note else "")


def visible_gpus() -> int:
    """CUDA devices this process can see (through its CUDA_VISIBLE_DEVICES); 0 where CUDA cannot start."""
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver counts as no GPU: the run then grades for the CPU, and says so
        return 0


def _other_kind() -> str:
    from perflab import env

    return "mps" if env._mps_available() else "cpu"


def decide(gpus: int | None, backend: str = "local", visible: int | None = None) -> GradingDevice:
    """The run's device. `gpus` None: every GPU this process sees (respecting CUDA_VISIBLE_DEVICES),
    one per job; 0: no GPU, even where there are some (they are hidden from every job, and the run
    grades for the CPU class); N: N of them (ValueError where fewer are visible). The Ray back-end grades
    on its workers' GPUs, which the head may not have: there `gpus` is taken as given."""
    if gpus is not None and (isinstance(gpus, bool) or gpus < 0):
        raise ValueError(f"gpus: must be 0 or more, got {gpus!r}")
    if backend != "local":
        return GradingDevice("cuda", gpus) if gpus else GradingDevice(_other_kind(), 0)
    visible = visible_gpus() if visible is None else visible
    if gpus is None:
        gpus = visible
    if gpus > visible:
        mask = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ValueError(f"gpus: {gpus} asked for, but this machine shows {visible} CUDA device(s)"
                         + (f" (CUDA_VISIBLE_DEVICES={mask!r})" if mask is not None else "")
                         + "; pass --gpus 0 to grade on the CPU")
    if gpus:
        return GradingDevice("cuda", gpus)
    if visible:
        return GradingDevice("cpu", 0, note=f"--gpus 0: the {visible} GPU(s) here are hidden from every job, "
                                           "and the run grades for this machine's CPU class")
    return GradingDevice(_other_kind(), 0)


def slot_gpu(device: GradingDevice, index: int) -> str:
    """Pool slot `index`'s CUDA_VISIBLE_DEVICES entry: its GPU through the grader's own mask on a CUDA run
    (`run.visible_gpu`), else "" so that no process of the job sees a GPU."""
    from perflab.grading.run import visible_gpu

    return visible_gpu(index % device.gpus) if device.kind == "cuda" and device.gpus else ""


def job_limits(limits: sandbox.Limits, kind: str | None) -> sandbox.Limits:
    """The sandbox limits of a job graded for `kind`: on CUDA no address-space cap (the driver maps far
    more address space than it uses, and CUDA cannot start under the default cap); the submission's
    memory is then held by its cgroup alone, where the machine has cgroups."""
    return dataclasses.replace(limits, address_space=False) if kind == "cuda" else limits
