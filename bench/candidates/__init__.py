"""Candidate modules for bench/bench_verify.py and the verify tests: each file follows the lab contract
(`make_step(seed) -> step`, `step() -> (loss, indices)`) against perflab's toy reference
(`perflab.verify.candidates:toy_step`, 10 gradient repeats a step)."""
