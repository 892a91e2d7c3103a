"""Adversarial: a numerically broken candidate whose losses turn NaN a few steps into timing."""

from perflab.verify.candidates import toy_step

GOOD_STEPS = 8


def make_step(seed):
    inner = toy_step(seed, repeats=8)
    state = {"calls": 0}

    def step():
        state["calls"] += 1
        loss, indices = inner()
        return (loss if state["calls"] <= GOOD_STEPS else float("nan")), indices

    return step
