"""Error case: the process kills itself mid-run."""

import os
import signal

from perflab.verify.candidates import toy_step


def make_step(seed):
    inner = toy_step(seed, repeats=8)

    def step():
        os.kill(os.getpid(), signal.SIGKILL)
        return inner()

    return step
