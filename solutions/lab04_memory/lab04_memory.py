# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 4 — Trade compute for memory
#
# **On Colab:** upload `perflab-student.zip` in the Files pane and first run the install cell of the kit's
# README (*On Colab*), ending in `%cd /content/perflab-student/labs/lab04_memory`; Colab's own torch stays.
#
# A training step keeps, until its backward pass, every tensor the forward pass saved for it: the
# input of each convolution, the output of each ReLU, what each BatchNorm needs. That memory grows
# with the batch size, and it is usually what stops a batch from fitting on a device. This lab
# measures it and then buys memory back with compute, two ways:
#
# * **gradient checkpointing**: keep only the input of a stage, and recompute its forward during
#   backward — less memory, more time;
# * **gradient accumulation**: run a large batch as several micro-batches and add their gradients —
#   the memory of the small batch, the gradient of the large one (with one caveat: BatchNorm).
#
# | part | what | you write | points |
# | --- | --- | --- | --- |
# | 1 | where training memory goes: static memory and saved activations | — | — |
# | 2 | activation memory against batch size, and a linear fit | — | — |
# | 3 | gradient checkpointing per ResNet stage, BatchNorm handled; which stages fit a budget at the least cost | `checkpoint_stages`, `CHECKPOINT_CHOICE` | 32 <!-- checkpoint_visible checkpoint_hidden checkpoint_batchnorm checkpoint_choice --> |
# | 4 | the largest batch that fits a memory budget | `largest_batch` | 20 <!-- largest_batch_visible largest_batch_hidden largest_batch_model --> |
# | 5 | what checkpointing costs: your prediction first, then re-measured by the autograder | `PREDICT_COST`, `WHY_COST` | 8 <!-- test_predict_cost checkpoint_cost_verified --> |
# | 6 | gradient accumulation, and the BatchNorm caveat | `accumulate_gradients` | 20 <!-- accumulate_visible accumulate_hidden --> |
# | — | written analysis (graded by hand) | four answers | 20 <!-- answer_memory_model answer_cost answer_budget answer_accumulation --> |
#
# **The contract.** Every function you write is specified in one place, the docstring of
# `perflab/labs/lab04/__init__.py`: its signature, what goes in, what must come out, and the memory model the
# budget search is graded against. The visible tests below check your functions on a few cases; the
# hidden ones, which run when your notebook is graded, hold them to the same contract on random
# models, shapes and budgets.
#
# **How you are graded.** When the autograder runs your notebook, it takes the source of each of
# your three functions (with the imports, helper functions, classes and plain constants of this
# notebook that they use) and runs it in a fresh process of its own, on models, inputs and budgets
# it draws at random; it compares what comes out (outputs, gradients, saved bytes, BatchNorm
# statistics, the batch sizes you tried) with its reference, and re-measures the cost of your
# checkpointing from the same source. It checks your choice of stages to checkpoint with its own
# memory measurement. So a function must not rely on an object built elsewhere in
# the notebook (a tensor, a model): build those inside it. The visible tests help you but earn
# nothing by themselves; in that run the verification cell only says "deferred". Kernel hooks,
# patched modules and environment variables change no score, and are flagged for your instructor.
#
# **Modes.** The notebook sizes its work by `perflab.env.run_mode()`: `laptop` on a CPU or Apple GPU
# (64-pixel images, a few minutes on 2 cores), `full` on an NVIDIA GPU (224 pixels, and the CUDA
# allocator's real peaks beside the saved-tensor count), `grade` when the autograder runs it.
#
# **How long.** On the reference machine (2 AMD EPYC cores, no GPU), for instance, this notebook ran
# top to bottom in laptop mode in 68 s, one lab at a time on a quiet machine. Its last cell prints how
# long it took on yours.
#
# Fill in every cell that says `YOUR CODE HERE` or `YOUR ANSWER HERE`, run the notebook top to bottom
# (Kernel → Restart & Run All), and make sure the visible tests pass before you submit.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import contextlib
import copy
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential  # noqa: F401 (yours to use)

from perflab import dataset, env, memory, timing, workload
from perflab.counting import restoring_buffers
from perflab.labs import common, lab04, predict
from perflab.labs.lab04 import measure as lab04_measure

common.setup_notebook()
LAB = lab04.LAB
S = lab04.sizes()
BASELINE = lab04.baseline_config()
DEVICE = env.pick_device(BASELINE.device)
INFO = env.machine_info()
SIDE = S.memory_image_size  # image side of the memory measurements
NUM_CLASSES = 10
if not dataset.is_built(S.data):
    print(f"building the {S.data} data set (once)...")
    dataset.build(S.data)
torch.manual_seed(0)
RESULTS: dict = {}
print(common.hardware_statement(LAB, INFO))

# %% [markdown]
# ## Part 1 — Where training memory goes
#
# Lab 1 split the memory of a training step in four: **parameters**, **gradients** (one per
# parameter), **optimizer state** (SGD with momentum keeps one buffer per parameter) and
# **activations** saved for backward. The first three do not depend on the batch: they are the
# *floor* every batch size stands on. The activations grow with every image in the batch.
#
# `perflab.memory` measures both: `static_memory` from the real tensors, `activation_bytes` with
# `torch.autograd.graph.saved_tensors_hooks`, each saved storage counted once. The lab's memory model
# (`lab04_measure.memory_model`, as the contract defines it) is their sum, measured at any batch size.

# %%
net = workload.build_model(BASELINE, NUM_CLASSES)
PLAIN = lab04_measure.memory_model(net, SIDE)
print(PLAIN.static.table())
x = torch.randn(S.batch_size, 3, SIDE, SIDE, device=DEVICE)
labels = torch.zeros(S.batch_size, dtype=torch.long, device=DEVICE)
saved = memory.activation_bytes(net.train(), x, lab04_measure.cross_entropy_on(labels))
print(f"\nsaved for backward at batch {S.batch_size}, {SIDE} px:\n{saved.table(top=8)}")
by_stage: dict[str, int] = {}
for name, (_, nbytes) in saved.by_module.items():
    by_stage[name.split(".")[0] or "(top level)"] = by_stage.get(name.split(".")[0] or "(top level)", 0) + nbytes
print("\nby stage: " + ", ".join(f"{k} {memory.format_bytes(v)}" for k, v in by_stage.items()))
RESULTS["memory_budget"] = {"parameters": PLAIN.static.parameter_bytes, "gradients": PLAIN.static.gradient_bytes,
                            "optimizer": PLAIN.static.optimizer_bytes, "activations": saved.bytes}

# %% [markdown]
# Notice where the activations sit: the stem (`conv1`, `bn1`, `relu`, `maxpool`) and `layer1` work at
# the highest resolution, so they save the most bytes per image although they hold the fewest
# parameters; `layer4` holds most of the parameters and saves little.
#
# ## Part 2 — Activation memory against batch size
#
# Measure the memory model at several batch sizes. Every saved tensor but a few per-channel
# statistics has the batch as its first dimension, so the activations should be a straight line in
# the batch size: a fixed cost plus a cost per sample. `lab04_measure.fit_line` gives the least-squares
# intercept and slope.

# %%
plain_acts = {b: PLAIN.activations(b) for b in common.progress(S.batches, desc="plain")}
intercept, per_sample = lab04_measure.fit_line(list(plain_acts), list(plain_acts.values()))
worst = max(abs(v - (intercept + per_sample * b)) for b, v in plain_acts.items())
print(f"activations = {memory.format_bytes(intercept)} + {memory.format_bytes(per_sample)} per image "
      f"(largest residual {worst:.0f} bytes)")
print(f"static floor (parameters + gradients + optimizer state): {memory.format_bytes(PLAIN.static_bytes)}")
crossing = PLAIN.static_bytes / per_sample
print(f"activations overtake the static floor at a batch of about {crossing:.0f} images of {SIDE} px")


# %% [markdown]
# ## Part 3 — Gradient checkpointing per stage (32 points)
#
# `torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)` runs `fn(x)` *without* keeping what
# it saves for backward (only `x` is kept); when backward reaches it, it runs `fn(x)` again, this
# time keeping everything, and backpropagates through that. Applied to a whole ResNet stage, the
# stage's activations live only during its own backward: memory traded for one more forward pass
# of the stage.
#
# Three details matter:
#
# 1. **`use_reentrant=False`.** The old (reentrant) implementation gives no gradient to the
#    parameters inside a stage whose input does not require grad, cannot be nested, and does not
#    support `torch.autograd.grad`; the non-reentrant one has none of these limits. Checkpoint a stage
#    whenever autograd records (`torch.is_grad_enabled()`), whatever its input; with grad disabled
#    (evaluation) there is nothing to save, so run it plainly.
# 2. **`checkpoint_sequential(functions, segments, x)`** splits a sequence into segments and
#    checkpoints each, *except the last*, which runs plainly (its output is needed at once). It is
#    not "one stage, one segment": check what it saves before you use it.
# 3. **BatchNorm.** The forward pass recomputed in backward is a second train-mode forward: every
#    BatchNorm in the stage updates its running statistics again and counts the batch twice. The
#    next cell shows it with perflab's own simple wrapper `workload.CheckpointedStage`.

# %%
def one_step(model, x, y):
    model.train()
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()


demo = lab04.resnet18(NUM_CLASSES, seed=0)
naive = copy.deepcopy(demo)
for name in lab04.STAGES:
    setattr(naive, name, workload.CheckpointedStage(getattr(naive, name)))
xs, ys = torch.randn(4, 3, 32, 32), torch.randint(0, NUM_CLASSES, (4,))
one_step(demo, xs, ys)
one_step(naive, xs, ys)
bn_plain, bn_naive = demo.layer1[0].bn1, naive.layer1.stage[0].bn1
print(f"layer1[0].bn1 after one step: num_batches_tracked plain {int(bn_plain.num_batches_tracked)}, "
      f"checkpointed {int(bn_naive.num_batches_tracked)}")
print(f"running_mean differs by up to {float((bn_naive.running_mean - bn_plain.running_mean).abs().max()):.2e} "
      f"(the momentum was applied twice)")

# %% [markdown]
# The gradients are still right (the recomputation normalises with the same batch statistics), but a
# model evaluated later uses running statistics that moved twice as fast. `checkpoint` takes a
# `context_fn` argument (non-reentrant only): a function returning two context managers, the first
# wrapped around the forward pass, the second around its recomputation. A recomputation context that
# restores the stage's buffers when it ends (`perflab.counting.restoring_buffers(stage)` does exactly
# that) leaves them as the one real forward pass set them.
#
# Write `checkpoint_stages(model, stages)` (contract: `perflab/labs/lab04/__init__.py`): wrap each named stage
# in place and return the model. If you define helper classes or functions, list them in
# `CHECKPOINT_HELPERS`: part 5 exports them with your function so the autograder can time it in a
# fresh process (the export file starts with this notebook's imports).

# %% nbgrader={"grade": false, "grade_id": "checkpoint_stages", "locked": false, "schema_version": 3, "solution": true, "task": false}
CHECKPOINT_HELPERS = []  # the classes and functions checkpoint_stages uses

### BEGIN SOLUTION
class CheckpointedStage(nn.Module):
    """One stage run as one checkpointed segment; its recomputation leaves BatchNorm statistics alone."""

    def __init__(self, stage):
        super().__init__()
        self.stage = stage

    def forward(self, x):
        if not torch.is_grad_enabled():
            return self.stage(x)
        return checkpoint(self.stage, x, use_reentrant=False,
                          context_fn=lambda: (contextlib.nullcontext(), restoring_buffers(self.stage)))


CHECKPOINT_HELPERS = [CheckpointedStage]
### END SOLUTION


def checkpoint_stages(model, stages):
    """Run each child of `model` named in `stages` under non-reentrant checkpointing; returns `model`."""
    ### BEGIN SOLUTION
    for name in stages:
        setattr(model, name, CheckpointedStage(getattr(model, name)))
    return model
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "checkpoint_visible", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
base = lab04.resnet18(NUM_CLASSES, seed=1)
xv, yv = torch.randn(4, 3, 32, 32), torch.randint(0, NUM_CLASSES, (4,))
plain_v, ckpt_v = copy.deepcopy(base), copy.deepcopy(base)
params_before = list(ckpt_v.parameters())
ckpt_v = checkpoint_stages(ckpt_v, lab04.STAGES)
assert [id(p) for p in ckpt_v.parameters()] == [id(p) for p in params_before], "wrap in place, keep the parameters"
loss_v = lab04_measure.cross_entropy_on(yv)
bytes_plain = memory.activation_bytes(plain_v.train(), xv, loss_v).bytes
bytes_ckpt = memory.activation_bytes(ckpt_v.train(), xv, loss_v).bytes
print(f"saved activations: plain {memory.format_bytes(bytes_plain)}, all stages checkpointed "
      f"{memory.format_bytes(bytes_ckpt)} ({1 - bytes_ckpt / bytes_plain:.0%} less)")
assert bytes_ckpt < 0.6 * bytes_plain, "checkpointing all four stages should save over 40% here"
one_step(plain_v, xv, yv)
one_step(ckpt_v, xv, yv)
for (name, p), q in zip(plain_v.named_parameters(), ckpt_v.parameters(), strict=True):
    assert q.grad is not None and torch.allclose(q.grad, p.grad, rtol=1e-4, atol=1e-6), f"gradient of {name} differs"
print("visible tests passed")

# %% nbgrader={"grade": true, "grade_id": "checkpoint_hidden", "locked": true, "points": 15, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: ResNet-18 with random stages, classes and input sizes, and a small CNN whose first
# stage takes the raw input; outputs, gradients, and saved bytes against the reference's saving.
### BEGIN HIDDEN TESTS
from perflab.labs.lab04 import judges as hidden04
hidden04.check("checkpoint_hidden", globals())
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "checkpoint_batchnorm", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# BatchNorm statistics are updated once per step, as without checkpointing.
for (name, b), c in zip(plain_v.named_buffers(), ckpt_v.buffers(), strict=True):
    assert torch.allclose(c.float(), b.float(), rtol=1e-5, atol=1e-6), \
        f"{name}: {'counted twice' if 'num_batches' in name else 'updated again by the recomputed forward'}"
print("BatchNorm statistics match the plain model's")
### BEGIN HIDDEN TESTS
from perflab.labs.lab04 import judges as hidden04
hidden04.check("checkpoint_batchnorm", globals())
### END HIDDEN TESTS

# %% [markdown]
# Which stage is worth checkpointing? Each one saves its own activations but keeps its input, and
# costs one more forward pass of the stage. Measure the saving of each stage alone, and count its cost:
# the FLOPs of one forward pass of the stage (`lab04_measure.stage_forward_flops`, FlopCounterMode as in
# lab 1), the work its recomputation adds to a step.

# %%
STAGE_FLOPS = lab04_measure.stage_forward_flops(PLAIN.model, S.batch_size, SIDE)
stage_rows = []
for stage in lab04.STAGES:
    alone = checkpoint_stages(workload.build_model(BASELINE, NUM_CLASSES), (stage,))
    acts = lab04_measure.memory_model(alone, SIDE).activations(S.batch_size)
    stage_rows.append((stage, PLAIN.activations(S.batch_size) - acts))
    print(f"checkpoint {stage} alone: saves {memory.format_bytes(stage_rows[-1][1])} at batch {S.batch_size} "
          f"({stage_rows[-1][1] / PLAIN.activations(S.batch_size):.0%} of the activations), "
          f"recomputes {STAGE_FLOPS[stage] / 1e9:.3f} GFLOP ({STAGE_FLOPS[stage] / sum(STAGE_FLOPS.values()):.0%} "
          "of the four stages' forward)")

# %% [markdown]
# ### Which stages to checkpoint: your decision (7 points)
#
# Suppose this training step must fit an activation budget: `lab04.ACTIVATION_BUDGET_SHARE` of what the
# plain step saves for backward at the lab's batch size (`lab04_measure.activation_budget`). The next
# cell prints it for this machine, in bytes and as that share.
#
# Set `CHECKPOINT_CHOICE` to the stages to checkpoint: a tuple of names from `lab04.STAGES`, `()` for
# none. **Fitting comes first**: with those stages checkpointed, the activations the step keeps must be
# within the budget. **The least recomputation second**: of the choices that fit, take the one whose
# stages' forward passes cost the fewest FLOPs, the cost your table counts. Decide it from your table
# (`stage_rows`, `STAGE_FLOPS`) and `ACTIVATION_BUDGET`, not from names typed in; the test cell after
# yours measures your choice with the memory model and prints what it keeps beside the budget.
#
# The autograder checks your choice with its own measurement: it checkpoints your stages with the kit's
# own checkpointing, measures the activations a step keeps at the graded workload, and counts the FLOPs
# their recomputation costs (FLOPs, not seconds: the same on every machine, and exactly the work a
# recomputed stage repeats). Full marks when your choice fits at the least cost of any choice that fits
# (within the small tolerance the contract states); half when it fits at a higher cost than needed;
# nothing when it does not fit.

# %%
ACTIVATION_BUDGET = lab04_measure.activation_budget(plain=PLAIN)
print(f"activation budget: {memory.format_bytes(ACTIVATION_BUDGET)}, {lab04.ACTIVATION_BUDGET_SHARE:.0%} of the "
      f"{memory.format_bytes(PLAIN.activations(S.batch_size))} the plain step saves at batch {S.batch_size}, {SIDE} px")

# %% nbgrader={"grade": false, "grade_id": "checkpoint_choice_decision", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
# Every subset of the stages, each stage's saving from the table (each stage saves its own activations,
# so savings add up), kept where it fits; the cheapest, the one that keeps less on a tie.
_saving = dict(stage_rows)
_plain_acts = PLAIN.activations(S.batch_size)
_fitting = []  # (recomputed FLOPs, activations kept, stages)
for _mask in range(2 ** len(lab04.STAGES)):
    _stages = tuple(name for i, name in enumerate(lab04.STAGES) if _mask >> i & 1)
    _kept = _plain_acts - sum(_saving[name] for name in _stages)
    if _kept <= ACTIVATION_BUDGET:
        _fitting.append((sum(STAGE_FLOPS[name] for name in _stages), _kept, _stages))
CHECKPOINT_CHOICE = min(_fitting)[2] if _fitting else tuple(lab04.STAGES)
### END SOLUTION
print("CHECKPOINT_CHOICE =", CHECKPOINT_CHOICE)

# %% nbgrader={"grade": true, "grade_id": "checkpoint_choice", "locked": true, "points": 7, "schema_version": 3, "solution": false, "task": false}
# Your choice measured here with your checkpoint_stages; the autograder measures it with its own.
assert not lab04.choice_problems(CHECKPOINT_CHOICE), lab04.choice_problems(CHECKPOINT_CHOICE)[0]
chosen = checkpoint_stages(workload.build_model(BASELINE, NUM_CLASSES), tuple(CHECKPOINT_CHOICE))
CHOICE_ACTIVATIONS = lab04_measure.memory_model(chosen, SIDE).activations(S.batch_size)
CHOICE_FLOPS = sum(STAGE_FLOPS[name] for name in CHECKPOINT_CHOICE)
print(f"checkpointing {', '.join(CHECKPOINT_CHOICE) or 'no stage'}: {memory.format_bytes(CHOICE_ACTIVATIONS)} of "
      f"activations at batch {S.batch_size}, budget {memory.format_bytes(ACTIVATION_BUDGET)}: "
      f"{'fits' if CHOICE_ACTIVATIONS <= ACTIVATION_BUDGET else 'does NOT fit'}; recomputes "
      f"{CHOICE_FLOPS / 1e9:.3f} GFLOP")
### BEGIN HIDDEN TESTS
from perflab.labs.lab04 import judges as hidden04
hidden04.check("checkpoint_choice", globals())
### END HIDDEN TESTS

# %% [markdown]
# Now the whole picture: training memory against batch size with and without checkpointing every
# stage, the static floor under both, and a straight line through each. On a CUDA device the
# dotted lines are the caching allocator's real peak (`torch.cuda.max_memory_allocated`) over a
# whole training step, optimizer included: what the device must actually hold.

# %%
CKPT = lab04_measure.memory_model(checkpoint_stages(workload.build_model(BASELINE, NUM_CLASSES), lab04.STAGES), SIDE)
ckpt_acts = {b: CKPT.activations(b) for b in common.progress(S.batches, desc="checkpointed")}
ckpt_intercept, ckpt_per_sample = lab04_measure.fit_line(list(ckpt_acts), list(ckpt_acts.values()))
print(f"checkpointed: {memory.format_bytes(ckpt_intercept)} + {memory.format_bytes(ckpt_per_sample)} per image "
      f"({1 - ckpt_per_sample / per_sample:.0%} less per image)")


def step_peak(model, batch_size):
    """The allocator's peak over one training step at `batch_size` (after a warm-up step)."""
    model = copy.deepcopy(model).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xb = torch.randn(batch_size, 3, SIDE, SIDE, device=DEVICE)
    yb = torch.zeros(batch_size, dtype=torch.long, device=DEVICE)

    def step():
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    step()
    return memory.peak_memory(step, DEVICE).peak_bytes


peaks = {}
if DEVICE.type == "cuda":
    for b in S.batches:
        peaks[(b, False)] = step_peak(PLAIN.model, b)
        peaks[(b, True)] = step_peak(CKPT.model, b)
else:
    print(f"No CUDA allocator here ({DEVICE.type}): the figure shows the memory model only.")

bs = np.array(S.batches)
fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
for acts, (a0, a1), style, label in ((plain_acts, (intercept, per_sample), "o-", "no checkpointing"),
                                     (ckpt_acts, (ckpt_intercept, ckpt_per_sample), "s--", "all stages checkpointed")):
    ax.plot(bs, [(PLAIN.static_bytes + acts[b]) / 2**20 for b in S.batches], style, label=label)
    ax.plot(bs, (PLAIN.static_bytes + a0 + a1 * bs) / 2**20, color="0.6", linewidth=0.8)
    if peaks:
        ax.plot(bs, [peaks[(b, "checkpointed" in label)] / 2**20 for b in S.batches], ":", marker=style[0],
                label=f"{label}: CUDA allocator peak")
ax.axhline(PLAIN.static_bytes / 2**20, color="black", linestyle=":", linewidth=1)
ax.annotate("static floor: parameters + gradients + momentum", (0.02, PLAIN.static_bytes / 2**20),
            xycoords=("axes fraction", "data"), xytext=(0, 4), textcoords="offset points", fontsize=8)
ax.set(xlabel="batch size", ylabel="training memory (MiB)",
       title=f"{BASELINE.model} at {SIDE} px: memory against batch size (grey: linear fits)")
ax.legend(fontsize=8)
plt.show()
MEMORY_ROWS = [{"batch_size": int(b), "bytes": int(PLAIN.static_bytes + acts[b]), "activation_bytes": int(acts[b]),
                "checkpointed": ckpt, **({"peak_bytes": int(peaks[(b, ckpt)])} if peaks else {})}
               for ckpt, acts in ((False, plain_acts), (True, ckpt_acts)) for b in S.batches]


# %% [markdown]
# ## Part 4 — The largest batch that fits a budget (20 points)
#
# Given a memory budget, what is the largest batch that fits? Memory only grows with the batch, so
# the answer is a search, and each probe costs a forward pass (on a GPU, a probe that is too large is
# an out-of-memory error, slow to recover from). So grow the batch by **doubling** from 1 until it no
# longer fits, then **bisect** between the last batch that fitted and the first that did not: you
# never probe more than twice the answer, and you need about 2·log₂(answer) probes.
#
# Write `largest_batch(budget_bytes, memory_of, max_batch=4096)` (contract: `perflab/labs/lab04/__init__.py`).
# `memory_of(b)` is any non-decreasing function: the tests use straight lines, allocator-like steps
# and plateaus, and the lab's memory model of ResNet-18 with hidden budgets.

# %% nbgrader={"grade": false, "grade_id": "largest_batch", "locked": false, "schema_version": 3, "solution": true, "task": false}
def largest_batch(budget_bytes, memory_of, max_batch=lab04.MAX_BATCH):
    """The largest b in 1..max_batch with memory_of(b) <= budget_bytes (0 if none)."""
    ### BEGIN SOLUTION
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)) \
            or not math.isfinite(budget_bytes) or budget_bytes <= 0:
        raise ValueError(f"budget_bytes: must be a positive number of bytes, got {budget_bytes!r}")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch: must be an integer >= 1, got {max_batch!r}")
    if memory_of(1) > budget_bytes:
        return 0
    fits, too_big = 1, None
    while too_big is None and fits < max_batch:
        trial = min(2 * fits, max_batch)
        if memory_of(trial) <= budget_bytes:
            fits = trial
        else:
            too_big = trial
    if too_big is None:
        return fits
    while too_big - fits > 1:
        middle = (fits + too_big) // 2
        if memory_of(middle) <= budget_bytes:
            fits = middle
        else:
            too_big = middle
    return fits
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "largest_batch_visible", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
probes = []


def line(b):
    probes.append(b)
    return 1000 + 10 * b


assert largest_batch(1000 + 10 * 37, line) == 37
assert max(probes) <= 2 * 37 and len(probes) <= lab04.max_calls(37), probes
assert largest_batch(1005, line) == 0, "nothing fits: 0"
assert largest_batch(10**9, line, max_batch=100) == 100, "everything fits: max_batch"
steps = lambda b: 2**20 * math.ceil((3e6 + 1e5 * b) / 2**20)  # noqa: E731 (an allocator rounding to 1 MiB)
assert largest_batch(steps(50), steps) == max(b for b in range(1, 200) if steps(b) <= steps(50))
print("visible tests passed; probes for the answer 37:", probes[:lab04.max_calls(37)])

# %% nbgrader={"grade": true, "grade_id": "largest_batch_hidden", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random straight lines, allocator steps and plateaus, budgets below, between, on and
# above the values; the probes you make; bad arguments.
### BEGIN HIDDEN TESTS
from perflab.labs.lab04 import judges as hidden04
hidden04.check("largest_batch_hidden", globals())
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "largest_batch_model", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: hidden budgets on the reference's memory model of ResNet-18, plain and checkpointed.
### BEGIN HIDDEN TESTS
from perflab.labs.lab04 import judges as hidden04
hidden04.check("largest_batch_model", globals())
### END HIDDEN TESTS

# %% [markdown]
# Now the question the lab asks: with a budget that fits a batch of `S.budget_batch` without
# checkpointing, how large a batch fits with it? Compare the search with what the straight lines of
# part 3 predict.

# %%
BUDGET = PLAIN(S.budget_batch)
fit_plain = largest_batch(BUDGET, PLAIN)
fit_ckpt = largest_batch(BUDGET, CKPT)
predicted = {False: math.floor((BUDGET - PLAIN.static_bytes - intercept) / per_sample),
             True: math.floor((BUDGET - CKPT.static_bytes - ckpt_intercept) / ckpt_per_sample)}
print(f"budget {memory.format_bytes(BUDGET)} (static floor {memory.format_bytes(PLAIN.static_bytes)})")
print(f"largest batch without checkpointing: {fit_plain} (the line predicts {predicted[False]})")
print(f"largest batch with every stage checkpointed: {fit_ckpt} (the line predicts {predicted[True]}), "
      f"{fit_ckpt / max(fit_plain, 1):.2f}x larger")
if DEVICE.type == "cuda":
    print(f"the CUDA allocator's real peak at those batches: plain {memory.format_bytes(step_peak(PLAIN.model, fit_plain))}, "
          f"checkpointed {memory.format_bytes(step_peak(CKPT.model, fit_ckpt))} (the budget counts saved tensors only)")
LARGEST = {"budget_bytes": int(BUDGET), "plain": fit_plain, "checkpointed": fit_ckpt,
           "predicted_plain": predicted[False], "predicted_checkpointed": predicted[True]}

# %% [markdown]
# ## Part 5 — What it costs (8 points)
#
# Checkpointing every stage runs nearly the whole forward pass twice: once in the forward, once more
# in backward to rebuild what was not kept. How much slower that makes a *step* depends on what share
# of the step the recomputed forward is; you can estimate it from how the backward's work compares
# with the forward's (section 1 counted both). The grade here is not for speed: it is for memory saved
# at a bounded cost.
#
# **Predict first (2 points).** Before the next cells measure it, write the speedup you expect of the
# checkpointed step over the plain one (`PREDICT_COST`, a positive number: below 1 means slower) and
# one line of why (`WHY_COST`). It is graded on being written, never on being right; the measurement
# prints it beside what it finds.
#
# The next cell times a training step of the lab's workload with and without your checkpointing
# (interleaved blocks, bootstrap CI: `perflab.timing.compare`); its "speedup" is below 1, and that is
# your `CLAIM`. The graded cell after it exports your `checkpoint_stages` and has `perflab.verify`
# re-measure it in a fresh interpreter, checking first that it trains identically to the plain
# model. The same fresh process measures what your checkpoint buys on the workload itself: the
# activation bytes one training step keeps for backward, plain and checkpointed. It passes when that
# memory falls by at least `lab04.MIN_WORKLOAD_SAVING_SHARE` of what checkpointing every stage gives,
# and the speedup's confidence interval stays above the bar for this hardware: calibrated from the
# reference solution on the grading machine, or, where none was calibrated, perflab's conservative
# rule for a known cost (`perflab.verify.expectations.COST_FLOOR`).

# %% nbgrader={"grade": false, "grade_id": "predict_cost", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICT_COST = 0.75
WHY_COST = "backward does about twice the forward's work, and checkpointing every stage adds about one more forward: 3 units become 4"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_predict_cost", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# Graded on being written (a number and a line of why), never on being right.
predict.check("PREDICT_COST", PREDICT_COST, "WHY_COST", WHY_COST)
### BEGIN HIDDEN TESTS
from perflab.labs.lab04 import judges as hidden04
hidden04.check("test_predict_cost", globals())
### END HIDDEN TESTS
print("prediction written: PREDICT_COST =", PREDICT_COST)

# %%
base_work = workload.build(BASELINE)
ckpt_work = workload.build(BASELINE)
checkpoint_stages(ckpt_work.model, lab04.GRADED_STAGES)
COMPARISON = timing.compare(lambda: workload.train_step(base_work), lambda: workload.train_step(ckpt_work),
                            blocks=S.compare_blocks, block_size=2, device=DEVICE,
                            labels=("plain", "checkpointed"))
CLAIM = COMPARISON.speedup
print(COMPARISON)
print(f"\nthe checkpointed step takes {1 / CLAIM - 1:+.0%} time")
print(predict.beside("checkpointed step against plain", globals().get("PREDICT_COST"), CLAIM))
base_work.close()
ckpt_work.close()

# %% nbgrader={"grade": true, "grade_id": "checkpoint_cost_verified", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# The autograder's re-measurement: your checkpoint_stages exported, a fresh interpreter, the
# correctness gate, the activation memory it keeps, interleaved blocks, bootstrap CI, the bar of this hardware.
CANDIDATE = lab04.export_candidate(common.results_path(LAB).with_name("lab04_candidate.py"), checkpoint_stages,
                                   *CHECKPOINT_HELPERS, config=BASELINE)
VERDICT, EXPECTATION = lab04.verify_checkpoint(CANDIDATE, claim=CLAIM)
print(EXPECTATION.reason)
print(VERDICT.describe())
lab04.report(VERDICT, EXPECTATION)
assert lab04.accepted(VERDICT.outcome), f"{VERDICT.outcome}: {VERDICT.reason}"


# %% [markdown]
# ## Part 6 — Gradient accumulation, and the BatchNorm caveat (20 points)
#
# The other way to train with a batch that does not fit: split it. The mean loss over N samples is a
# weighted sum of the mean losses of its micro-batches, each weighted by its share of the samples
# (n_k / N), and the gradient is linear, so
#
# $$\nabla \frac{1}{N}\sum_{i=1}^{N} \ell_i \;=\; \sum_k \frac{n_k}{N}\, \nabla \frac{1}{n_k} \sum_{i \in k} \ell_i .$$
#
# Backward *adds* into `.grad`, so running backward on each micro-batch's loss, scaled by n_k / N,
# leaves exactly the large batch's gradient, while only one micro-batch's activations are alive at a
# time. Mind the weight when the last micro-batch is smaller, and clear stale gradients first.
#
# Write `accumulate_gradients(model, inputs, targets, micro_batch_size)` (contract:
# `perflab/labs/lab04/__init__.py`).

# %% nbgrader={"grade": false, "grade_id": "accumulate_gradients", "locked": false, "schema_version": 3, "solution": true, "task": false}
def accumulate_gradients(model, inputs, targets, micro_batch_size):
    """Leave the large-batch gradient of the mean cross-entropy in .grad, in micro-batches; the mean loss."""
    ### BEGIN SOLUTION
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size: must be an integer >= 1, got {micro_batch_size!r}")
    model.zero_grad(set_to_none=True)
    n = inputs.shape[0]
    total = 0.0
    for start in range(0, n, micro_batch_size):
        xb, yb = inputs[start:start + micro_batch_size], targets[start:start + micro_batch_size]
        loss = F.cross_entropy(model(xb), yb) * (xb.shape[0] / n)
        loss.backward()
        total += float(loss.detach())
    return total
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "accumulate_visible", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
cnn = lab04.plain_cnn(width=8, num_classes=5, seed=3)
xa, ya = torch.randn(10, 3, 8, 8), torch.randint(0, 5, (10,))
big = copy.deepcopy(cnn)
big_loss = F.cross_entropy(big(xa), ya)
big_loss.backward()
for p in cnn.parameters():
    p.grad = torch.ones_like(p)  # stale gradients must not count
got = accumulate_gradients(cnn, xa, ya, micro_batch_size=4)  # micro-batches of 4, 4 and 2
assert math.isclose(got, float(big_loss), rel_tol=1e-5), (got, float(big_loss))
for (name, p), q in zip(big.named_parameters(), cnn.parameters(), strict=True):
    assert torch.allclose(q.grad, p.grad, rtol=1e-4, atol=1e-7), f"gradient of {name} differs from the large batch's"
print("visible tests passed")

# %% nbgrader={"grade": true, "grade_id": "accumulate_hidden", "locked": true, "points": 15, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random CNNs without BatchNorm and ResNet-18 with BatchNorm in eval mode, random batch
# and micro-batch sizes (uneven last micro-batch, one sample, the whole batch, more than the batch),
# stale gradients, the micro-batches the model actually saw, the mode kept, bad arguments.
### BEGIN HIDDEN TESTS
from perflab.labs.lab04 import judges as hidden04
hidden04.check("accumulate_hidden", globals())
### END HIDDEN TESTS

# %% [markdown]
# **The BatchNorm caveat.** In train mode BatchNorm normalises each batch by *its own* mean and
# variance. A micro-batch of 4 has other statistics than the batch of 16 it came from, so each sample
# is normalised differently and the accumulated gradient is *not* the large batch's. The cell below
# measures the gap on ResNet-18, in train mode and in eval mode (running statistics: no dependence
# between samples).

# %%
resnet = lab04.resnet18(NUM_CLASSES, seed=4)
xg, yg = torch.randn(16, 3, 32, 32), torch.randint(0, NUM_CLASSES, (16,))
with torch.no_grad():
    resnet.train()(xg)  # running statistics that are not the initial ones
BN_GAP = {"train": lab04_measure.batchnorm_gap(accumulate_gradients, resnet.train(), xg, yg, 4),
          "eval": lab04_measure.batchnorm_gap(accumulate_gradients, resnet.eval(), xg, yg, 4)}
print(f"largest relative gradient gap, batch 16 as 4 micro-batches of 4: BatchNorm in train mode "
      f"{BN_GAP['train']:.1%}, in eval mode {BN_GAP['eval']:.1e}")
micro_acts, big_acts = PLAIN.activations(S.batch_size), PLAIN.activations(4 * S.batch_size)
print(f"activations alive: one micro-batch of {S.batch_size} {memory.format_bytes(micro_acts)}, "
      f"the batch of {4 * S.batch_size} at once {memory.format_bytes(big_acts)}")

# %% [markdown]
# What to do about it: (1) for an *exact* check of an accumulation loop, use a model without
# BatchNorm, or put BatchNorm in eval mode (`model.eval()` only changes BatchNorm and dropout here);
# (2) in real training, accept that BatchNorm sees micro-batch statistics (it usually trains fine if
# micro-batches are not tiny), or freeze BatchNorm (eval mode for its layers, e.g. when fine-tuning),
# or replace it with a normalisation that does not mix samples (GroupNorm, LayerNorm); (3) running
# statistics are updated once per micro-batch: with k micro-batches the momentum is applied k times
# per optimizer step.
#
# ## Written analysis (20 points)

# %% [markdown]
# **Question 1 (5 points).** From your fit in parts 2 and 3: what are the fixed cost and the cost per
# image of the activations, with and without checkpointing, and at which batch size do activations
# overtake the static floor here? Which stage saved the most when checkpointed alone, and why that one
# (think about resolution and channels)?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_memory_model", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# Rubric. A good answer quotes the student's own fit: the cost per image and the fixed cost, plain and
# with every stage checkpointed (the fit should be near exact: saved bytes are linear in the batch);
# the batch size where activations overtake the static floor (the floor divided by the cost per
# image); the stage that saved most alone, explained by resolution and channels: each later stage
# halves the side (a quarter of the pixels) while only doubling the channels, so its tensors are half
# the size, and `layer1`, at the highest resolution after the stem, saves most. On the reference
# machine (laptop mode, 64 px), for instance, the fit gave about 1.7 MiB per image plain and 0.85 MiB
# checkpointed, a floor of 128 MiB overtaken at about 74 images.

# %% [markdown]
# **Question 2 (5 points).** How much slower was the checkpointed step in your measurement and in the
# autograder's? Is that what you expect from how much extra work checkpointing does? When is the
# trade worth making, and when is it not?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_cost", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# Rubric. A good answer quotes both figures (the notebook's `CLAIM` with its CI, the autograder's
# re-measured CI) and sets `PREDICT_COST` beside them; explains the cost from the extra work (backward
# does about twice the forward's work, so a step is about 3 forward units, and checkpointing every
# stage recomputes nearly the whole forward, about one more: near 3/4 of the speed) and says why the
# measurement may differ (the stem and head are not recomputed; memory traffic, not only arithmetic);
# and says when the trade is worth it (memory is the limit: a batch or image size that would not fit,
# a batch large enough to use the device, fewer accumulation steps) and when not (the batch fits with
# room to spare), noting that checkpointing only the early, high-resolution stages buys most of the
# memory for less recomputation. On the reference machine, for instance, both measured about
# 0.75-0.8x.

# %% [markdown]
# **Question 3 (5 points).** With the same budget, how much larger a batch fit with checkpointing?
# Why not twice or four times larger, and what part of memory does checkpointing not touch at all?
# (On a GPU: how far was the allocator's real peak from the memory model, and why?)

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_budget", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# Rubric: the student's own two batch sizes, then why the gain is not larger. On the reference machine,
# for instance, a budget that fit 64 images plain fit about 130 with every stage checkpointed,
# about twice as many: the per-image activations halve, but not more, because the stem (conv1, bn1,
# relu, maxpool at full and half resolution) is not checkpointed and saves the largest tensors, each
# stage's input is kept, and during backward one stage's activations are recomputed and alive at a
# time. Checkpointing does not touch the static floor at all (parameters, gradients, optimizer state),
# so when the floor dominates the budget (small images) it buys little. On a GPU the
# allocator's peak is above the model: it also holds the batch itself, cuDNN workspaces, gradients of
# activations during backward and the allocator's rounding of blocks.

# %% [markdown]
# **Question 4 (5 points).** Why does accumulating micro-batch gradients give the large batch's
# gradient, what breaks that with BatchNorm (quote your measured gap), and what would you do about
# it in a real training run?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_accumulation", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# Rubric: the linearity argument, the student's measured gap quoted, and a remedy. For instance: the mean loss over the batch is the sum of the micro-batch mean losses weighted by
# n_k / N, and differentiation is linear, so the weighted sum of micro-batch gradients is the batch
# gradient; backward accumulates into .grad, so scaling each micro-batch loss by n_k / N and calling
# backward on each leaves exactly that sum (up to fp32 rounding: a gap of about 1e-7 in eval mode).
# BatchNorm in train mode breaks the premise that each sample's loss depends on that sample only: it
# normalises with the statistics of the micro-batch, so the gap was tens of percent in train mode. In
# real training: keep micro-batches large enough for stable statistics and accept the difference, or
# freeze BatchNorm (eval mode, e.g. for fine-tuning), or use GroupNorm/LayerNorm; for an exact
# correctness check, compare with BatchNorm in eval mode or on a model without it.

# %% [markdown]
# ## Save your results
#
# The results file feeds `perflab report`: memory against batch size with and without checkpointing,
# the memory budget, the largest batches, the cost with its CI and the autograder's verdict. Your
# `CHECKPOINT_CHOICE` goes in it too, with the budget and your table: lab 6 reads it from there.

# %% nbgrader={"grade": false, "grade_id": "save-results", "locked": true, "schema_version": 3, "solution": false, "task": false}
path = common.save_results(LAB, {
    "memory_vs_batch": MEMORY_ROWS,
    "memory_budget": RESULTS["memory_budget"],
    "largest_batch": LARGEST,
    "speedups": [{**COMPARISON.as_speedup("checkpoint every stage"), "claimed": CLAIM}],
    "verification": [VERDICT.to_row(lab04.EXPECTATION)],
    "accumulation": {"batchnorm_gap_train": BN_GAP["train"], "batchnorm_gap_eval": BN_GAP["eval"]},
    "checkpoint": {"stages": list(CHECKPOINT_CHOICE), "budget_bytes": int(ACTIVATION_BUDGET),
                   "budget_share": lab04.ACTIVATION_BUDGET_SHARE, "batch_size": S.batch_size, "image_size": SIDE,
                   "plain_activation_bytes": int(PLAIN.activations(S.batch_size)),
                   "activation_bytes": int(CHOICE_ACTIVATIONS), "recompute_flops": int(CHOICE_FLOPS),
                   "stage_saving_bytes": {name: int(saving) for name, saving in stage_rows},
                   "stage_forward_flops": {name: int(n) for name, n in STAGE_FLOPS.items()}},
}, config=BASELINE)
print(f"saved {path}")

# %% [markdown]
# ## Closing note: what this lab costs to run
#
# The cell below prints how long this notebook took, top to bottom, on the machine in front of you
# and in the mode it ran in. The kit quotes no fixed time for a lab: it depends on your cores, your
# device and whatever else runs beside it (noise only ever adds time). `make lab LAB=lab04_memory MODE=laptop`
# runs and times it the same way from a terminal.

# %%
print(common.elapsed_statement(LAB))
