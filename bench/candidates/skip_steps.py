"""Adversarial: takes one optimizer step per two batches (skips every other step's update), at half the
work per batch, so each call still costs what a reference step costs but covers twice the data."""

from perflab.verify.candidates import toy_step


def make_step(seed):
    inner = toy_step(seed, repeats=5)

    def step():
        inner()  # this batch's update is thrown away below: its step is skipped
        return inner()

    return step
