"""The fresh-interpreter side of a verification: `python -I -m perflab.verify.child < job.json`.

Order matters: the clocks are bound (importing `guard` binds them) and perflab's files are checked
before the candidate's module is imported; the baseline is built from perflab's reference first.
The child only measures and reports raw data (JSON, to the path the job names); the parent decides.
"""

from __future__ import annotations

# Bind the clocks first: nothing but the standard library and perflab.verify.guard is imported yet.
from perflab.verify import guard  # isort: skip

CLOCKS = guard.Clocks()

import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

from perflab.verify import pace  # noqa: E402
from perflab.verify.tolerance import LOSS_TOLERANCE, LOSS_TRAJECTORY_RTOL, STUDENT_TRAJECTORY_RTOL  # noqa: E402

# How many fixed-seed steps each side runs before timing: they warm up (compile, autotune, caches)
# and feed the correctness gate.
GATE_STEPS = 4
# The precisions of LOSS_TOLERANCE from most to least exact: a gate between two holds the looser one.
_PRECISION_ORDER = ("fp32", "tf32", "fp16", "bf16")
# Exactly repeated losses (bit for bit) where the reference's differ: outputs cached across steps.
MAX_REPEATED_LOSSES = 1
# Seconds a timed block should last: long enough that clock resolution and the per-block device
# sync cost well under 0.1%, short enough that an interference episode hits single blocks.
TARGET_BLOCK_SECONDS = 0.04
MAX_BLOCK_STEPS = 32
# After each block the child idles this long and reads the CPU time of the threads that were not
# there when the reference had warmed up (before any candidate code existed): work the candidate
# left running in the background (a thread that keeps computing) shows up there. The threads the
# reference already had are left out: libgomp's workers spin in bursts for ~10 ms after a parallel
# region (measured after a ResNet-18 step on 2 cores: 1.9 cores busy in some 2 ms windows), which a
# whole-process reading takes for deferred work.
IDLE_PROBE_SECONDS = 0.005
# Before the probe, unmeasured: a candidate's own new thread pool gets to stop spinning.
IDLE_SETTLE_SECONDS = 0.003
# CPU cores (median over blocks) the new threads burn while the child idles between timed blocks
# that mean deferred work: an honest candidate's new threads (if any) sleep, a background worker ~1.
IDLE_CPU_EXCESS = 0.15
# Setup (make_step) time beyond the reference's, in candidate steps, that means the work was done
# before timing started (precomputed outputs); at least this many seconds so jitter never counts.
SETUP_EXCESS_STEPS = 50
SETUP_EXCESS_MIN_SECONDS = 2.0
# The timed seconds a verification may take when its blocks were made longer for a loader's pace
# (`perflab.verify.pace`), and the margin over the estimate for min_pairs of them (warm steps are fast).
PACE_MAX_TIMED_SECONDS = 120.0
PACE_BUDGET_MARGIN = 1.5
# A CUDA-event time this much above the wall time of the same block means a doctored clock.
EVENT_WALL_SLACK = 1.05


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        CLOCKS.synchronize()
    backend = getattr(torch.backends, "mps", None)
    if backend is not None and backend.is_available():
        torch.mps.synchronize()


class Side:
    """One built side: its step function and what it produced."""

    def __init__(self, name: str, step: Any, lead_in: int = 0) -> None:
        self.name = name
        self.step = step
        # Untimed steps before each timed block: the batches this side's loader workers prefetched while
        # the other side's block ran, which a block would otherwise take from the queue at no cost.
        self.lead_in = lead_in
        self.losses: list[float] = []
        self.indices: list[list[int]] = []
        self.step_seconds: list[float] = []
        self.block_seconds: list[float] = []
        # The CUDA-event time of each timed block, index for index with block_seconds (the gate's warm-up
        # runs are not timed blocks and keep neither).
        self.block_event_ms: list[float] = []
        self.idle_cpu: list[float] = []

    def run(self, steps: int, *, per_step: bool = False) -> tuple[float, float | None]:
        """Run `steps` steps between two device syncs: (wall seconds on the bound clock, the CUDA-event
        milliseconds of the same run where CUDA is in use, else None)."""
        import torch

        clock = CLOCKS.perf_counter_ns
        use_events = CLOCKS.event is not None and _cuda_in_use()
        if use_events:
            start_ev, end_ev = CLOCKS.event(enable_timing=True), CLOCKS.event(enable_timing=True)
        _sync()
        t0 = clock()
        if use_events:
            start_ev.record()
        pending: list[Any] = []  # plain tensors, read after the block's one sync
        for _ in range(steps):
            s0 = clock()
            loss, idx = self.step()
            # A plain tensor's value is computed (or queued on the device) already: reading it waits for
            # the device, which the sync ending the block does once. Anything else (a float, an object
            # whose float() might do work) is read here, inside the timed block.
            pending.append(loss.detach() if type(loss) is torch.Tensor else float(loss))
            self.indices.append([int(i) for i in idx])
            if per_step:
                _sync()
                self.step_seconds.append((clock() - s0) / 1e9)
        if use_events:
            end_ev.record()
        _sync()
        seconds = (clock() - t0) / 1e9
        self.losses.extend(float(x) for x in pending)
        return seconds, (float(CLOCKS.elapsed_time(start_ev, end_ev)) if use_events else None)

    def time_block(self, steps: int) -> float:
        """One timed block of the protocol, after the side's untimed lead-in: its wall seconds and its
        event time kept side by side."""
        if self.lead_in:
            self.run(self.lead_in)
        seconds, event_ms = self.run(steps)
        self.block_seconds.append(seconds)
        if event_ms is not None:
            self.block_event_ms.append(event_ms)
        return seconds

    def probe_idle(self) -> None:
        """CPU cores the candidate's threads keep busy while the protocol idles right after this
        side's block (nothing where the OS cannot say which thread used the CPU)."""
        import time as _time

        if _REST_THREADS is None:
            return
        _time.sleep(IDLE_SETTLE_SECONDS)
        cpu0, wall0 = _new_threads_cpu_ns(), CLOCKS.perf_counter_ns()
        _time.sleep(IDLE_PROBE_SECONDS)
        cpu1, wall1 = _new_threads_cpu_ns(), CLOCKS.perf_counter_ns()
        # A thread that ended inside the window drops out of the second reading: never below zero.
        self.idle_cpu.append(max(0, cpu1 - cpu0) / max(wall1 - wall0, 1))


# The thread ids of this process once the reference has warmed up (None where /proc is missing).
_REST_THREADS: frozenset[int] | None = None


def _thread_ids() -> frozenset[int] | None:
    try:
        return frozenset(int(name) for name in os.listdir("/proc/self/task"))
    except (OSError, ValueError):
        return None


def _new_threads_cpu_ns() -> int:
    """CPU nanoseconds used so far by the threads not in `_REST_THREADS` (Linux per-thread clocks)."""
    total = 0
    for tid in (_thread_ids() or frozenset()) - (_REST_THREADS or frozenset()):
        try:  # the kernel's clock id for a thread's CPU time: MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)
            total += CLOCKS.clock_gettime_ns((~tid << 3) | 6)
        except OSError:  # the thread ended
            continue
    return total


def _cuda_in_use() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _problem(code: str, detail: str) -> dict[str, str]:
    return {"code": code, "detail": detail}


def _tolerance(*dtypes: str) -> tuple[str, float, float]:
    worst = max(dtypes, key=_PRECISION_ORDER.index)
    rtol, atol = LOSS_TOLERANCE[worst]
    return worst, rtol, atol


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return 0.0 if not n else (ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2)


def _compare_outputs(a: Side, b: Side, start: int, stop: int, rtol: float | None, atol: float,
                     phase: str, trajectory_rtol: float = LOSS_TRAJECTORY_RTOL) -> list[dict[str, str]]:
    """Same samples, finite losses, and (unless `rtol` is None) close losses for steps [start, stop):
    within `rtol` at the first step, within the larger of `rtol` and `trajectory_rtol` after it."""
    for k in range(start, stop):
        if not math.isfinite(b.losses[k]):
            return [_problem("loss_not_finite", f"the candidate's loss at step {k + 1} is {b.losses[k]}")]
        if a.indices[k] != b.indices[k]:
            na, nb = len(a.indices[k]), len(b.indices[k])
            what = (f"{nb} samples instead of {na}" if na != nb
                    else "different samples (or another order)")
            return [_problem("samples_differ", f"at step {k + 1} ({phase}) the candidate consumed {what} "
                                               "than the reference: it must train on exactly the same data")]
        diff = abs(a.losses[k] - b.losses[k])
        tol = None if rtol is None else atol + (rtol if k == 0 else max(rtol, trajectory_rtol)) * abs(a.losses[k])
        if tol is not None and diff > tol:
            why = ("it computes something else" if k < GATE_STEPS else
                   "it did not do the reference's training work in every timed step (a skipped backward or "
                   "update, a frozen optimizer, fewer samples than it reports)")
            return [_problem("loss_mismatch", f"at step {k + 1} ({phase}) the candidate's loss {b.losses[k]:.6g} "
                                              f"differs from the reference's {a.losses[k]:.6g} by {diff:.3g}, "
                                              f"more than rounding explains ({tol:.3g}): {why}")]
    return []


def _cached(a: Side, b: Side, n: int) -> list[dict[str, str]]:
    """Losses repeated bit for bit on consecutive steps where the reference's changed."""
    repeats = sum(1 for k in range(1, n) if b.losses[k] == b.losses[k - 1] and a.losses[k] != a.losses[k - 1])
    if repeats <= MAX_REPEATED_LOSSES:
        return []
    return [_problem("cached_outputs", f"the candidate returned the same loss bit for bit on {repeats} consecutive "
                                       "steps where the reference's changed: outputs reused across steps, "
                                       "not computed")]


def _deferred(a: Side, b: Side, excess_setup: float, m: int) -> list[dict[str, str]]:
    """Work a module candidate moved out of its timed blocks: into a background thread, or into make_step."""
    from perflab.verify import decide

    found = []
    busy = max(_median(a.idle_cpu), _median(b.idle_cpu))
    if busy > IDLE_CPU_EXCESS:
        found.append(_problem("deferred_work", f"between timed blocks, while the verifier idled, threads the "
                                               f"candidate started kept {busy:.2f} CPU cores busy: work moved "
                                               "outside the timed region (e.g. a background thread)"))
    step = decide.quantile(b.block_seconds, decide.QUANTILE) / m
    if excess_setup > max(SETUP_EXCESS_MIN_SECONDS, SETUP_EXCESS_STEPS * step):
        found.append(_problem("deferred_work", f"make_step took {excess_setup:.1f} s longer than the reference's "
                                               f"setup, more than {SETUP_EXCESS_STEPS} of its own timed steps: "
                                               "work done before timing started"))
    return found


def _events_exceeding_walls(*sides: Side) -> list[dict[str, str]]:
    """A timed block whose CUDA-event time exceeds its own wall time (a doctored clock). Each block is
    compared with itself only: the gate's warm-up runs (cuDNN autotuning, compilation) are no blocks."""
    for side in sides:
        if not side.block_event_ms:
            continue
        if len(side.block_event_ms) != len(side.block_seconds):
            return [_problem("clock_tampered", f"the {side.name} has {len(side.block_event_ms)} CUDA-event times "
                                               f"for {len(side.block_seconds)} timed blocks")]
        for ms, wall in zip(side.block_event_ms, side.block_seconds, strict=True):
            if ms / 1e3 > wall * EVENT_WALL_SLACK + 1e-3:
                return [_problem("clock_tampered", f"a CUDA-event time ({ms:.1f} ms) exceeds the wall time "
                                                   f"of its block ({wall * 1e3:.1f} ms)")]
    return []


def _decode_seconds() -> float:
    """Seconds this process has spent decoding training sets into device memory (`perflab.workload`,
    read only if a side imported it)."""
    return float(getattr(sys.modules.get("perflab.device_data"), "DECODE_SECONDS", [0.0])[0])


def _lead_in(side: Any) -> int:
    """Untimed steps before each of `side`'s timed blocks (`perflab.verify.pace`)."""
    return pace.lead_in(_prefetched_batches(side))


def block_steps(step_seconds: float, queues: tuple[int, int] = (0, 0), fixed: int = 0) -> int:
    """Steps in each timed block: `fixed` where the budget names a count, else about TARGET_BLOCK_SECONDS
    of the fastest warm step, and at least what the sides' loader queues need (`perflab.verify.pace`)."""
    if fixed:
        return fixed
    by_time = max(1, min(MAX_BLOCK_STEPS, math.ceil(TARGET_BLOCK_SECONDS / max(step_seconds, 1e-9))))
    return max(by_time, pace.min_block_steps(*queues))


def paced_budget(budget: Any, steps: int, step_a: float, step_b: float) -> Any:
    """`budget`, with time for min_pairs pairs where a loader's pace made blocks of `steps` longer than
    the clock alone would (`step_a`, `step_b`: each side's fastest warm step) (a starved 340 ms step in blocks of 8 fits 7 pairs in the default 20 s), within
    PACE_MAX_TIMED_SECONDS; `budget` itself where it already has the time."""
    from perflab.verify import decide

    if steps <= block_steps(step_a, fixed=budget.block_steps or 0):
        return budget
    need = min(PACE_MAX_TIMED_SECONDS, PACE_BUDGET_MARGIN * budget.min_pairs * steps * (step_a + step_b))
    if need <= budget.max_timed_seconds:
        return budget
    return decide.Budget.from_dict({**budget.to_dict(), "max_timed_seconds": need})


def _prefetched_batches(side: Any) -> int:
    """Batches a configuration's DataLoader holds ready when its workers have run ahead; 0 without
    workers or for a module (its loader is its own)."""
    config = side.kwargs.get("config") or {}
    return pace.queued_batches(config.get("num_workers"), config.get("prefetch_factor"))


def _compiles(side: Any) -> bool:
    """Whether a reference side asks for torch.compile (a TrainConfig's compile_mode, or a factory's)."""
    return bool(side.kwargs.get("compile_mode") or side.kwargs.get("config", {}).get("compile_mode"))


def _apply_compile_patches() -> None:
    """Apply the runtime patches torch.compile makes the first time anything is compiled (dynamo wraps
    nn.Module.__init__/__setstate__ and the optimizers' _init_group), so a compiling candidate's are
    not mistaken for tampering; a candidate that replaces them again is still caught."""
    from torch._dynamo import eval_frame, mutation_guard

    eval_frame.TorchPatcher.patch()
    mutation_guard.install_generation_tagging_init()


def _gate(side: Side, saved_hooks: Any) -> tuple[int | None, int | None]:
    """The side's GATE_STEPS warm-up and gate steps; with `saved_hooks`, the second step also measures
    the activation bytes it saves for backward (`perflab.verify.saved`; the first builds what is built
    lazily, such as optimizer state) and, on a CUDA device, the caching allocator's peak over that step
    above what was allocated when it began: (saved bytes, peak bytes or None), else (None, None)."""
    if saved_hooks is None:
        side.run(GATE_STEPS, per_step=True)
        return None, None
    from perflab.verify.saved import SavedBytes

    side.run(1, per_step=True)
    start = _cuda_peak_start()
    with SavedBytes(saved_hooks) as seen:
        side.run(1, per_step=True)
    peak = _cuda_peak_since(start)
    side.run(GATE_STEPS - 2, per_step=True)
    return seen.bytes, peak


def _cuda_peak_start() -> int | None:
    """Bytes the CUDA allocator holds now, with its peak counter reset; None without CUDA in use."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.memory_allocated())


def _cuda_peak_since(start: int | None) -> int | None:
    """The allocator's peak since `_cuda_peak_start` above what it held then: what one step needed."""
    import torch

    if start is None:
        return None
    torch.cuda.synchronize()
    return max(0, int(torch.cuda.max_memory_allocated()) - start)


def run(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from perflab.verify import candidates, decide

    CLOCKS.bind_torch()
    from perflab.verify import saved

    saved_hooks = saved.bind()  # before any student code exists, like the clocks
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    out: dict[str, Any] = {"problems": []}
    problems = out["problems"]
    # perflab's modules loaded so far (the package, verify, stats); those imported later are checked
    # at the end. Files nothing imports cannot change the run.
    hash_problems = guard.check_hashes(job["hashes"], only=guard.imported_files())
    if hash_problems:
        problems.append(_problem("perflab_modified", "; ".join(hash_problems[:3])))
        return out

    seed = int(job["seed"])
    base_side = candidates.Side.from_dict(job["baseline"])
    cand_side = candidates.Side.from_dict(job["candidate"])
    if base_side.is_student_code:
        raise candidates.CandidateError("the baseline must be perflab's reference, not a module file")
    clock = CLOCKS.perf_counter_ns

    # The baseline is built from perflab before any student code exists in this process.
    base_factory = candidates.load_factory(base_side)
    t0, decoded0 = clock(), _decode_seconds()
    a = Side("baseline", base_factory(seed, **base_side.kwargs), _lead_in(base_side))
    # Less the decoding of a training set kept on the device (a side after it finds it decoded): the
    # setup-excess check compares what each side built, not who decoded first.
    setup_a = (clock() - t0) / 1e9 - (_decode_seconds() - decoded0)
    # Its warm-up and gate steps too: every thread it needs exists afterwards.
    saved_a, peak_a = _gate(a, saved_hooks if job.get("activation_bytes") else None)
    global _REST_THREADS
    _REST_THREADS = _thread_ids()
    if not all(math.isfinite(x) for x in a.losses):
        raise RuntimeError(f"the reference's own loss is not finite ({a.losses}): check the reference setup")
    if cand_side.kind == "reference":
        import perflab.workload  # noqa: F401  (a config candidate imports it anyway: watch it from now)
    if cand_side.is_student_code or _compiles(cand_side):
        _apply_compile_patches()
    before = guard.Snapshot.take()

    t0 = clock()
    cand_factory = candidates.load_factory(cand_side)
    out["import_seconds"] = (clock() - t0) / 1e9
    cand_dtype = candidates.module_dtype(cand_side.dtype) if cand_side.is_student_code else cand_side.dtype

    def tampering(when: str) -> bool:
        found = CLOCKS.problems()
        if found:
            problems.append(_problem("clock_tampered", f"{'; '.join(found)} ({when})"))
            return True
        changed = before.changed(guard.Snapshot.take())
        if changed:
            problems.append(_problem("runtime_patched", f"{', '.join(changed[:4])} replaced ({when})"))
            return True
        return False

    if tampering("when the candidate module was imported"):
        return out
    t0, decoded0 = clock(), _decode_seconds()
    b = Side("candidate", cand_factory(seed, **cand_side.kwargs), _lead_in(cand_side))
    setup_b = (clock() - t0) / 1e9 - (_decode_seconds() - decoded0)
    out["setup_seconds"] = {"baseline": setup_a, "candidate": setup_b}
    if tampering("while the candidate was built"):
        return out

    # Warm-up and correctness gate, before any timing.
    saved_b, peak_b = _gate(b, saved_hooks if job.get("activation_bytes") else None)
    if saved_a is not None and saved_b is not None:
        out["activation_bytes"] = {"baseline": saved_a, "candidate": saved_b}
    if peak_a is not None and peak_b is not None:
        out["cuda_peak_bytes"] = {"baseline": peak_a, "candidate": peak_b}
    dtype, rtol, atol = _tolerance(base_side.dtype, cand_dtype)
    out["warmup_seconds"] = {  # first-step cost beyond a warm step: compilation, autotuning, caches
        side.name: side.step_seconds[0] - min(side.step_seconds[1:]) for side in (a, b)}
    out["gate"] = {"steps": GATE_STEPS, "dtype": dtype, "rtol": rtol, "atol": atol,
                   "baseline_losses": list(a.losses), "candidate_losses": list(b.losses),
                   "baseline_step_seconds": list(a.step_seconds), "candidate_step_seconds": list(b.step_seconds)}
    # Student code is held to the loss trajectory of every step, the gate's here and the timed ones after
    # timing (STUDENT_TRAJECTORY_RTOL). A configuration runs perflab's own step with other knobs, so
    # only its first loss (the same model on the same samples) is compared: past it the losses follow
    # the updates, and on a small workload SGD turns rounding into chaos (see LOSS_TRAJECTORY_RTOL),
    # which would fail an honest precision or layout change.
    student = cand_side.is_student_code
    trajectory_rtol = STUDENT_TRAJECTORY_RTOL[dtype] if student else LOSS_TRAJECTORY_RTOL
    compared = GATE_STEPS if student else 1
    problems.extend(_compare_outputs(a, b, 0, compared, rtol, atol, "correctness check", trajectory_rtol))
    problems.extend(_compare_outputs(a, b, compared, GATE_STEPS, None, atol, "correctness check"))
    problems.extend(_cached(a, b, GATE_STEPS))
    if problems or tampering("during the warm-up steps"):
        return out

    budget = decide.Budget.from_dict(job["budget"])
    # The fastest warm step, like the estimator: interference only lengthens steps.
    step_s = min(a.step_seconds[1:])
    m = block_steps(step_s, (_prefetched_batches(base_side), _prefetched_batches(cand_side)), budget.block_steps)
    out["block_steps"] = m
    paced = paced_budget(budget, m, step_s, min(b.step_seconds[1:]))
    if paced is not budget:
        budget = paced
        out["max_timed_seconds"] = budget.max_timed_seconds
    expectation = float(job["expectation"])
    decision = None
    timed = 0.0
    pairs = 0
    timing_start = clock()
    while True:
        order = (a, b) if pairs % 2 == 0 else (b, a)
        for side in order:
            seconds = side.time_block(m)
            side.probe_idle()
            timed += seconds
        pairs += 1
        exhausted = decide.out_of_budget(pairs, timed, budget)
        if decide.should_look(pairs, budget) or (exhausted and pairs >= 2):
            decision = decide.decide(a.block_seconds, b.block_seconds, expectation, seed=seed)
            if decision.outcome != "undecided" or exhausted:
                break
        elif exhausted:
            break
    timing_wall = (clock() - timing_start) / 1e9
    out.update(baseline_times=a.block_seconds, candidate_times=b.block_seconds, timed_seconds=timed,
               timing_wall_seconds=timing_wall,
               idle_cpu={"baseline": a.idle_cpu, "candidate": b.idle_cpu},
               event_ms={"baseline": a.block_event_ms, "candidate": b.block_event_ms})
    if decision is not None:
        out["decision"] = {"outcome": decision.outcome, "speedup": decision.speedup, "ci": list(decision.ci)}

    if tampering("during timing"):
        return out
    n = min(len(a.losses), len(b.losses))
    # Both sides ran the same steps on the same samples (A's step k against B's step k). Student code
    # must have done the reference's work in every one of them: its losses are held to the trajectory.
    # A configuration's may drift apart (see LOSS_TRAJECTORY_RTOL): only the samples, finiteness and
    # fresh (not repeated) losses are checked.
    # Repeated losses first: they say more precisely what a cache does than the trajectory it leaves.
    problems.extend(_cached(a, b, n))
    problems.extend(_compare_outputs(a, b, GATE_STEPS, n, rtol if student else None, atol, "timed steps",
                                     trajectory_rtol))
    if student:
        problems.extend(_deferred(a, b, setup_b - setup_a, m))
    problems.extend(_events_exceeding_walls(a, b))
    # Again at the end, for the modules the run imported (a file changed after the first check).
    hash_problems = guard.check_hashes(job["hashes"], only=guard.imported_files())
    if hash_problems:
        problems.append(_problem("perflab_modified", "; ".join(hash_problems[:3]) + " (during the run)"))
    return out


def main() -> None:
    start = CLOCKS.perf_counter_ns()
    from perflab.verify import machine_load

    machine_load.adopt_orphans()  # every process this run starts is reaped here before it exits
    sandboxed = len(sys.argv) == 3 and sys.argv[1] == "--job"  # the grader's sandbox: job in a file, result on its pipe
    if sandboxed:
        with open(sys.argv[2], encoding="utf-8") as f:
            job = json.load(f)
    else:
        job = json.loads(sys.stdin.read())
    result_path = job["result_path"]
    try:
        result = run(job)
    except MemoryError:
        result = {"error": {"code": "out_of_memory", "detail": "the run ran out of memory (MemoryError)"}}
    except BaseException as exc:  # noqa: BLE001 - any failure of student code must become a verdict
        text = f"{type(exc).__name__}: {exc}"
        code = "out_of_memory" if ("alloc" in text.lower() and "memory" in text.lower()) else "raised"
        from perflab.verify import candidates

        if isinstance(exc, candidates.CandidateError):
            code = "bad_candidate"
        tail = traceback.format_exc().strip().splitlines()[-6:]
        result = {"error": {"code": code, "detail": text[:500], "traceback": tail}}
    result["nonce"] = job["nonce"]
    result["child_wall_seconds"] = (CLOCKS.perf_counter_ns() - start) / 1e9
    result_fd = os.environ.get("PERFLAB_RESULT_FD") if sandboxed else None
    if result_fd:
        with os.fdopen(int(result_fd), "w", encoding="utf-8") as f:
            json.dump(result, f)
    else:
        tmp = result_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(result, f)
        os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    # Loader workers and the like end here, so the grader counts their CPU time as this run's own
    # (`machine_load`), not as another process's load on the machine.
    machine_load.reap_descendants()
    # Skip interpreter shutdown: no student atexit handler or finaliser runs after the result is written.
    os._exit(0)


if __name__ == "__main__":
    main()
