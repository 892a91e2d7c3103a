"""Adversarial: halves what CUDA events report, at import."""

import torch

from perflab.verify.candidates import toy_step

_real = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: _real(self, end) / 2


def make_step(seed):
    return toy_step(seed, repeats=10)
