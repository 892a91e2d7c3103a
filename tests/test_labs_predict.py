"""Predict, then measure: a prediction is graded on being written, never on being right."""

from __future__ import annotations

import json
import math

import pytest

from perflab.labs import lab02, lab04, lab05, predict
from perflab.labs.lab02 import judges as hidden02
from perflab.labs.lab02 import probes as lab02_probes
from perflab.labs.lab04 import judges as hidden04
from perflab.labs.lab04 import probes as lab04_probes
from perflab.labs.lab05 import judges as hidden05
from perflab.labs.lab05 import probes as lab05_probes

WHY = "the data wait is a third of the step"


@pytest.mark.parametrize("value", [0.5, 1, 1.3, 40.0, 1e9, math.inf])
def test_any_positive_number_is_a_prediction(value: float) -> None:
    assert predict.problems("P", value, "WHY", WHY) == []


@pytest.mark.parametrize("value", [None, 0, -1.2, math.nan, "1.3x", True, [1.3]])
def test_a_missing_or_malformed_value_is_named(value: object) -> None:
    found = predict.problems("PREDICT_X", value, "WHY_X", WHY)
    assert len(found) == 1 and found[0].startswith("PREDICT_X: ")


@pytest.mark.parametrize("why", [None, "", "idk", "   ", 3])
def test_a_missing_why_is_named(why: object) -> None:
    found = predict.problems("PREDICT_X", 1.2, "WHY_X", why)
    assert len(found) == 1 and found[0].startswith("WHY_X: ")


def _judged(namespace: dict) -> str | None:
    observed = json.loads(json.dumps(predict.observe(namespace, "P", "WHY")))  # what crosses the boundary
    try:
        predict.judge(observed, "P", "WHY")
    except AssertionError as exc:
        return str(exc)
    return None


def test_the_judge_reads_only_what_the_probe_sent() -> None:
    assert _judged({"P": 1.3, "WHY": WHY}) is None
    assert _judged({"P": math.inf, "WHY": WHY}) is None  # "never" is an answer to a break-even
    assert _judged({"P": 0.01, "WHY": WHY}) is None  # far off is still a prediction: accuracy is not graded
    assert "P: " in _judged({"WHY": WHY})
    assert "P: " in _judged({"P": "fast", "WHY": WHY})
    assert "WHY: " in _judged({"P": 1.3})


def test_beside_prints_the_prediction_next_to_the_measurement() -> None:
    assert predict.beside("speedup", 1.3, 1.42) == "speedup: predicted 1.3x, measured 1.42x"
    assert predict.beside("break-even", math.inf, math.inf, unit=" steps") == "break-even: predicted never, measured never"
    assert "no prediction written" in predict.beside("speedup", None, 1.0)


@pytest.mark.parametrize(("contract", "probes", "hidden"),
                         [(lab02, lab02_probes, hidden02), (lab04, lab04_probes, hidden04), (lab05, lab05_probes, hidden05)])
def test_each_prediction_has_a_probe_and_a_judge(contract, probes, hidden) -> None:  # noqa: ANN001 - modules
    for key, (name, why) in contract.PREDICTIONS.items():
        grade_id = f"test_predict_{key}"
        observed = probes.PROBES[grade_id]({name: 2.0, why: WHY}, 0)
        hidden.JUDGES[grade_id](observed, None)
        with pytest.raises(AssertionError, match=name):
            hidden.JUDGES[grade_id](probes.PROBES[grade_id]({why: WHY}, 0), None)


def test_a_decision_without_its_why_earns_half_of_its_re_measured_cell() -> None:
    """BEST (lab 2) and CHOICE (lab 5) are read with their one line of why, through the real probes; the
    re-measured mark keeps its verdict and its reason, halved where the why is missing."""
    from perflab.grading.marks import Mark

    best = lab02.baseline_config("tiny")
    for probe, answers, why_name in ((lab02_probes.PROBES["test_best_verified"], {"BEST": best, "CLAIM": 1.0}, "WHY_BEST"),
                                     (lab05_probes.PROBES["test_choice_verified"], {"CHOICE": None, "CLAIM": 1.0},
                                      "WHY_CHOICE")):
        passed = Mark(1.0, "pass: 1.02x", {"verdict": "pass"})
        for why in (None, "", "ok", 7):
            observed = json.loads(json.dumps(probe({**answers, why_name: why}, 0)))  # what crosses the boundary
            halved = predict.with_reason(passed, why_name, observed["why"], "why")
            assert halved.fraction == 0.5 and halved.verdict == passed.verdict, halved
            assert halved.message.startswith("pass: 1.02x; " + why_name) and "half of this cell" in halved.message
        observed = json.loads(json.dumps(probe({**answers, why_name: WHY}, 0)))
        assert predict.with_reason(passed, why_name, observed["why"], "why") is passed
        failed = Mark(0.0, "fail: 0.8x")
        assert predict.with_reason(failed, why_name, None, "why").fraction == 0.0


def test_the_decision_judges_halve_a_passing_re_measurement_without_a_why(monkeypatch) -> None:
    """judge_best_verified and judge_choice as the grader calls them, the re-measurement stubbed to a pass."""
    from types import SimpleNamespace

    from perflab.grading.judging import Context
    from perflab.labs import common
    from perflab.verify.expectations import Expectation

    verdict = SimpleNamespace(outcome="pass", speedup=1.2, ci=(1.1, 1.3), claim=1.2, reason="clears 0.90x", code="")
    bar = Expectation("x", 0.9, "parity", "cpu", False, "parity")
    monkeypatch.setattr(common, "verify_against_bar", lambda *a, **k: (verdict, bar))
    best = {"type": "TrainConfig", "config": lab02.baseline_config("tiny").to_dict(), "claim": 1.2}
    for judge, observed, lab in ((hidden02.judge_best_verified, best, lab02.LAB),
                                 (hidden05.judge_choice, {"choice": None, "claim": 1.0}, lab05.LAB)):
        ctx = Context(lab, 0, "tiny")
        assert judge({**observed, "why": WHY}, ctx).fraction == 1.0
        half = judge(observed, ctx)
        assert half.fraction == 0.5 and "WHY_" in half.message, half
