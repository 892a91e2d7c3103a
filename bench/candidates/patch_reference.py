"""Adversarial: makes the reference's matmul sleep (slowing the baseline), leaving its own step alone."""

import time

import torch

from perflab.verify.candidates import toy_step

_real_matmul = torch.Tensor.__matmul__


def _slow_matmul(self, other):
    time.sleep(0.0005)
    return _real_matmul(self, other)


torch.Tensor.__matmul__ = _slow_matmul


def make_step(seed):
    step = toy_step(seed, repeats=10)

    def fast_step():
        torch.Tensor.__matmul__ = _real_matmul  # fast while its own steps run...
        try:
            return step()
        finally:
            torch.Tensor.__matmul__ = _slow_matmul  # ...slow again for the reference's

    return fast_step
