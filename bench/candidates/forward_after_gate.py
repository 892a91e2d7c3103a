"""Adversarial: honest through the correctness gate, then returns the forward loss without backward or
update (the issue's lab 1 cheat on the toy): the reported samples stay right, the model stops training."""

from perflab.verify.candidates import toy_step

HONEST_STEPS = 4  # the verifier's GATE_STEPS


def make_step(seed):
    inner = toy_step(seed, repeats=10)
    cells = dict(zip(inner.__code__.co_freevars, inner.__closure__, strict=True))
    x, y, w, next_indices = (cells[k].cell_contents for k in ("x", "y", "w", "next_indices"))
    calls = [0]

    def step():
        calls[0] += 1
        if calls[0] <= HONEST_STEPS:
            return inner()
        idx = next_indices()
        err = x[idx] @ w - y[idx]
        return float((err * err).mean()), idx.tolist()

    return step
