"""Error case: the step raises."""

from perflab.verify.candidates import toy_step


def make_step(seed):
    inner = toy_step(seed, repeats=8)
    state = {"calls": 0}

    def step():
        state["calls"] += 1
        if state["calls"] > 2:
            raise RuntimeError("shape mismatch in my custom layer")
        return inner()

    return step
