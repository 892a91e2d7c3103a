"""Honest bench candidates: perflab's toy workload with a known number of gradient repeats.

The reference does the work 10 times a step; `make_step_8` does it 8 times (a true 1.25x),
`make_step_5` 5 times (2x), and `make_step_10` 10 times (1.0x: no speedup at all).
"""

from perflab.verify.candidates import toy_step


def make_step_10(seed, **kwargs):
    return toy_step(seed, repeats=10, **kwargs)


def make_step_8(seed, **kwargs):
    return toy_step(seed, repeats=8, **kwargs)


def make_step_5(seed, **kwargs):
    return toy_step(seed, repeats=5, **kwargs)
