"""Adversarial: slows the clock at import so the baseline looks slow and the candidate fast."""

import time

from perflab.verify.candidates import toy_step

_real_ns = time.perf_counter_ns
_real = time.perf_counter
time.perf_counter_ns = lambda: _real_ns() // 2
time.perf_counter = lambda: _real() / 2


def make_step(seed):
    return toy_step(seed, repeats=10)
