"""The parent side of a verification: start a fresh interpreter, limit it, read its JSON, decide.

The child (`perflab.verify.child`) measures; this process decides from the child's raw block
times, so a verdict can always be recomputed from what it carries.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import logging
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from perflab.verify import decide, guard, machine_load
from perflab.verify.candidates import Side

log = logging.getLogger(__name__)
T = TypeVar("T")

OUTCOMES = ("pass", "fail", "inconclusive", "error", "deferred")
# Wall-time limit of one verification: the timing budget (20 s) plus building both sides and their
# warm-up, which on a 2-core CPU includes up to ~2 minutes of torch.compile for ResNet-18.
TIME_LIMIT_SECONDS = 300.0
# Address-space limit of the child on CPU: importing torch reserves ~3 GiB of address space and
# ResNet-18 training at grade and laptop sizes stays under 2 GiB resident; a candidate that wants more
# is broken. On CUDA the driver reserves far more address space than it uses, so no limit is set there.
MEMORY_LIMIT_BYTES = 8 * 2**30
# A claim is "far off" when it lies outside the re-measured CI stretched by this fraction either way:
# students time on their own machines, so an honest figure can sit a little outside ours.
CLAIM_TOLERANCE = 0.25
# A claim above the re-measured CI's upper end by this factor is contradicted: the candidate fails.
# The graded notebook computes its claim on the grading machine in the same run, so only a figure
# that was not measured (a typed-in number, a patched clock) lands this far off; the in-notebook
# timings are short, hence the wide margin. An under-claim is only noted.
CLAIM_CONTRADICTED = 3.0
# The child's timed total may exceed the parent's wall clock by this much (clock granularity) before
# it counts as a doctored clock: the timed blocks are a strict part of the child's life.
WALL_SLACK_SECONDS = 0.05
# How much of the child's stderr a reason quotes.
STDERR_TAIL = 400
# Torch intra-op threads of the child unless the caller names a count. One thread cannot be stalled by
# another process on the machine: with one of 2 cores kept busy, a child of 2 threads spent 3 s a pair
# on lab 3's grade step (OpenMP waits at every op for the thread that shares the busy core) and ended
# "too few pairs" for the reference and a near-lazy choice alike, where a child of 1 thread decided both
# at the first look (bf16 1.60x pass, channels_last 1.05x fail, 12 s each; `make bench-verify`).
# Calibration times through this same protocol, so the bars hold at this thread count.
VERIFY_THREADS = 1


@dataclass(frozen=True)
class Verdict:
    """What a verification concluded, with the raw block times it concluded from.

    outcome      pass | fail | inconclusive | error | deferred (not measured here: in the grading
                 kernel the grader re-measures the exported choice itself, after the notebook ran)
    code         a named reason: "clears_bar" / "below_bar" / "undecided" when measured, else the check
                 that stopped it ("loss_mismatch", "clock_tampered", "timeout", ...)
    reason       one or two sentences a student can read
    """

    outcome: str
    code: str
    reason: str
    expectation: float
    claim: float | None = None
    claim_far_off: bool = False
    baseline_times: tuple[float, ...] = ()
    candidate_times: tuple[float, ...] = ()
    block_steps: int = 0
    seed: int = 0
    elapsed_seconds: float = 0.0
    timed_seconds: float = 0.0
    baseline: str = ""
    candidate: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome: {self.outcome!r} is not one of {', '.join(OUTCOMES)}")
        object.__setattr__(self, "baseline_times", tuple(float(x) for x in self.baseline_times))
        object.__setattr__(self, "candidate_times", tuple(float(x) for x in self.candidate_times))

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @property
    def pairs(self) -> int:
        return len(self.baseline_times)

    @property
    def speedup(self) -> float | None:
        """Ratio of the 20th-percentile block times (derived from the raw samples)."""
        if self.pairs < 2:
            return None
        return decide.speedup(self.baseline_times, self.candidate_times)

    @property
    def ci(self) -> tuple[float, float] | None:
        """Bootstrap 95% CI of `speedup` (deterministic: seeded by the verification's seed)."""
        if self.pairs < 2:
            return None
        return decide.bootstrap_ratio_ci(self.baseline_times, self.candidate_times, seed=self.seed)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["baseline_times"] = list(self.baseline_times)
        data["candidate_times"] = list(self.candidate_times)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        return cls.from_dict(json.loads(text))

    def to_row(self, name: str) -> dict[str, Any]:
        """The `verification` row of a results file (`perflab.results`)."""
        row: dict[str, Any] = {"name": name, "verdict": self.outcome, "reason": self.reason}
        if self.speedup is not None:
            row["speedup"] = self.speedup
            row["ci"] = list(self.ci or ())
        return row

    def describe(self) -> str:
        lines = [f"{self.outcome.upper()} ({self.code}): {self.reason}"]
        if self.speedup is not None and self.ci is not None:
            lo, hi = self.ci
            lines.append(f"speedup {self.speedup:.3f}x, 95% CI [{lo:.3f}, {hi:.3f}], bar {self.expectation:.2f}x, "
                         f"{self.pairs} pairs of {self.block_steps}-step blocks, {self.elapsed_seconds:.1f} s")
        return "\n".join(lines)


def direction(lo: float, hi: float) -> str:
    """What a speedup's CI says about the change, in the kit's one vocabulary: "faster" or "slower"
    only when the whole CI is on that side of 1, else "no difference detected"."""
    if lo > 1.0:
        return "faster"
    if hi < 1.0:
        return "slower"
    return "no difference detected"


# Where the calling thread's children run (`placed`): (cores, CUDA_VISIBLE_DEVICES entry), None for the
# process's own.
_placement: contextvars.ContextVar[tuple[tuple[int, ...] | None, str | None]] = contextvars.ContextVar(
    "perflab_verify_placement", default=(None, None))
# Whether the calling thread measures for the grader (inside `placed`): a disturbed measurement is taken again.
_grading: contextvars.ContextVar[bool] = contextvars.ContextVar("perflab_verify_grading", default=False)


@contextlib.contextmanager
def placed(cpus: tuple[int, ...] | None, gpu: str | None) -> Iterator[None]:
    """Inside this block, this thread's `run_child` runs its child on `cpus` (sched_setaffinity, where the
    OS still allows them) and sees only GPU `gpu` (its CUDA_VISIBLE_DEVICES entry). A local grading pool
    gives each job its own cores or GPU; the judges' re-measurements of that job run there too, not on
    the grader's first GPU beside another job's notebook. A re-measurement in this block that other
    processes' load disturbed is taken again once the machine is quiet (`verify`)."""
    token = _placement.set((tuple(cpus) if cpus else None, gpu))
    try:
        with measured_again_when_disturbed():
            yield
    finally:
        _placement.reset(token)


@contextlib.contextmanager
def measured_again_when_disturbed() -> Iterator[None]:
    """Inside this block, this thread's `verify` measures again, once the machine is quiet, a run that other
    processes' load disturbed (`machine_load`): the grader's judges (`placed`) and calibration."""
    grading = _grading.set(True)
    try:
        yield
    finally:
        _grading.reset(grading)


def _preexec(memory_limit: int | None, cpus: tuple[int, ...] | None = None) -> Any:
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_limit:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
        if cpus and hasattr(os, "sched_setaffinity"):
            with contextlib.suppress(OSError):  # cores taken away since the pool started: run unpinned
                os.sched_setaffinity(0, cpus)

    return limit


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return text[-STDERR_TAIL:]


def run_child(job: dict[str, Any], *, time_limit: float, memory_limit: int | None) -> tuple[dict[str, Any] | None, str, float]:
    """Run the child on `job` (where `placed` put this thread); its result (None if none came back), a
    reason when none did, and the wall time."""
    with tempfile.TemporaryDirectory(prefix="perflab-verify-") as tmp:
        tmpdir = Path(tmp)
        job = dict(job, result_path=str(tmpdir / "result.json"))
        stdout, stderr = tmpdir / "stdout.txt", tmpdir / "stderr.txt"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
        cpus, gpu = _placement.get()
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-I", "-m", "perflab.verify.child"],
                                    stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=tmp, env=env,
                                    start_new_session=True, preexec_fn=_preexec(memory_limit, cpus))
            timed_out = False
            try:
                try:
                    assert proc.stdin is not None
                    proc.stdin.write(json.dumps(job).encode())
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
                try:
                    proc.wait(timeout=time_limit)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(proc.pid)
                    proc.wait()
            except BaseException:  # interrupted (Ctrl-C): leave no child behind
                _kill_group(proc.pid)
                proc.wait()
                raise
            wall = time.perf_counter() - start
            _kill_group(proc.pid)  # whatever the candidate left behind (loader workers, a fork)
        result = None
        try:
            result = json.loads(Path(job["result_path"]).read_text())
        except (OSError, ValueError):
            result = None
        if timed_out:
            return None, f"timeout: the run did not finish within its {time_limit:.0f} s limit", wall
        if result is None or result.get("nonce") != job["nonce"]:
            code = proc.returncode
            if code is not None and code < 0:
                name = signal.Signals(-code).name
                why = f"killed: the process died from signal {name}"
                if name == "SIGKILL" and memory_limit:
                    why += " (killed by the system or itself; out of memory is one cause)"
            else:
                why = f"crashed: the process exited with status {code} without a result"
            tail = _tail(stderr)
            return None, why + (f"; its last output: {tail}" if tail else ""), wall
        return result, "", wall


def _default_memory_limit(baseline: Side, candidate: Side) -> int | None:
    import torch

    devices = {s.kwargs.get("config", {}).get("device") for s in (baseline, candidate)}
    if torch.cuda.is_available() and "cpu" not in devices:
        return None
    return MEMORY_LIMIT_BYTES


def verify(baseline: Any, candidate: Any, *, expectation: float, claim: float | None = None,
           budget: decide.Budget | None = None, seed: int = 0, threads: int | None = None,
           time_limit: float = TIME_LIMIT_SECONDS, memory_limit: int | None | str = "auto",
           hashes: dict[str, str] | None = None, runner: Callable[..., Any] | None = None,
           measure_activations: bool = False) -> Verdict:
    """Re-measure `candidate` against perflab's reference `baseline` in a fresh interpreter; a `Verdict`.

    baseline     a `TrainConfig` or `Side.reference(...)`: always perflab's code, never the student's
    candidate    a `TrainConfig`, a `Side`, or the path of a module file that follows the contract
    expectation  the speedup the candidate must clear (see `load_expectation`)
    claim        the student's own figure, checked against the re-measured CI
    threads      torch intra-op threads in the child (default VERIFY_THREADS, the count the bars are calibrated at)
    hashes       perflab's file hashes the child must find (default: `guard.expected_hashes()`)
    runner       runs the child job like `run_child` (the grader passes its sandbox; default: a local process)
    measure_activations  also measure the activation bytes one training step of each side saves for
                 backward (`perflab.verify.saved`, in the child's first gate step): `details["activation_bytes"]`;
                 on a CUDA device also the allocator's peak over that step above what it began with:
                 `details["cuda_peak_bytes"]`
    """
    base_side = _as_side(baseline, "baseline")
    cand_side = _as_side(candidate, "candidate")
    if base_side.is_student_code:
        raise ValueError("baseline: must be perflab's reference (a TrainConfig or Side.reference), "
                         "never a module exported by the student; time the lab's reference baseline instead")
    if not (expectation > 0 and math.isfinite(expectation)):
        raise ValueError(f"expectation: must be a positive number, got {expectation!r}")
    if claim is not None and not (isinstance(claim, (int, float)) and claim > 0 and math.isfinite(claim)):
        raise ValueError(f"claim: must be a positive number (the speedup you measured), got {claim!r}")
    budget = budget or decide.Budget()
    threads = VERIFY_THREADS if threads is None else threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads: must be a whole number of torch threads >= 1, got {threads!r}")
    if _same_work(base_side, cand_side):
        return no_change(expectation, claim=claim, seed=seed, baseline=base_side.label, candidate=cand_side.label)
    if memory_limit == "auto":
        memory_limit = _default_memory_limit(base_side, cand_side)
    job = {"nonce": secrets.token_hex(16), "seed": seed, "threads": threads, "expectation": expectation,
           "budget": budget.to_dict(), "baseline": base_side.to_dict(), "candidate": cand_side.to_dict(),
           "hashes": hashes if hashes is not None else guard.expected_hashes(),
           "activation_bytes": bool(measure_activations)}
    log.info("verifying %s against %s (bar %.2fx)", cand_side.label, base_side.label, expectation)
    shareable = runner is None and not cand_side.is_student_code
    needed = threads + max(_workers(base_side), _workers(cand_side), 1)  # cores the child may keep busy
    result, why, wall, seed, busy = _measured(job, runner or run_child, shareable, time_limit=time_limit,
                                              memory_limit=memory_limit, needed=needed)
    tries = 1
    first = _first_run(result, busy)
    if machine_load.disturbed(busy, needed) and _grading.get() and _clean(result):
        # The grader's measurement, and another process competed for the cores while the child timed:
        # measure again once the machine is quiet (a student's figure is never judged on someone else's load).
        log.warning("the machine was busy with other work while %s was re-measured (%.2f CPU cores on "
                    "average); measuring again once it is quiet", cand_side.label, busy)
        machine_load.wait_for_quiet(needed=needed)
        result, why, wall, seed, busy = _measured(job, runner or run_child, shareable, time_limit=time_limit,
                                                  memory_limit=memory_limit, needed=needed)
        tries = 2
    common = {"expectation": expectation, "claim": claim, "seed": seed, "elapsed_seconds": wall,
              "baseline": base_side.label, "candidate": cand_side.label}
    verdict = Verdict("error", why.split(":")[0], why, **common) if result is None else judge(result, budget=budget,
                                                                                              **common)
    verdict = _with_load(verdict, busy, tries, needed)
    if tries == 2:  # what the disturbed first run measured stays beside the verdict, for whoever audits it
        verdict = dataclasses.replace(verdict, details={**verdict.details, "first_run": first})
    return verdict


def _workers(side: Side) -> int:
    """Loader workers a side's configuration starts (0 for a module: its processes are its own business)."""
    config = side.kwargs.get("config")
    workers = config.get("num_workers") if isinstance(config, dict) else None
    return workers if isinstance(workers, int) and not isinstance(workers, bool) and workers > 0 else 0


def _clean(result: Any) -> bool:
    """A child result that may be measured again: timed, with no problem found (a run that raised, or where
    the guard found tampering, keeps its verdict: disturbing the machine never buys a second draw of it)."""
    return isinstance(result, dict) and "error" not in result and not result.get("problems")


def _first_run(result: Any, busy: float | None) -> dict[str, Any]:
    """What a first run measured, kept where it is measured again: its block times and the load beside it."""
    times = result if isinstance(result, dict) else {}
    return {"foreign_cores": busy, **{k: times.get(k) for k in ("baseline_times", "candidate_times")}}


# What a verdict timed on a busy machine says (`perflab.labs.common.suspicion` flags it for a person).
BUSY_WORDS = "the figure is partly the machine's load; measure again when the machine is idle"


def _with_load(verdict: Verdict, busy: float | None, tries: int, needed: int) -> Verdict:
    """`verdict` with the cores other processes kept busy while it was timed (`details["foreign_cores"]`),
    how many times it was measured (`"measured"`) and whether that load disturbed it (`"disturbed"`: more
    than the cores its `needed` left free, `machine_load.disturbed`), its reason saying so where it did."""
    if busy is None:
        return verdict
    details = {**verdict.details, "foreign_cores": busy, "measured": tries,
               "disturbed": machine_load.disturbed(busy, needed)}
    return dataclasses.replace(verdict, reason=verdict.reason + load_note(details), details=details)


def load_note(details: dict[str, Any]) -> str:
    """What a verdict's reason adds where other processes disturbed its timing ('' where they did not): for
    a reason that is rewritten after the verifier (the keep rule's), so the note is never lost."""
    busy = details.get("foreign_cores")
    if not details.get("disturbed") or not isinstance(busy, (int, float)):
        return ""
    twice = ", twice" if details.get("measured") == 2 else ""
    return f"; other processes kept {busy:.2f} CPU cores busy on average while it was timed{twice}: {BUSY_WORDS}"


# Measurements a grading run shares (`shared_measurements`): one child's raw result per job, by the job
# less its nonce and seed, and `once_per_run`'s results; None outside such a run.
_shared: dict[str, Any] | None = None
_sharing_depth = 0
_sharing_guard = threading.Lock()
_job_locks: dict[str, threading.Lock] = {}


@contextlib.contextmanager
def shared_measurements() -> Iterator[None]:
    """Inside this block, re-measuring perflab's own code on both sides (two configurations, never a
    module of student code) with the same job as one this process already measured reuses that child's
    raw result, judged again for each caller's claim. A grading run wraps its submissions in it: students
    who decided the same configuration get the same measurement rather than two draws of the noise (one
    passing and one failing by chance), and the machine times it once, not once per student."""
    global _shared, _sharing_depth
    with _sharing_guard:
        _sharing_depth += 1
        if _shared is None:
            _shared = {}
    try:
        yield
    finally:
        with _sharing_guard:
            _sharing_depth -= 1
            if _sharing_depth == 0:
                _shared = None
                _job_locks.clear()


def _measured(job: dict[str, Any], run: Callable[..., Any], shareable: bool, *, time_limit: float,
              memory_limit: int | None, needed: int = 2) -> tuple[Any, str, float, int, float | None]:
    """(result, why, wall seconds, the seed it was measured with, the cores other processes kept busy
    meanwhile or None): the child's run, or the run's shared measurement of the same job
    (`shared_measurements`). A failed, flagged, undecidably short or disturbed run is never handed on."""
    def measure() -> tuple[Any, str, float, int, float | None]:
        start = machine_load.sample()
        measured = run(job, time_limit=time_limit, memory_limit=memory_limit)
        return (*measured, job["seed"], machine_load.foreign_cores(start, machine_load.sample()))

    def decided(measured: tuple[Any, str, float, int, float | None]) -> bool:
        result = measured[0]
        return (isinstance(result, dict) and "error" not in result and not result.get("problems")
                and len(result.get("baseline_times", [])) >= job["budget"]["min_pairs"]
                and not machine_load.disturbed(measured[4], needed))

    if not shareable:
        return measure()
    key = json.dumps({k: v for k, v in job.items() if k not in ("nonce", "seed")}, sort_keys=True, default=str)
    return _once(f"job:{key}|{time_limit}|{memory_limit}", measure, keep=decided)


def once_per_run(key: str, measure: Callable[[], T]) -> T:
    """`measure()`; within a grading run (`shared_measurements`), its first result for `key`, measured once
    (a caller that asks while it is measured waits for it). For a grader's measurement of the machine
    itself, which does not change between the submissions of one run."""
    return _once(f"once:{key}", measure)


def _once(key: str, measure: Callable[[], T], keep: Callable[[T], bool] = lambda _: True) -> T:
    """`measure()`, or inside a grading run the value kept for `key` (measured by the first caller, which
    the others wait for; kept only where `keep` says so)."""
    store = _shared
    if store is None:
        return measure()
    with _sharing_guard:
        lock = _job_locks.setdefault(key, threading.Lock())
    with lock:
        if key in store:
            log.info("reusing this grading run's measurement (%s)", key.split(":", 1)[0])
            return store[key]
        value = measure()
        if keep(value):
            store[key] = value
        return value


def _same_work(a: Side, b: Side) -> bool:
    """Whether two sides run the same perflab code with the same arguments (a candidate that changed
    nothing), configurations compared by what they do on their device (`TrainConfig.effective`: pin_memory
    on a CPU is the same run, and timing it would only measure noise against the bar)."""
    if not (a.kind == b.kind == "reference" and a.target == b.target and a.factory == b.factory and a.dtype == b.dtype):
        return False
    if a.kwargs == b.kwargs:
        return True
    if set(a.kwargs) == set(b.kwargs) == {"config"}:
        from perflab.workload import TrainConfig

        try:
            configs = [TrainConfig.from_dict(side.kwargs["config"]).effective() for side in (a, b)]
        except (TypeError, ValueError):
            return False
        return configs[0] == configs[1]
    return False


def no_change(expectation: float, *, claim: float | None = None, seed: int = 0, baseline: str = "",
              candidate: str = "") -> Verdict:
    """The verdict on a candidate identical to the baseline, without timing it: there is no speedup to
    measure. Where this hardware's bar asks for a gain it fails; where it asks only for no regression
    (no gain to give here), keeping the baseline is the right decision and passes."""
    common = {"expectation": expectation, "claim": claim, "seed": seed, "baseline": baseline, "candidate": candidate}
    # An unchanged configuration's speedup is 1.00x exactly; a claim more than CLAIM_CONTRADICTED times that
    # is contradicted as it would be by a re-measurement. (A smaller miss is the student's own A/A noise,
    # which a notebook's short comparison can put well away from 1.0: no far-off note without a CI to hold.)
    if claim is not None and claim > CLAIM_CONTRADICTED:
        return Verdict("fail", "claim_contradicted",
                       f"your claimed {claim:.2f}x is more than {CLAIM_CONTRADICTED:g} times the speedup of a "
                       "candidate that is the baseline (1.00x): a claim must come from your own measurement",
                       claim_far_off=True, **common)
    if expectation > 1.0:
        return Verdict("fail", "no_change", f"no change: the candidate is the baseline, so its speedup is 1.00x, "
                                            f"below this machine's bar of {expectation:.2f}x (the reference "
                                            "solution gains here; apply the optimisation)", **common)
    return Verdict("pass", "no_change", f"no change: the candidate is the baseline; this machine's bar is "
                                        f"{expectation:.2f}x (no gain to take here), so keeping the baseline is "
                                        "the right decision", **common)


def _as_side(value: Any, name: str) -> Side:
    from perflab.workload import TrainConfig

    if isinstance(value, Side):
        return value
    if isinstance(value, TrainConfig):
        return Side.from_config(value)
    if isinstance(value, (str, os.PathLike)):
        return Side.module(value)
    raise ValueError(f"{name}: expected a TrainConfig, a Side or a module path, got {type(value).__name__}")


_ERROR_WORDS = {"raised": "the candidate raised an error", "out_of_memory": "the run ran out of memory",
                "bad_candidate": "the candidate does not follow the lab's contract"}


def judge(result: dict[str, Any], *, budget: decide.Budget, expectation: float, claim: float | None,
          seed: int, elapsed_seconds: float, baseline: str = "", candidate: str = "") -> Verdict:
    """The verdict on one child result (pure: tests feed it synthetic results)."""
    common: dict[str, Any] = {"expectation": expectation, "claim": claim, "seed": seed,
                              "elapsed_seconds": elapsed_seconds, "baseline": baseline, "candidate": candidate}
    if "error" in result:
        err = result["error"]
        code = err.get("code", "raised")
        reason = f"{_ERROR_WORDS.get(code, 'the run failed')}: {err.get('detail', '')}"
        return Verdict("error", code, reason, details={"traceback": err.get("traceback", [])}, **common)
    a = result.get("baseline_times", [])
    b = result.get("candidate_times", [])
    timed = float(result.get("timed_seconds", 0.0))
    details = {k: result[k] for k in ("gate", "setup_seconds", "warmup_seconds", "import_seconds", "idle_cpu", "timing_wall_seconds",
                                      "child_wall_seconds", "decision") if k in result}
    for key in ("activation_bytes", "cuda_peak_bytes"):
        seen = result.get(key)
        if isinstance(seen, dict) and all(type(seen.get(k)) is int and seen[k] >= 0 for k in ("baseline", "candidate")):
            details[key] = {"baseline": seen["baseline"], "candidate": seen["candidate"]}
    common.update(baseline_times=a, candidate_times=b, block_steps=int(result.get("block_steps", 0)),
                  timed_seconds=timed, details=details)
    problems = list(result.get("problems", []))
    if timed > elapsed_seconds + WALL_SLACK_SECONDS:
        problems.insert(0, {"code": "clock_tampered",
                            "detail": f"the child's timed blocks add up to {timed:.2f} s but the whole run took "
                                      f"{elapsed_seconds:.2f} s of wall time"})
    if problems:
        first = problems[0]
        more = f" (also: {', '.join(p['code'] for p in problems[1:])})" if len(problems) > 1 else ""
        return Verdict("fail", first["code"], first["detail"] + more, **common)
    if len(a) < 2 or len(a) != len(b):
        return Verdict("error", "no_samples", "the run ended without enough timed blocks to estimate a speedup",
                       **common)
    if len(a) < budget.min_pairs:
        # A CI from a handful of blocks is not a decision: an honest candidate could fail on noise.
        return Verdict("inconclusive", "too_few_pairs",
                       f"only {len(a)} timed pairs fit in the budget ({budget.min_pairs} are needed for a "
                       "decision); flagged for review", **common)
    verdict_decision = decide.decide(a, b, expectation, seed=seed)
    child_decision = result.get("decision", {}).get("outcome")
    if child_decision is not None and child_decision != verdict_decision.outcome:
        return Verdict("fail", "results_tampered",
                       f"the child reported {child_decision!r} but its own block times say "
                       f"{verdict_decision.outcome!r}", **common)
    lo, hi = verdict_decision.ci
    est = verdict_decision.speedup
    measured = f"re-measured speedup {est:.2f}x (95% CI {lo:.2f}-{hi:.2f}x over {len(a)} pairs: {direction(lo, hi)})"
    if verdict_decision.outcome == "pass":
        outcome, code, reason = "pass", "clears_bar", f"{measured} clears the expected {expectation:.2f}x"
    elif verdict_decision.outcome == "fail":
        outcome, code, reason = "fail", "below_bar", f"{measured} is below the expected {expectation:.2f}x"
    else:
        outcome, code = "inconclusive", "undecided"
        reason = (f"{measured} still straddles the expected {expectation:.2f}x after the whole timing budget "
                  "(flagged for review)")
    far_off = False
    if claim is not None and claim > hi * CLAIM_CONTRADICTED:
        return Verdict("fail", "claim_contradicted",
                       f"your claimed {claim:.2f}x is more than {CLAIM_CONTRADICTED:g} times the {measured}: "
                       "a claim must come from your own measurement", claim_far_off=True, **common)
    if claim is not None:
        far_off = claim < lo / (1 + CLAIM_TOLERANCE) or claim > hi * (1 + CLAIM_TOLERANCE)
        if far_off:
            reason += (f"; your claimed {claim:.2f}x lies outside the re-measured CI by more than "
                       f"{CLAIM_TOLERANCE:.0%}")
    return Verdict(outcome, code, reason, claim_far_off=far_off, **common)
