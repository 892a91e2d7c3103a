"""The correctness gate's loss tolerances: how far a candidate's loss may stray from the reference's.

Standard library only: the verify child imports this right after binding its clocks.
"""

from __future__ import annotations

# First-step loss tolerance (relative, absolute) per precision. The first step's loss is the forward
# pass of the same initial model on the same samples, so it differs only by rounding: fp32 by ~1e-3
# (TF32 convolutions, other algorithms for another memory format), bf16 (8-bit mantissa) by ~1e-2
# (measured 0.8% for ResNet-18 on CPU), fp16 (11-bit) by less. Halving the batch moves it by ~5%.
LOSS_TOLERANCE = {"fp32": (5e-3, 1e-4), "tf32": (1e-2, 1e-4), "fp16": (2e-2, 1e-3), "bf16": (3e-2, 1e-3)}
# Later gate steps follow the updates, and SGD on a small batch amplifies rounding: measured for
# ResNet-18 at batch 8, lr 0.05, fp32 channels_last differs by up to 8% and bf16 by up to 18% within
# four steps. Beyond this student code computes something else (a skipped update, other data).
# Configurations are held to the first step only: at the autograder's sizes (32 px, batch 8, lr
# 0.002, 8 seeds) bf16 with channels_last drifted up to 42% from fp32 by step 3, fp32 channels_last
# 9% by step 4, while skipping every update moved the losses by as little as 0.8%: past the first
# step the trajectory told an honest change from a wrong one no better than chance.
LOSS_TRAJECTORY_RTOL = 0.3
# Student code (a module candidate) is held to the reference's loss at EVERY step both sides ran, the
# timed steps included: a step that skips backward or the update, or trains on fewer samples than it
# reports, moves every later loss. The labs that time student code (lab 1's fixed mystery pipeline,
# lab 4's checkpointed run) do the reference's arithmetic. Measured by bench/bench_drift.py on a
# 2-core CPU at the verifier's one thread over 132 steps (the gate's 4 and the most a verification
# times there): each planted mystery pipeline against its reference fix (ids alice, bob, carol, dave,
# erin, frank, judy: every catalogue bug) and lab 4's plain run against every stage checkpointed
# differ by 0, bit for bit. Cheats leave the trajectory: on the mystery pipeline forward-only or a
# frozen optimizer after the gate by 3% at the first missed update and 11% two steps later (48-64%
# at most over the 132 steps, every other update skipped 83-166%, over the six ids); on the
# toy reference (which learns slowly) forward-only passes 1% at step 28, every other update skipped
# at step 56. 1% catches both in the shortest verification; a GPU's nondeterministic reductions were
# not measured (run bench/bench_drift.py --device cuda before grading lab 4 on one). Code that
# declares a lower precision (DTYPE bf16/fp16) keeps LOSS_TRAJECTORY_RTOL: its rounding compounds.
STUDENT_TRAJECTORY_RTOL = {"fp32": 1e-2, "tf32": 1e-2, "fp16": LOSS_TRAJECTORY_RTOL, "bf16": LOSS_TRAJECTORY_RTOL}
