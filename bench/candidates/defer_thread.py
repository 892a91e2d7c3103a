"""Adversarial: a background thread computes steps ahead; `step()` only pops finished results."""

import queue
import threading

from perflab.verify.candidates import toy_step


def make_step(seed):
    inner = toy_step(seed, repeats=10)
    done = queue.Queue(maxsize=64)

    def produce():
        while True:
            done.put(inner())

    threading.Thread(target=produce, daemon=True).start()
    return done.get
