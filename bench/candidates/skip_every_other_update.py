"""Adversarial: after the gate, computes every step's loss and gradient but applies only every other
update (half the optimizer's work), still reporting every batch's samples."""

from perflab.verify.candidates import toy_step

HONEST_STEPS = 4


def make_step(seed):
    inner = toy_step(seed, repeats=5)
    cells = dict(zip(inner.__code__.co_freevars, inner.__closure__, strict=True))
    x, y, w, next_indices = (cells[k].cell_contents for k in ("x", "y", "w", "next_indices"))
    calls = [0]

    def step():
        calls[0] += 1
        if calls[0] <= HONEST_STEPS or calls[0] % 2 == 0:
            return inner()
        idx = next_indices()
        err = x[idx] @ w - y[idx]
        return float((err * err).mean()), idx.tolist()  # this step's update is skipped

    return step
