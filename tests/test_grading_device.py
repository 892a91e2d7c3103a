"""One grading device per run: decided once by the grader, carried to every process of a job, and loud
where it cannot start (docs/DESIGN.md, "The grading device").

On a GPU server the sandbox's address-space limit stopped CUDA in the graded notebook, which then ran
quietly on the CPU while the judges re-measured on the GPU and blamed the student. These tests build
that machine on a CPU: a job graded for CUDA here cannot start it, exactly as the sandboxed kernel
could not there.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import nbformat
import pytest
import torch

from perflab import env
from perflab.grading import devices, pipeline, run, sandbox, worker
from perflab.grading.state import State

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "grading"))
import cases  # noqa: E402

SOLUTIONS = Path(__file__).parent / "fixtures" / "grading" / "solutions"
LAB = cases.LAB


# ---------------------------------------------------------------------------------------------
# The device, decided once


def test_the_default_is_every_visible_gpu_one_per_job():
    assert devices.decide(None, visible=2) == devices.GradingDevice("cuda", 2)
    assert pipeline.default_jobs(cores=16, gpus=2) == 2  # not 8 jobs on GPU 0, as before
    assert devices.decide(1, visible=2) == devices.GradingDevice("cuda", 1)


def test_gpus_0_on_a_gpu_host_hides_them_and_grades_for_the_cpu_saying_so():
    device = devices.decide(0, visible=2)
    assert device.kind in ("cpu", "mps") and device.gpus == 0
    assert "hidden" in device.note and "--gpus 0" in device.line()
    assert devices.slot_gpu(device, 0) == ""  # every process of the job sees no GPU


def test_more_gpus_than_visible_is_one_clear_line():
    with pytest.raises(ValueError, match="2 asked for, but this machine shows 0 CUDA device"):
        devices.decide(2, visible=0)


def test_without_a_gpu_the_run_grades_for_this_machine():
    assert devices.decide(None, visible=0).kind in ("cpu", "mps")


def test_ray_takes_the_workers_gpus_as_given():
    assert devices.decide(1, backend="ray", visible=0).kind == "cuda"


def test_a_slot_maps_its_gpu_through_the_graders_mask(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    device = devices.GradingDevice("cuda", 2)
    assert [devices.slot_gpu(device, i) for i in (0, 1)] == ["2", "3"]


def test_the_cli_defaults_to_every_gpu():
    from perflab.cli import build_parser

    args = build_parser().parse_args(["grade", "grade"])
    assert args.gpus is None
    assert pipeline.Settings().gpus is None


# ---------------------------------------------------------------------------------------------
# Loud, not silent


def test_a_process_assigned_cuda_that_cannot_start_it_stops_with_the_drivers_reason(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine starts CUDA")
    monkeypatch.setenv(env.DEVICE_ENV, "cuda")
    with pytest.raises(env.DeviceUnavailable, match="graded for CUDA .* cannot start here: .+"):
        env.pick_device()
    monkeypatch.setenv(env.DEVICE_ENV, "cpu")
    assert env.pick_device().type == "cpu" and env.run_mode() == "laptop"


def test_an_assigned_cpu_wins_over_a_visible_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(env.DEVICE_ENV, "cpu")
    assert env.pick_device().type == "cpu"
    with env.assigned("cpu"):
        assert env.assigned_device() == "cpu"


def test_the_worker_reads_the_first_probes_device_and_the_results_device(tmp_path):
    probe = tmp_path / "start.json"
    probe.write_text(json.dumps({"device": {"assigned": "cuda", "error": "RuntimeError: CUDA driver initialization failed"}}))
    fault = worker.device_fault(probe)
    assert "could not start cuda" in fault and "initialization failed" in fault and "--gpus 0" in fault
    probe.write_text(json.dumps({"device": {"assigned": "cuda", "device": "cuda"}}))
    assert worker.device_fault(probe) is None
    files = {f"{LAB}.json": json.dumps({"machine": {"device": "cpu"}})}
    assert "ran on cpu, but this job is graded for cuda" in worker.results_device_mismatch(files, LAB, "cuda")
    assert worker.results_device_mismatch(files, LAB, "cpu") is None
    # A notebook that set PERFLAB_DEVICE itself ran elsewhere by its own doing: no machine fault to hide behind.
    changed = {"kernel": {"env": {env.DEVICE_ENV: "cpu"}}}
    assert worker.results_device_mismatch(files, LAB, "cuda", changed) is None
    kept = {"kernel": {"env": {env.DEVICE_ENV: "cuda"}}}
    assert "graded for cuda" in worker.results_device_mismatch(files, LAB, "cuda", kept)


# ---------------------------------------------------------------------------------------------
# Limits that CUDA survives

# What the CUDA driver does when it starts: reserve a large span of address space it may never touch.
RESERVE = textwrap.dedent("""
    import ctypes, ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    PROT_NONE, MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE = 0, 0x02, 0x20, 0x4000
    addr = libc.mmap(None, 32 << 30, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    print("reserved" if addr not in (None, ctypes.c_void_p(-1).value) else "refused")
""")


def _reserve(tmp_path: Path, limits: sandbox.Limits) -> str:
    work = tmp_path / f"work-{limits.address_space}"
    work.mkdir()
    (work / "reserve.py").write_text(RESERVE)
    done = sandbox.run([sys.executable, "-I", str(work / "reserve.py")], workdir=work, limits=limits)
    return done.output_tail


def test_a_cuda_job_has_no_address_space_cap_and_a_cpu_job_keeps_it(tmp_path):
    cpu_limits = devices.job_limits(sandbox.Limits(wall_s=60), "cpu")
    cuda_limits = devices.job_limits(sandbox.Limits(wall_s=60), "cuda")
    assert cpu_limits.address_space and not cuda_limits.address_space
    assert cuda_limits.memory_bytes == cpu_limits.memory_bytes  # still the submission's memory, by cgroup
    assert "refused" in _reserve(tmp_path, cpu_limits)
    assert "reserved" in _reserve(tmp_path, cuda_limits)


def test_the_verifiers_no_limit_on_cuda_stays_no_limit_in_the_sandbox(monkeypatch, tmp_path):
    seen = {}

    def fake_run(argv, *, workdir, limits, hide, env):
        seen.update(limits=limits, env=env)
        return sandbox.SandboxRun(1, False, 0.1, b"", "", sandbox.Isolation("none"))

    monkeypatch.setattr(sandbox, "run", fake_run)
    job = {"nonce": "n", "candidate": {"kind": "config"}}
    run.sandboxed_child(job, time_limit=10, memory_limit=None, limits=sandbox.Limits(), hide=[], cpus=None,
                        gpu="1", device="cuda")
    assert seen["limits"].address_space is False
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "1" and seen["env"][env.DEVICE_ENV] == "cuda"
    run.sandboxed_child(job, time_limit=10, memory_limit=2 << 30, limits=sandbox.Limits(), hide=[], cpus=None,
                        gpu="", device="cpu")
    assert seen["limits"].address_space and seen["limits"].memory_bytes == 2 << 30
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == ""


# ---------------------------------------------------------------------------------------------
# The job's data sets


def test_data_sets_are_those_of_the_jobs_device_not_the_graders():
    on_cuda = pipeline.data_sizes(["lab03_amp"], pipeline.Settings(env={"PERFLAB_MODE": "grade"}, device="cuda"))
    on_cpu = pipeline.data_sizes(["lab03_amp"], pipeline.Settings(env={"PERFLAB_MODE": "grade"}, device="cpu"))
    assert "full" in on_cuda and "full" not in on_cpu


# ---------------------------------------------------------------------------------------------
# The whole pipeline, for a device this machine cannot start


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("device-class")
    course = root / "course"
    pipeline.setup(course, SOLUTIONS, [LAB])
    release = nbformat.read(course / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    source = nbformat.read(SOLUTIONS / LAB / f"{LAB}.ipynb", as_version=4)
    (root / "class").mkdir()
    nbformat.write(cases.solved(release, source), root / "class" / f"alice_{LAB}.ipynb")
    with zipfile.ZipFile(root / "download.zip", "w") as zf:
        zf.write(root / "class" / f"alice_{LAB}.ipynb", f"alice_{LAB}.ipynb")
    from perflab.grading import collect

    collect.collect(course, root / "download.zip")
    return course


@pytest.mark.slow
def test_a_job_graded_for_a_device_the_sandbox_cannot_start_is_the_machines_fault(course, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine starts CUDA")
    # The grader's process sees "CUDA" (as the H200's did); the sandboxed kernel cannot start it.
    fake = dataclasses.replace(env.machine_info("cpu"), device="cuda", hardware_class="cuda-simulated")
    monkeypatch.setattr(env, "machine_info", lambda *a, **k: fake)
    settings = pipeline.Settings(limits=sandbox.Limits(wall_s=120), cell_timeout=60, env={"PERFLAB_MODE": "tiny"},
                                 gpus=1, device="cuda", unisolated=sandbox.isolation().kind == "none")
    summary = pipeline.grade(course, settings, solutions=SOLUTIONS)
    assert summary.machine_faults and not summary.graded
    fault = summary.machine_faults[0]
    assert fault.startswith(f"{LAB}/alice: not graded: the grading machine could not start cuda")
    assert "driver" in fault.lower() or "cuda" in fault.lower()
    assert "NOT GRADED through the grading machine's fault" in summary.line()
    assert State.load(course).get(LAB, "alice") is None  # no score recorded: graded again next run

    # The same submission, graded for this machine's own device, is graded.
    again = pipeline.grade(course, dataclasses.replace(settings, gpus=None, device=None), solutions=SOLUTIONS)
    assert again.graded == (f"{LAB}/alice",) and again.device in ("cpu", "mps")
    assert State.load(course).get(LAB, "alice").score > 0


def test_the_demo_takes_the_gpus_flag():
    out = subprocess.run([sys.executable, "-m", "perflab.demo", "--help"], capture_output=True, text=True, check=True)
    assert "--gpus" in out.stdout


# ---------------------------------------------------------------------------------------------
# Lab 6 graded alone starts from the student's own decisions


def test_lab6s_job_carries_the_students_graded_decisions_where_the_notebook_reads_them(tmp_path):
    """Lab 6 starts from the decisions the grading state holds for the student's graded labs 2-5 (what their
    judges graded), laid where the notebook reads them at home; a results file the student's code wrote
    into a graded folder is not read, and a lab not graded is left out (the notebook's default)."""
    from perflab import results
    from perflab.grading import job as job_mod
    from perflab.grading.result import Job, LabInfo
    from perflab.grading.state import CellResult, Record, State
    from perflab.labs.lab06 import report_inputs as lab06_report
    from perflab.workload import TrainConfig

    course = tmp_path / "course"
    graded = {"lab02_feed": {"config": TrainConfig(num_workers=1, persistent_workers=True, prefetch_factor=2).to_dict()},
              "lab03_amp": {"config": TrainConfig(amp_dtype="bf16", channels_last=True).to_dict()},
              "lab04_memory": {"checkpoint": ["layer1", "layer2"]},
              "lab05_compile": {"choice": "default"}}
    state = State.load(course)
    for lab, decision in graded.items():
        state.put(Record("ann", lab, "x", "graded", (CellResult("test_x", 1.0, 1.0, decision=decision),)))
        results.save(course / "autograded" / "ann" / lab / "results" / f"{lab}.json", lab,  # written by her code
                     {"compile": {"choice": "max-autotune"}}, config=TrainConfig(num_workers=3))
    submitted = course / "submitted" / "ann" / "lab06_together" / "lab06_together.ipynb"
    job = pipeline.with_earlier(course, Job("ann", "lab06_together", submitted, "x"))
    assert [lab for lab, _ in job.earlier] == list(pipeline.starts_from("lab06_together")) == list(graded)
    assert pipeline.with_earlier(course, Job("bob", "lab06_together", submitted, "x")).earlier == ()

    work = tmp_path / "work"
    work.mkdir()
    tmpl = tmp_path / "tmpl"
    (tmpl / "source" / "lab06_together").mkdir(parents=True)
    info = LabInfo("lab06_together", "lab06_together.ipynb", (), {})
    job_mod.prepare_job(job, info, tmpl, work, pipeline.Settings(device="cpu"), nbformat.v4.new_notebook(), 1)
    found = lab06_report.earlier_decisions(work / "notebook")  # where the notebook runs
    assert found["loader"] == {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 2}
    assert found["precision"] == {"amp_dtype": "bf16", "channels_last": True}
    assert found["compile_mode"] == "default" and found["checkpoint"] == ("layer1", "layer2")
    assert json.loads((work / "job.json").read_text())["device"] == "cpu"


def test_the_plan_without_earlier_results_is_the_one_calibration_times():
    """Graded alone on an H200, the notebook re-entered bf16 without channels_last and no compile, while the
    bar was calibrated on bf16 + channels_last + compile: one function now gives both."""
    from perflab.labs import lab03
    from perflab.labs.lab03 import judges as hidden03
    from perflab.labs.lab06 import judges as hidden06
    from perflab.verify.expectations import Expectation

    gpu = dataclasses.replace(env.machine_info("cpu"), device="cuda", hardware_class="cuda-simulated")
    answer = lab03.baseline_config("tiny").replace(amp_dtype="bf16", channels_last=True)
    gains = {"lab03_amp", "compile"}

    def bar(name):
        return Expectation(name, 1.1, "gain" if name in gains else "parity", "cuda-simulated", True, "calibrated")

    import unittest.mock as mock

    with mock.patch.object(hidden03, "reference_best", lambda mode=None, info=None: answer), \
            mock.patch.object(env, "supports_autocast", lambda device, dtype: True):
        decided = hidden06.reference_decisions(gpu, "grade")
        assert decided["precision"] == {"amp_dtype": "bf16", "channels_last": True}
        assert decided["compile_mode"] == "default"
        final = hidden06.reference_final("tiny", gpu, expectations=bar)
    assert (final.amp_dtype, final.channels_last) == ("bf16", True)
    notebook = (Path(__file__).parents[1] / "solutions" / "lab06_together" / "lab06_together.py").read_text()
    # The reference notebook's re-entry is that same function, on the grader's side (its solution region,
    # which the release strips); the student's copy tells them to enter a missing decision by hand.
    assert "import perflab.labs.lab06.judges as hidden06" in notebook
    assert "hidden06.reference_decisions(INFO)" in notebook and "lab06.reference_decisions" not in notebook
    # ... and quotes no hidden test's line: the grader's leak guard would keep no feedback notebook of it.
    from perflab.grading import feedback
    from perflab.labs import build

    source = build.read_notebook(build.source_notebook("lab06_together"))
    guarded = {line for lines in feedback.hidden_lines(source.cells).values() for line in lines}
    decisions = next(c for c in source.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "decisions")
    assert not {line.strip() for line in decisions.source.splitlines()} & guarded
    assert "enter that lab's decision by hand, from your own\n# measurement in that lab" in notebook
    released = (Path(__file__).parents[1] / "labs" / "lab06_together" / "lab06_together.ipynb").read_text()
    assert "reference_decisions" not in released and "enter that lab's decision by hand" in released


# ---------------------------------------------------------------------------------------------
# The reference notebooks on a GPU's device-resident path (run here on the CPU)


@pytest.mark.slow
@pytest.mark.parametrize("lab", ["lab03_amp"])
def test_the_reference_notebook_runs_the_device_resident_path_without_an_error(lab, tmp_path, tiny_data):
    """Lab 3's census took the raw uint8 batch of the set kept on the device to the model (two tracebacks
    on an H200, then no results file). The reference notebook's text twin runs top to bottom as a script,
    in tiny mode, with the fed baseline a GPU grades from: any exception stops it."""
    twin = Path(__file__).parents[1] / "solutions" / lab / f"{lab}.py"
    (tmp_path / twin.name).write_text(twin.read_text())
    environ = {k: v for k, v in __import__("os").environ.items() if k not in ("PERFLAB_DEVICE",)}
    environ.update(PERFLAB_MODE="tiny", MPLBACKEND="Agg", **{env.FED_ENV: "1"})
    done = subprocess.run([sys.executable, twin.name], cwd=tmp_path, env=environ, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    saved = json.loads((tmp_path / "results" / f"{lab}.json").read_text())
    assert saved["config"]["data_on_device"] and saved["config"]["gpu_augment"]


def test_a_raw_device_batch_cannot_reach_the_model(tiny_data):
    from perflab import workload

    work = workload.build(workload.TrainConfig(data="tiny", batch_size=4, data_on_device=True, gpu_augment=True))
    images, labels, _ = work.next_batch()
    assert images.dtype == torch.uint8
    with pytest.raises(workload.RawBatch, match="work.on_device"):
        work.model(images)
    ready, labels = work.on_device(images, labels)
    assert work.model(ready).shape == (4, work.num_classes)


def test_an_unbuilt_set_in_a_read_only_folder_is_one_line_not_oserror_30(tmp_path, monkeypatch):
    import errno

    from perflab import dataset

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(dataset.DatasetError, match="tiny set is not built and its folder cannot be written here "
                                                   r"\(Read-only file system\).*perflab dataset build --size tiny"):
        dataset.build("tiny", root=tmp_path / "sets" / "tiny")


def test_lab6_is_graded_after_the_labs_it_starts_from_and_reads_what_they_merged(tmp_path):
    from perflab.grading.result import Job
    from perflab.grading.state import CellResult, Record, State
    from perflab.workload import TrainConfig

    course = tmp_path / "course"
    todo = [Job("ann", "lab06_together", course / "a.ipynb", "1"), Job("ann", "lab03_amp", course / "b.ipynb", "2")]
    waves = []

    def run(wave):
        waves.append(wave)
        for job in wave:  # what the merge of a graded submission leaves: its record, with the decision graded
            if job.lab == "lab03_amp":
                State.load(course).put(Record(job.student, job.lab, job.sha256, "graded", (
                    CellResult("test_amp_verified", 1.0, 1.0, decision={"config": TrainConfig().to_dict()}),)))

    pipeline.in_waves(course, todo, run)
    assert [[j.lab for j in wave] for wave in waves] == [["lab03_amp"], ["lab06_together"]]
    assert [lab for lab, _ in waves[1][0].earlier] == ["lab03_amp"]
