"""The sandboxed runs of grading: the worker on a prepared job, and the judges' runs of student code.

    check_isolation(settings)                this machine's sandbox kind, or Unisolated (refused)
    grader_only_paths()                      the folders of the checkout a sandbox must not see
    run_worker(workdir, env, limits, hide)   `perflab.grading.worker` on a prepared work folder
    sandboxed_child(job, ...)                a `perflab.verify` child run (a candidate of student code)
    sandboxed_program(program, timeout, ...) a program holding student code (`Context.run_program`)

Each run gets a fresh work folder (`workfolders`) and `perflab.grading.sandbox`'s limits; what comes
back is raw data for the parent to read.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from perflab.grading import sandbox
from perflab.grading.job import Settings
from perflab.grading.workfolders import work_folder
from perflab.labs import registry

REPO = Path(__file__).resolve().parents[2]
# Folders of the kit a graded notebook may read: the package (less its grader-only part), the data
# sets, the released labs and the environment. Everything else in the checkout is hidden from the sandbox.
PUBLIC_ENTRIES = frozenset({"perflab", "datasets", "labs", ".venv", "venv", ".whl"})


class Unisolated(ValueError):
    """The sandbox has no namespaces here and the instructor did not choose to grade without them."""


def check_isolation(settings: Settings) -> sandbox.Isolation:
    """This machine's sandbox kind; `Unisolated` (one line: why, and the two ways on) where it has no
    namespaces and `settings.unisolated` is not set: perflab never runs student code unisolated by default."""
    iso = sandbox.isolation()
    if iso.kind == "none" and not settings.unisolated:
        why = "; ".join(iso.notes) or "no Linux namespaces here"
        raise Unisolated(f"refusing to run student code without Linux namespaces ({why}): it would run as you, "
                         "with the network and your files; grade in the container (autograder/Containerfile, see "
                         "docs/instructors.md) or pass --unisolated to grade anyway (recorded in the grades)")
    return iso


def grader_only_paths(repo: Path = REPO) -> list[Path]:
    """Folders of the checkout the sandbox must not see: the grader-only judges, the solutions, the
    expectations and course folders, the tests, the git history, and any other folder of the kit."""
    keep = [Path(sys.prefix).resolve(), *(Path(p).resolve() for p in sandbox.data_folders())]
    out = registry.grader_only_folders()
    for child in sorted(Path(repo).iterdir()):
        if not child.is_dir() or child.is_symlink() or child.name in PUBLIC_ENTRIES:
            continue
        if any(k == child.resolve() or child.resolve() in k.parents for k in keep):
            continue
        out.append(child)
    return out


def visible_gpu(index: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of this process's GPU number `index` (a pool slot), what every
    process of that slot is given: the grader's own mask mapped (under `2,3`, slot 0 is GPU 2; UUIDs and
    MIG names kept as written), else the index."""
    ids = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    return ids[index] if index < len(ids) else str(index)


def run_worker(workdir: Path, env: Mapping[str, str], limits: sandbox.Limits,
               hide: Sequence[Path]) -> sandbox.SandboxRun:
    """Run `perflab.grading.worker` on the work folder `job.prepare_job` laid out, in the sandbox."""
    return sandbox.run([sys.executable, "-m", "perflab.grading.worker", str(workdir)], workdir=workdir,
                       limits=limits, hide=hide, env=env)


def course_env() -> dict[str, str]:
    """The course's model and data set as this process has them ($PERFLAB_MODEL, $PERFLAB_DATA), for a sandbox:
    a course on another model or an ImageFolder is graded on them in every process of a job."""
    from perflab.env import COURSE_ENV

    return {name: os.environ[name] for name in COURSE_ENV if os.environ.get(name, "").strip()}


def _device_env(gpu: str | None, device: str | None) -> dict[str, str]:
    """The environment that gives a sandboxed process its job's device: the GPU it may see (its
    CUDA_VISIBLE_DEVICES entry; "" hides every GPU) and the kind it is graded for ($PERFLAB_DEVICE), on the
    course's model and data set."""
    from perflab.env import DEVICE_ENV

    return {**({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}),
            **({DEVICE_ENV: device} if device else {}), **course_env()}


def sandboxed_child(job: dict[str, Any], *, time_limit: float, memory_limit: int | None, limits: sandbox.Limits,
                    hide: Sequence[Path], cpus: tuple[int, ...] | None, gpu: str | None,
                    device: str | None = None) -> tuple[Any, str, float]:
    """`perflab.verify`'s child run in a fresh sandbox: a candidate of student code is re-measured
    where it can reach nothing of the grader's; the parent still decides from its raw times."""
    with work_folder("verify-") as workdir:
        job = dict(job)
        candidate = dict(job["candidate"])
        if candidate.get("kind") == "module":
            shutil.copyfile(candidate["target"], workdir / "candidate.py")
            candidate["target"] = str(workdir / "candidate.py")
        job["candidate"] = candidate
        job["result_path"] = str(workdir / "result.json")
        (workdir / "verify-job.json").write_text(json.dumps(job), encoding="utf-8")
        env = {"HOME": str(workdir), "PYTHONDONTWRITEBYTECODE": "1", "MPLCONFIGDIR": str(workdir / "mpl"),
               **_device_env(gpu, device)}
        # The verifier's memory limit is each process's address space; None (its choice on CUDA) is no
        # address-space limit here too, the job's memory then held by the sandbox's cgroup alone.
        box = (replace(limits, wall_s=time_limit, cpus=cpus or limits.cpus, address_space=False)
               if memory_limit is None else
               replace(limits, wall_s=time_limit, cpus=cpus or limits.cpus, memory_bytes=memory_limit))
        run = sandbox.run([sys.executable, "-I", "-m", "perflab.verify.child", "--job", str(workdir / "verify-job.json")],
                          workdir=workdir, limits=box, hide=hide, env=env)
        if run.timed_out:
            return None, f"timeout: the run did not finish within its {time_limit:.0f} s limit", run.wall_s
        try:
            result = json.loads(run.result.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            result = None
        if not isinstance(result, dict) or result.get("nonce") != job["nonce"]:
            return None, (f"crashed: the process exited with status {run.returncode} without a result; its last "
                          f"output: {run.output_tail[-300:]}"), run.wall_s
        return result, "", run.wall_s


def sandboxed_program(program: str, timeout: float, *, limits: sandbox.Limits, hide: Sequence[Path],
                      cpus: tuple[int, ...] | None, gpu: str | None, device: str | None = None) -> tuple[int, str]:
    """A program holding student code, run with `python -I` in a fresh sandbox: (exit status, output tail)."""
    with work_folder("program-") as workdir:
        (workdir / "program.py").write_text(program, encoding="utf-8")
        env = {"HOME": str(workdir), "PYTHONDONTWRITEBYTECODE": "1", **_device_env(gpu, device)}
        run = sandbox.run([sys.executable, "-I", str(workdir / "program.py")], workdir=workdir,
                          limits=replace(limits, wall_s=timeout, cpus=cpus or limits.cpus), hide=hide, env=env)
        return (-9 if run.timed_out else run.returncode), run.output_tail
