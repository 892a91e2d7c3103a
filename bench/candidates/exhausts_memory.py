"""Error case: allocates far more memory than the limit allows."""

import torch


def make_step(seed):
    hoard = []

    def step():
        while True:
            hoard.append(torch.ones(2**28))  # 1 GiB a time

    return step
