"""Adversarial: the full batch through the gate, then trains on half of each batch while reporting all
of its indices (the samples check sees the right data; the work is half)."""

from perflab.verify.candidates import toy_step

HONEST_STEPS = 4


def make_step(seed):
    inner = toy_step(seed, repeats=10)
    cells = dict(zip(inner.__code__.co_freevars, inner.__closure__, strict=True))
    x, y, w, next_indices, lr = (cells[k].cell_contents for k in ("x", "y", "w", "next_indices", "lr"))
    calls = [0]

    def step():
        calls[0] += 1
        if calls[0] <= HONEST_STEPS:
            return inner()
        idx = next_indices()
        half = idx[: len(idx) // 2]
        xb, yb = x[half], y[half]
        for _ in range(10):
            err = xb @ w - yb
            grad = xb.T @ err * (2.0 / (len(half) * xb.shape[1]))
        w.sub_(grad, alpha=lr)
        return float((err * err).mean()), idx.tolist()

    return step
