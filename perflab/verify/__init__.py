"""Re-measure a claimed speedup in a fresh interpreter: noise-robust, and hard to fool.

    from perflab.verify import verify, load_expectation
    bar = load_expectation("amp_bf16")
    verdict = verify(baseline_config, candidate_config, expectation=bar.threshold, claim=1.4)
    verdict.outcome, verdict.reason, verdict.speedup, verdict.ci

The protocol (docs/DESIGN.md, "Verifying a claimed speedup"): a fresh `python -I` child binds its clocks
before any student code is imported and checks perflab's files against recorded hashes; it builds
perflab's reference baseline and the candidate, runs a correctness gate (same samples, losses within a
dtype-aware tolerance), then times interleaved A B B A blocks until the bootstrap CI of the ratio of
20th-percentile block times clears or misses the bar, or the budget runs out. The parent decides from
the child's raw block times. `candidates` holds the module contract a lab exports to.
"""

from perflab.verify.candidates import CandidateError, Side, export_functions
from perflab.verify.decide import Budget, Decision, bootstrap_ratio_ci, speedup
from perflab.verify.expectations import Expectation, load_expectation
from perflab.verify.protocol import Verdict, judge, verify

__all__ = ["Budget", "CandidateError", "Decision", "Expectation", "Side", "Verdict", "bootstrap_ratio_ci",
           "export_functions", "judge", "load_expectation", "speedup", "verify"]

import sys as _sys  # noqa: E402
import types as _types  # noqa: E402

from perflab.verify import guard as _guard  # noqa: E402


class _VerifyPackage(_types.ModuleType):
    """`from perflab import verify` gives this package; calling it runs `verify.verify`, so the package
    face reads `verify(baseline, candidate, expectation=...)` while `verify.load_expectation` still works."""

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return verify(*args, **kwargs)


_sys.modules[__name__].__class__ = _VerifyPackage

# Record perflab's file hashes as early as possible in this process (see guard.expected_hashes).
_guard.expected_hashes()
