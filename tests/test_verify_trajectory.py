"""The child's loss-trajectory rule, without a child process: student code is held to the reference's
loss at every step, the timed ones included; a configuration only at its first step."""

from __future__ import annotations

from perflab.verify import child
from perflab.verify.tolerance import LOSS_TOLERANCE, STUDENT_TRAJECTORY_RTOL


def _sides(reference: list[float], candidate: list[float]) -> tuple[child.Side, child.Side]:
    a, b = child.Side("baseline", None), child.Side("candidate", None)
    a.losses, b.losses = list(reference), list(candidate)
    a.indices = [[k, k + 1] for k in range(len(reference))]
    b.indices = [list(i) for i in a.indices]
    return a, b


def _timed(a: child.Side, b: child.Side, student: bool) -> list[dict[str, str]]:
    rtol, atol = LOSS_TOLERANCE["fp32"]
    trajectory = STUDENT_TRAJECTORY_RTOL["fp32"] if student else child.LOSS_TRAJECTORY_RTOL
    return child._compare_outputs(a, b, child.GATE_STEPS, len(a.losses), rtol if student else None, atol,
                                  "timed steps", trajectory)


def test_a_missed_update_in_a_timed_step_is_a_loss_mismatch_for_student_code_only() -> None:
    reference = [2.3, 2.25, 2.2, 2.1, 2.0, 1.9, 1.8, 1.7]
    # The mystery pipeline's forward-only cheat: 3% off at the first missed update (bench/bench_drift.py).
    cheat = reference[:6] + [1.8 * 1.03, 1.7 * 1.11]
    found = _timed(*_sides(reference, cheat), student=True)
    assert [p["code"] for p in found] == ["loss_mismatch"]
    assert "at step 7 (timed steps)" in found[0]["detail"] and "every timed step" in found[0]["detail"]
    assert _timed(*_sides(reference, cheat), student=False) == []  # a configuration may drift


def test_honest_rounding_in_the_timed_steps_passes() -> None:
    reference = [2.3, 2.25, 2.2, 2.1, 2.0, 1.9, 1.8, 1.7]
    assert _timed(*_sides(reference, list(reference)), student=True) == []
    nearly = [x * (1 + 0.5 * STUDENT_TRAJECTORY_RTOL["fp32"]) for x in reference]
    assert _timed(*_sides(reference, nearly), student=True) == []


def test_lower_precision_student_code_keeps_the_looser_trajectory_tolerance() -> None:
    assert STUDENT_TRAJECTORY_RTOL["fp32"] == STUDENT_TRAJECTORY_RTOL["tf32"] < STUDENT_TRAJECTORY_RTOL["bf16"]
    assert STUDENT_TRAJECTORY_RTOL["bf16"] == STUDENT_TRAJECTORY_RTOL["fp16"] == child.LOSS_TRAJECTORY_RTOL
