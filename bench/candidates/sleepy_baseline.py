"""Adversarial: exports its own baseline that sleeps, so its candidate (the same work) would look faster.

The verifier never times a student's baseline: against perflab's reference this candidate is 1.0x.
"""

import time

from perflab.verify.candidates import toy_step


def make_baseline_step(seed):
    inner = toy_step(seed, repeats=10)

    def step():
        time.sleep(0.003)
        return inner()

    return step


def make_step(seed):
    return toy_step(seed, repeats=10)
