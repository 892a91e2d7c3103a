"""What every lab notebook uses: the sizes of the mode in force, an honest statement of what this
machine can give, saving results beside the notebook, and a progress bar that stays quiet when graded.

    from perflab.labs import common
    common.setup_notebook()                   # first cell: keep graded cells free of stderr
    SIZES = common.sizes()                    # ModeSizes of the mode in force (tiny|laptop|full|grade)
    print(common.hardware_statement("lab01_measure"))
    for step in common.progress(range(SIZES.steps), desc="train"): ...
    common.save_results("lab01_measure", {"counts": {...}})   # -> results/lab01_measure.json
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from perflab import env

if TYPE_CHECKING:
    from perflab.workload import TrainConfig

T = TypeVar("T")

# Results go here, relative to the folder the notebook runs in (nbgrader runs it in the
# submission's own folder, Jupyter in the notebook's folder).
RESULTS_DIR = "results"

# kineto, torch.profiler's engine, writes start/stop lines (and on machines without a GPU a
# harmless "gpuGetDeviceCount failed") straight to the process's stderr; the notebook kernel
# forwards them into the cell, and nbgrader scores a test cell that wrote stderr 0. Level 6
# silences it (read when the profiler first starts).
KINETO_QUIET_LEVEL = "6"

# What a lab asks of the hardware lives in its contract module, `perflab.labs.labNN.HARDWARE_NOTES`:
# {device kind: the sentence a student reads before trusting a number}.
LAB_MODULE = re.compile(r"^(lab\d\d)_")


def lab_hardware_notes(lab: str | None) -> dict[str, str]:
    """The HARDWARE_NOTES of `lab`'s contract module (perflab.labs.lab01 for lab01_measure), or none."""
    match = LAB_MODULE.match(lab or "")
    if not match:
        return {}
    try:
        module = importlib.import_module(f"perflab.labs.{match.group(1)}")
    except ModuleNotFoundError as exc:
        if exc.name != f"perflab.labs.{match.group(1)}":
            raise
        return {}
    return dict(getattr(module, "HARDWARE_NOTES", {}))


def setup_notebook() -> None:
    """Call once at the top of a lab: warnings and perflab's log lines go to stdout, and the
    profiler's native chatter is silenced, so no graded cell fails for text on stderr."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)
    warnings.showwarning = _warning_to_stdout
    logger = logging.getLogger("perflab")
    if not any(getattr(h, "_perflab_lab", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._perflab_lab = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)


def _warning_to_stdout(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                       file: Any = None, line: str | None = None) -> None:
    sys.stdout.write(warnings.formatwarning(message, category, filename, lineno, line))


def sizes(mode: str | None = None) -> env.ModeSizes:
    """The sizes of `mode` (default: the mode in force): data set, image side, batch, steps."""
    return env.mode_sizes(mode)


def hardware_statement(lab: str | None = None, info: env.MachineInfo | None = None) -> str:
    """A few lines saying what this machine is and what it can give a lab, for the top of a notebook."""
    info = info or env.machine_info()
    mode = env.run_mode()
    lines = [info.describe(), f"mode          {mode} ({_describe_sizes(env.mode_sizes(mode, lab=lab))})"]
    if info.device == "cuda":
        lines.append("can give     CUDA events for timing, NVML utilisation, pinned-memory copies, "
                     "GPU augmentation; tensor cores for fp16/bf16 where the GPU has them")
    elif info.device == "mps":
        lines.append("can give     an asynchronous Apple GPU (sync before reading a clock), fp16/bf16 "
                     "autocast; no CUDA events, no pinned-memory effect")
    else:
        bf16 = ("bf16 matmuls in hardware (AMX/AVX-512-BF16): mixed precision can pay off"
                if info.cpu_bf16 else "no bf16 hardware: mixed precision is emulated, expect parity at best")
        lines.append(f"can give     {info.cpu_count} CPU cores, {bf16}; no GPU-only features "
                     "(pinned memory, CUDA events, GPU augmentation)")
    note = lab_hardware_notes(lab).get(info.device)
    if note:
        lines.append(f"this lab     {note}")
    _STARTED[lab or ""] = time.perf_counter()
    return "\n".join(lines)


# When each lab's notebook printed its hardware statement (its first cell): what `elapsed_statement` times.
_STARTED: dict[str, float] = {}


def elapsed_statement(lab: str) -> str:
    """How long this notebook has run since its first cell, on this machine and in this mode: the time
    a lab quotes for itself (the kit types no run times into its prose; they depend on the machine)."""
    start = _STARTED.get(lab)
    if start is None:
        return f"{lab}: not timed (run the notebook from its first cell to time it)"
    seconds = time.perf_counter() - start
    took = f"{seconds:.0f} s" if seconds < 120 else f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    info = env.machine_info()
    return (f"{lab} ran top to bottom in {took} here: {env.run_mode()} mode, {info.device} "
            f"({info.device_name}, {info.cpu_count} CPU cores)")


def _describe_sizes(s: env.ModeSizes) -> str:
    return f"data {s.data}, images {s.image_size} px, batch {s.batch_size}, {s.steps} steps"


def results_path(lab: str, folder: str | os.PathLike[str] | None = None) -> Path:
    """Where `save_results` writes: results/<lab>.json under `folder` (default: the working folder).
    Under `nbgrader validate` (a check run of the notebook) the default is a scratch folder instead,
    so validating never overwrites the results the student's own run wrote."""
    if folder is None and os.environ.get("NBGRADER_EXECUTION") == "validate":
        import tempfile

        folder = Path(tempfile.gettempdir()) / f"perflab-validate-{os.getpid()}"
    return Path(folder or Path.cwd()) / RESULTS_DIR / f"{lab}.json"


def save_results(lab: str, sections: Mapping[str, Any], *, config: Any = None,
                 folder: str | os.PathLike[str] | None = None) -> Path:
    """Validate and write this lab's results (perflab.results schema) beside the notebook; returns the path."""
    from perflab import results

    return results.save(results_path(lab, folder), lab, sections, config=config)


def progress_enabled() -> bool:
    """Whether a progress bar may draw: never when graded (nbgrader scores a cell that writes stderr
    0) or in the kit's tiny test runs, and only where someone watches (a terminal or a notebook)."""
    if env.run_mode() in ("grade", "tiny"):
        return False
    return _in_notebook() or sys.stderr.isatty()


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ip = shell.get_ipython() if hasattr(shell, "get_ipython") else None
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def progress(iterable: Iterable[T], **kwargs: Any) -> Iterable[T]:
    """tqdm over `iterable` where a bar can help, else the iterable untouched (no output at all)."""
    if not progress_enabled():
        return iterable
    from tqdm.auto import tqdm

    kwargs.setdefault("leave", False)
    return tqdm(iterable, **kwargs)


# Inconclusive verifications the keep rule does not judge: the instructor decides whether they earn the
# points. That is every inconclusive claimed speedup (labs 1, 3 and 4, whose cells are no keep-or-drop
# decision) and a decision whose re-measurement fit too few pairs to be one; a decision whose
# re-measurement straddles its bar is judged by the keep rule instead (`judge_decision`).
INCONCLUSIVE_ENV = "PERFLAB_INCONCLUSIVE"
INCONCLUSIVE_POLICIES = ("credit", "no-credit")


def inconclusive_policy() -> str:
    policy = os.environ.get(INCONCLUSIVE_ENV, "credit").strip().lower()
    if policy not in INCONCLUSIVE_POLICIES:
        raise ValueError(f"{INCONCLUSIVE_ENV}: {policy!r} is not one of {', '.join(INCONCLUSIVE_POLICIES)}")
    return policy


def accepted(outcome: str) -> bool:
    """Whether a verification outcome earns the cell's points under the instructor's policy. In the
    grading kernel a verification is "deferred": the grader re-measures it in its own process. A decision's
    re-measurement reaches here already judged by the keep rule (`judge_decision`): pass or fail."""
    return outcome in ("pass", "deferred") or (outcome == "inconclusive" and inconclusive_policy() == "credit")


DEFERRED_REASON = ("not measured in this kernel: the grader re-measures your exported choice in its own process "
                   "after the notebook ran, against the bar it loads")


# Set by the grading worker in the kernel of a lab whose re-measurements the grader makes itself.
REMEASURED_ENV = "PERFLAB_GRADER_REMEASURES"


def in_grading_kernel() -> bool:
    """Whether this process is a notebook kernel the autograder runs and whose speedups the grader
    re-measures itself (its verdicts count for nothing, so they are not measured twice)."""
    return os.environ.get("NBGRADER_EXECUTION") == "autograde" and os.environ.get(REMEASURED_ENV) == "1"


def changed_fields_problems(name: str, config: Any, base: TrainConfig, allowed: Sequence[str], *,
                            allowed_kind: str = "", base_name: str = "baseline_config()",
                            purpose: str) -> list[str]:
    """Is `config` (the notebook's `name`) a TrainConfig that differs from `base` in `allowed` fields only?

    The problem reads "<name> changes <fields>: only <allowed_kind> <allowed> may differ from <base_name>
    (anything else changes the work, <purpose>)".
    """
    from perflab.workload import TrainConfig

    if not isinstance(config, TrainConfig):
        return [f"{name}: expected a perflab.workload.TrainConfig, got {type(config).__name__}"]
    others = [f.name for f in dataclasses.fields(TrainConfig)
              if f.name not in allowed and getattr(config, f.name) != getattr(base, f.name)]
    if others:
        kind = f"{allowed_kind} " if allowed_kind else ""
        return [f"{name} changes {', '.join(others)}: only {kind}{', '.join(allowed)} may differ from {base_name} "
                f"(anything else changes the work, {purpose})"]
    return []


class FakeClock:
    """A clock that only moves when told to: measurements against it are exact."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def decision_bar(expectation: Any) -> Any:
    """The bar for a student's decision (lab 2's BEST, lab 5's CHOICE, lab 6's FINAL): never below
    parity. A calibration that found the reference slower on this hardware (a "cost" bar, right for
    checkpointing, which trades time for memory on purpose) says that keeping the change is the wrong
    decision here, so what the student keeps must at least not cost time."""
    from perflab.verify.expectations import PARITY_BAR

    if expectation.kind != "cost" or expectation.threshold >= PARITY_BAR:
        return expectation
    return dataclasses.replace(
        expectation, threshold=PARITY_BAR, kind="parity",
        reason=(f"a decision is held to parity ({PARITY_BAR}) at least: the reference of {expectation.name} costs "
                f"time on this hardware ({expectation.reason}), so keeping it is no gain here"))


def verify_against_bar(baseline: Any, candidate: Any, expectation_name: Any, *, claim: float | None = None,
                       max_pairs: int | None = None, max_seconds: float | None = None,
                       runner: Any = None, measure_activations: bool = False,
                       decision: bool = False) -> tuple[Any, Any]:
    """Re-measure `candidate` against `baseline` in a fresh interpreter (`perflab.verify.verify`),
    held to the bar calibrated for this hardware under `expectation_name`, inside the grading
    machine's timing lock. `max_pairs` caps the protocol's pairs (None: its own budget; the tiny
    mode's cap), `max_seconds` the timed seconds with it (default 30). `runner` runs the verify child
    (default: a local process; the grader passes its sandbox for a candidate of student code).
    `measure_activations` also re-measures the activation bytes of one training step of each side.
    `decision`: the candidate is what the student decided to keep, held at least to parity
    (`decision_bar`) and judged by the keep rule (`judge_decision`): failed where it is measurably slower
    than leaving it out, and, where the re-measurement straddles the bar, passed or failed as the keep rule
    would keep or drop the change on the grader's own CI.

    Returns (verdict, expectation): a `perflab.verify.Verdict` and the `Expectation` it was held to.
    """
    from perflab.grading.timelock import timed_section
    from perflab.verify import Budget, Verdict, load_expectation, verify
    from perflab.verify.expectations import Expectation
    from perflab.workload import TrainConfig

    if isinstance(expectation_name, Expectation):  # a bar set by a rule of the lab's own (lab 1's mystery)
        expectation = expectation_name
    else:
        expectation = load_expectation(expectation_name,
                                       workload=baseline if isinstance(baseline, TrainConfig) else None)
    if decision:
        expectation = decision_bar(expectation)
    if in_grading_kernel():
        return Verdict("deferred", "deferred", DEFERRED_REASON, expectation.threshold, claim=claim), expectation
    budget = None
    if max_pairs is not None:
        budget = Budget(max_pairs=max_pairs, max_timed_seconds=max_seconds or 30.0)
    with timed_section():
        verdict = verify(baseline, candidate, expectation=expectation.threshold, claim=claim, budget=budget,
                         measure_activations=measure_activations, **({"runner": runner} if runner is not None else {}))
    if decision:
        verdict = judge_decision(verdict)
    return verdict, expectation


# ---------------------------------------------------------------------------------------------
# The keep rule: the kit's one answer to "is this change worth keeping?", from the 95% CI of the change's
# speedup over leaving it out (above 1: faster with it). Labs 3, 5 and 6 decide with it in the notebook
# (lab 3's AMP_CONFIG, lab 5's CHOICE, lab 6's screening), and the grader judges a decision it re-measures
# with it (lab 2's BEST, lab 5's CHOICE, lab 6's FINAL: `judge_decision`). docs/DESIGN.md, "Workloads
# where the lesson is true", gives the measurements behind both constants.

# Keep a change when the lower end of its CI lies above this: measurably faster than leaving it out. An
# unchanged configuration's CI centres on 1.0 (an A/A test), so nothing lower keeps noise; and every bar
# that asks a decision for a gain is at least perflab.verify.expectations.GAIN_BAR_FLOOR, above it, so a
# change the grader requires reads as kept to an honest measurement.
KEEP_ABOVE = 1.0
# A change is measurably slower than leaving it out when the upper end of its CI lies below this: at least
# 5% slower. The student decides from a measurement in the notebook's process, the grader re-measures in a
# fresh one, and the two differ by a few per cent that no honest measurement controls: the reference's own
# lab 6 FINAL, kept by its screening, re-measured 0.96x (CI 0.95-0.99x) in one CI run. Adding a loader
# worker on one core reads 0.89x (CI 0.87-0.92x): below it.
SLOWER_BELOW = 0.95
# What the rule finds a change to be, in the kit's words (`perflab.timing`, `perflab.verify.protocol.direction`).
FASTER, NO_GAIN, SLOWER = "faster", "no measurable gain", "slower"


@dataclass(frozen=True)
class KeepDecision:
    """What the keep rule made of one CI: keep the change or not, what it found, and why in words."""

    keep: bool
    finding: str  # FASTER | NO_GAIN | SLOWER
    low: float
    high: float

    @property
    def why(self) -> str:
        ci = f"95% CI {self.low:.2f}-{self.high:.2f}x"
        if self.finding == FASTER:
            return f"measurably faster than leaving it out ({ci}, above {KEEP_ABOVE:.2f}x): keep it"
        if self.finding == SLOWER:
            return f"measurably slower than leaving it out ({ci}, below {SLOWER_BELOW:.2f}x): leave it out"
        return f"no measurable gain over leaving it out ({ci}, not above {KEEP_ABOVE:.2f}x): leave it out"


def keep_rule(ci: Any) -> KeepDecision:
    """Is a change worth keeping? `ci`: the 95% CI of its speedup over leaving it out, as a
    `perflab.stats.Interval` (`Comparison.ci()`) or (low, high). Kept when its low end lies above
    KEEP_ABOVE (measurably faster); left out otherwise, said "slower" when its high end lies below
    SLOWER_BELOW (measurably slower, beyond what two processes disagree by)."""
    low, high = (ci.low, ci.high) if hasattr(ci, "low") else (ci[0], ci[1])
    low, high = float(low), float(high)
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ValueError(f"ci: expected a finite interval (low <= high), got {low!r}-{high!r}")
    if low > KEEP_ABOVE:
        return KeepDecision(True, FASTER, low, high)
    return KeepDecision(False, SLOWER if high < SLOWER_BELOW else NO_GAIN, low, high)


def slower_than_leaving_it_out(verdict: Any) -> Any:
    """A decision the re-measurement finds measurably slower than leaving it out (the keep rule's SLOWER:
    the CI of its speedup wholly below SLOWER_BELOW) is the wrong decision on this machine, whatever bar it
    clears: a fail. A decision to change nothing is never slower than itself: the verifier gives it its
    no-change verdict untimed (`perflab.verify.protocol.no_change`), which has no CI."""
    ci = verdict.ci if verdict.outcome in ("pass", "inconclusive") else None
    if ci is None or keep_rule(ci).finding != SLOWER:
        return verdict
    from perflab.verify.protocol import load_note

    return dataclasses.replace(verdict, outcome="fail", code="slower_than_without", reason=(
        f"re-measured speedup {verdict.speedup:.2f}x (95% CI {ci[0]:.2f}-{ci[1]:.2f}x): measurably slower than "
        "leaving the change out on this machine, so leaving it out is the right decision here"
        + load_note(verdict.details)))


# The verifier's code for a CI that still straddles the bar after the whole timing budget: the one
# inconclusive outcome the keep rule judges. Fewer pairs than a decision needs ("too_few_pairs") is no
# measurement of the decision at all; it stays with the instructor's policy, flagged.
STRADDLES = "undecided"


# What a reason says once `judge_decision` has decided a straddling re-measurement (for whoever reads grades).
JUDGED_BY_RULE = re.compile(r"judged by the keep rule|this machine's bar asks no gain")


def judge_decision(verdict: Any) -> Any:
    """A decision's re-measurement as the grader scores it, by the keep rule on the grader's own CI: failed
    where the change is measurably slower than leaving it out (`slower_than_leaving_it_out`); where the CI
    straddles the bar after the whole budget, passed when the keep rule keeps the change ("kept_by_rule")
    and failed when it leaves it out ("dropped_by_rule"), never credited by default. Under a bar that asks
    no gain (parity or below: this machine gives nothing to take, or the conservative rule of an uncalibrated
    class), a straddling CI cannot tell a small gain from none, so it passes where a gain lies within it
    ("gain_within_ci": its high end at least KEEP_ABOVE) and fails where none does ("no_gain_within_ci").
    The keep rule's own test (the low end above 1.0) would fail there every honest decision the notebook
    measured as a gain on a machine too noisy for the grader to confirm it: lab 3's reference in tiny mode,
    kept at CI 1.21-1.97x in the notebook, re-measured 1.02x (CI 0.84-1.44x); a loader worker that costs time
    (0.86x, CI 0.79-0.96x, credited before) still fails."""
    verdict = slower_than_leaving_it_out(verdict)
    if verdict.outcome != "inconclusive" or verdict.code != STRADDLES or verdict.ci is None:
        return verdict
    measured = verdict.reason.replace(" (flagged for review)", "")
    if verdict.expectation <= KEEP_ABOVE:
        gain_within = verdict.ci[1] >= KEEP_ABOVE
        return dataclasses.replace(
            verdict, outcome="pass" if gain_within else "fail",
            code="gain_within_ci" if gain_within else "no_gain_within_ci",
            reason=f"{measured}; this machine's bar asks no gain, and "
                   + ("a gain lies within the CI: the grader cannot tell it from the one you measured" if gain_within
                      else f"no gain lies within the CI (all of it below {KEEP_ABOVE:.2f}x): leave it out"))
    rule = keep_rule(verdict.ci)
    return dataclasses.replace(
        verdict, outcome="pass" if rule.keep else "fail", code="kept_by_rule" if rule.keep else "dropped_by_rule",
        reason=f"{measured}; judged by the keep rule: {rule.why}")


def verdict_record(verdict: Any, expectation: Any) -> dict[str, Any]:
    """A verdict as the grade table records it (an error counts as a fail; `code` keeps the verifier's
    named reason, e.g. "below_bar" for a figure measured under its bar, "loss_mismatch" for a gate)."""
    outcome = verdict.outcome if verdict.outcome != "error" else "fail"
    record = {"name": expectation.name, "verdict": outcome, "code": getattr(verdict, "code", None),
              "speedup": verdict.speedup,
              "ci": list(verdict.ci) if verdict.ci is not None else None, "claimed": verdict.claim,
              "hardware_class": expectation.hardware_class, "reason": verdict.reason}
    busy = (getattr(verdict, "details", None) or {}).get("foreign_cores")
    if isinstance(busy, (int, float)):  # the other processes' load while it was timed (`verify.machine_load`)
        record["foreign_cores"] = busy
    saved = (getattr(verdict, "details", None) or {}).get("activation_bytes")
    if saved:  # what a step keeps for backward, re-measured with the time (lab 4)
        record["activation_bytes"] = dict(saved)
    return record


def mark_of(verdict: Any, expectation: Any) -> Any:
    """The grader's mark for a re-measured speedup: full points when the instructor's policy accepts
    the outcome, with the verdict's record and reason."""
    from perflab.grading.marks import Mark

    record = verdict_record(verdict, expectation)
    earned = accepted(record["verdict"])
    message = f"{record['verdict']}: {verdict.reason}" if verdict.reason else record["verdict"]
    return Mark(1.0 if earned else 0.0, message, record, flag=suspicion(verdict))


# What the verifier found that a person should look at: a doctored clock or runtime, perflab's files
# changed, outputs reused, work moved out of the timed blocks, or training that left the reference's
# trajectory (or its samples) only once the gate had passed: work skipped where the gate cannot see.
SUSPECT_CODES = ("clock_tampered", "runtime_patched", "perflab_modified", "cached_outputs", "deferred_work")
SUSPECT_AFTER_GATE = ("loss_mismatch", "samples_differ")


def suspicion(verdict: Any) -> str | None:
    """Why a re-measurement should be flagged for a person (None for an honest pass, fail or error timed on
    an otherwise idle machine)."""
    code, reason = getattr(verdict, "code", ""), getattr(verdict, "reason", "") or ""
    if code in SUSPECT_CODES or (code in SUSPECT_AFTER_GATE and "(timed steps)" in reason):
        return f"the re-measurement found {code}: {reason}"
    details = getattr(verdict, "details", None) or {}
    busy = details.get("foreign_cores")
    if details.get("disturbed") and isinstance(busy, (int, float)):
        twice = ", twice" if details.get("measured") == 2 else ""
        return (f"the machine was busy with other work ({busy:.2f} CPU cores on average) while this cell was "
                f"re-measured{twice}: {BUSY_FLAG_END}")
    return None


# How the flag of a re-measurement timed on a busy machine ends (a flag for the machine, not the student).
BUSY_FLAG_END = "grade it again when the machine is idle"


def report(verdict: Any, expectation: Any) -> dict[str, Any]:
    """Show a verdict's record to the student in the notebook and return it; an error counts as a fail."""
    from perflab.grading.timelock import report_verdict

    record = verdict_record(verdict, expectation)
    return report_verdict(record["name"], record["verdict"], speedup=record["speedup"], ci=record["ci"],
                          claimed=record["claimed"], hardware_class=record["hardware_class"],
                          reason=record["reason"])


