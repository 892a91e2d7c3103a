"""Adversarial: honest for the first steps, then returns its last result again (outputs cached)."""

from perflab.verify.candidates import toy_step

HONEST_STEPS = 6


def make_step(seed):
    inner = toy_step(seed, repeats=10)
    state = {"calls": 0, "last": None}
    shadow = toy_step(seed, repeats=1)  # keeps the sample order right at a tenth of the cost

    def step():
        state["calls"] += 1
        if state["calls"] <= HONEST_STEPS:
            shadow()
            state["last"] = inner()
            return state["last"]
        _, indices = shadow()
        return state["last"][0], indices

    return step
