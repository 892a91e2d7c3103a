"""Error case: the step never returns."""

import time


def make_step(seed):
    def step():
        while True:
            time.sleep(0.05)

    return step
