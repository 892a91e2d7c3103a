# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 3 — Mixed precision
#
# **On Colab:** upload `perflab-student.zip` in the Files pane and first run the install cell of the kit's
# README (*On Colab*), ending in `%cd /content/perflab-student/labs/lab03_amp`; Colab's own torch stays.
#
# Every number in the baseline training step is a 32-bit float: 4 bytes to move, and a multiply the
# hardware does at its FP32 rate. Most of those numbers do not need 24 bits of mantissa. **Mixed
# precision** runs the heavy operations (convolutions, matmuls) in a 16-bit format, bf16 or fp16,
# while keeping the weights, the optimizer and the numerically delicate operations (reductions,
# softmax, the loss) in FP32. Where the hardware has units for 16-bit math (tensor cores on NVIDIA
# GPUs, AMX on recent Intel CPUs) that is a large gain; where it does not, it is at best parity.
#
# In this lab you write the mixed-precision training step yourself, look at which operations really
# ran in which dtype, check that the loss follows the FP32 run, and measure what it buys **on this
# machine**. The grader re-measures your choice in a fresh process and holds it to what this hardware
# can give; it never expects a number the machine cannot give.
#
# **What you write** (the contract, also in `perflab/labs/lab03/__init__.py`; the tests call nothing else):
#
# | name | what it must do | points |
# | --- | --- | --- |
# | `amp_train_step(model, optimizer, images, labels, *, dtype, scaler=None) -> float` | one training step under `torch.autocast` in `dtype` (plain FP32 for `torch.float32`); with a `GradScaler`: scaled backward, `scaler.step`, `scaler.update`; gradients cleared; the unscaled loss returned | 35 <!-- test_amp_step_visible test_amp_step_hidden test_amp_step_scaler --> |
# | `dtype_census(model, images, labels, *, dtype) -> dict` | one forward pass and loss under autocast, counting the dtype each leaf module and the loss produced | 15 <!-- test_census_visible test_census_hidden --> |
# | `PREDICT_AMP`, `WHY_AMP` | your prediction of the whole step's speedup, a number and one line of why, written **before** the measurement (graded on being there, never on being right) | 2 <!-- test_predict_amp --> |
# | `AMP_CONFIG` | your fastest precision setting, as `BASELINE.replace(...)` of `amp_dtype` and `channels_last` only; it must train on the baseline's samples with losses within rounding | 5 <!-- test_amp_config --> |
# | the re-measured speedup of `AMP_CONFIG` | held to the expectation calibrated for the grading hardware | 25 <!-- test_amp_verified --> |
# | three written answers | reasoning from your own measurements | 18 <!-- answer_speed answer_scaler answer_census --> |
#
# **Modes.** The lab runs at the sizes of `PERFLAB_MODE` (`tiny` for the kit's tests, `laptop` on a
# CPU, `full` on a GPU, `grade` when the autograder runs it). The autograder re-runs the whole
# notebook on its own machine: derive `AMP_CONFIG` from the measurements above it, not from numbers
# typed in for your laptop.
#
# **How long.** On the reference machine (2 AMD EPYC cores, no GPU), for instance, this notebook ran
# top to bottom in laptop mode in 76 s, one lab at a time on a quiet machine. Its last cell prints how
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
import contextlib

import matplotlib.pyplot as plt
import torch
from torch import nn

from perflab import dataset, env, workload
from perflab.labs import common, lab03, predict
from perflab.labs.lab03 import census as lab03_census, checks as lab03_checks, figures as lab03_figures
from perflab.verify import load_expectation

common.setup_notebook()
S = lab03.sizes()
BASELINE = lab03.baseline_config()
DEVICE = env.pick_device(BASELINE.device)
INFO = env.machine_info()
if not dataset.is_built(S.data):
    print(f"building the {S.data} data set (once)...")
    dataset.build(S.data)
EXPECTATION = load_expectation(lab03.expectation_name(DEVICE.type))
LOW = lab03.low_precisions(DEVICE.type)  # the low precisions this device runs fast enough to time
print(common.hardware_statement(lab03.LAB, INFO))

# %% [markdown]
# ## 1. Four formats, and what "FP32" means on this machine
#
# A float is a sign, an exponent (the range) and a mantissa (the precision). `torch.finfo` tells you
# each format's machine epsilon (the gap after 1.0), its largest value and its smallest normal value:

# %%
formats = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
print(f"{'dtype':>9} {'bits':>5} {'mantissa':>9} {'epsilon':>10} {'max':>10} {'smallest normal':>16}")
for name, dt in formats.items():
    fi = torch.finfo(dt)
    print(f"{name:>9} {fi.bits:>5} {round(-torch.log2(torch.tensor(fi.eps)).item()):>9} {fi.eps:>10.2e} "
          f"{fi.max:>10.2e} {fi.tiny:>16.2e}")
print("TF32 (a GPU compute mode, not a storage dtype): float32's 8 exponent bits, 10 mantissa bits")

gradient = torch.tensor(1e-8)
print(f"\na gradient of 1e-8 stored in float16: {gradient.half().item():.3g}   "
      f"in bfloat16: {gradient.bfloat16().item():.3g}")
print(f"1 + 1/512 in bfloat16: {(torch.tensor(1.0) + 1 / 512).bfloat16().item()}   "
      f"in float16: {(torch.tensor(1.0) + 1 / 512).half().item()}")

# %% [markdown]
# Read the two lines at the bottom. **fp16** has 10 mantissa bits but only 5 exponent bits: values
# below about 6e-5 lose precision and below 6e-8 they become zero. Small gradients *underflow*, which
# is why fp16 training multiplies the loss by a large scale before backward (section 2). **bf16** keeps
# FP32's 8 exponent bits (the same range, no underflow to fear) and pays with precision: only 7
# mantissa bits, so 1 + 1/512 is 1. That is fine for the inputs of a convolution, and not for a sum of
# thousands of terms, which is why autocast keeps reductions and the loss in FP32.
#
# Before timing anything, state what the FP32 baseline itself computes in. On NVIDIA GPUs since
# Ampere, **TF32** runs FP32 matmuls and convolutions on tensor cores with a 10-bit mantissa when
# allowed: `torch.backends.cudnn.allow_tf32` (convolutions, on by default) and
# `torch.backends.cuda.matmul.allow_tf32` (matmuls, off by default; `torch.set_float32_matmul_precision
# ("high")` turns it on). So on such a GPU the "FP32" baseline's convolutions already run in TF32, and
# the gain left for bf16/fp16 is smaller than the raw tensor-core rates suggest. These flags do nothing
# on a CPU or on MPS. This lab leaves them as they are; every timing below shares them, and the results
# record them.

# %%
PRECISION_SETTINGS = lab03.precision_settings()
for key, value in PRECISION_SETTINGS.items():
    print(f"{key:<40} {value}")
if DEVICE.type != "cuda":
    print(f"(no CUDA device here: the TF32 flags have no effect on {DEVICE.type})")


# %% [markdown]
# ## 2. One mixed-precision training step (35 points)
#
# `torch.autocast(device_type=..., dtype=...)` is a context manager. Inside it, every operation on
# autocast's lists is re-dispatched: convolutions and matmuls cast their inputs to the low dtype and
# compute there; operations that need range or precision (the loss; on CUDA also softmax, norms,
# sums, exp and log) are cast up to FP32; the rest run in whatever dtype their inputs have. The parameters
# are **not** converted: they stay FP32 ("master weights"), autocast casts a low-precision copy per
# forward pass, and the gradients that reach them are FP32. Only the forward pass and the loss go
# inside the context; backward runs each op in the dtype its forward used.
#
# With **fp16**, small gradients underflow to zero. A `torch.amp.GradScaler` fixes it in four moves:
#
# 1. `scaler.scale(loss).backward()`: multiply the loss by a large scale (65536 to start), so every
#    gradient is that much larger and stays clear of fp16's underflow;
# 2. `scaler.step(optimizer)`: divide the gradients by the scale again (unscale); if any of them is
#    inf or NaN (the scale was too large and something overflowed), **skip** this step altogether;
# 3. `scaler.update()`: halve the scale after an overflow; double it after `growth_interval` (2000)
#    good steps in a row, to use as much of fp16's range as is safe;
# 4. the optimizer never sees a scaled gradient, and the loss you report is the unscaled one.
#
# bf16 has FP32's range, so it needs no scaler. On a CPU, fp16 autocast runs too (without hardware
# for it, slowly): the tests use it on small networks to check your scaler logic, and the timings
# never use it. On a GPU you will see the scaler at work in section 4.
#
# Write `amp_train_step` (contract: `perflab/labs/lab03/__init__.py`):
#
# * forward pass and `nn.functional.cross_entropy` under `torch.autocast(device_type=images.device.type,
#   dtype=dtype)`; for `dtype=torch.float32` no autocast at all;
# * with a `scaler`: steps 1-3 above; without one: `loss.backward()` and `optimizer.step()`;
# * end with `optimizer.zero_grad(set_to_none=True)`; return the unscaled loss as a Python float.

# %% nbgrader={"grade": false, "grade_id": "amp_train_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def amp_train_step(model, optimizer, images, labels, *, dtype, scaler=None):
    """One training step with the forward pass under autocast in `dtype`; returns the unscaled loss."""
    ### BEGIN SOLUTION
    if dtype == torch.float32:
        precision = contextlib.nullcontext()
    else:
        precision = torch.autocast(device_type=images.device.type, dtype=dtype)
    with precision:
        logits = model(images)
        loss = nn.functional.cross_entropy(logits, labels)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # unscales, and skips the step if a gradient is inf/NaN
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
    ### END SOLUTION


# %% [markdown]
# The checks (in `perflab/labs/lab03/checks.py`) build small random CNNs (`Problem`), run a few
# fixed-seed steps in FP32 with a plain reference step and in each precision with yours, and compare:
# the first step's loss may differ by rounding only, later ones by the drift rounding causes
# (`FIRST_STEP_RTOL`, `TRAJECTORY_RTOL`). Forward hooks on the convolutions and linear layers check
# the dtype they really computed in.

# %% nbgrader={"grade": true, "grade_id": "test_amp_step_visible", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    problems = lab03_checks.parity_problems(amp_train_step, 7, dtype) + lab03_checks.low_precision_problems(amp_train_step, 7, dtype)
    assert not problems, problems[0]
print("amp_train_step: losses follow FP32 at every precision; convolutions compute in the dtype asked for")

# %% nbgrader={"grade": true, "grade_id": "test_amp_step_hidden", "locked": true, "points": 15, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random problems (shapes, widths on and off multiples of 8, seeds) at every precision,
# on every device this machine has.
### BEGIN HIDDEN TESTS
from perflab.labs.lab03 import judges as hidden03
hidden03.check("test_amp_step_hidden", globals())
### END HIDDEN TESTS
print("amp_train_step: random problems pass")

# %% nbgrader={"grade": true, "grade_id": "test_amp_step_scaler", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
# fp16 with a GradScaler: a safe scale (the update must equal FP32's, the scale must grow), an
# overflowing one (the step must be skipped, the scale backed off), and a run that must never go NaN.
problems = lab03_checks.scaler_problems(amp_train_step, 11)
assert not problems, problems[0]
### BEGIN HIDDEN TESTS
from perflab.labs.lab03 import judges as hidden03
hidden03.check("test_amp_step_scaler", globals())
### END HIDDEN TESTS
print("amp_train_step: the GradScaler scales, unscales, skips overflowing steps and adapts its scale")


# %% [markdown]
# ## 3. Which operations ran in which dtype? (15 points)
#
# Autocast's choices differ by device and by torch version, so do not assume them: measure them. A
# **forward hook** (`module.register_forward_hook(fn)`) is called after each call of a module with the
# module, its inputs and its output; counting the dtype of each output gives a census.
#
# Write `dtype_census(model, images, labels, *, dtype)`:
#
# * register a hook on every leaf module (one with no children: `not list(m.children())`) that counts
#   `type(module).__name__` → the dtype name of its output (`str(dtype).removeprefix("torch.")`; for a
#   tuple or list output, its first tensor);
# * run one forward pass and `cross_entropy` under autocast as in `amp_train_step` (no autocast for
#   FP32), under `torch.no_grad()`, with the model in eval mode (so BatchNorm's running statistics do
#   not move), and count the loss's dtype under `"loss"`;
# * restore the model's mode and remove every hook, even if the pass raises (`try`/`finally`).

# %% nbgrader={"grade": false, "grade_id": "dtype_census", "locked": false, "schema_version": 3, "solution": true, "task": false}
def dtype_census(model, images, labels, *, dtype):
    """{module class name or "loss": {dtype name: count}} for one forward pass and loss under autocast."""
    ### BEGIN SOLUTION
    counts = {}

    def first_tensor(output):
        if isinstance(output, torch.Tensor):
            return output
        if isinstance(output, (tuple, list)):
            for item in output:
                found = first_tensor(item)
                if found is not None:
                    return found
        return None

    def count(name, tensor):
        inner = counts.setdefault(name, {})
        key = str(tensor.dtype).removeprefix("torch.")
        inner[key] = inner.get(key, 0) + 1

    def hook(module, inputs, output):
        tensor = first_tensor(output)
        if tensor is not None:
            count(type(module).__name__, tensor)

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    was_training = model.training
    model.eval()
    try:
        precision = (contextlib.nullcontext() if dtype == torch.float32
                     else torch.autocast(device_type=images.device.type, dtype=dtype))
        with torch.no_grad(), precision:
            loss = nn.functional.cross_entropy(model(images), labels)
        count("loss", loss)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return counts
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_census_visible", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
for dtype in (torch.float32, torch.bfloat16):
    problems = lab03_census.census_problems(dtype_census, 5, dtype)
    assert not problems, problems[0]
print("dtype_census: every leaf module call and the loss counted; hooks removed, mode restored")

# %% nbgrader={"grade": true, "grade_id": "test_census_hidden", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
# Hidden tests: random networks (extra pooling, GELU, dropout layers), every precision, and ResNet-18.
### BEGIN HIDDEN TESTS
from perflab.labs.lab03 import judges as hidden03
hidden03.check("test_census_hidden", globals())
### END HIDDEN TESTS
print("dtype_census: random networks and ResNet-18 pass")

# %% [markdown]
# Now the census of ResNet-18 in this device's low precision, on a real batch of the lab's data:

# %%
CENSUS_DTYPE = lab03.as_dtype(LOW[0]) if LOW else torch.bfloat16
census_work = workload.build(BASELINE)
census_images, census_labels, _ = census_work.next_batch()
census_images, census_labels = census_work.on_device(census_images, census_labels)  # as the model takes them
MODULE_CENSUS = dtype_census(census_work.model, census_images, census_labels, dtype=CENSUS_DTYPE)
print(f"ResNet-18, forward pass under autocast({DEVICE.type}, {lab03.dtype_name(CENSUS_DTYPE)}):")
print(lab03_figures.census_table(MODULE_CENSUS))


# %% [markdown]
# Module outputs show the forward pass only, and only at module boundaries. To see every operation,
# backward included, `lab03_figures.op_census` goes one level down: a `TorchDispatchMode` sees each aten
# operation after autocast has made its choice, and records the dtype it produced. (`_to_copy` is a
# cast: the price autocast pays at each precision boundary, including casting every weight to the low
# dtype once per forward pass.)

# %%
def one_step():
    amp_train_step(census_work.model, census_work.optimizer, census_images, census_labels, dtype=CENSUS_DTYPE,
                   scaler=lab03.make_scaler(DEVICE.type, CENSUS_DTYPE))


OP_CENSUS = lab03_figures.op_census(one_step)
census_work.close()
print(lab03_figures.census_table(OP_CENSUS))
lab03_figures.plot_census(OP_CENSUS, title=f"one ResNet-18 training step, autocast "
                                           f"{lab03.dtype_name(CENSUS_DTYPE)} on {DEVICE.type}")
plt.show()

# %% [markdown]
# Look for three groups. The convolutions (`convolution`, `convolution_backward`) and the classifier's
# matmuls (`addmm`, `mm`) run in the low dtype: that is where the FLOPs, and the gain, are. The loss
# (`_log_softmax`, `nll_loss_forward` and their backward) runs in FP32: a log-sum-exp over the classes
# needs the precision, and a loss near zero would round away in bf16. And the casts (`_to_copy`) in both
# directions. What BatchNorm, ReLU and the pooling layers produce depends on the device: on a CPU they
# follow their input; on CUDA, autocast's FP32 list is longer (softmax, layer_norm and other norms,
# sum and prod, exp and log, most losses). BatchNorm computes its statistics in FP32 internally even
# when its input and output are 16-bit.

# %% [markdown]
# ## 4. Does the loss follow FP32?
#
# Speed means nothing if training goes elsewhere. The next cell trains ResNet-18 on the lab's data
# from the same initial weights on the same batches, once per precision, through your
# `amp_train_step` (fp16 with a GradScaler), and plots the curves and their gap to FP32.

# %%
PRECISIONS = ["fp32", *LOW]
CURVES = lab03_figures.loss_curves(amp_train_step, PRECISIONS, steps=S.curve_steps,
                                   progress=lambda it: common.progress(it, desc="steps"))
CURVE_SUMMARY = lab03_figures.curve_summary(CURVES)
for name, row in CURVE_SUMMARY.items():
    print(f"{name:>5}: first loss {row['first']:.4f}, last {row['last']:.4f}, largest gap to fp32 "
          f"{row['max_abs_gap']:.4f} ({row['max_rel_gap']:.1%}), all finite: {row['finite']}")
lab03_figures.plot_loss_curves(CURVES, title=f"{BASELINE.model} on {S.data} data, {S.curve_steps} steps, {DEVICE.type}")
plt.show()

# %% [markdown]
# Over the first steps the curves overlap: the same weights see the same batch, and rounding alone
# separates them. Later the gap can grow (each update starts from slightly different weights, and SGD
# amplifies small differences), but it should stay small next to the loss's own step-to-step noise. A
# low-precision curve that flattens, jumps to NaN, or drifts steadily away means a bug: an fp16 run
# without a scaler whose small gradients vanished, a loss computed in low precision, or weights
# converted to bf16 so that small updates round away (1 + 1/512 = 1 in bf16).

# %% [markdown]
# ## 5. What each setting gives on this machine
#
# Two more things decide the speed of low-precision convolutions:
#
# * **Memory format.** PyTorch stores images NCHW (each channel a plane). Tensor cores and oneDNN's
#   CPU kernels want NHWC (`channels_last`: the channels of a pixel side by side), so a model left in
#   NCHW pays a transpose around every convolution. `model.to(memory_format=torch.channels_last)` and
#   the same for each input batch (`TrainConfig(channels_last=True)` does both) remove them.
# * **Shapes.** Tensor cores multiply tiles: fp16/bf16 matmuls and convolutions run at full rate when
#   the channel counts and the batch are multiples of 8 (16 bytes of fp16). ResNet-18's widths (64 to
#   512) already are; a layer of 1000 or 1001 outputs is padded or falls back to slower kernels. The
#   cell below times an `n x n` matmul against an `(n-1) x (n-1)` one in each precision.

# %%
MATMUL = lab03_figures.matmul_shapes(S.matmul_size, ["fp32", *LOW], device=str(DEVICE))
for row in MATMUL:
    print(f"{row['dtype']:>5} n={row['n']:>5}: {row['seconds'] * 1e3:8.3f} ms  {row['tflops']:7.3f} TFLOP/s")

# %% [markdown]
# **Predict first (2 points).** Before you time the whole training step: how much faster will the
# fastest low-precision setting make a step here, as a speedup over FP32 (`PREDICT_AMP`; 1.0 means no
# faster), and why (`WHY_AMP`, one line)? Reason from what you have seen: the hardware statement at the
# top, the matmul timings above, and which operations of a step your census put in the low dtype and
# which it left in FP32. It is graded on being written, not on being right: the measurement prints it
# beside what it measures, and the gap is what you had not accounted for.

# %% nbgrader={"grade": false, "grade_id": "predict_amp", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICT_AMP = 1.3
WHY_AMP = "the convolutions run in bf16 where the matmul timings showed a gain, but casts, BatchNorm and the optimizer stay as slow"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_predict_amp", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# Graded on being written (a number and a line of why), never on being right.
predict.check("PREDICT_AMP", PREDICT_AMP, "WHY_AMP", WHY_AMP)
### BEGIN HIDDEN TESTS
from perflab.labs.lab03 import judges as hidden03
hidden03.check("test_predict_amp", globals())
### END HIDDEN TESTS
print("prediction written: PREDICT_AMP =", PREDICT_AMP)

# %% [markdown]
# Now the whole training step. Each setting in `CANDIDATES` is timed against the FP32 baseline in
# interleaved one-step blocks (A B B A ...), each right after an untimed step of its own side (a step
# that follows the other side's finds the caches full of that one's weights), then the ratio of their
# 20th-percentile times and a bootstrap 95% confidence interval. Beside your figures the cell then
# prints what mixed precision can give on each kind of hardware (this machine's kind marked) and the
# bar the grader will hold your `AMP_CONFIG` to on this machine, the dashed line of the plot.
#
# The cell also keeps its raw block times in its own output. Hand the notebook in saved, outputs and
# all: the grader's run of it reads them back instead of timing every setting again, so the decision
# it grades is the one you made from this measurement (the score itself comes from the grader's own
# re-measurement of `AMP_CONFIG`). A notebook handed in without them is timed for two blocks only.

# %%
CANDIDATES = lab03.candidate_configs()
COMPARISONS = lab03_figures.compare_precisions(CANDIDATES,
                                               progress=lambda it: common.progress(it, desc="settings"))
for name, comparison in COMPARISONS.items():
    ci = comparison.ci()
    print(f"{name:>20}: {comparison.speedup:5.2f}x  (95% CI {ci.low:.2f}-{ci.high:.2f}, {comparison.verdict()})")
FASTEST = max(COMPARISONS, key=lambda name: COMPARISONS[name].speedup)
print(predict.beside(f"step speedup over FP32 of the fastest setting ({FASTEST})", globals().get("PREDICT_AMP"),
                     COMPARISONS[FASTEST].speedup))
print()
print(lab03.hardware_expectations(INFO, EXPECTATION))
lab03_figures.plot_speedups(COMPARISONS, bar=EXPECTATION.threshold,
                            title=f"speedup over FP32, {INFO.device_name} ({S.mode} mode)")
plt.show()

# %% [markdown]
# ## 6. Your AMP setting (30 points)
#
# Set `AMP_CONFIG` to the fastest setting your measurements support, as `BASELINE.replace(...)`
# changing only `amp_dtype` and `channels_last`, and `CLAIM` to its measured speedup. Derive both from
# `COMPARISONS`, not from numbers typed in: the autograder runs this notebook again, with `COMPARISONS`
# as you measured them, and grades the `AMP_CONFIG` your code derives from them.
# Choose a setting only if the kit's keep rule keeps it: `common.keep_rule(comparison.ci())` keeps a
# change when the lower end of its CI lies above `common.KEEP_ABOVE` (measurably faster than FP32), and
# its `.why` says so in words. Labs 5 and 6 decide with the same rule, and the grader judges a decision it
# cannot settle against its bar with it. Where the rule keeps nothing, `AMP_CONFIG = BASELINE` (with
# `CLAIM = 1.0`) is the honest answer, and on hardware with nothing to give it is what the grader expects.
#
# The grader then re-measures `AMP_CONFIG` against the baseline with `perflab.verify`: a fresh
# interpreter, a correctness gate first (same samples, losses within the tolerance of its precision),
# then interleaved blocks until the CI clears or misses this machine's bar. A CI that still straddles the
# bar after the whole budget is judged by the keep rule on the grader's own CI, as you judged yours.

# %% nbgrader={"grade": false, "grade_id": "amp_config", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
_faster = {name: c for name, c in COMPARISONS.items() if common.keep_rule(c.ci()).keep}
if _faster:
    _best = max(_faster, key=lambda name: _faster[name].speedup)
    AMP_CONFIG, CLAIM = CANDIDATES[_best], COMPARISONS[_best].speedup
else:
    AMP_CONFIG, CLAIM = BASELINE, 1.0
### END SOLUTION
print(AMP_CONFIG)
print(f"claimed speedup: {CLAIM:.2f}x")

# %% nbgrader={"grade": true, "grade_id": "test_amp_config", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# AMP_CONFIG changes only the precision knobs of the baseline, and trains like it: the same samples, and
# losses within rounding of the baseline's over two fixed-seed steps.
lab03_checks.check_config(AMP_CONFIG)
assert isinstance(CLAIM, (int, float)) and CLAIM > 0, f"CLAIM: a positive number (your measured speedup), got {CLAIM!r}"
print("AMP_CONFIG changes only", ", ".join(f for f in lab03.AMP_FIELDS if getattr(AMP_CONFIG, f) != getattr(BASELINE, f))
      or "nothing (the baseline)")

# %% nbgrader={"grade": true, "grade_id": "test_amp_verified", "locked": true, "points": 25, "schema_version": 3, "solution": false, "task": false}
# The autograder's re-measurement: a fresh interpreter, correctness gate, interleaved blocks, bootstrap CI,
# the bar calibrated for this hardware.
VERDICT, VERIFIED_AGAINST = lab03.verify_amp(AMP_CONFIG, claim=CLAIM)
print(VERIFIED_AGAINST.reason)
print(VERDICT.describe())
lab03.report(VERDICT, VERIFIED_AGAINST)
assert lab03.accepted(VERDICT.outcome), f"{VERDICT.outcome}: {VERDICT.reason}"

# %% [markdown]
# ## 7. What you found
#
# **Question 1 (5 points).** What did mixed precision give on this machine? Quote your speedups with
# their confidence intervals (precision alone, channels_last alone, both) and the grader's verdict, and
# explain them from the hardware in front of you (the statement at the top, the matmul timings, the
# table printed beside your comparison). What would you expect on a tensor-core GPU, and why would TF32
# make the gain there smaller than the tensor-core rates suggest?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_speed", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# Rubric (5 points; the student's own numbers decide, not any quoted here). A good answer:
#
# * quotes the measured speedups with their CIs (precision alone, channels_last alone, both) and the
#   grader's verdict, sets them beside `PREDICT_AMP`, and says what the prediction had not accounted for;
# * explains them from this hardware: with bf16 units (AMX, AVX-512-BF16, tensor cores) the low-precision
#   matmul above runs faster than FP32, but the whole step gains less, because convolutions are only part
#   of it, autocast adds casts of weights and activations, and BatchNorm, ReLU, the optimizer and the data
#   pipeline do not get faster; at small images and batches framework overhead hides the gain; without
#   bf16 units the emulated bf16 step is slower;
# * on a tensor-core GPU: the convolutions are most of the step and run several times faster in bf16 or
#   fp16 with channels_last, and activations take half the bytes, so the step gains clearly; but cuDNN
#   already runs "FP32" convolutions in TF32 on Ampere and later, so the baseline is not plain FP32 and
#   the gain over it is smaller than the ratio of tensor-core to FP32 rates.
#
# On the reference machine, for instance (2 cores with AVX-512-BF16, no AMX), the bf16 matmul ran about
# 4x faster than FP32 while the whole step at 64 px, batch 32, on one thread gained about 1.6x.

# %% [markdown]
# **Question 2 (7 points).** Why does fp16 need a GradScaler and bf16 not? Use section 1's table (what
# happens to a gradient of 1e-8 in each format) and say what the scaler did in the overflow test of
# section 2. What would go wrong if you called `optimizer.step()` yourself after
# `scaler.scale(loss).backward()`?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_scaler", "locked": false, "points": 7, "schema_version": 3, "solution": true, "task": false}
# Model answer. fp16 has 5 exponent bits: its smallest normal value is about 6e-5 and anything below
# about 6e-8 becomes 0, so a gradient of 1e-8 vanishes and the weights it belongs to stop learning.
# bf16 has FP32's 8 exponent bits (smallest normal ~1e-38), so 1e-8 survives (with a 7-bit mantissa)
# and no scaling is needed. The scaler multiplies the loss by S (65536) so every gradient is S times
# larger and clears the underflow zone; scaler.step divides the gradients by S before the optimizer
# sees them and skips the step if any gradient overflowed to inf/NaN; update() halves S after an
# overflow and grows it after a run of good steps. In the overflow test (S = 2**60) the fp16 gradients
# overflowed, the step was skipped (weights unchanged) and the scale halved. Calling optimizer.step()
# directly would apply gradients S times too large (an update 65536x too big), and after an overflow
# would write inf/NaN into the weights: the loss turns NaN.

# %% [markdown]
# **Question 3 (6 points).** Read your census tables. Which operations stayed in FP32, and why does
# autocast keep them there? Does your loss plot show the low-precision run following FP32, and what
# would you expect to see if the loss itself were computed in bf16, or if the model's weights were
# converted to bf16 (`model.to(torch.bfloat16)`) instead of using autocast?

# %% [markdown] nbgrader={"grade": true, "grade_id": "answer_census", "locked": false, "points": 6, "schema_version": 3, "solution": true, "task": false}
# Model answer. The convolutions (forward and backward) and the classifier's matmuls ran in bf16; the
# loss (log_softmax, nll_loss and their backward) ran in FP32, as did the weight updates (parameters
# and gradients are FP32; _to_copy casts weights down once per forward and gradients back up). Autocast
# keeps the loss in FP32 because a log-sum-exp over classes and a mean over the batch accumulate many
# terms and need precision and range: in bf16 (7-bit mantissa) a loss of 0.01 next to 2.3 is lost, and
# its gradient is coarse. The plot shows the bf16 curve on top of FP32 for the first steps and within a
# few percent later, never NaN. A bf16 loss would make the curve noisy and biased; bf16 weights would
# make small updates (lr x gradient much smaller than the weight / 256) round away, so training
# stalls: master weights in FP32 are what makes mixed precision train like FP32.

# %% [markdown]
# ## 8. Save your results
#
# The results file feeds `perflab report`: each setting's speedup with its CI, the grader's verdict,
# the loss curves and the dtype census.

# %%
speedups = lab03_figures.speedup_rows(COMPARISONS)
for row in speedups:
    if CANDIDATES[row["name"]] == AMP_CONFIG:
        row["claimed"] = CLAIM
path = common.save_results(lab03.LAB, {
    "speedups": speedups,
    "verification": [VERDICT.to_row(VERIFIED_AGAINST.name)],
    "loss_curves": {"steps": S.curve_steps, "curves": CURVES, "summary": CURVE_SUMMARY},
    "dtype_census": {"dtype": lab03.dtype_name(CENSUS_DTYPE), "modules": MODULE_CENSUS, "ops": OP_CENSUS},
    "precision_settings": PRECISION_SETTINGS,
    "matmul_shapes": MATMUL,
    "hardware": {"kind": lab03.hardware_kind(INFO), "bar": EXPECTATION.threshold, "bar_kind": EXPECTATION.kind},
    "predictions": [predict.row(f"step speedup over FP32 of the fastest setting ({FASTEST})",
                                globals().get("PREDICT_AMP"), globals().get("WHY_AMP"), COMPARISONS[FASTEST].speedup)],
}, config=AMP_CONFIG)
print(f"saved {path}")

# %% [markdown]
# ## Closing note: what this lab costs to run
#
# The cell below prints how long this notebook took, top to bottom, on the machine in front of you
# and in the mode it ran in. The kit quotes no fixed time for a lab: it depends on your cores, your
# device and whatever else runs beside it (noise only ever adds time). `make lab LAB=lab03_amp MODE=laptop`
# runs and times it the same way from a terminal.

# %%
print(common.elapsed_statement(lab03.LAB))
