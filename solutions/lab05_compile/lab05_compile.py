# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Lab 5 — Compile
#
# **On Colab:** upload `perflab-student.zip` in the Files pane and first run the install cell of the kit's
# README (*On Colab*), ending in `%cd /content/perflab-student/labs/lab05_compile`; Colab's own torch stays.
#
# `torch.compile(model)` promises a faster model for one line of code. What it really offers is a
# trade: you pay **compile time** once, up front, and in exchange each later step may be cheaper.
# Whether that trade is worth it depends on the model, the hardware, how many steps you will run,
# and whether your code lets the compiler see the whole step at once. This lab measures each of
# those on **this machine**:
#
# 1. what the compile modes do, and what each costs in compile time and gives per step;
# 2. **graph breaks**: code that makes the compiler give up on part of the model, found with
#    `torch._dynamo.explain` and removed;
# 3. the **break-even** point: after how many steps the compile time has been paid back (if ever);
# 4. **recompilation**: the smaller last batch of an epoch that silently triggers a second compile;
# 5. your choice of mode, re-measured by the autograder in a fresh process.
#
# Be ready for an honest answer, whichever it is. On a CPU, oneDNN already runs ResNet-18's
# convolutions and there may be little left to fuse, while compiling its training step takes minutes
# on a few cores. So the lab does its compiling on a **small model** (a residual MLP) whose compiles
# are short, and compiles ResNet-18 only in `full` mode on a GPU; whether compiling pays on your
# machine is what you will measure.
#
# **What you write** (the contract, also in `perflab/labs/lab05/__init__.py`; the tests call nothing else):
#
# | name | what it must do | points |
# | --- | --- | --- |
# | `graph_breaks(fn, *args) -> list[(line, reason)]` | one entry per graph break `torch._dynamo.explain` finds, with the line it broke at | 10 <!-- test_graph_breaks_visible test_graph_breaks_hidden --> |
# | `FixedBlock(BrokenBlock)` | the same outputs (and gradients) as `BrokenBlock`, with zero graph breaks | 15 <!-- test_fixed_visible test_fixed_hidden --> |
# | `measure_compile(build, steps, *, clock, sync) -> CompileTiming` | the first (compiling) call timed apart from the steady-state calls, after `torch._dynamo.reset()` | 10 <!-- test_measure_compile_visible test_measure_compile_hidden --> |
# | compiled `FixedBlock` against eager | outputs and gradients within tolerance on random inputs | 10 <!-- test_compiled_matches_eager --> |
# | `break_even_steps(compile_seconds, eager_step, compiled_step)` | steps until compiling pays off; `math.inf` when it never does | 13 <!-- test_break_even_visible test_break_even_hidden --> |
# | `PREDICT_BREAK_EVEN`, `WHY_BREAK_EVEN` | your prediction of the break-even, with one line of why, written **before** the measurement (graded on being there, never on being right) | 2 <!-- test_predict_break_even --> |
# | `no_recompile_setup(model, dataset, batch_size, *, seed, backend)` | a compiled model and a loader that compile once over ragged epochs | 15 <!-- test_no_recompile_visible test_no_recompile_hidden --> |
# | `CHOICE` | the mode your measurements support (or `None`), re-measured by the autograder; half without `WHY_CHOICE`, one line of why | 10 <!-- test_choice_verified --> |
# | three written answers | reasoning from your own measurements | 15 <!-- answer_modes answer_break_even answer_breaks --> |
#
# **Modes.** The lab runs at the sizes of `PERFLAB_MODE` (`tiny` for the kit's tests, `laptop` on a
# CPU, `full` on a GPU, `grade` when the autograder runs it). The autograder re-runs the whole
# notebook on its own machine, its timing cells at the smallest budget: derive `CHOICE` from the
# measurements above it, and hand the notebook in saved, outputs and all (they carry your decision).
#
# **How long.** On the reference machine (2 AMD EPYC cores, no GPU), for instance, this notebook ran
# top to bottom in laptop mode in 68 s, one lab at a time on a quiet machine. Its last cell prints how
# long it took on yours.
#
# Fill in every cell that says `YOUR CODE HERE` or `YOUR ANSWER HERE`, run the notebook top to bottom
# (Kernel → Restart & Run All), and make sure the visible tests pass before you submit.
#
# **How you are graded.** When the autograder runs your notebook, right after each graded cell it
# reads your answers: your functions' outputs on inputs it draws at random, and the configuration
# and claim you export. It checks them, and re-measures your speedups, in its own process, which
# nothing in this notebook can reach. The visible tests help you but earn nothing by themselves;
# in that run a verification cell only says "deferred". Kernel hooks, patched modules and
# environment variables change no score, and are flagged for your instructor.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import inspect
import math
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from perflab import dataset, env, timing, workload
from perflab.labs import common, lab05, predict
from perflab.labs.lab05 import checks as lab05_checks
from perflab.labs.lab05 import dynamo as lab05_dynamo
from perflab.labs.lab05 import BrokenBlock, CompileTiming, CountingBackend

common.setup_notebook()
lab05.quiet_compile_logs()  # graph breaks and recompiles are read as data below, not as log spam
S = lab05.sizes()
DEVICE = env.pick_device()
INFO = env.machine_info()
MODES = lab05.available_modes(DEVICE)
WORKLOAD = lab05.graded_workload()  # what the autograder re-measures: "small" or "resnet18"
SMALL_RUN = S.mode in ("tiny", "grade")


def SYNC():
    env.synchronize(DEVICE)


print(common.hardware_statement(lab05.LAB, INFO))
print(f"compile modes timed here: {', '.join(MODES)}; graded workload: {WORKLOAD}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "part1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. What `torch.compile` does, and its modes
#
# `torch.compile` works in three stages:
#
# * **TorchDynamo** runs your Python function's bytecode symbolically and records the tensor
#   operations into an FX **graph**, together with **guards**: the assumptions the graph was built
#   under (input shapes, dtypes, devices, the values of Python constants it read). The next call
#   checks the guards; if they hold, the compiled graph runs; if not, it **recompiles**.
# * **AOTAutograd** traces the backward pass ahead of time, so forward and backward are both graphs.
# * **Inductor** (the default backend) turns the graphs into code: C++ with OpenMP on a CPU, Triton
#   kernels on a GPU. Its main trick is **fusion**: a chain of elementwise operations (the LayerNorm,
#   GELU, residual add of a block) becomes one loop that reads its inputs once, instead of one pass
#   over memory per operation. Matmuls and convolutions mostly still go to the vendor libraries.
#
# The `mode=` argument chooses how hard Inductor works:
#
# | mode | what it adds | helps when | costs |
# | --- | --- | --- | --- |
# | `"default"` | fusion, memory planning | memory-bound chains of small ops | seconds to a minute of compile |
# | `"reduce-overhead"` | **CUDA graphs**: the compiled graphs' kernel launches are recorded once and replayed with one launch | small batches on a GPU, where the GPU waits for Python to launch kernels (~5 µs each) | GPU only; more memory (static buffers); needs static shapes |
# | `"max-autotune"` | benchmarks several kernels (Triton templates on GPU, C++ GEMM templates on CPU) for each matmul/conv at compile time, plus CUDA graphs on a GPU | large matmul/conv-heavy models on a GPU | compile several times longer |
#
# On a CPU there are no kernel launches to save, so `reduce-overhead` does nothing there and is not
# timed; `max-autotune` is timed in `laptop` and `full` mode only (its autotuning takes minutes).
#
# Compiled code is also cached **on disk** (Inductor's FX-graph cache, under `/tmp/torchinductor_<user>`):
# compiling the same graph a second time, even in another process, mostly loads the cached kernels.
# `torch._dynamo.reset()` clears the in-memory caches, not that one, so the first compile you ever
# run is the slowest; keep that in mind when you read your compile times.

# %% [markdown] nbgrader={"grade": false, "grade_id": "part2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. Graph breaks (25 points)
#
# When Dynamo meets something it cannot put in a graph, it **breaks** the graph: it compiles what it
# has so far, runs the offending code in ordinary Python, and starts a new graph after it. The model
# still runs, and still gives the right answer, but each break costs: fusion cannot cross it, each
# piece is a separate compiled call with its own guards, and some breaks force a device sync.
#
# `BrokenBlock` below is a residual MLP block with four habits that break graphs, all common in real
# code: a `.item()`, a `print`, an `if` on a tensor's value, and a numpy call on the activations.

# %% nbgrader={"grade": false, "grade_id": "show-broken", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(inspect.getsource(BrokenBlock))
block = BrokenBlock(16)
x = torch.randn(8, 16)
with lab05.quiet():
    explained = torch._dynamo.explain(block)(x)
print(f"graphs: {explained.graph_count}, graph breaks: {explained.graph_break_count}, "
      f"ops captured: {explained.op_count}")
for reason in explained.break_reasons:
    print("-", str(reason.reason).splitlines()[0])


# %% [markdown] nbgrader={"grade": false, "grade_id": "part2a", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 2a. Where does it break? (10 points)
#
# `torch._dynamo.explain(fn)(*args)` traces `fn(*args)` with a backend that compiles nothing and
# returns an `ExplainOutput`: `graph_count`, `graph_break_count`, and `break_reasons`, one per break,
# each with a `reason` (text) and a `user_stack` (the frames of *your* code where it happened; the
# last one is the innermost).
#
# Write `graph_breaks(fn, *args)`: a list with one `(line, reason)` tuple per break, in the order
# `explain` reports them, where `line` is the line number of the innermost user frame and `reason`
# is a non-empty description (the first line of `reason` is plenty).

# %% nbgrader={"grade": false, "grade_id": "graph_breaks", "locked": false, "schema_version": 3, "solution": true, "task": false}
def graph_breaks(fn, *args):
    """(line, reason) for each graph break torch._dynamo.explain finds in fn(*args)."""
    ### BEGIN SOLUTION
    out = torch._dynamo.explain(fn)(*args)
    rows = []
    for brk in out.break_reasons:
        line = brk.user_stack[-1].lineno if brk.user_stack else -1
        rows.append((int(line), str(brk.reason).splitlines()[0]))
    return rows
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_graph_breaks_visible", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
with lab05.quiet():
    found = graph_breaks(BrokenBlock(16), torch.randn(8, 16))
source, first = inspect.getsourcelines(BrokenBlock.forward)
planted = [first + i for i, text in enumerate(source)
           if any(key in text for key in (".item()", "print(", "if h.mean()", "np.interp"))]
assert [line for line, _ in found] == planted, f"expected breaks at lines {planted}, found {found}"
for line, reason in found:
    print(f"line {line}: {source[line - first].strip()}\n    -> {reason}")

# %% nbgrader={"grade": true, "grade_id": "test_graph_breaks_hidden", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: functions you have not seen (one break, two, none, prints), on random shapes.
### BEGIN HIDDEN TESTS
from perflab.labs.lab05 import judges as hidden05
hidden05.check("test_graph_breaks_hidden", globals())
### END HIDDEN TESTS
print("graph_breaks: the lines dynamo broke at")


# %% [markdown] nbgrader={"grade": false, "grade_id": "part2b", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 2b. Remove them (15 points)
#
# Each break has a standard cure:
#
# * **`.item()`** turns a tensor into a Python number, which Dynamo cannot keep in a graph (and on a
#   GPU it waits for the device). Keep the value a 0-d tensor and do the arithmetic in torch
#   (`clamp(min=...)` instead of Python's `max`).
# * **`print`** is a side effect Dynamo will not trace. Drop it, or log outside the compiled region.
# * **`if tensor:`** is control flow on data: the graph cannot know which branch to record. Compute
#   both and select with `torch.where(cond, a, b)` (or use `torch.cond` for expensive branches).
# * **numpy** functions Dynamo has no torch translation for (like `np.interp`) run outside the graph.
#   Write them with torch operations; a two-point `np.interp` is a linear map and a `clamp`.
#
# One trap: a value that left torch in the original (the `.item()`, the numpy round trip) carried
# **no gradient** there. Your rewrite must give the same gradients too, so `.detach()` what the
# original could not differentiate through. Printing is not an output: you may drop it.
#
# Write `FixedBlock`, a subclass of `BrokenBlock` that overrides only `forward`.

# %% nbgrader={"grade": false, "grade_id": "FixedBlock", "locked": false, "schema_version": 3, "solution": true, "task": false}
class FixedBlock(BrokenBlock):
    """BrokenBlock's forward, rewritten so that dynamo captures it in one graph."""

    def forward(self, x):
        ### BEGIN SOLUTION
        h = self.fc1(self.norm(x))
        peak = h.detach().abs().amax().clamp(min=1.0)            # stays a tensor, no gradient as before
        h = nn.functional.gelu(h) / peak
        h = self.fc2(h)
        h = torch.where(h.mean() > 0, h - h.mean(dim=0), h)      # both branches, selected on the device
        gate = ((h.detach() + 2.0) / 4.0).clamp(0.0, 1.0)        # np.interp over [-2, 2] -> [0, 1]
        return x + h * gate
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_fixed_visible", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
torch.manual_seed(0)
original = BrokenBlock(16)
fixed = FixedBlock(16)
fixed.load_state_dict(original.state_dict())
for shift in (3.0, -3.0):  # push the data-dependent branch each way
    with torch.no_grad():
        original.fc2.bias.add_(shift)
        fixed.fc2.bias.add_(shift)
    x = torch.randn(8, 16)
    with lab05.quiet():
        want, got = original(x), fixed(x)
        breaks = torch._dynamo.explain(fixed)(x).graph_break_count
    assert breaks == 0, f"FixedBlock still has {breaks} graph break(s)"
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), \
        f"outputs differ from BrokenBlock's by {(got - want).abs().max().item():.3g}"
print("FixedBlock: zero graph breaks, BrokenBlock's outputs on both branches")

# %% nbgrader={"grade": true, "grade_id": "test_fixed_hidden", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random widths, batches and scales, both branches; explain must find zero breaks.
### BEGIN HIDDEN TESTS
from perflab.labs.lab05 import judges as hidden05
hidden05.check("test_fixed_hidden", globals())
### END HIDDEN TESTS
print("FixedBlock: zero graph breaks on random inputs")

# %% [markdown] nbgrader={"grade": false, "grade_id": "part2c", "locked": true, "schema_version": 3, "solution": false, "task": false}
# To keep breaks from creeping back, compile with `fullgraph=True`: a graph break then becomes an
# error at the line that caused it, instead of a silent slowdown. The cell uses the lab's counting
# backend (it runs the graph as it is and counts what Dynamo hands it), so it costs no compile time.

# %% nbgrader={"grade": false, "grade_id": "fullgraph", "locked": true, "schema_version": 3, "solution": false, "task": false}
x = torch.randn(8, 16)
for cls in (BrokenBlock, FixedBlock):
    counter = CountingBackend()
    torch._dynamo.reset()
    try:
        with lab05.quiet():
            torch.compile(cls(16), fullgraph=True, backend=counter)(x)
        print(f"{cls.__name__}: compiled as {counter.count} graph with fullgraph=True")
    except Exception as exc:  # dynamo's Unsupported error, raised at the first break
        print(f"{cls.__name__}: fullgraph=True refused it: {type(exc).__name__}: {str(exc).splitlines()[0]}")


# %% [markdown] nbgrader={"grade": false, "grade_id": "part3", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3. Compile time apart from the steady state (22 points)
#
# `torch.compile` returns at once: it compiles **lazily**, on the first call (and again whenever a
# guard fails). So the first call of a compiled step is the compile, and only the calls after it
# tell you what the compiled code costs per step. Time them apart:
#
# * call `torch._dynamo.reset()` first: Dynamo caches compiled code per function, and a second
#   experiment on the same function would otherwise reuse the first one's compile and report none;
# * build the step (untimed), then time the first call and `steps` more calls, one by one, each
#   ended by `sync()` so queued GPU work is charged to the call that queued it.
#
# Write `measure_compile(build, steps, *, clock=time.perf_counter, sync=None)`. It returns a
# `CompileTiming(first, steady)` (from `perflab.labs.lab05`), which derives the steady-state step
# (the median) and the compile cost (the first call's excess over a steady step) from those raw
# numbers. `steps < 1`: `ValueError` naming `steps`.

# %% nbgrader={"grade": false, "grade_id": "measure_compile", "locked": false, "schema_version": 3, "solution": true, "task": false}
def measure_compile(build, steps, *, clock=time.perf_counter, sync=None):
    """Reset dynamo, build the step, then time its first call and `steps` steady calls one by one."""
    ### BEGIN SOLUTION
    if steps < 1:
        raise ValueError(f"steps: must be at least 1, got {steps}")
    torch._dynamo.reset()
    step = build()
    seconds = []
    for _ in range(steps + 1):
        start = clock()
        step()
        if sync is not None:
            sync()
        seconds.append(clock() - start)
    return CompileTiming(seconds[0], tuple(seconds[1:]))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_measure_compile_visible", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# A scripted clock that moves only when build() or a step runs: the measurement is exact.
clock = lab05.FakeClock()
build = lab05.ScriptedBuild(clock, build_cost=0.25, costs=[4.0, 0.5, 0.25, 0.75])
result = measure_compile(build, 3, clock=clock, sync=build.sync)
assert isinstance(result, CompileTiming), f"expected a CompileTiming, got {type(result).__name__}"
assert result.first == 4.0, f"first: expected 4.0 s (the first call, not build()), got {result.first}"
assert result.steady == (0.5, 0.25, 0.75), f"steady: got {result.steady}"
assert build.syncs == 4, f"sync() should follow each of the 4 calls, it ran {build.syncs} times"
assert result.compile_seconds == 3.5
print(result.describe())

# %% nbgrader={"grade": true, "grade_id": "test_measure_compile_hidden", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random scripted costs and step counts, bad arguments, and a reset before building
# (an already-compiled function measured twice must be compiled twice).
### BEGIN HIDDEN TESTS
from perflab.labs.lab05 import judges as hidden05
hidden05.check("test_measure_compile_hidden", globals())
### END HIDDEN TESTS
print("measure_compile: exact against a scripted clock, resets dynamo")

# %% [markdown] nbgrader={"grade": false, "grade_id": "part3b", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now the real thing: a training step (forward, loss, backward, SGD step) of the lab's small model,
# eager and compiled in each mode this device offers. `lab05.small_step` builds exactly the workload
# the autograder re-measures on this machine (unless it is a CUDA GPU in full or grade mode, where
# it is ResNet-18; see 3c).
#
# Right after each compiled measurement, `perflab.timing.compare` times eager against compiled in
# interleaved blocks (A B B A ...), so both see the same drift of a busy machine, and gives the
# steady-state speedup with a bootstrap confidence interval. (It must come right after: the next
# `measure_compile` resets Dynamo, and a compiled step called after a reset compiles again.) The
# cell records its raw figures in its output: save the notebook after running it, and the autograder
# reads them from there rather than compiling every mode again.
#
# **Predict first (2 points).** Before the next cell runs: after how many training steps of the
# graded workload will the default mode's compile have paid for itself on this machine? Write it as
# `PREDICT_BREAK_EVEN` (a number of steps; `math.inf` for "never") with one line of why
# (`WHY_BREAK_EVEN`): think of what the compiler can fuse in this step, what the eager step already
# does well on this device, and what a compile costs. It is graded on being written, never on being
# right; part 4 prints it beside the break-even you measure.

# %% nbgrader={"grade": false, "grade_id": "predict_break_even", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICT_BREAK_EVEN = math.inf
WHY_BREAK_EVEN = "on a CPU the matmuls already run in BLAS and fusion saves little per step, so a compile may never be repaid"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_predict_break_even", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# Graded on being written (a number of steps, math.inf for never, and a line of why), never on being right.
predict.check("PREDICT_BREAK_EVEN", PREDICT_BREAK_EVEN, "WHY_BREAK_EVEN", WHY_BREAK_EVEN)
### BEGIN HIDDEN TESTS
from perflab.labs.lab05 import judges as hidden05
hidden05.check("test_predict_break_even", globals())
### END HIDDEN TESTS
print("prediction written: PREDICT_BREAK_EVEN =", PREDICT_BREAK_EVEN)

# %% nbgrader={"grade": false, "grade_id": "measure-modes", "locked": true, "schema_version": 3, "solution": false, "task": false}
STEPS = {}


def small_build(compile_mode):
    def build():
        STEPS[compile_mode] = lab05.small_step(0, compile_mode, **S.small_kwargs())
        return STEPS[compile_mode]
    return build


def measure_modes():
    """Eager, then each mode: its compile (your `measure_compile`) and, right after, its steady state
    against eager in interleaved blocks."""
    timings = {"eager": measure_compile(small_build(None), S.steps, sync=SYNC)}
    comparisons = {}
    for mode in common.progress(MODES, desc="modes"):
        with lab05.quiet():
            timings[mode] = measure_compile(small_build(mode), S.steps, sync=SYNC)
            comparisons[mode] = timing.compare(STEPS[None], STEPS[mode], blocks=S.compare_blocks, device=DEVICE,
                                               labels=("eager", f"compile {mode}"))
    return timings, comparisons


# Recorded in this cell's output; when graded, your saved run's figures while your measure_compile is the one
# that made them (the grader re-measures CHOICE itself).
TIMINGS, COMPARISONS = lab05.measured_modes(measure_modes, "small", DEVICE, code=measure_compile)
for name, t in TIMINGS.items():
    print(f"{name:>15}: {t.describe()}")
for comparison in COMPARISONS.values():
    print(f"\n{comparison}")

# %% nbgrader={"grade": false, "grade_id": "plot-modes", "locked": true, "schema_version": 3, "solution": false, "task": false}
fig, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
for name, t in TIMINGS.items():
    calls = [t.first, *t.steady]
    ax.plot(range(1, len(calls) + 1), np.array(calls) * 1e3, "o-", markersize=3, label=name)
ax.set(yscale="log", xlabel="call", ylabel="ms (log scale)",
       title=f"SmallNet training step: the first call compiles ({DEVICE.type})")
ax.legend()
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "part3c", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 3c. ResNet-18 (GPU only)
#
# On a CUDA GPU in `full` (and `grade`) mode the same measurement runs on the course's ResNet-18
# training step, and that is the workload the autograder re-measures. On a CPU this cell skips: the
# compile takes minutes there; you can measure what it gives yourself with
# `perflab profile --compile-mode default` if you have the time to spare.

# %% nbgrader={"grade": false, "grade_id": "measure-resnet", "locked": true, "schema_version": 3, "solution": false, "task": false}
RESNET_TIMINGS, RESNET_COMPARISONS = {}, {}
if WORKLOAD == "resnet18":
    RESNET = lab05.resnet_config()
    if not dataset.is_built(RESNET.data):
        print(f"building the {RESNET.data} data set (once)...")
        dataset.build(RESNET.data)
    WORKS = {}

    def resnet_build(compile_mode):
        def build():
            WORKS[compile_mode] = workload.build(RESNET.replace(compile_mode=compile_mode))
            return lambda: workload.train_step(WORKS[compile_mode])
        return build

    def measure_resnet_modes():
        timings = {"eager": measure_compile(resnet_build(None), S.steps, sync=SYNC)}
        comparisons = {}
        eager_step = lambda: workload.train_step(WORKS[None])  # noqa: E731
        for mode in common.progress([m for m in MODES if m in S.modes_resnet], desc="ResNet-18 modes"):
            with lab05.quiet():
                timings[mode] = measure_compile(resnet_build(mode), S.steps, sync=SYNC)
                comparisons[mode] = timing.compare(eager_step, lambda m=mode: workload.train_step(WORKS[m]),
                                                   blocks=S.compare_blocks, device=DEVICE,
                                                   labels=("eager", f"compile {mode}"))
        return timings, comparisons

    RESNET_TIMINGS, RESNET_COMPARISONS = lab05.measured_modes(measure_resnet_modes, "resnet18", DEVICE,
                                                                    code=measure_compile)
    for name, t in RESNET_TIMINGS.items():
        print(f"ResNet-18 {name:>15}: {t.describe()}")
    for comparison in RESNET_COMPARISONS.values():
        print(f"\n{comparison}")
else:
    print(f"graded workload here: {WORKLOAD} (ResNet-18 is compiled on a CUDA GPU in full or grade mode only)")

# %% [markdown] nbgrader={"grade": false, "grade_id": "part3d", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### 3d. Your choice (10 points for the correctness gate below; part 6 re-measures it)
#
# Set `CHOICE` to what your measurements support **on the graded workload** (`GRADED_COMPARISONS`
# below): a compile mode, or `None`, "do not compile". Decide it the way you would defend it to a
# colleague: which figure of a comparison tells you a gain is real rather than the drift of a busy
# machine (a median alone does not), whether the gain repays the compile you measured over the steps
# you will run (your break-even), and what you pick when two modes both qualify or none does. The kit
# keeps a change by one rule, in this lab as in labs 3 and 6: `common.keep_rule(comparison.ci())` keeps
# it when the lower end of its CI lies above `common.KEEP_ABOVE` (measurably faster than eager), and its
# `.why` says so in words. Derive it from the variables, not from a string typed in. The cell
# after yours records `CHOICE` and `WHY_CHOICE` in its output. The autograder runs your code again on your
# saved figures (replayed while the code that measured them is unchanged), so the `CHOICE` graded is the
# one your code makes from them; where it grades on another kind of device than yours, the answer may
# differ, and your code decides from its own run's figures. Beside it,
# set `WHY_CHOICE` to one line of why your measurements support it (which figures, and what they
# showed): a person reads it, and a decision without one earns half of its re-measured cell.
#
# The autograder then re-measures `CHOICE` against eager in a fresh process and holds it to the
# bar calibrated for its hardware: a mode that is slower than eager fails, and so does `None` where
# compiling gives a real gain (on a GPU). Where its re-measurement cannot settle the bar, it judges your
# mode by the same keep rule, on its own CI: kept if measurably faster than eager, else a fail.

# %% nbgrader={"grade": false, "grade_id": "CHOICE", "locked": false, "schema_version": 3, "solution": true, "task": false}
GRADED_COMPARISONS = RESNET_COMPARISONS if WORKLOAD == "resnet18" else COMPARISONS
### BEGIN SOLUTION
_lower = {mode: c.ci().low for mode, c in GRADED_COMPARISONS.items()}
_best = max(_lower, key=_lower.get) if _lower else None
_rule = common.keep_rule(GRADED_COMPARISONS[_best].ci()) if _best is not None else None
CHOICE = _best if _rule is not None and _rule.keep else None
WHY_CHOICE = (f"{_best}'s steady-state speedup had the highest CI lower bound: {_rule.why}"
              + ("" if CHOICE else ", so I do not compile")
              if _rule is not None else "no mode was measured on the graded workload, so I do not compile")
### END SOLUTION
print("CHOICE =", repr(CHOICE))
print("why:", globals().get("WHY_CHOICE", "(no WHY_CHOICE written: the re-measured cell would earn half)"))

# %% nbgrader={"grade": false, "grade_id": "claim", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Your decision, recorded in this cell's output at home; when graded, the decision your code makes in that run.
CHOICE, WHY_CHOICE = lab05.as_decided(CHOICE, globals().get("WHY_CHOICE"), DEVICE)
assert not lab05.choice_problems(CHOICE), lab05.choice_problems(CHOICE)[0]
CLAIM = GRADED_COMPARISONS[CHOICE].speedup if CHOICE in GRADED_COMPARISONS else 1.0
print(f"your claimed steady-state speedup: {CLAIM:.3f}x")

# %% [markdown] nbgrader={"grade": false, "grade_id": "part3e", "locked": true, "schema_version": 3, "solution": false, "task": false}
# A faster model that computes something else is worth nothing. The test below compiles your
# `FixedBlock` with `CHOICE` (the default mode if you chose not to compile) and compares it with the
# eager `BrokenBlock` on random weights and inputs: outputs, the input's gradient and every
# parameter's gradient must agree within float32 rounding. This is where a missing `.detach()`
# shows up.

# %% nbgrader={"grade": true, "grade_id": "test_compiled_matches_eager", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
GATE = lab05_checks.check_compiled_matches_eager(FixedBlock, mode=CHOICE or "default", seed=7)
print("compiled FixedBlock matches eager BrokenBlock; largest differences:",
      {k: f"{v:.2g}" for k, v in GATE.items()})


# %% [markdown] nbgrader={"grade": false, "grade_id": "part4", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4. When does compiling pay? (13 points)
#
# A run of `n` steps costs `n * eager_step` eager and `compile_seconds + n * compiled_step`
# compiled. Compiling pays from the smallest whole `n` at which the compiled run is no longer
# slower. When the compiled step saves nothing (`compiled_step >= eager_step`), that `n` does not
# exist: the honest answer is **never** (`math.inf`), not a large number.
#
# Write `break_even_steps(compile_seconds, eager_step, compiled_step)`: that `n` (0 when there is no
# compile cost), `math.inf` when it never pays, and `ValueError` naming the argument for a negative
# or non-finite `compile_seconds` or a step time that is not a positive, finite number.

# %% nbgrader={"grade": false, "grade_id": "break_even_steps", "locked": false, "schema_version": 3, "solution": true, "task": false}
def break_even_steps(compile_seconds, eager_step, compiled_step):
    """Smallest whole number of steps after which compiling has paid for itself; math.inf if never."""
    ### BEGIN SOLUTION
    if not (isinstance(compile_seconds, (int, float)) and math.isfinite(compile_seconds) and compile_seconds >= 0):
        raise ValueError(f"compile_seconds: must be a finite number of seconds >= 0, got {compile_seconds!r}")
    for name, value in (("eager_step", eager_step), ("compiled_step", compiled_step)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name}: must be a positive, finite number of seconds, got {value!r}")
    if compile_seconds == 0:
        return 0
    saving = eager_step - compiled_step
    if saving <= 0:
        return math.inf
    return math.ceil(compile_seconds / saving)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_break_even_visible", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
assert break_even_steps(30.0, 0.2, 0.1) == 300
assert break_even_steps(31.0, 0.2, 0.1) == 310
assert break_even_steps(10.0, 0.1, 0.1) == math.inf, "no saving per step: it never pays"
assert break_even_steps(10.0, 0.1, 0.12) == math.inf, "a slower compiled step never pays"
assert break_even_steps(0.0, 0.1, 0.12) == 0
try:
    break_even_steps(-1.0, 0.2, 0.1)
except ValueError as exc:
    assert "compile_seconds" in str(exc)
else:
    raise AssertionError("a negative compile time should raise ValueError")
print("break_even_steps: visible cases pass")

# %% nbgrader={"grade": true, "grade_id": "test_break_even_hidden", "locked": true, "points": 8, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random measurements (about a quarter without any saving), the edges, bad arguments.
### BEGIN HIDDEN TESTS
from perflab.labs.lab05 import judges as hidden05
hidden05.check("test_break_even_hidden", globals())
### END HIDDEN TESTS
print("break_even_steps: random measurements")

# %% [markdown] nbgrader={"grade": false, "grade_id": "part4b", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Your machine's answer, from your measurements: the compile cost from `measure_compile`, net of
# eager's own first call (the first call of *any* step pays warm-up: allocations, kernel choices,
# cold caches; only what the compiled first call pays beyond that is the compile), and the two step
# times from the interleaved comparison (timed side by side, so a busy machine slows both alike). The plot shows the wall time of a run against its length: compiled runs start at their
# compile cost and climb at their steady rate; where a compiled line crosses the eager one (if it
# does), compiling has paid.

# %% nbgrader={"grade": false, "grade_id": "break-even-here", "locked": true, "schema_version": 3, "solution": false, "task": false}
GRADED_TIMINGS = RESNET_TIMINGS if WORKLOAD == "resnet18" else TIMINGS
BREAK_EVEN, STEADY = {}, {}  # BREAK_EVEN: steps after which compiling pays, None where it never measurably does
EAGER_WARMUP = GRADED_TIMINGS["eager"].compile_seconds  # eager's first-call excess: warm-up, not compiling
for mode, comparison in GRADED_COMPARISONS.items():
    compile_seconds = max(0.0, GRADED_TIMINGS[mode].compile_seconds - EAGER_WARMUP)
    eager_step, compiled_step = comparison.a_per_call, comparison.b_per_call
    STEADY[mode] = (compile_seconds, eager_step, compiled_step)
    interval = comparison.ci()
    # your function's step count, stated only where the speedup's CI excludes 1 (else it is noise)
    BREAK_EVEN[mode], words = lab05.break_even_here(break_even_steps(compile_seconds, eager_step, compiled_step),
                                                    (interval.low, interval.high))
    print(f"{mode:>15}: compile {compile_seconds:.1f} s (net of eager's {EAGER_WARMUP:.2f} s first-call warm-up), "
          f"step {compiled_step * 1e3:.2f} ms vs eager {eager_step * 1e3:.2f} ms -> {words}")
if "default" in BREAK_EVEN:
    measured = BREAK_EVEN["default"] if BREAK_EVEN["default"] is not None else math.inf
    print(predict.beside("break-even of the default mode", globals().get("PREDICT_BREAK_EVEN"), measured, unit=" steps"))

finite = [n for n in BREAK_EVEN.values() if n is not None]
horizon = int(max(finite) * 2) if finite else 10_000
runs = np.linspace(0, horizon, 200)
fig, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
eager_rate = min(e for _, e, _ in STEADY.values()) if STEADY else GRADED_TIMINGS["eager"].steady_median
ax.plot(runs, runs * eager_rate, label="eager", color="black")
for mode, (compile_seconds, _, compiled_step) in STEADY.items():
    ax.plot(runs, compile_seconds + runs * compiled_step, label=f"compile {mode}")
    if BREAK_EVEN[mode] is not None:
        ax.axvline(BREAK_EVEN[mode], linestyle=":", color="0.5")
ax.set(xlabel="steps in the run", ylabel="wall time (s)", title=f"When compiling pays ({WORKLOAD})")
ax.legend()
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "part4c", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The compile you just timed ran on a machine whose Inductor cache may already hold this code (an
# earlier run of this notebook, of `perflab verify`): a warm cache. A first run on a fresh machine
# pays more. The next cell measures that: the small model's first compiled call in a **fresh
# process** with every Inductor cache turned off (`TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`), beside a
# fresh process with the caches as this machine left them. (In `tiny` and `grade` mode it skips: two
# more compiles are time the kit's tests and the autograder do not need.)

# %% nbgrader={"grade": false, "grade_id": "cold-cache", "locked": true, "schema_version": 3, "solution": false, "task": false}
COLD_CACHE = {}
if not SMALL_RUN and "default" in MODES:
    for label, cold in (("warm cache", False), ("cold cache", True)):
        with lab05.quiet():
            COLD_CACHE[label] = lab05_dynamo.first_calls_in_fresh_process("default", S.small_kwargs(), cold=cold)
        calls = COLD_CACHE[label]
        print(f"fresh process, {label}: first call {calls['first']:.1f} s, second {calls['second'] * 1e3:.1f} ms")
    print(f"the cold compile costs {COLD_CACHE['cold cache']['first'] / COLD_CACHE['warm cache']['first']:.1f}x the warm one")
else:
    print(f"{S.mode} mode: the cold-cache measurement is skipped (run the lab in laptop or full mode to see it)")

# %% [markdown] nbgrader={"grade": false, "grade_id": "part5", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5. The ragged last batch (15 points)
#
# A data set of 84 samples in batches of 32 gives batches of 32, 32 and **20** (the cell below prints
# this mode's sizes). A graph compiled for a batch of 32 has a guard on that size; the batch of 20
# fails it, and Dynamo **recompiles**. By
# default it then marks the batch dimension dynamic ("automatic dynamic shapes"), so it recompiles
# once rather than every epoch, but with Inductor that one recompile costs as much as the first
# compile, in the middle of your first epoch, and dynamic-shape kernels can be a little slower.
#
# The cell below trains two epochs over such a loader and counts the graphs Dynamo compiles, with
# `torch._dynamo.utils.counters` and the reasons `lab05.recompile_reasons()` reads from Dynamo. In
# `laptop` and `full` mode it uses Inductor, so the per-step times show what the recompile costs;
# in `tiny` and `grade` mode it uses Dynamo's `"eager"` backend, which captures the same graphs
# and fails the same guards but skips the code generation.

# %% nbgrader={"grade": false, "grade_id": "ragged-demo", "locked": true, "schema_version": 3, "solution": false, "task": false}
from torch._dynamo.utils import counters  # noqa: E402

DEMO_BACKEND = "eager" if SMALL_RUN else "inductor"
RAGGED = lab05.IndexedFeatures(S.ragged_samples, S.features)


def run_epochs(compiled, loader, epochs=2):
    """Train `compiled` over `epochs` passes of `loader`; each step's seconds and batch size."""
    seconds, sizes = [], []
    for _ in range(epochs):
        for x, y in loader:
            start = time.perf_counter()
            nn.functional.cross_entropy(compiled(x), y).backward()
            SYNC()  # queued device work is charged to the step that queued it
            seconds.append(time.perf_counter() - start)
            sizes.append(len(x))
    return seconds, sizes


torch.manual_seed(0)
naive_model = lab05.SmallNet(features=S.features, width=S.width, depth=S.depth)
naive_loader = torch.utils.data.DataLoader(RAGGED, batch_size=S.batch_size, shuffle=True,
                                           generator=torch.Generator().manual_seed(0))
torch._dynamo.reset()
counters.clear()
with lab05.quiet():
    NAIVE = run_epochs(torch.compile(naive_model, backend=DEMO_BACKEND), naive_loader)
NAIVE_GRAPHS = counters["stats"]["unique_graphs"]
NAIVE_REASONS = lab05.recompile_reasons()
print(f"batch sizes per step: {NAIVE[1]}")
print(f"graphs compiled over two epochs: {NAIVE_GRAPHS}")
for reason in NAIVE_REASONS:
    print("recompiled because:", reason)


# %% [markdown] nbgrader={"grade": false, "grade_id": "part5b", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Two fixes:
#
# * **`drop_last=True`** on the loader: every batch has the same size, one graph. The dropped tail
#   is a different set of samples each epoch (the order is reshuffled), so nothing is lost for
#   good; but with a tiny data set, or for evaluation, dropping samples may not be acceptable.
# * **Dynamic shapes**: `torch.compile(model, dynamic=True)`, or `torch._dynamo.mark_dynamic(x, 0)`
#   on each batch, compiles one graph for any batch size from the start. Every sample is used; the
#   kernels are generated for a symbolic size. One catch: sizes 0 and 1 are always specialised, so a
#   last batch of exactly **one** sample still recompiles.
#
# Write `no_recompile_setup(model, dataset, batch_size, *, seed=0, backend="inductor")`: return
# `(compiled, loader)`, the model compiled with `torch.compile(..., backend=backend)` and a shuffled
# loader (order from `seed`, no sample twice in an epoch), such that two epochs of forward and
# backward compile **one** graph. Pass `backend` through: the tests hand you a counting backend.

# %% nbgrader={"grade": false, "grade_id": "no_recompile_setup", "locked": false, "schema_version": 3, "solution": true, "task": false}
def no_recompile_setup(model, dataset, batch_size, *, seed=0, backend="inductor"):
    """A compiled model and a loader whose epochs compile one graph, ragged last batch or not."""
    ### BEGIN SOLUTION
    order = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=order,
                                         drop_last=True)
    return torch.compile(model, backend=backend), loader
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_no_recompile_visible", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
counter = CountingBackend()
torch.manual_seed(0)
model = lab05.SmallNet(features=S.features, width=16, depth=1)
torch._dynamo.reset()
with lab05.quiet():
    compiled, loader = no_recompile_setup(model, RAGGED, S.batch_size, seed=1, backend=counter)
    steps = run_epochs(compiled, loader)[1]
    reasons = lab05.recompile_reasons()
assert counter.count == 1, f"{counter.count} graphs compiled over two epochs; recompiled because: {reasons}"
print(f"one graph over two epochs of {len(steps) // 2} steps (batch sizes {sorted(set(steps))})")

# %% nbgrader={"grade": true, "grade_id": "test_no_recompile_hidden", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random data set and batch sizes (a ragged tail of at least 2), shuffled epochs,
# no repeated samples, outputs equal to the model's, one graph over two epochs.
### BEGIN HIDDEN TESTS
from perflab.labs.lab05 import judges as hidden05
hidden05.check("test_no_recompile_hidden", globals())
### END HIDDEN TESTS
print("no_recompile_setup: one graph over ragged epochs")

# %% nbgrader={"grade": false, "grade_id": "ragged-fixed", "locked": true, "schema_version": 3, "solution": false, "task": false}
torch.manual_seed(0)
fixed_model = lab05.SmallNet(features=S.features, width=S.width, depth=S.depth)
torch._dynamo.reset()
counters.clear()
with lab05.quiet():
    compiled, loader = no_recompile_setup(fixed_model, RAGGED, S.batch_size, seed=0, backend=DEMO_BACKEND)
    FIXED = run_epochs(compiled, loader)
FIXED_GRAPHS = counters["stats"]["unique_graphs"]
print(f"with your fix: {FIXED_GRAPHS} graph(s) over two epochs")

fig, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
for (seconds, _), label in ((NAIVE, f"drop_last=False ({NAIVE_GRAPHS} graphs)"), (FIXED, f"your fix ({FIXED_GRAPHS})")):
    ax.plot(range(1, len(seconds) + 1), np.array(seconds) * 1e3, "o-", markersize=3, label=label)
ragged_steps = [i + 1 for i, n in enumerate(NAIVE[1]) if n != S.batch_size]
for step in ragged_steps:
    ax.axvline(step, color="0.6", linestyle=":")
ax.set(yscale="log", xlabel="step (dotted: a short batch)", ylabel="ms (log scale)",
       title=f"Two epochs, {DEMO_BACKEND} backend: the ragged batch recompiles")
ax.legend()
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "part6", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 6. The autograder re-measures your choice (25 points)
#
# `perflab.verify` starts a fresh Python process, builds eager and `CHOICE` on the graded workload
# (on this machine: the one printed at the top), lets both warm up (the compile happens there and is
# reported apart), checks that the compiled losses match eager's, then times interleaved blocks
# until the bootstrap CI of the speedup clears or misses the bar calibrated for this hardware.
# Where calibration shows compiling gives nothing here, the bar is parity: no gain required, no
# slowdown allowed. A CI that still straddles the bar after the whole budget is judged by the keep rule
# (`common.keep_rule`) on the grader's own CI, as you judged your comparisons.

# %% nbgrader={"grade": true, "grade_id": "test_choice_verified", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
VERDICT, EXPECTATION = lab05.verify_choice(CHOICE, claim=CLAIM)
print(EXPECTATION.reason)
print(VERDICT.describe())
warm = VERDICT.details.get("warmup_seconds", {})
if warm:
    print("first-step cost in the fresh process (compilation included): "
          + ", ".join(f"{k} {v:.1f} s" for k, v in warm.items()))
lab05.report(VERDICT, EXPECTATION)
assert lab05.accepted(VERDICT.outcome), f"{VERDICT.outcome}: {VERDICT.reason}"

# %% [markdown] nbgrader={"grade": false, "grade_id": "answer_modes_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 1 (5 points).** For each mode you timed: what did it cost to compile, and what did it
# give per step (quote your speedups and their CIs)? Which did you choose, and why? What would you
# expect to change on a GPU, and which mode would you try first there for a small batch?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_modes", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# *Rubric (graders: accept any answer that reads the student's own numbers correctly).* A good answer
# gives, per mode, the compile cost (net of eager's first call) and the steady-state speedup with its
# CI; a choice that follows from them (a mode only where the keep rule keeps it: the low end of its CI
# above `common.KEEP_ABOVE`); and on a GPU,
# fusion and launch overhead, with reduce-overhead (CUDA graphs) first for a small batch. On the
# reference machine (2 cores), for instance, the default mode compiled the small model's training
# step in tens of seconds (less on a rerun, thanks to the on-disk cache) and its steady step was no
# faster than eager: the CI of the
# speedup straddled or lay below 1, because the matmuls already run in BLAS and the few fusable
# elementwise ops are a small share of the step, while the compiled step adds guard checks and
# runtime wrappers. max-autotune (laptop mode) compiled for longer and gave no more. So CHOICE is
# None here. On a GPU the picture changes: each eager op is a separate kernel launch of several
# microseconds and a separate pass over GPU memory, so fusion pays, and for a small batch the step
# is launch-bound: reduce-overhead (CUDA graphs) is the first mode to try.

# %% [markdown] nbgrader={"grade": false, "grade_id": "answer_break_even_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 2 (5 points).** What break-even did you measure? Compare it with two runs: this
# notebook's own experiments (tens of steps) and a real training run (say 90 epochs of 1,000 steps).
# When is "never" the honest answer, and how would a warm or cold compile cache change your numbers?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_break_even", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# *Rubric.* A good answer states the student's own break-even (steps, or never) beside
# `PREDICT_BREAK_EVEN` and says what the prediction missed; sets it against both horizons with
# arithmetic (compile seconds over the per-step saving: say, a saving of 0.1 ms against 20 s of
# compile would need 200,000 steps, more than either run); says that "never" (math.inf) is the honest
# answer whenever the compiled step is not measurably faster, since a huge finite number suggests it
# would pay eventually; and uses the cold-cache measurement of part 4 (or, in a mode that skips it,
# the reasoning): a first compile on a fresh machine costs more than a warm rerun, so a break-even
# from a warm cache is optimistic for new hardware.

# %% [markdown] nbgrader={"grade": false, "grade_id": "answer_breaks_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Question 3 (5 points).** Which of the four graph breaks would cost most on a GPU, and why?
# For the ragged last batch, when would you choose `drop_last=True` and when dynamic shapes?
# Use what you saw in the step-time plot of part 5.

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_breaks", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# *Rubric: which break costs most and why, and a reasoned choice for the ragged batch. For instance:* on a GPU the `.item()` and the numpy call are the worst: each copies a value from
# the device to the host, which waits for every queued kernel to finish (a sync that stalls the
# pipeline), and each splits the step into separately compiled pieces, so nothing fuses across the
# break; the print and the branch also split graphs (the branch needs the value on the host too).
# For the ragged batch: the plot showed one step, at the first short batch, taking as long as a
# compile (with Inductor, seconds) while all others stayed flat. drop_last=True is the simplest fix
# for training on a large data set, where dropping fewer than a batch of a reshuffled epoch loses
# nothing; dynamic shapes (dynamic=True or mark_dynamic on the batch dimension) are the choice when
# every sample must be used (evaluation, tiny data sets), at the price of kernels compiled for a
# symbolic size and a recompile anyway if the last batch has a single sample.

# %% [markdown] nbgrader={"grade": false, "grade_id": "save", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 7. Save your results
#
# The results file feeds `perflab report`: compile seconds and steady-state steps per mode, the
# break-even, graph breaks before and after, recompiles, and your verified choice.

# %% nbgrader={"grade": false, "grade_id": "save-results", "locked": true, "schema_version": 3, "solution": false, "task": false}
with lab05.quiet():
    FIXED_BREAKS = torch._dynamo.explain(FixedBlock(16))(torch.randn(8, 16)).graph_break_count
speedup_rows = [{**c.as_speedup(f"compile {mode} (steady state)"), "claimed": c.speedup}
                for mode, c in GRADED_COMPARISONS.items()]
if VERDICT.speedup is not None:
    speedup_rows.append({"name": f"verified: {CHOICE or 'no compile'}", "speedup": VERDICT.speedup,
                         "ci": list(VERDICT.ci), "verdict": VERDICT.outcome, "claimed": CLAIM})
path = common.save_results(lab05.LAB, {
    "compile": {
        "workload": WORKLOAD,
        "modes": {name: t.to_dict() for name, t in GRADED_TIMINGS.items()},
        "small_model": {name: t.to_dict() for name, t in TIMINGS.items()},
        "steady_interleaved": {mode: {"eager_step": e, "compiled_step": k} for mode, (_, e, k) in STEADY.items()},
        "break_even_steps": dict(BREAK_EVEN),
        "never_pays": [mode for mode, n in BREAK_EVEN.items() if n is None],
        "choice": CHOICE,
    },
    "graph_breaks": {"before": explained.graph_break_count, "after": FIXED_BREAKS,
                     "reasons": [str(r.reason).splitlines()[0] for r in explained.break_reasons]},
    "recompiles": {"ragged_graphs": NAIVE_GRAPHS, "fixed_graphs": FIXED_GRAPHS, "reasons": NAIVE_REASONS},
    "speedups": speedup_rows,
    "verification": [VERDICT.to_row(EXPECTATION.name)],
}, config=lab05.resnet_config().replace(compile_mode=CHOICE) if WORKLOAD == "resnet18" else None)
print(f"saved {path}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "closing", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Closing note: what this lab costs to run
#
# The cell below prints how long this notebook took, top to bottom, on the machine in front of you
# and in the mode it ran in. The kit quotes no fixed time for a lab: it depends on your cores, your
# device and whatever else runs beside it (noise only ever adds time). `make lab LAB=lab05_compile MODE=laptop`
# runs and times it the same way from a terminal.
#
# On a CPU the small model's compiled step can be *slower* than eager (the compiled step's guards and
# wrappers can cost more than fusion saves on a step of under a millisecond); then the honest `CHOICE`
# is `None`. On a GPU, run the lab in `full` mode: ResNet-18 is compiled in every mode, and the answer
# changes.

# %%
print(common.elapsed_statement(lab05.LAB))
