"""Adversarial: trains on half of each batch but reports the full batch's indices."""

from perflab.verify.candidates import toy_step


def make_step(seed):
    half = toy_step(seed, repeats=10, batch=32)
    full_order = toy_step(seed, repeats=1)

    def step():
        loss, _ = half()
        _, indices = full_order()
        return loss, indices

    return step
