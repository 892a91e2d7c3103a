# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 1 — Measure first
#
# **On Colab:** upload `perflab-student.zip` in the Files pane and first run the install cell of the kit's
# README (*On Colab*), ending in `%cd /content/perflab-student/labs/lab01_measure`; Colab's own torch stays.
#
# Before you make training faster, find out where its time and memory go. A guess is almost always
# wrong: the convolution you were sure of may take a tenth of the step while JPEG decoding takes half.
# In this lab you build the measuring instruments yourself and point each one at the ResNet-18
# training loop of `perflab.workload`:
#
# | part | instrument | you write | points |
# | --- | --- | --- | --- |
# | 1 | a timer: warm-up, sync, median and tails | `time_callable` | 10 <!-- time_callable_visible time_callable_hidden --> |
# | 2 | FLOPs and parameters by closed form, checked against `FlopCounterMode` | `conv2d_flops`, `linear_flops`, `conv2d_params`, `linear_params`, `model_forward_flops` | 12 <!-- counting_visible counting_hidden_layers counting_hidden_model --> |
# | 3 | the memory budget of a training step | `training_memory_budget` | 8 <!-- memory_budget_visible memory_budget_hidden --> |
# | 4 | cProfile + pstats on the training loop | (you read it) | — |
# | 5 | line_profiler on the data pipeline | (you read it) | — |
# | 6 | a memory profiler on a leaking preprocessing step | `find_leak`, `preprocess_fixed` | 10 <!-- find_leak_visible find_leak_hidden preprocess_fixed_check --> |
# | 7 | torch.profiler with a schedule, phase labels and a trace | `profile_training` | 8 <!-- profile_training_visible profile_training_hidden --> |
# | 8 | the roofline | `conv2d_bytes`, `roofline_verdict` | 7 <!-- roofline_visible roofline_hidden --> |
# | 9 | the verdict: data or model, compute or memory | `bottleneck_verdict` | 10 <!-- bottleneck_visible bottleneck_rule_hidden bottleneck_here --> |
# | 10 | the mystery pipeline: find its planted bottlenecks, fix them, read its trace | `DIAGNOSIS`, a fixed copy, `TRACE_ANSWERS` | 18 <!-- mystery_trace mystery_diagnosis mystery_fix --> |
# | — | written analysis (graded by hand) | three answers | 17 <!-- answer_timing answer_profilers answer_bottleneck --> |
#
# **The contract.** Every function you write is specified in one place, the docstring of
# `perflab/labs/lab01/__init__.py`: its signature, what goes in, what must come out. The visible tests below
# call that module's checks with your functions, so you can read what they check; the hidden ones,
# which run when your notebook is graded, hold your functions to the same contract on random inputs.
#
# **Modes.** The notebook sizes its work by `perflab.env.run_mode()`: `laptop` on a CPU or Apple GPU
# (small data, 64-pixel images; the whole lab runs in a few minutes on 2 cores), `full` on an NVIDIA
# GPU, `grade` when the autograder runs it. Your verdict in part 9 is checked against the grader's
# *own* measurement on the grading machine, so reason from what you measure, not from what you expect.
#
# **How long.** On the reference machine (2 AMD EPYC cores, no GPU), for instance, this notebook ran
# top to bottom in laptop mode in 64 s, one lab at a time on a quiet machine. Its last cell prints how
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
import cProfile
import inspect
import io
import math
import pathlib
import pstats
import time
import tracemalloc

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, record_function

from perflab import counting, dataset, env, memory, mystery, phases, roofline, timing, workload
from perflab.labs import common, lab01
from perflab.labs.lab01 import checks as lab01_checks
from perflab.labs.lab01 import mystery as lab01_mystery
from perflab.labs.lab01 import FakeDevice

common.setup_notebook()
LAB = lab01.LAB
SIZES = common.sizes()
CONFIG = lab01.lab_config()
DEVICE = env.pick_device(CONFIG.device)
SMALL_RUN = SIZES.mode in ("tiny", "grade")  # the kit's own tests and the autograder: fewer repeats
if not dataset.is_built(SIZES.data):
    print(f"building the {SIZES.data} data set (once)...")
    dataset.build(SIZES.data)
torch.manual_seed(0)
RESULTS: dict = {}
print(common.hardware_statement(LAB))


# %% [markdown]
# ## Part 1 — A timer you can trust
#
# Timing one call with two clock readings gives a number, not a measurement. Four things go wrong:
#
# 1. **Warm-up.** The first calls pay one-off costs: lazy initialisation, the allocator growing its
#    pools, cold caches, cuDNN choosing algorithms. Call the function a few times *untimed* first.
# 2. **Asynchrony.** On a GPU, `fn()` only *queues* work and returns at once; the clock must be read
#    after `torch.cuda.synchronize()` (or `torch.mps.synchronize()`), or you time the queueing. Sync
#    once after the warm-up too, or the first timed call pays for queued warm-up work.
# 3. **Noise.** Other programs, frequency scaling and the garbage collector add time, never remove it.
#    Report the **median** (robust to a few slow calls), not the mean.
# 4. **Tails.** A training step that is usually 50 ms but sometimes 200 ms hurts; report the **p95** and
#    **p99**, and the **spread** (interquartile range over the median) so a reader sees how noisy the
#    machine was. `torch.utils.benchmark` warns when the spread passes 10%.
#
# Write `time_callable` (contract: `perflab/labs/lab01/__init__.py`). Take `clock` and `sync` as arguments
# rather than calling `time.perf_counter` and `torch.cuda.synchronize` directly: that makes your timer
# testable with a *fake* device whose clock and queue we control exactly (`FakeDevice` below), and
# usable on any device.

# %% nbgrader={"grade": false, "grade_id": "time_callable", "locked": false, "schema_version": 3, "solution": true, "task": false}
def time_callable(fn, warmup=3, repeats=20, clock=time.perf_counter, sync=None):
    """Time `repeats` calls of `fn()` after `warmup` untimed ones; see the contract for the result."""
    ### BEGIN SOLUTION
    if warmup < 0:
        raise ValueError(f"warmup: must be 0 or more calls, got {warmup}")
    if repeats < 1:
        raise ValueError(f"repeats: must be at least 1, got {repeats}")
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()  # nothing queued by the warm-up may leak into the first timed call
    samples = []
    for _ in range(repeats):
        start = clock()
        fn()
        if sync is not None:
            sync()
        samples.append(clock() - start)
    p25, median, p75, p95, p99 = np.percentile(samples, [25, 50, 75, 95, 99])
    spread = (p75 - p25) / median if median > 0 else 0.0
    return {"samples": samples, "median": float(median), "p95": float(p95), "p99": float(p99),
            "spread": float(spread)}
    ### END SOLUTION


# %% [markdown]
# The fake device: each call of `fn` spends `launch` seconds on the host and queues its duration of
# device work; `dev.sync()` waits for the queue. A timer that forgets to sync sees only the launches.

# %% nbgrader={"grade": true, "grade_id": "time_callable_visible", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
dev = FakeDevice(launch=1e-6)
durations = [0.5, 0.4] + [0.010, 0.011, 0.012, 0.013, 0.100]  # two warm-up calls, then five timed
result = time_callable(dev.work(durations), warmup=2, repeats=5, clock=dev.clock, sync=dev.sync)
assert dev.calls == 7, "fn must be called warmup + repeats times"
assert np.allclose(result["samples"], [1e-6 + d for d in durations[2:]]), result["samples"]
assert math.isclose(result["median"], 0.012 + 1e-6)
assert math.isclose(result["p95"], np.percentile(np.array(durations[2:]) + 1e-6, 95))
assert math.isclose(result["spread"], (0.013 - 0.011) / 0.012001, rel_tol=1e-6)
print("visible tests passed:", {k: round(v, 6) for k, v in result.items() if k != "samples"})

# %% nbgrader={"grade": true, "grade_id": "time_callable_hidden", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random warm-ups, repeats and durations on the fake device, and bad arguments.
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("time_callable_hidden", globals())
### END HIDDEN TESTS

# %% [markdown]
# Now point it at something real: a forward pass of ResNet-18 on one batch, **without** warm-up, so
# you can see what warm-up protects you from. Each dot is one call, in call order.

# %%
model = workload.build_model(CONFIG, num_classes=10).eval()
batch = torch.randn(CONFIG.batch_size, 3, CONFIG.image_size, CONFIG.image_size, device=DEVICE)


def forward():
    with torch.no_grad():
        model(batch)


cold = time_callable(forward, warmup=0, repeats=8 if SMALL_RUN else 25,
                     sync=lambda: env.synchronize(DEVICE))
fig, ax = plt.subplots(figsize=(7, 3), layout="constrained")
ax.plot(np.array(cold["samples"]) * 1e3, "o-", markersize=4)
ax.axhline(cold["median"] * 1e3, color="0.5", linestyle="--", label=f"median {cold['median'] * 1e3:.1f} ms")
ax.axhline(cold["p95"] * 1e3, color="tab:red", linestyle=":", label=f"p95 {cold['p95'] * 1e3:.1f} ms")
ax.set(xlabel="call", ylabel="ms", title=f"{CONFIG.model} forward, batch {CONFIG.batch_size}, no warm-up")
ax.legend()
plt.show()
print(f"spread (IQR / median): {cold['spread']:.1%}")

# %% [markdown]
# Compare with `perflab.timing.benchmark`, the kit's reference timer (same idea, plus a bootstrap
# confidence interval of the median and warnings in words). It keeps the raw samples and derives every
# statistic from them, so the numbers can never disagree with each other.

# %%
reference = timing.benchmark(forward, warmup=3, repeats=5 if SMALL_RUN else 20, device=DEVICE,
                             label=f"{CONFIG.model} forward")
print(reference)
RESULTS["baseline"] = {"step_time": reference.as_stat()}


# %% [markdown]
# **Question (5 points).** From *your* plot and numbers: how many calls did warm-up take on this
# machine, and how much slower was the first call than the median? How far is p95 from the median,
# and what in your machine's state explains the gap? Given that, why does a speedup measured from a
# single call before and after a change mean little?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_timing", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# Rubric (depends on the machine). A good answer reads the student's own plot: how many calls warm-up
# took and how much slower the first call was than the median (allocator growth, oneDNN choosing
# kernels, cold caches), and how far p95 sat above the median, explained by what steals cores (other
# processes, frequency changes). On the reference machine (2 cores), for instance, the first forward
# pass took several times the median, the second was already close, and p95 sat 10–30% above the
# median. The answer should say that noise only adds time, so the
# median and low quantiles are stable and the tails are not. A single call before and after a change
# compares two draws from these distributions: the warm-up of the first and a noisy tail can each be
# larger than the effect, so a claimed speedup needs many calls, a median, and a spread beside it.

# %% [markdown]
# ## Part 2 — Counting FLOPs and parameters
#
# A convolution with `C_in` input channels, `C_out` output channels, a `k_h × k_w` kernel and `groups`
# groups computes, for each of the `N · C_out · H_out · W_out` output elements, a dot product of length
# `(C_in / groups) · k_h · k_w`: that many multiply-adds, **2 FLOPs each** (the convention of
# `torch.utils.flop_counter.FlopCounterMode`, which also leaves bias additions out). The output side is
#
# $$H_{out} = \left\lfloor \frac{H + 2p_h - d_h (k_h - 1) - 1}{s_h} \right\rfloor + 1$$
#
# with padding `p`, dilation `d` and stride `s` (the same for the width). A linear layer on an input
# of shape `(..., in_features)` does `rows · in · out` multiply-adds, where `rows` is the product of
# the leading dimensions. Parameters: the weight tensor plus the bias if there is one.
#
# Write the five functions of the contract. `lab01.layer_calls(model, input_shape)` hands you every
# Conv2d and Linear call of a model with its input shape (forward hooks, as in `perflab.counting`).

# %% nbgrader={"grade": false, "grade_id": "counting", "locked": false, "schema_version": 3, "solution": true, "task": false}
def conv2d_flops(conv, input_shape):
    """Forward FLOPs of `conv` on an (N, C, H, W) input."""
    ### BEGIN SOLUTION
    n = input_shape[0]
    h_out, w_out = conv_output_hw(conv, input_shape)
    kh, kw = _pair(conv.kernel_size)
    return 2 * n * conv.out_channels * h_out * w_out * (conv.in_channels // conv.groups) * kh * kw
    ### END SOLUTION


def linear_flops(linear, input_shape):
    """Forward FLOPs of `linear` on an input of shape (..., in_features)."""
    ### BEGIN SOLUTION
    return 2 * math.prod(input_shape[:-1]) * linear.in_features * linear.out_features
    ### END SOLUTION


def conv2d_params(conv):
    """Weights plus bias of `conv`, by formula."""
    ### BEGIN SOLUTION
    kh, kw = _pair(conv.kernel_size)
    weights = conv.out_channels * (conv.in_channels // conv.groups) * kh * kw
    return weights + (conv.out_channels if conv.bias is not None else 0)
    ### END SOLUTION


def linear_params(linear):
    """Weights plus bias of `linear`, by formula."""
    ### BEGIN SOLUTION
    return linear.in_features * linear.out_features + (linear.out_features if linear.bias is not None else 0)
    ### END SOLUTION


def model_forward_flops(model, input_shape):
    """Forward FLOPs of every Conv2d and Linear call of `model` at `input_shape`, summed."""
    ### BEGIN SOLUTION
    total = 0
    for call in lab01.layer_calls(model, input_shape):
        if isinstance(call.module, nn.Conv2d):
            total += conv2d_flops(call.module, call.input_shape)
        else:
            total += linear_flops(call.module, call.input_shape)
    return total
    ### END SOLUTION


def conv_output_hw(conv, input_shape):
    """(H_out, W_out) of `conv` on an (N, C, H, W) input (a helper for the functions above)."""
    ### BEGIN SOLUTION
    _, _, h, w = input_shape
    (kh, kw), (sh, sw) = _pair(conv.kernel_size), _pair(conv.stride)
    (ph, pw), (dh, dw) = _pair(conv.padding), _pair(conv.dilation)
    return (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    ### END SOLUTION


def _pair(value):
    """nn.Conv2d stores kernel_size, stride, padding and dilation as pairs; accept an int too."""
    return (value, value) if isinstance(value, int) else tuple(value)


# %% nbgrader={"grade": true, "grade_id": "counting_visible", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
stem = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)  # ResNet-18's first layer
assert conv2d_flops(stem, (1, 3, 224, 224)) == 2 * 64 * 112 * 112 * 3 * 7 * 7 == 236_027_904
assert conv2d_params(stem) == 64 * 3 * 7 * 7
fc = nn.Linear(512, 1000)
assert linear_flops(fc, (8, 512)) == 2 * 8 * 512 * 1000
assert linear_params(fc) == 512 * 1000 + 1000
resnet = workload.build_model(workload.TrainConfig(device="cpu", model="resnet18"), num_classes=1000)
assert model_forward_flops(resnet, (1, 3, 224, 224)) == 3_628_146_688  # 1.81 G multiply-adds
print("visible tests passed")

# %% nbgrader={"grade": true, "grade_id": "counting_hidden_layers", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random convolutions (strides, padding, dilation, groups, bias) and linear layers,
# each compared with what FlopCounterMode counts; parameter counts against the real tensors.
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("counting_hidden_layers", globals())
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "counting_hidden_model", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: ResNet-18 with a random number of classes at a random input size, and a small CNN.
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("counting_hidden_model", globals())
### END HIDDEN TESTS

# %% [markdown]
# Where do the FLOPs and the parameters of the course's model (ResNet-18 unless your course names another)
# live? Count them per stage (the model's top-level parts that hold parameters) at this lab's image size,
# and count the backward pass too (with `perflab.counting.count_flops`, which runs `FlopCounterMode` over
# forward and backward).

# %%
shape = (CONFIG.batch_size, 3, CONFIG.image_size, CONFIG.image_size)
net = workload.build_model(CONFIG, num_classes=10)
stages = [name for name, part in net.named_children() if any(True for _ in part.parameters())]
flops_by_stage = dict.fromkeys(stages, 0)
for call in lab01.layer_calls(net, shape):
    stage = call.name.split(".")[0]
    if isinstance(call.module, nn.Conv2d):
        flops_by_stage[stage] += conv2d_flops(call.module, call.input_shape)
    else:
        flops_by_stage[stage] += linear_flops(call.module, call.input_shape)
params_by_stage = {s: sum(p.numel() for p in getattr(net, s).parameters()) for s in stages}
counted = counting.count_flops(net, torch.zeros(shape, device=DEVICE), backward=True)
assert sum(flops_by_stage.values()) == counted.forward
print(f"forward {counted.forward / 1e9:.2f} GFLOP, forward+backward {counted.train / 1e9:.2f} GFLOP "
      f"(backward / forward = {counted.backward / counted.forward:.2f}); "
      f"{counting.count_parameters(net) / 1e6:.2f} M parameters")
fig, ax = plt.subplots(figsize=(7, 3), layout="constrained")
x = np.arange(len(stages))
ax.bar(x - 0.2, [flops_by_stage[s] / counted.forward for s in stages], 0.4, label="share of FLOPs")
ax.bar(x + 0.2, [params_by_stage[s] / sum(params_by_stage.values()) for s in stages], 0.4,
       label="share of parameters (conv + BN + fc)")
ax.set_xticks(x, stages)
ax.set(ylabel="share", title=f"{CONFIG.model}: FLOPs and parameters by stage")
ax.legend()
plt.show()
RESULTS["counts"] = {"parameters": counting.count_parameters(net), "flops_forward": counted.forward,
                     "flops_train": counted.train}

# %% [markdown]
# The backward pass costs about twice the forward: for each layer it computes the gradient with
# respect to the input *and* with respect to the weights, each as large a product as the forward.
# (The first convolution needs no input gradient, which is why the ratio is a little under 2.)

# %% [markdown]
# ## Part 3 — The memory budget of a training step
#
# A training step holds four kinds of memory:
#
# * **parameters** — every weight (4 bytes each in fp32);
# * **gradients** — one per trainable parameter, the same size again;
# * **optimizer state** — plain SGD keeps nothing, SGD with momentum one buffer per parameter, Adam two
#   (its running mean and variance of the gradient);
# * **activations** — what the forward pass saves for backward (a convolution keeps its input, a ReLU
#   its output, a BatchNorm its normalised input and statistics). This is the part that grows with the
#   batch size.
#
# Count activations by what autograd actually saves: `torch.autograd.graph.saved_tensors_hooks(pack,
# unpack)` calls `pack(tensor)` for every tensor saved for backward. Several saved tensors can share
# one storage (views, a tensor saved by two ops), so count each storage once
# (`t.untyped_storage().data_ptr()`, `.nbytes()`), and leave parameters out (a convolution saves its
# weight too, but that is already counted). BatchNorm updates its running statistics in a forward pass
# in train mode; put them back afterwards so measuring leaves no trace.

# %% nbgrader={"grade": false, "grade_id": "memory_budget", "locked": false, "schema_version": 3, "solution": true, "task": false}
OPTIMIZER_BUFFERS = {"sgd": 0, "sgd-momentum": 1, "adam": 2}


def training_memory_budget(model, optimizer, input_shape):
    """Bytes of parameters, gradients, optimizer state and saved activations for one training step."""
    ### BEGIN SOLUTION
    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    grad_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    buffers = {name: b.clone() for name, b in model.named_buffers()}
    model.train()
    x = torch.randn(tuple(input_shape), device=params[0].device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    activations = sum(n for ptr, n in saved.items() if ptr not in param_storages)
    return {"parameters": param_bytes, "gradients": grad_bytes,
            "optimizer": OPTIMIZER_BUFFERS[optimizer] * grad_bytes, "activations": activations}
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "memory_budget_visible", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
tiny_net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 2))
budget = training_memory_budget(tiny_net, "adam", (2, 3, 4, 4))
n_params = (8 * 3 * 9 + 8) + (128 * 2 + 2)
assert budget["parameters"] == budget["gradients"] == 4 * n_params, budget
assert budget["optimizer"] == 2 * 4 * n_params, budget
# input (2*3*4*4) saved by the conv, ReLU output (2*8*4*4) saved by ReLU and (as a view) by the linear layer
assert budget["activations"] == 4 * (2 * 3 * 4 * 4 + 2 * 8 * 4 * 4), budget
print("visible tests passed:", budget)

# %% nbgrader={"grade": true, "grade_id": "memory_budget_hidden", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random CNNs with BatchNorm and frozen layers, SGD, SGD with momentum and Adam,
# against perflab.memory's measurement (the optimizer state from a real step).
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("memory_budget_hidden", globals())
### END HIDDEN TESTS

# %% [markdown]
# The budget of *this* lab's training step, for both optimizers, and how activations grow with the
# batch (static memory does not).

# %%
net = workload.build_model(CONFIG, num_classes=10)
shape = (CONFIG.batch_size, 3, CONFIG.image_size, CONFIG.image_size)
budgets = {name: training_memory_budget(net, name, shape) for name in ("sgd-momentum", "adam")}
batches = [2, 4, 8] if SMALL_RUN else [2, 8, 16, 32, 64]  # BatchNorm needs 2 samples in train mode
activations = [training_memory_budget(net, "sgd", (b, *shape[1:]))["activations"] for b in batches]
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2), layout="constrained")
bottom = np.zeros(len(budgets))
for part in ("parameters", "gradients", "optimizer", "activations"):
    values = np.array([b[part] for b in budgets.values()]) / 2**20
    left.bar(list(budgets), values, bottom=bottom, label=part)
    bottom += values
left.set(ylabel="MiB", title=f"one step, batch {CONFIG.batch_size}, {CONFIG.image_size} px")
left.legend(fontsize=8)
right.plot(batches, np.array(activations) / 2**20, "o-", label="activations")
static = budgets["sgd-momentum"]
right.axhline((static["parameters"] + static["gradients"] + static["optimizer"]) / 2**20, color="0.5",
              linestyle="--", label="static (SGD with momentum)")
right.set(xlabel="batch size", ylabel="MiB", title="activations grow with the batch")
right.legend(fontsize=8)
plt.show()
RESULTS["memory_budget"] = budgets["sgd-momentum"]
for name, b in budgets.items():
    print(name, {k: memory.format_bytes(v) for k, v in b.items()})

# %% [markdown]
# ## Part 4 — cProfile: which Python functions take the time
#
# `cProfile` records every Python function call (and every call into C that Python makes) with two
# times: **tottime**, spent in the function itself, and **cumtime**, spent in it *and everything it
# called*. Sorting by cumulative time reads a program top-down: the training loop at the top, then
# whatever part of it costs most. It is deterministic (it sees every call) and therefore slows Python
# code down; time spent inside one C call (a convolution) is not inflated.
#
# `pstats.Stats(profiler)` reads a profile; `.sort_stats("cumulative").print_stats(n)` prints its top
# `n` functions, and `.stats` maps each function key `(filename, line, name)` to
# `(primitive calls, total calls, tottime, cumtime, callers)` when you want the numbers themselves.
# You will point this instrument, and the next three, at a pipeline nobody has diagnosed for you in
# part 10.

# %% [markdown]
# Profile the baseline training loop (`perflab.workload.train`) for a few steps and read the top of
# the table. Look for three things: the loop itself, the data loader (`__next__`, `__getitem__`,
# PIL's `decode`, the transforms) and the model (`_call_impl`, `conv2d`, `backward`).

# %%
profiler = cProfile.Profile()
profiler.runcall(workload.train, CONFIG, min(SIZES.steps, 8))
train_stats = pstats.Stats(profiler)
top = sorted(train_stats.stats.items(), key=lambda item: item[1][3], reverse=True)[:25]
print(f"{'cumtime s':>10} {'tottime s':>10} {'calls':>7}  function")
for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in top:
    where = f"{filename.split('site-packages/')[-1]}:{line}" if line else filename
    print(f"{cumtime:>10.3f} {tottime:>10.3f} {calls:>7}  {name}  ({where})")

# %% [markdown]
# ## Part 5 — line_profiler: which line of the data pipeline
#
# cProfile says *which function*; `line_profiler` says *which line*, for the functions you hand it. Here
# is one sample of the data pipeline written out step by step — read the file, decode the JPEG, crop,
# flip, jitter the colours, convert, normalise — the same steps `perflab.dataset.train_transform` runs.

# %%
from line_profiler import LineProfiler
from PIL import Image
from torchvision.transforms import v2

crop = v2.RandomResizedCrop(CONFIG.image_size, scale=(0.6, 1.0), antialias=True)
flip = v2.RandomHorizontalFlip()
jitter = v2.ColorJitter(0.2, 0.2, 0.2)
normalise = v2.Normalize(dataset.MEAN, dataset.STD)


def load_sample(path):
    with open(path, "rb") as f:
        data = f.read()
    image = Image.open(io.BytesIO(data)).convert("RGB")
    x = v2.functional.to_image(image)
    x = crop(x)
    x = flip(x)
    x = jitter(x)
    x = v2.functional.to_dtype(x, torch.float32, scale=True)
    return normalise(x)


paths = [path for path, _ in dataset.load(SIZES.data, CONFIG.image_size).samples]
lprof = LineProfiler()
profiled = lprof(load_sample)
for path in common.progress(paths[: 24 if SMALL_RUN else 300], desc="line_profiler"):
    profiled(path)
pipeline_stats = lprof.get_stats()
lprof.print_stats(stream=None, output_unit=1e-3)

# %% [markdown]
# `get_stats()` returns a `LineStats` whose `timings` map each profiled function's key
# `(filename, first line, name)` to a list of `(line number, hits, time)`, time in units of
# `stats.unit` seconds: the slowest line of the pipeline, read off it.

# %%
code = load_sample.__code__
timings = pipeline_stats.timings[(code.co_filename, code.co_firstlineno, code.co_name)]
lineno, hits, t = max(timings, key=lambda row: row[2])
source = inspect.getsource(load_sample).splitlines()
print(f"slowest line: {source[lineno - code.co_firstlineno].strip()!r}: "
      f"{t / sum(row[2] for row in timings):.0%} of the pipeline, {t * pipeline_stats.unit / hits * 1e3:.2f} ms per call")

# %% [markdown]
# ## Part 6 — A memory profiler on a leaking preprocessing step
#
# `lab01.preprocess_leaky` turns a uint8 batch into a normalised float tensor. Call it in a loop and
# memory climbs. Here is its source:

# %%
print(inspect.getsource(lab01.preprocess_leaky))
lab01.reset_leak()
tracemalloc.start()
before = tracemalloc.take_snapshot()
growth = []
for i in range(30):
    lab01.preprocess_leaky(lab01.random_batch(i, n=8, size=32))
    growth.append(tracemalloc.get_traced_memory()[0] / 2**20)
after = tracemalloc.take_snapshot()
tracemalloc.stop()
for stat in after.compare_to(before, "lineno")[:3]:
    print(stat)
lab01.reset_leak()
fig, ax = plt.subplots(figsize=(6, 2.8), layout="constrained")
ax.plot(growth, "o-", markersize=3)
ax.set(xlabel="call", ylabel="traced MiB", title="preprocess_leaky: memory only goes up")
plt.show()


# %% [markdown]
# `tracemalloc` records where every Python-level allocation was made. Two snapshots, before and after
# some calls, compared by line (`after.compare_to(before, "lineno")`), list the lines whose live
# allocations grew, biggest first. Note what it names: the line that *allocated* the memory that is
# still alive, which is not always the line that *keeps* it alive — read the code around it.
#
# Write `find_leak`: call `fn(make_input())` once first (so one-off allocations such as caches of
# constants are made before the first snapshot), then snapshot, call it `calls` times, snapshot, and
# return the file and line of the biggest growth. Then write `preprocess_fixed`: the same result,
# nothing kept.

# %% nbgrader={"grade": false, "grade_id": "find_leak", "locked": false, "schema_version": 3, "solution": true, "task": false}
def find_leak(fn, make_input, calls=50):
    """(filename, lineno) of the line whose allocations grow most over `calls` calls of fn(make_input())."""
    ### BEGIN SOLUTION
    fn(make_input())
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(calls):
            fn(make_input())
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    frame = after.compare_to(before, "lineno")[0].traceback[0]
    return frame.filename, frame.lineno
    ### END SOLUTION


def preprocess_fixed(batch):
    """What lab01.preprocess_leaky returns, without keeping anything between calls."""
    ### BEGIN SOLUTION
    if batch.dtype != np.uint8 or batch.ndim != 4 or batch.shape[-1] != 3:
        raise ValueError(f"batch: expected uint8 (N, H, W, 3), got {batch.dtype} {batch.shape}")
    scaled = batch.astype(np.float32) / 255.0
    normalised = (scaled - lab01.MEAN.reshape(1, 1, 1, 3)) / lab01.STD.reshape(1, 1, 1, 3)
    return torch.from_numpy(np.ascontiguousarray(normalised.transpose(0, 3, 1, 2)))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "find_leak_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
filename, lineno = find_leak(lab01.preprocess_leaky, lambda: lab01.random_batch(0, n=4, size=16), calls=20)
lab01.reset_leak()
leak_source, leak_first = inspect.getsourcelines(lab01.preprocess_leaky)
assert filename == inspect.getsourcefile(lab01.preprocess_leaky), filename
assert leak_first <= lineno < leak_first + len(leak_source), lineno
print(f"the leak allocates at line {lineno}: {leak_source[lineno - leak_first].strip()!r}")

# %% nbgrader={"grade": true, "grade_id": "find_leak_hidden", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: functions you have not seen, each keeping what one of its lines allocates.
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("find_leak_hidden", globals())
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "preprocess_fixed_check", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Same values as preprocess_leaky on several batches; neither traced memory nor the process's resident
# set grows over repeated calls.
lab01_checks.check_preprocess_fixed(preprocess_fixed, seed=607)
print("preprocess_fixed keeps nothing")

# %% [markdown]
# **What tracemalloc cannot see.** tracemalloc hooks Python's own allocator (`PyMem_*`/`PyObject_*`);
# NumPy reports its data buffers to it explicitly, which is why the leak above showed up. PyTorch does
# not: a tensor's storage comes from PyTorch's C++ allocator (`c10`'s CPU allocator, or the CUDA caching
# allocator on a GPU), which calls `malloc`/`posix_memalign` directly and never tells tracemalloc. A
# 64 MiB tensor is invisible to it; the process's resident set (RSS) and a *native* memory profiler see
# it. `memray` intercepts `malloc` itself, so it does.

# %%
import psutil

process = psutil.Process()
tracemalloc.start()
rss_before, traced_before = process.memory_info().rss, tracemalloc.get_traced_memory()[0]
big_tensor = torch.ones(64 * 2**20 // 4)
big_array = np.ones(16 * 2**20 // 8)
traced = tracemalloc.get_traced_memory()[0] - traced_before
rss = process.memory_info().rss - rss_before
tracemalloc.stop()
print(f"allocated 64 MiB tensor + 16 MiB array: tracemalloc saw {traced / 2**20:.1f} MiB, "
      f"the resident set grew {rss / 2**20:.1f} MiB")
del big_tensor, big_array

try:
    import memray
except ImportError:  # memray builds on Linux and macOS only
    memray = None
if memray is not None:
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        capture = pathlib.Path(tmp) / "capture.bin"
        with memray.Tracker(capture):
            big_tensor = torch.ones(64 * 2**20 // 4)
            del big_tensor
        peak = memray.FileReader(capture).metadata.peak_memory
    print(f"memray saw a peak of {peak / 2**20:.1f} MiB in the same allocation")
else:
    print("memray is not available here; on Linux or macOS `pip install memray` and see its peak")


# %% [markdown]
# ## Part 7 — torch.profiler: operators, phases and a trace
#
# cProfile stops at the boundary of PyTorch's C++ code; `torch.profiler` starts there. It records every
# operator (`aten::convolution`, `aten::addmm`, ...) with its CPU time, and on a GPU every kernel with
# its device time. Three habits make its output readable:
#
# * a **schedule** — `torch.profiler.schedule(wait=1, warmup=1, active=N)` skips one step, runs the
#   profiler for one step without keeping it (its own start-up cost), then records `N` steps; call
#   `prof.step()` at the end of every training step;
# * **labels** — `with record_function("forward"):` names a region, so the trace shows the phases of
#   each step (`data`, `h2d`, `forward`, `backward`, `optimizer`) above the operators inside them;
# * a **trace** — `prof.export_chrome_trace(path)` writes JSON that https://ui.perfetto.dev (or
#   `chrome://tracing`) draws as a timeline. Export it in `on_trace_ready`, which runs when the
#   recorded steps end.
#
# Write `profile_training`: build the workload with `workload.build(config)`, then write the loop
# yourself (it is short: `images, labels, index = work.next_batch()` (three tensors: the batch, its
# labels and the samples' positions in the data set), copy to `work.device`, forward with
# `nn.functional.cross_entropy`, backward, `work.optimizer.step()` and `zero_grad`), each phase in its
# label. Sync the device before `prof.step()`. Call `work.close()` at the end.

# %% nbgrader={"grade": false, "grade_id": "profile_training", "locked": false, "schema_version": 3, "solution": true, "task": false}
def profile_training(config, active_steps, trace_path):
    """torch.profiler over wait + warmup + active training steps with phase labels; trace exported."""
    ### BEGIN SOLUTION
    work = workload.build(config)
    activities = [ProfilerActivity.CPU]
    if work.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=active_steps, repeat=1)

    def export(prof):
        prof.export_chrome_trace(str(trace_path))

    try:
        with torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=export) as prof:
            for _ in range(2 + active_steps):
                with record_function("data"):
                    images, labels, _ = work.next_batch()
                with record_function("h2d"):
                    images, labels = images.to(work.device), labels.to(work.device)
                with record_function("forward"):
                    loss = nn.functional.cross_entropy(work.model(images), labels)
                with record_function("backward"):
                    loss.backward()
                with record_function("optimizer"):
                    work.optimizer.step()
                    work.optimizer.zero_grad(set_to_none=True)
                env.synchronize(work.device)
                prof.step()
    finally:
        work.close()
    return prof
    ### END SOLUTION


# %%
TRACE = common.results_path(LAB).with_suffix(".trace.json")
TRACE.parent.mkdir(parents=True, exist_ok=True)
ACTIVE = 2 if SMALL_RUN else 5
prof = profile_training(CONFIG, ACTIVE, TRACE)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
print(f"trace written to {TRACE}: open it in https://ui.perfetto.dev")

# %% nbgrader={"grade": true, "grade_id": "profile_training_visible", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
label_counts = lab01_checks.check_trace(TRACE, ACTIVE)
print("visible tests passed; label events in the trace:", label_counts)

# %% nbgrader={"grade": true, "grade_id": "profile_training_hidden", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: your profile_training on the grading machine with a random number of active steps.
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("profile_training_hidden", globals())
### END HIDDEN TESTS

# %% [markdown]
# How much of each step did each phase take, by the profiler's own clock? And which operators cost most
# inside the forward and backward labels? (`perflab.tracing` does the same walk over the event tree that
# you could do with `prof.events()`.)

# %%
phase_time = {label: 0.0 for label in lab01.PHASE_LABELS}
for event in prof.events():
    if event.name in phase_time:
        phase_time[event.name] += event.cpu_time_total / 1e6 / ACTIVE
ops = sorted((a for a in prof.key_averages() if a.key.startswith("aten::")),
             key=lambda a: a.self_cpu_time_total, reverse=True)[:10]
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.2), layout="constrained")
left.barh(list(phase_time), [v * 1e3 for v in phase_time.values()])
left.set(xlabel="ms per step (profiler's clock)", title="phases")
right.barh([a.key for a in ops][::-1], [a.self_cpu_time_total / 1e3 / ACTIVE for a in ops][::-1])
right.set(xlabel="self CPU ms per step", title="top operators")
plt.show()
RESULTS["top_ops"] = [{"name": a.key, "self_time_s": a.self_cpu_time_total / 1e6 / ACTIVE,
                       "calls": a.count // ACTIVE} for a in ops]


# %% [markdown]
# **Question (6 points).** You have now looked at the same training loop through three instruments:
# cProfile (part 4), line_profiler (part 5) and torch.profiler (part 7). For each, name one thing it
# showed you that the other two could not, quoting your own numbers (the function, the line, the
# operator, and their share of the time). Which instrument would you reach for first next time, and why?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_profilers", "locked": false, "points": 6, "schema_version": 3, "solution": true, "task": false}
# Model answer (numbers from a 2-core laptop in laptop mode). cProfile put `train_step` at the top by
# cumulative time and split it between the loader (`DataLoader.__next__` → `ImageFolder.__getitem__`,
# about a third of the step with `num_workers=0`) and the model (`Module._call_impl`, `backward`); it
# alone shows the Python call structure, e.g. that the transforms are called once per sample.
# line_profiler showed *which line* of the pipeline costs: JPEG decode and `convert("RGB")` together
# with the random resized crop dominate, the normalisation is cheap — cProfile only saw one
# `__call__` for all transforms. torch.profiler saw inside PyTorch: `aten::mkldnn_convolution` and
# its backward take most of the model time, BatchNorm and ReLU a few percent, and the labels give the
# phases on one timeline (the data label as wide as the forward). First: torch.profiler with labels for
# the big picture (phases and ops at once), then cProfile or line_profiler inside the phase that wins.

# %% [markdown]
# ## Part 8 — The roofline
#
# A layer that does `F` FLOPs while moving `B` bytes between memory and the processor has **arithmetic
# intensity** `I = F / B`. A device with peak compute `P` (FLOP/s) and memory bandwidth `W` (bytes/s)
# can run it at most at `min(P, W · I)`: the roof. Below the **ridge point** `I* = P / W` the layer is
# **memory-bound** (more FLOPs per byte would help, faster arithmetic would not); above it,
# **compute-bound**.
#
# Traffic model (a lower bound, as in `perflab.roofline`): a layer reads its input and its weights
# (and bias) once and writes its output once. Write `conv2d_bytes` and `roofline_verdict`; the peaks
# of this device are measured by `perflab.roofline.measure_peaks` (a large matmul and a large copy, the
# best of several runs): what this software reaches here, usually below the spec sheet.

# %% nbgrader={"grade": false, "grade_id": "roofline", "locked": false, "schema_version": 3, "solution": true, "task": false}
def conv2d_bytes(conv, input_shape, bytes_per_element=4):
    """Bytes `conv` must move at least: input, weights (+ bias) and output, each element once."""
    ### BEGIN SOLUTION
    h_out, w_out = conv_output_hw(conv, input_shape)
    outputs = input_shape[0] * conv.out_channels * h_out * w_out
    return (math.prod(input_shape) + conv2d_params(conv) + outputs) * bytes_per_element
    ### END SOLUTION


def roofline_verdict(flops, bytes_moved, peak_flops, peak_bandwidth):
    """("compute-bound" | "memory-bound", attainable FLOP/s) of a layer on a device."""
    ### BEGIN SOLUTION
    intensity = flops / bytes_moved
    verdict = "compute-bound" if intensity >= peak_flops / peak_bandwidth else "memory-bound"
    return verdict, min(peak_flops, peak_bandwidth * intensity)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "roofline_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
assert conv2d_bytes(conv, (1, 64, 56, 56)) == 4 * (64 * 56 * 56 + 64 * 64 * 9 + 64 * 56 * 56)
assert roofline_verdict(1e9, 1e9, 1e12, 1e11) == ("memory-bound", 1e11)  # intensity 1 < ridge 10
assert roofline_verdict(1e11, 1e9, 1e12, 1e11) == ("compute-bound", 1e12)  # intensity 100 > ridge 10
print("visible tests passed")

# %% nbgrader={"grade": true, "grade_id": "roofline_hidden", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random convolutions at 2 and 4 bytes per element; random layers on random devices.
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("roofline_hidden", globals())
### END HIDDEN TESTS

# %% [markdown]
# Measure this device's peaks, place five chosen layers of ResNet-18 on its roof, and time each layer
# alone with your own timer to see how close to the roof it gets.

# %%
peaks = roofline.measure_peaks(DEVICE)
print(peaks)
net = workload.build_model(CONFIG, num_classes=10).eval()
chosen = {"conv1", "layer1.0.conv1", "layer2.0.downsample.0", "layer3.1.conv2", "layer4.1.conv2", "fc"}
points, rows = [], []
for call in lab01.layer_calls(net, (CONFIG.batch_size, 3, CONFIG.image_size, CONFIG.image_size)):
    if call.name not in chosen:
        continue
    if isinstance(call.module, nn.Conv2d):
        flops, nbytes = conv2d_flops(call.module, call.input_shape), conv2d_bytes(call.module, call.input_shape)
    else:
        flops = linear_flops(call.module, call.input_shape)
        nbytes = 4 * (math.prod(call.input_shape) + linear_params(call.module)
                      + math.prod(call.input_shape[:-1]) * call.module.out_features)
    verdict, attainable = roofline_verdict(flops, nbytes, peaks.peak_flops(), peaks.bandwidth)
    x = torch.randn(call.input_shape, device=DEVICE)

    def run_layer(module=call.module, x=x):
        with torch.no_grad():
            module(x)

    seconds = time_callable(run_layer, warmup=2, repeats=5 if SMALL_RUN else 20,
                            sync=lambda: env.synchronize(DEVICE))["median"]
    points.append(roofline.point(call.name, flops, nbytes, peaks, seconds=seconds))
    rows.append({"name": call.name, "flops": float(flops), "bytes": float(nbytes), "verdict": verdict})
if any(p.achieved > p.attainable for p in points):
    # A peak is the most this device was seen to do: a layer above the micro-benchmarks' roof means
    # its kernel beat them, so the roof goes up to it (and the verdicts are placed again).
    peaks, points = roofline.raised_to_fit(peaks, points)
    print(f"A layer ran above the micro-benchmarks' roof: the peak is raised to what it reached ({peaks.source}): "
          f"{peaks.peak_flops() / 1e9:.1f} GFLOP/s, {peaks.bandwidth / 1e9:.1f} GB/s")
for p, row in zip(points, rows, strict=True):
    row["verdict"], attainable = roofline_verdict(p.flops, p.bytes, peaks.peak_flops(), peaks.bandwidth)
    print(f"{p.name:<24} {p.intensity:7.1f} FLOP/B  {row['verdict']:<14} roof {attainable / 1e9:8.1f} "
          f"GFLOP/s, achieved {p.achieved / 1e9:7.1f} GFLOP/s ({p.achieved / attainable:.0%})")
roofline.plot_roofline(points, peaks)
plt.show()
RESULTS["roofline"] = {"peak_flops": peaks.peak_flops(), "peak_bandwidth": peaks.bandwidth, "layers": rows}


# %% [markdown]
# ## Part 9 — The verdict: what limits this training step?
#
# Put it together. Two questions, two measurements:
#
# * **Data or model?** `perflab.phases.measure_phases` times each phase of real training steps with the
#   device synchronised at phase edges. If the step waits for the loader (`data`) at least
#   `lab01.DATA_SHARE` of the time, or for the host-to-device copy (`h2d`) at least `lab01.COPY_SHARE`,
#   the **data** side limits training; otherwise the **model**.
# * **Compute or memory?** Give each conv and linear layer its roofline time, `flops / attainable`.
#   If the memory-bound layers hold at least `lab01.MEMORY_TIME_SHARE` of that time, the model is
#   **memory**-bound; otherwise **compute**-bound.
#
# These are the thresholds `perflab profile` uses (`perflab.diagnose`, where each one's reason is
# written). Write `bottleneck_verdict`. When graded, the autograder measures this training step on *its*
# machine and checks your function's verdict on its numbers against its own; near a threshold, where one
# run cannot decide, both answers count.

# %% nbgrader={"grade": false, "grade_id": "bottleneck_verdict", "locked": false, "schema_version": 3, "solution": true, "task": false}
def bottleneck_verdict(phase_seconds, layers, peak_flops, peak_bandwidth):
    """{"stage": "data" | "model", "bound": "compute" | "memory"} from phase times and layer costs."""
    ### BEGIN SOLUTION
    total = sum(phase_seconds.values())
    data = phase_seconds.get("data", 0.0) / total
    copy = phase_seconds.get("h2d", 0.0) / total
    stage = "data" if data >= lab01.DATA_SHARE or copy >= lab01.COPY_SHARE else "model"
    memory_time = all_time = 0.0
    for layer in layers:
        verdict, attainable = roofline_verdict(layer["flops"], layer["bytes"], peak_flops, peak_bandwidth)
        all_time += layer["flops"] / attainable
        if verdict == "memory-bound":
            memory_time += layer["flops"] / attainable
    bound = "memory" if all_time > 0 and memory_time / all_time >= lab01.MEMORY_TIME_SHARE else "compute"
    return {"stage": stage, "bound": bound}
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "bottleneck_visible", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
layers_demo = [{"flops": 1e9, "bytes": 1e7}, {"flops": 1e6, "bytes": 1e6}]  # intensity 100 and 1, ridge 10
starved = {"data": 0.6, "h2d": 0.0, "forward": 0.1, "backward": 0.2, "optimizer": 0.1}
busy = {"data": 0.05, "h2d": 0.0, "forward": 0.3, "backward": 0.55, "optimizer": 0.1}
assert bottleneck_verdict(starved, layers_demo, 1e11, 1e10) == {"stage": "data", "bound": "compute"}
assert bottleneck_verdict(busy, [{"flops": 1e6, "bytes": 1e6}], 1e11, 1e10) == {"stage": "model", "bound": "memory"}
print("visible tests passed")

# %% nbgrader={"grade": true, "grade_id": "bottleneck_rule_hidden", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random phase times and layers, away from the thresholds.
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("bottleneck_rule_hidden", globals())
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "bottleneck_here", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: the autograder measures this lab's training step on the grading machine and checks your
# verdict on its numbers against its own.
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("bottleneck_here", globals())
### END HIDDEN TESTS

# %% [markdown]
# Now measure your own machine and read the verdict.

# %%
breakdown = phases.measure_phases(CONFIG, steps=max(3, SIZES.steps // 2), warmup=1 if SMALL_RUN else 2)
print(breakdown.table())
net = workload.build_model(CONFIG, num_classes=10)
model_layers = []
for call in lab01.layer_calls(net, (CONFIG.batch_size, 3, CONFIG.image_size, CONFIG.image_size)):
    if isinstance(call.module, nn.Conv2d):
        model_layers.append({"flops": conv2d_flops(call.module, call.input_shape),
                             "bytes": conv2d_bytes(call.module, call.input_shape)})
    else:
        model_layers.append({"flops": linear_flops(call.module, call.input_shape),
                             "bytes": 4 * (math.prod(call.input_shape) + linear_params(call.module)
                                           + math.prod(call.input_shape[:-1]) * call.module.out_features)})
verdict = bottleneck_verdict(breakdown.seconds, model_layers, peaks.peak_flops(), peaks.bandwidth)
fig, ax = plt.subplots(figsize=(7, 1.8), layout="constrained")
left_edge = 0.0
for name in breakdown.seconds:
    ax.barh([0], [breakdown.share(name)], left=left_edge, label=f"{name} {breakdown.share(name):.0%}")
    left_edge += breakdown.share(name)
ax.axvline(lab01.DATA_SHARE, color="black", linestyle=":", linewidth=1)
ax.set(xlim=(0, 1), yticks=[], xlabel="share of the step", title=f"verdict: {verdict['stage']}, {verdict['bound']}-bound")
ax.legend(ncol=5, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.6))
plt.show()
RESULTS["phases"] = {"before": dict(breakdown.seconds)}
RESULTS["bottleneck"] = {"verdict": f"{verdict['stage']}, {verdict['bound']}-bound",
                         "reason": f"data {breakdown.share('data'):.0%} of the step, h2d {breakdown.share('h2d'):.0%}"}
print(verdict)

# %% [markdown]
# **Question (6 points).** State the bottleneck of this training step on your machine and argue it from
# your own measurements: the phase shares, the roofline of the layers (which ones are memory-bound, and
# how far below the roof the compute-bound ones run), and what the profilers showed. Then name the
# optimisation you would try first, what you expect it to change in these numbers, and on what hardware
# your verdict would flip.

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_bottleneck", "locked": false, "points": 6, "schema_version": 3, "solution": true, "task": false}
# Rubric. A good answer argues the verdict from the student's own numbers: the phase shares (data
# against the threshold), the roofline (which layers are memory-bound, how far below the roof the
# compute-bound convolutions run) and the profilers' top ops; names a first optimisation with the
# change it expects in those numbers; and names the hardware on which the verdict flips. On the
# reference machine (2 cores, laptop mode), for instance, data was about 15–25% of the step with
# `num_workers=0`, under the 30% threshold, and the 3×3 convolutions ran at 20–40% of the measured
# matmul peak (intensities of 50–200 FLOP/B against a ridge near 10 FLOP/B: compute-bound); the
# 1×1 downsample convolutions and the fc layer were memory-bound but held little of the time, and
# `mkldnn_convolution` and its backward dominated the self time. Overlapping the loader with the
# model (`num_workers=2`, lab 2) would remove the data share, leaving a compute-bound step; after
# that only cheaper arithmetic (bf16 on AMX CPUs, lab 3) helps. On a GPU the verdict flips: the model
# becomes far faster, the single-process JPEG pipeline does not, and the data share rises above half.

# %% [markdown]
# ## Part 10 — The mystery pipeline
#
# So far you pointed each instrument where we told you to. Real profiling is detective work: a
# training script is slow and nobody knows why. Below, the kit writes **your own** ResNet-18 training
# script, `mystery_pipeline.py`: it trains correctly, but two or three performance bugs have been
# planted in it, drawn for your student id (your neighbour's pipeline has other bugs, on other lines).
# Each is something real scripts carry, and each shows up in one of the instruments of this lab.
#
# Work as the course teaches, in four phases: the **baseline** (time a step), the **bottleneck type**
# (data, host-device sync, compute or memory), the **component** (which function), the **operation**
# (which line). Then fix a copy, and prove the fix. The contract (`perflab/labs/lab01/mystery.py`):
#
# * `TRACE_FILE` and `TRACE_ANSWERS`: numbers you read off your pipeline's torch.profiler trace — **4
#   points**. The grader parses the same file and checks each answer.
# * `DIAGNOSIS`: one dict per bug you found, with the `line` of `mystery_pipeline.py` where it is,
#   its `function`, its `kind` (`"data"`, `"sync"`, `"compute"` or `"memory"`), the `tool` that showed
#   it (one of `lab01_mystery.TOOLS`), the `evidence` (your numbers), the `fix`, and `saves`: what
#   fixing this bug **alone** saves of the planted step time, as you measured it. Write a copy with
#   only that fix and time it against the planted one: `lab01_mystery.saving(PIPELINE, copy)` gives
#   1 - t(copy) / t(planted), and `lab01_mystery.savings(PIPELINE, [copy, ...])` times several at once.
#   **8 points**, shared among the bugs that cost step time, a share per bug for the line and for the
#   type. The grader measures what each such bug costs its own copy of your pipeline, and counts a
#   finding's type only when its `saves` is a saving this notebook measured (what `saving` or `savings`
#   returned for a copy with that fix alone, or the mean or median of several, rounded as you like: a
#   number typed in earns the line's share only) and agrees with the grader's measurement (within a
#   factor of 2; where the grader's measurements of two bugs differ clearly, a tie orders neither,
#   nor does a reading clearly the other way round):
#   knowing where a bug is does not say what it costs. A
#   bug that only holds memory saves no step time to agree on, so no measurement can tell finding it
#   from reading it off the kit: report it and fix it all the same (a long run dies of it), but it
#   earns no share, and a finding at it costs nothing. A finding at a line with no bug costs as much as
#   a right one earns: report what your measurements show, not every line you suspect. Bugs differ in
#   what they cost, and a bug that costs little is still a finding: its measured saving says how little.
# * `FIXED_PIPELINE`: your fixed copy, written **by a cell of this notebook** (only the notebook is
#   submitted), and `FIX_SPEEDUP`, the speedup you measured — **6 points**. The grader re-measures your
#   copy against the planted pipeline in its own process: it must be faster, and train exactly as the
#   planted one does (the same losses on the same samples; a "fix" that changes the training is no fix).
#
# Your id: the grader draws your pipeline from the id it grades you under, whatever this notebook
# says. If the line below cannot find it (it reads `PERFLAB_STUDENT_ID`, set by the grader, then what
# you type into `MY_ID`, then your JupyterHub user name), type your course id into `MY_ID`.

# %%
MY_ID = ""  # your course id, as your instructor grades you
STUDENT_ID = mystery.student_id(MY_ID)
PIPELINE = lab01_mystery.write_pipeline(STUDENT_ID)
print(f"the mystery pipeline of {STUDENT_ID!r} is in {PIPELINE.resolve()}")
print(f"run it from a terminal too: python {PIPELINE.name} --steps 30")

# %% [markdown]
# **Phase 1, the baseline: read the trace.** Start with the big picture. The cell below profiles the
# *planted* pipeline with torch.profiler (a schedule, and the pipeline's own `data` / `forward` /
# `backward` / `optimizer` labels) and writes a Chrome trace. Open it in https://ui.perfetto.dev if you
# like, then read it with `json`: a trace is a list of events under `"traceEvents"`; a complete event
# (`"ph": "X"`) has a `name`, a start `ts` and a duration `dur`, both in microseconds. Answer in
# `TRACE_ANSWERS` — the grader parses the same file and checks each answer (4 points, an equal share
# per answer):
#
# * `step_ms`: the mean duration of a profiled step (the `ProfilerStep#N` events), in ms;
# * `data_share` and `backward_share`: the time inside the `data` and the `backward` labels, over the
#   total time of the profiled steps;
# * `top_backward`: the backward node with the most total time, from the events named
#   `autograd::engine::evaluate_function: <Node>` — give `<Node>`, e.g. `"AddmmBackward0"`.

# %%
TRACE_FILE = "mystery_trace.json"
trace_step = lab01_mystery.load_pipeline(PIPELINE).make_step(0)
with torch.profiler.profile(activities=[ProfilerActivity.CPU],
                            schedule=torch.profiler.schedule(wait=1, warmup=1, active=2 if SMALL_RUN else 4),
                            on_trace_ready=lambda p: p.export_chrome_trace(TRACE_FILE)) as prof:
    for _ in range(2 + (2 if SMALL_RUN else 4)):
        trace_step()
        prof.step()
print(f"trace written to {TRACE_FILE}")

# %% nbgrader={"grade": false, "grade_id": "mystery_trace_answers", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
import json as _json

events = [e for e in _json.loads(pathlib.Path(TRACE_FILE).read_text())["traceEvents"] if e.get("ph") == "X"]
step_durations = [e["dur"] for e in events if e["name"].startswith("ProfilerStep#")]
total = sum(step_durations)
label_time = {label: sum(e["dur"] for e in events if e["name"] == label) for label in ("data", "backward")}
node_time = {}
for e in events:
    if e["name"].startswith("autograd::engine::evaluate_function: "):
        node = e["name"].split(": ", 1)[1]
        node_time[node] = node_time.get(node, 0) + e["dur"]
TRACE_ANSWERS = {"step_ms": total / len(step_durations) / 1e3, "data_share": label_time["data"] / total,
                 "backward_share": label_time["backward"] / total, "top_backward": max(node_time, key=node_time.get)}
### END SOLUTION
print(TRACE_ANSWERS)

# %% nbgrader={"grade": true, "grade_id": "mystery_trace", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# Visible: the form of TRACE_ANSWERS. Hidden: each answer against the grader's parse of TRACE_FILE.
lab01_mystery.check_trace_answers(TRACE_ANSWERS)
print("TRACE_ANSWERS has the form the grader reads")
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("mystery_trace", globals())
### END HIDDEN TESTS

# %% [markdown]
# **Phase 2, the bottleneck type, and a first look at the component.** Time the pipeline's steps, then run
# the instruments over it. `lab01_mystery.line_costs` is line_profiler over every function and method the
# file defines (what `kernprof -l` does for a script): a line's time includes what it calls, so
# `self.next_batch()` holds all of the data loading and the lines of `__getitem__` split it up.
# `lab01_mystery.memory_growth` samples the process's resident memory after each step. Read them the way
# parts 4–7 taught you; add torch.profiler's operator table (part 7) or tracemalloc (part 6) where they
# help.

# %%
STEPS = 3 if SMALL_RUN else 8
planted_module = lab01_mystery.load_pipeline(PIPELINE)
step = planted_module.make_step(0)
step()  # warm-up
started = time.perf_counter()
for _ in range(STEPS):
    step()
print(f"baseline: {(time.perf_counter() - started) / STEPS * 1e3:.1f} ms a step "
      f"(batch {planted_module.BATCH_SIZE}, {planted_module.IMAGE_SIZE} px)")

profiler = cProfile.Profile()
profiler.runcall(lambda: [step() for _ in range(STEPS)])
mystery_stats = pstats.Stats(profiler)
print("\ncProfile, by cumulative time:")
mystery_stats.sort_stats("cumulative").print_stats(18)

costs = lab01_mystery.line_costs(PIPELINE, steps=STEPS)
print("line_profiler, the costliest lines of the pipeline:")
print(f"{'line':>5} {'ms/step':>8} {'share':>6} {'hits/step':>9}  function: code")
for row in costs[:14]:
    print(f"{row.line:>5} {row.ms_per_step:>8.2f} {row.share:>6.1%} {row.hits_per_step:>9.1f}  "
          f"{row.function}: {row.text[:70]}")

rss, trainer = lab01_mystery.memory_growth(PIPELINE, steps=6 if SMALL_RUN else 16)
fig, ax = plt.subplots(figsize=(6, 2.6), layout="constrained")
ax.plot(range(1, len(rss) + 1), rss, "o-", markersize=3)
ax.set(xlabel="training step", ylabel="resident MiB", title="memory of the mystery pipeline, step by step")
plt.show()
print("what the trainer holds after those steps:",
      {name: f"{type(value).__name__}" + (f" of {len(value)}" if isinstance(value, (list, dict)) else "")
       for name, value in vars(trainer).items()})
del trainer

# %% [markdown]
# **Phases 3 and 4: the component and the operation; then the fix.** Read the lines your measurements
# point at. For each bug, ask what the line costs, whether the training needs it, and what the same
# result costs done right. Write `DIAGNOSIS`, then write the fixed copy from this cell (read
# `PIPELINE`'s text, change it, write `FIXED_PIPELINE`; or `%%writefile` a whole copy). A bug the
# measurements do not show you is better left out than guessed.

# %% nbgrader={"grade": false, "grade_id": "mystery_investigation", "locked": false, "schema_version": 3, "solution": true, "task": false}
FIXED_PIPELINE = "mystery_fixed.py"
# DIAGNOSIS = [{"line": 57, "function": "JpegFolder.__getitem__", "kind": "data", "tool": "line_profiler",
#               "evidence": "line 57 holds 40% of a step in 1536 hits", "fix": "what you changed",
#               "saves": lab01_mystery.saving(PIPELINE, "only_this_fix.py")}, ...]
### BEGIN SOLUTION
import re as _re

source_lines = PIPELINE.read_text(encoding="utf-8").splitlines()
# The work a training step must do, whatever it costs: reading, decoding and normalising the images,
# forward, backward and the optimizer. Time anywhere else is a suspect.
ESSENTIAL = ("self.next_batch()", "next(self.batches)", "Image.open(", "np.asarray(image.resize", "self.model(images)",
             "self.criterion(", "loss.backward()", "self.optimizer.step()", "zero_grad(", "torch.from_numpy(array)",
             "tensor.flip(", "torch.rand((), generator", "return tensor.contiguous()", "self.batches = iter",
             "return loss.detach()", "(tensor - MEAN) / STD")
# What a suspect line is, from experience (a profiler says where time goes, not whether a line is
# needed): its type, the tool that showed it, the statement to change, and its replacement (None:
# delete it). A statement runs to the end of its block and its continuation lines.
KNOWN = (
    (r"small\.getpixel\(|small\.getdata\(", "data", "line_profiler", r"^\s*array = np\.array\(",
     "array = np.asarray(small, dtype=np.float32) / 255.0"),
    (r"tensor\[c, row", "data", "line_profiler", r"^\s*for c in range\(3\):$", "tensor = (tensor - MEAN) / STD"),
    (r"image\.tolist\(\)", "data", "cProfile", r"collate_fn=python_collate", None),
    (r"torch\.histc\(p\.grad", "sync", "torch.profiler", r"torch\.histc\(p\.grad", None),
    (r"= accuracy\(self\.model", "compute", "torch.profiler", r"= accuracy\(self\.model", None),
    (r"copy\.deepcopy\(", "memory", "line_profiler", r"copy\.deepcopy\(", None),
)


def line_of(pattern):
    return next(i for i, text in enumerate(source_lines, 1) if _re.search(pattern, text))


def statement_span(line):
    """How many lines the statement at `line` takes: its block, or its open brackets' continuation."""
    indent = len(source_lines[line - 1]) - len(source_lines[line - 1].lstrip())
    end = line
    while end < len(source_lines) and source_lines[end].strip() and \
            len(source_lines[end]) - len(source_lines[end].lstrip()) > indent:
        end += 1
    return end - line + 1


findings, edits, fixed_at = [], {}, []  # fixed_at[i]: the lines of findings[i]'s edits
for row in costs:  # costliest first; a line that ran is a line the measurement shows, however cheap
    if row.hits_per_step <= 0 or any(token in row.text for token in ESSENTIAL):
        continue
    known = next((k for k in KNOWN if _re.search(k[0], row.text)), None)
    if known is None:
        continue
    _, kind, tool, fix_at, replacement = known
    where = line_of(fix_at)
    if where in edits:
        continue
    edits[where] = (statement_span(where), replacement)
    fixed_at.append([where])
    findings.append({"line": row.line, "function": row.function, "kind": kind, "tool": tool,
                     "evidence": f"line {row.line} takes {row.ms_per_step:.2f} ms a step ({row.share:.1%}) "
                                 f"in {row.hits_per_step:g} hits, and does no training work",
                     "fix": f"replaced by {replacement!r}" if replacement else f"removed line {where}"})

# Anomaly mode costs inside the lines it wraps, not on its own line: cProfile shows the stack capture.
format_stack = sum(v[3] for k, v in mystery_stats.stats.items() if k[2] in ("format_stack", "extract_stack"))
anomaly_lines = [i for i, text in enumerate(source_lines, 1) if "detect_anomaly(" in text]
if anomaly_lines and format_stack > 0:
    findings.append({"line": anomaly_lines[0], "function": "Trainer.step", "kind": "sync", "tool": "cProfile",
                     "evidence": f"traceback.format_stack: {format_stack:.2f} s cumulative over the profile",
                     "fix": "anomaly mode off"})
    for i in anomaly_lines:
        edits[i] = (1, source_lines[i - 1].split(",")[0].strip() + ":")
    fixed_at.append(anomaly_lines)

# Memory that grows with every step: the trainer keeps a list that grows by one per step.
held = lab01_mystery.memory_growth(PIPELINE, steps=3)[1]
for name, value in vars(held).items():
    if isinstance(value, list) and len(value) == 3 and value and isinstance(value[0], torch.Tensor):
        for i, text in enumerate(source_lines, 1):
            if f"self.{name}.append(" in text:
                findings.append({"line": i, "function": "Trainer.step", "kind": "memory", "tool": "memory profiler",
                                 "evidence": f"self.{name} holds one more tensor after every step "
                                             f"({sum(t.numel() * t.element_size() for t in value) / 3 / 2**10:.0f} KiB "
                                             f"each, never freed); resident memory {rss[0]:.0f} -> {rss[-1]:.0f} MiB",
                                 "fix": "do not keep the batches"})
                edits[i] = (1, None)
                fixed_at.append([i])
del held


def with_fixes(at_lines):
    """The pipeline's text with the edits at `at_lines` made (bottom up, so line numbers hold)."""
    lines = list(source_lines)
    for line in sorted(at_lines, reverse=True):
        span, replacement = edits[line]
        indent = lines[line - 1][: len(lines[line - 1]) - len(lines[line - 1].lstrip())]
        lines[line - 1: line - 1 + span] = [indent + replacement] if replacement else []
    return "\n".join(lines) + "\n"


pathlib.Path(FIXED_PIPELINE).write_text(with_fixes(edits), encoding="utf-8")
# What each fix alone saves: a copy with only that edit per finding, timed beside the planted pipeline.
copies = []
for at in fixed_at:
    copies.append(pathlib.Path(f"mystery_only_line_{at[0]}.py"))
    copies[-1].write_text(with_fixes(at), encoding="utf-8")
for finding, saved in zip(findings, lab01_mystery.savings(PIPELINE, copies), strict=True):
    finding["saves"] = round(saved, 3)
    finding["evidence"] += f"; fixing it alone saves {saved:.0%} of a step"
DIAGNOSIS = findings
### END SOLUTION
for finding in DIAGNOSIS:
    print(f"line {finding['line']} ({finding['function']}): {finding['kind']}, by {finding['tool']}, "
          f"saves {finding['saves']:.0%}: {finding['evidence']} -> {finding['fix']}")

# %% nbgrader={"grade": true, "grade_id": "mystery_diagnosis", "locked": true, "points": 8, "schema_version": 3, "solution": false, "task": false}
# Visible: the form of DIAGNOSIS. Hidden: your findings against what was planted for your id.
lab01_mystery.check_diagnosis(DIAGNOSIS, PIPELINE)
print(f"{len(DIAGNOSIS)} finding(s) in the form the grader reads")
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("mystery_diagnosis", globals())
### END HIDDEN TESTS

# %% [markdown]
# **Prove the fix.** First that it trains the same way (the check below runs both for a few steps from
# the same seed), then how much faster it is. `lab01_mystery.quick_speedup` times interleaved blocks of
# both (on one torch thread, in that thread's CPU time, as `saving` does) and takes the ratio of the
# fastest ones; the grader re-measures with the full protocol.

# %% nbgrader={"grade": false, "grade_id": "mystery_speedup", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
FIX_SPEEDUP = round(lab01_mystery.quick_speedup(PIPELINE, FIXED_PIPELINE, steps=2 if SMALL_RUN else 4,
                                                rounds=3 if SMALL_RUN else 5), 2)
### END SOLUTION
print(f"your fixed pipeline: {FIX_SPEEDUP}x the planted one, by your measurement")

# %% nbgrader={"grade": true, "grade_id": "mystery_fix", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# Visible: your copy trains as the planted pipeline does. The grader re-measures it in its own process.
losses = lab01_mystery.check_fixed(FIXED_PIPELINE, PIPELINE)
print(f"same losses as the planted pipeline over {len(losses)} steps; the grader re-measures the speedup")
### BEGIN HIDDEN TESTS
from perflab.labs.lab01 import judges as hidden01
hidden01.check("mystery_fix", globals())
### END HIDDEN TESTS

# %% [markdown]
# Keep what you found for the report.

# %%
RESULTS["mystery"] = {"student": STUDENT_ID, "findings": len(DIAGNOSIS), "fix_speedup": FIX_SPEEDUP,
                      "trace": {k: TRACE_ANSWERS.get(k) for k in ("step_ms", "data_share", "backward_share")}}

# %% [markdown]
# ## Save your results
#
# Everything measured above goes to `results/lab01_measure.json` (the schema of `perflab.results`),
# which `perflab report` turns into the optimization report in lab 6.

# %%
path = common.save_results(LAB, RESULTS, config=CONFIG)
print(f"saved {path}")

# %% [markdown]
# ## Closing note: what this lab costs to run
#
# The cell below prints how long this notebook took, top to bottom, on the machine in front of you
# and in the mode it ran in. The kit quotes no fixed time for a lab: it depends on your cores, your
# device and whatever else runs beside it (noise only ever adds time). `make lab LAB=lab01_measure MODE=laptop`
# runs and times it the same way from a terminal.

# %%
print(common.elapsed_statement(LAB))
