"""Lab 06's judges and the reference answers they compare against, the answer key among them (the
reference plan and decisions, `reference_final`, `calibration_pair`); grader-only: the student bundle
and the grading sandbox leave this module out.

Each judge in `JUDGES` decides one autograded cell from what the lab's probe
(`perflab.labs.lab06.probes.PROBES`) returned: it draws the same inputs from the grader's seed, computes the
reference answer here, and raises AssertionError with the student's feedback line on the first
problem. The re-measured speedup and the accuracy run happen here too, from the exported FINAL.
A solution notebook's hidden blocks run probe and judge in-process with `check(grade_id, globals())`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perflab import env
from perflab.grading.judging import Context, Mark, check_here
from perflab.grading.probing import decode_float
from perflab.labs import lab03, lab06, predict
from perflab.labs.lab03 import judges as hidden03
from perflab.labs.lab06 import CI_SEED, PARITY, QUANTILE, Change, Plan, ratio_ci
from perflab.labs.lab06 import checks as lab06_checks
from perflab.labs.lab06 import measure as lab06_measure
from perflab.labs.lab06 import memory as lab06_memory
from perflab.labs.lab06.checks import (
    CUMULATIVE_FILE,
    VISIBLE_ABLATION,
    VISIBLE_TABLES,
    close_to,
    rows_problems,
)
from perflab.workload import REFERENCE_CHECKPOINT_STAGES, TrainConfig

# The visible test cell's example (each change halves the time), whose rows CUMULATIVE_FILE stores.
VISIBLE_EXAMPLES: tuple[dict[str, list[float]], ...] = (VISIBLE_ABLATION,)

# ---------------------------------------------------------------------------------------------
# The answer key: the reference decisions and FINAL, and the pair calibration times (the student's kit
# holds the contract, `perflab.labs.lab06`, only: a cell `FINAL = lab06.reference_final()` finds nothing)


def loader_change(info: env.MachineInfo) -> Change:
    """Loader workers on the cores the model's TRAIN_THREADS leave free (at least 1, at most 4), kept alive
    across epochs; pinned memory on CUDA. Never workers beside torch threads on every core: lab 2 showed
    that crowded setting gains little or loses."""
    workers = max(1, min(info.cpu_count - lab06.TRAIN_THREADS, 4))
    fields = {"num_workers": workers, "persistent_workers": True, "prefetch_factor": 2}
    if info.device == "cuda":
        fields["pin_memory"] = True
    name = f"{workers} loader workers" + (", pinned" if info.device == "cuda" else "")
    return Change(name, fields, "num_workers")


def precision_change(info: env.MachineInfo, mode: str | None = None) -> Change | None:
    """Lab 3's reference answer as one change: its autocast dtype with the layout this device wants, held to
    lab 3's own calibrated bar (None where no autocast runs). One change, not two: on a GPU bf16 pays with
    channels_last, not alone (docs/DESIGN.md gives the re-measured figures). Where the reference
    keeps FP32 (a CPU without bf16 hardware) it is the bare autocast, for the plan to say why it is skipped."""
    amp = lab06.amp_dtype_for(info.device)
    if amp is None:
        return None
    mode = mode or env.run_mode()
    answer, base = hidden03.reference_best(mode, info), lab03.baseline_config(mode)
    fields = {f: getattr(answer, f) for f in lab06.PRECISION_FIELDS if getattr(answer, f) != getattr(base, f)}
    if not fields.get("amp_dtype"):
        fields = {"amp_dtype": amp}
    name = f"{fields['amp_dtype']} autocast" + (" + channels_last" if fields.get("channels_last") else "")
    return Change(name, fields, lab03.EXPECTATION)


def plan_changes(info: env.MachineInfo, mode: str | None = None, *, memory_needed: bool = False,
                 expectations: Callable[[str], Any] | None = None) -> list[Plan]:
    """The ablation's changes in order, each with what to do on this machine and why.

    A change whose calibration on this hardware class found no gain (parity or a cost) is skipped:
    the calibration already measured it here. Uncalibrated changes are tried where the hardware can
    give something and kept only if the screening measures a gain. Checkpointing is a cost: it is
    forced when memory demands it, else skipped. torch.compile of ResNet-18 is tried on CUDA only, or
    where calibration says it pays (docs/DESIGN.md says what it gave on a small CPU).
    """
    from perflab.verify import load_expectation

    mode = mode or env.run_mode()
    lookup = expectations or (lambda name: load_expectation(name, info, workload=lab06.baseline_config(mode)))
    plans = []

    def judged(change: Change, hardware_can: bool, why_not: str) -> Plan:
        bar = lookup(change.expectation)
        if bar.calibrated and bar.kind == "gain":
            return Plan(change, "try", f"calibrated on {bar.hardware_class}: a gain ({bar.reason})")
        if bar.calibrated:
            return Plan(change, "skip", f"calibrated on {bar.hardware_class}: {bar.kind}, no gain to take")
        if not hardware_can:
            return Plan(change, "skip", f"not calibrated here, and {why_not}")
        return Plan(change, "try", "not calibrated for this workload on this hardware: the screening measures it")

    base = lab06.baseline_config(mode)
    if lab06.is_fed(base):  # a GPU's fed baseline (env.baseline_loader): nothing is left for a loader to do
        plans.append(Plan(loader_change(info), "skip",
                          f"this device's baseline is already fed ({lab06.fed_text(base)})"))
    else:
        plans.append(judged(loader_change(info), True, ""))
    precision = precision_change(info, mode)
    if precision is not None:
        can = info.device != "cpu" or info.cpu_bf16
        plans.append(judged(precision, can,
                            "this CPU has no bf16 hardware (AMX/AVX-512-BF16): autocast is emulated, slower"))
    if precision is None or "channels_last" not in precision.fields:
        plans.append(judged(Change("channels_last", {"channels_last": True}, "channels_last"), True, ""))
    ckpt = Change("checkpoint every stage", {"checkpoint_stages": REFERENCE_CHECKPOINT_STAGES}, "checkpoint")
    if memory_needed:
        plans.append(Plan(ckpt, "force", "the baseline's batch does not fit the memory budget without it"))
    else:
        plans.append(Plan(ckpt, "skip", "the batch fits in memory: checkpointing would only cost time"))
    compile_change = Change("torch.compile", {"compile_mode": "default"}, "compile")
    bar = lookup("compile")
    if bar.calibrated:
        plans.append(judged(compile_change, True, ""))
    elif info.device == "cuda" and mode in ("full", "grade"):
        plans.append(Plan(compile_change, "try", "not calibrated on this GPU: the screening measures it "
                                           "(compilation happens in the warm-up)"))
    else:
        plans.append(Plan(compile_change, "skip", f"not calibrated here; on {info.device} in {mode} mode "
                                            "compiling ResNet-18 costs minutes and gains nothing measurable (lab 5)"))
    return plans


def reference_decisions(info: env.MachineInfo, mode: str | None = None) -> dict[str, Any]:
    """What labs 2, 3 and 5 decide on this kind of machine where their results are not beside lab 6, as
    `lab06.plan_from` takes them ({"loader", "precision", "compile_mode"}): the loader on the cores the model's
    thread leaves free, lab 3's answer (`precision_change`) where the hardware runs it, and compile on a
    GPU in full or grade mode. The one re-entry of the notebook's `decisions` cell, of `reference_final`
    and so of calibration: before, the notebook graded alone re-entered bf16 without channels_last and no
    compile, not the plan lab 6's bar was calibrated on, and lost its re-measured cell on an H200."""
    mode = mode or env.run_mode()
    precision = precision_change(info, mode)
    can = precision is not None and (info.device != "cpu" or info.cpu_bf16)
    return {"loader": dict(loader_change(info).fields),
            "precision": dict(precision.fields) if can and precision is not None else {},
            "compile_mode": "default" if info.device == "cuda" and mode in ("full", "grade") else None}


def reference_final(mode: str = "grade", info: env.MachineInfo | None = None,
                    expectations: Callable[[str], Any] | None = None) -> TrainConfig:
    """The reference solution's FINAL without screening: the plan of `reference_decisions`, each change
    kept where the calibration calls it a gain (and checkpointing where memory demands it)."""
    from perflab.verify import load_expectation

    info = info or env.machine_info()
    mode = mode or env.run_mode()
    lookup = expectations or (lambda name: load_expectation(name, info, workload=lab06.baseline_config(mode)))
    config = lab06.baseline_config(mode)
    decided = reference_decisions(info, mode)
    for plan in lab06.plan_from(decided["loader"], decided["precision"], decided["compile_mode"], info, mode,
                                memory_needed=lab06_memory.needs_checkpointing(config, info)):
        bar = lookup(plan.change.expectation)
        if plan.action == "force" or (plan.action == "try" and bar.calibrated and bar.kind == "gain"):
            config = plan.change.apply(config)
    return config


def calibration_pair(mode: str = "grade") -> tuple[TrainConfig, TrainConfig]:
    """(baseline, candidate) that `perflab calibrate` times for `lab06.EXPECTATION` on the grading machine."""
    return lab06.baseline_config(mode), reference_final(mode)


# ---------------------------------------------------------------------------------------------
# What lab 6 starts from: the student's decisions of the labs before it, as the grader graded them

# The graded labs whose decisions lab 6 takes over, as their judges recorded them (`Mark.decision`: lab 2's
# BEST, lab 3's AMP_CONFIG, lab 4's CHECKPOINT_CHOICE, lab 5's CHOICE), as its manifest declares them.
# The grader grades them first.
STARTS_FROM = lab06.MANIFEST["starts_from"]


def earlier_results(decisions: Mapping[str, Mapping[str, Any]], machine: Any = None) -> tuple[tuple[str, str], ...]:
    """(lab, results JSON) for the notebook to read its earlier decisions from where it reads them at home
    (`lab06_report.earlier_decisions`), built from the grader's record of each graded decision
    (`decisions`: lab -> `Mark.decision`), never from a file the student's code wrote. A lab with no graded
    decision (not graded, or its decision could not be read) is left out: the notebook starts from its
    documented default there, as a student who never ran that lab does."""
    from perflab import results

    out = []
    for lab in STARTS_FROM:
        decision = decisions.get(lab)
        if not isinstance(decision, Mapping):
            continue
        try:
            if "config" in decision:
                doc = results.make(lab, {}, config=TrainConfig.from_dict(dict(decision["config"])), machine=machine)
            elif "choice" in decision:
                doc = results.make(lab, {"compile": {"choice": decision["choice"]}}, machine=machine)
            elif "checkpoint" in decision:
                doc = results.make(lab, {"checkpoint": {"stages": list(decision["checkpoint"])}}, machine=machine)
            else:
                continue
        except (TypeError, ValueError, results.ResultsError):
            continue
        out.append((lab, json.dumps(doc)))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# The reference answers and the checks built on them (the problems in words, empty when all is well)


def reference_cumulative(measurements: Mapping[str, Sequence[float]], quantile: float = QUANTILE,
                         seed: int = CI_SEED) -> list[dict[str, Any]]:
    """What `cumulative_speedups` must return (no input checks)."""
    items = list(measurements.items())
    base = items[0][1]
    q0 = float(np.quantile(np.asarray(base, float), quantile))
    return [{"name": name, "speedup": q0 / float(np.quantile(np.asarray(times, float), quantile)),
             "ci": list(ratio_ci(base, times, quantile, seed)), "cumulative": True} for name, times in items[1:]]


def visible_cumulative() -> dict[str, Any]:
    """CUMULATIVE_FILE's content: each visible example with the rows the reference gives it."""
    return {"about": "expected cumulative_speedups rows of the visible example; written by the grader's "
                     "perflab/labs/lab06/judges/ (write_visible_cumulative)",
            "cases": [{"measurements": example, "quantile": QUANTILE, "seed": CI_SEED,
                       "rows": reference_cumulative(example)} for example in VISIBLE_EXAMPLES]}


def write_visible_cumulative(path: str | Path = CUMULATIVE_FILE) -> Path:
    """Rewrite the stored rows (after a change to the contract, or to numpy's quantile or bootstrap)."""
    path = Path(path)
    path.write_text(json.dumps(visible_cumulative(), indent=2) + "\n", encoding="utf-8")
    return path


def reference_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What `ablation_table` must return (no input checks)."""
    if not rows:
        return []
    final = math.log(float(rows[-1]["speedup"]))
    out, prev = [], 1.0
    for row in rows:
        cum = float(row["speedup"])
        step = cum / prev
        share = math.log(step) / final if abs(final) >= math.log1p(PARITY) else None
        out.append({"name": row["name"], "cumulative": cum, "ci": row.get("ci"), "step": step, "share": share})
        prev = cum
    return out


def table_problems(got: Any, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with `ablation_table(rows)`'s output `got`?"""
    want = reference_table(rows)
    where = f"ablation of {len(rows)} rows (final {rows[-1]['speedup']:.4g}x)" if rows else "no rows"
    if not isinstance(got, list) or len(got) != len(want):
        return [f"{where}: expected a list of {len(want)} records, got {got!r:.120}"]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(g, Mapping):
            return [f"{where}: record {i} should be a dict"]
        for key in ("name", "cumulative", "step"):
            ok = g.get(key) == w[key] if key == "name" else close_to(g.get(key), w[key])
            if not ok:
                return [f"{where}: {w['name']}: {key} {g.get(key)!r}, expected {w[key]!r}"]
        if list(g.get("ci") or []) != list(w["ci"] or []):
            return [f"{where}: {w['name']}: ci {g.get('ci')!r}, expected the row's own {w['ci']!r}"]
        if w["share"] is None:
            if g.get("share") is not None:
                return [f"{where}: {w['name']}: share should be None when the final speedup is within "
                        f"{PARITY:.0%} of 1.0 (no gain to share), got {g.get('share')!r}"]
        elif not close_to(g.get("share"), w["share"], 1e-7):
            return [f"{where}: {w['name']}: share {g.get('share')!r}, expected log(step) / log(final) = "
                    f"{w['share']:.6g}"]
    return []


def _value_error(got: Any, what: str, must_name: str) -> None:
    """`got` (an `outcome`) must be a ValueError whose message names `must_name`."""
    assert isinstance(got, dict), f"{what}: no result"
    if "raised" not in got:
        raise AssertionError(f"{what}: expected ValueError, nothing was raised")
    assert got["raised"] == "ValueError", f"{what}: expected ValueError, got {got['raised']}: {got.get('message', '')}"
    assert must_name in str(got.get("message", "")), f"{what}: the ValueError should name {must_name!r}: {got.get('message')}"


def _value(got: Any, what: str) -> Any:
    assert isinstance(got, dict), f"{what}: no result"
    if "raised" in got:
        raise AssertionError(f"{what} raised {got['raised']}: {got.get('message', '')}")
    return got.get("value")


def _decoded(value: Any) -> Any:
    """Rows as `encode` wrote them, with numbers back as floats (NaN and infinities included)."""
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    if isinstance(value, dict):
        number = decode_float(value) if set(value) == {"float"} else None
        return number if number is not None else {k: _decoded(v) for k, v in value.items()}
    return value


def _cumulative(got: Any, measurements: Mapping[str, Any], kwargs: Mapping[str, Any]) -> None:
    assert isinstance(got, dict), "no result"
    assert got.get("mutated") is False, "cumulative_speedups changed its input measurements"
    rows = _decoded(_value(got, "cumulative_speedups"))
    problems = rows_problems(rows, measurements, reference_cumulative(measurements, **kwargs),
                             kwargs.get("quantile", QUANTILE))
    assert not problems, problems[0]


def config_of(data: Any, name: str) -> TrainConfig:
    """A configuration the notebook exported, rebuilt here from its fields."""
    assert isinstance(data, dict), f"{name} could not be read"
    if data.get("config") is None:
        raise AssertionError(f"{name}: expected a perflab.workload.TrainConfig, got {data.get('type')}")
    try:
        return TrainConfig.from_dict(dict(data["config"]))
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"{name} is not a valid TrainConfig: {exc}") from None


def judge_final_config(observed: Any, ctx: Context) -> None:
    final = config_of(observed.get("final"), "FINAL")
    steps = observed.get("chain")
    if not isinstance(steps, list):
        raise AssertionError("CHAIN: expected a list of (name, TrainConfig) pairs starting with ('baseline', BASELINE)")
    chain = [(step.get("name"), config_of(step, f"CHAIN step {step.get('name')!r}")) for step in steps]
    problems = lab06.final_problems(final, chain, ctx.mode)
    assert not problems, problems[0]
    measured_at_home(final, ctx)
    not_contradicted(final, observed, ctx)


def measured_at_home(final: TrainConfig, ctx: Context) -> None:
    """FINAL must be the configuration an ablation of the notebook's home run timed last (the changes it
    kept, as groups: the loader, the precision...), or the baseline it timed against itself: a FINAL typed
    in from elsewhere earns the re-measurement's points only."""
    from perflab.labs import homework

    if ctx.measured_at_home is None:  # no submission was read: a solution checking itself, the kit's tests
        return
    wanted = homework.change_groups(lab06.baseline_config(ctx.mode), final)
    # measure_ablation's record, or measure_chain's
    for key in [*homework.keys_of(ctx.measured_at_home, "lab06.ablation"),
                *homework.keys_of(ctx.measured_at_home, "lab06.chain")]:
        steps = key.get("changes") if isinstance(key, Mapping) else None
        if isinstance(steps, list) and all(isinstance(step, list) for step in steps) \
                and sorted({str(group) for step in steps for group in step}) == wanted:
            return
    raise AssertionError(homework.unmeasured_note("FINAL", " + ".join(wanted) or "the baseline",
                                                  ctx.measured_at_home))


def judge_cumulative_visible(observed: Any, ctx: Context) -> None:
    _cumulative(observed, VISIBLE_ABLATION, {})


def judge_cumulative_hidden(observed: Any, ctx: Context) -> None:
    good, bad = lab06_checks.cumulative_cases(ctx.seed)
    got_good, got_bad = observed.get("good"), observed.get("bad")
    assert isinstance(got_good, list) and len(got_good) == len(good), "no result for every ablation"
    for (m, kwargs), got in zip(good, got_good, strict=True):
        _cumulative(got, m, kwargs)
    assert isinstance(got_bad, list) and len(got_bad) == len(bad), "no result for every bad input"
    for (_, what), got in zip(bad, got_bad, strict=True):
        _value_error(got, f"cumulative_speedups with {what}", "measurements")


def judge_ablation_table(observed: Any, ctx: Context) -> None:
    good, bad = lab06_checks.table_cases(ctx.seed)
    for name, cases in (("visible", list(VISIBLE_TABLES)), ("good", good)):
        got = observed.get(name)
        assert isinstance(got, list) and len(got) == len(cases), "no result for every ablation"
        for rows, result in zip(cases, got, strict=True):
            problems = table_problems(_decoded(_value(result, "ablation_table")), rows)
            assert not problems, problems[0]
    assert _value(observed.get("empty"), "ablation_table([])") == [], "ablation_table([]) should be []"
    got_bad = observed.get("bad")
    assert isinstance(got_bad, list) and len(got_bad) == len(bad), "no result for every bad input"
    for (rows, value), got in zip(bad, got_bad, strict=True):
        _value_error(got, f"ablation_table with a speedup of {value}", rows[1]["name"])


def remeasured(final: TrainConfig, observed: Mapping[str, Any], ctx: Context) -> tuple[Any, Any]:
    """The grader's re-measurement of FINAL (verdict, expectation), taken once per submission: the verified
    cell grades it, the decision cell holds the home ablation against it. The claim is the verified cell's."""
    from perflab.labs import common

    claim = decode_float(observed.get("claim"))
    claim = claim if claim is not None and math.isfinite(claim) and claim > 0 else None

    def measure() -> tuple[Any, Any]:
        s = lab06.sizes(ctx.mode)
        return common.verify_against_bar(lab06.baseline_config(ctx.mode), final, lab06.EXPECTATION, claim=claim,
                                         max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds, decision=True)

    return ctx.remembered(("lab06.remeasured", json.dumps(final.to_dict(), sort_keys=True), claim), measure)


def recorded_ablations(final: TrainConfig, ctx: Context) -> list[tuple[float, Any]]:
    """(the CI's low end of the chain's last configuration against its first, where it was made) of every
    home ablation that timed FINAL's changes and says where it was made (`homework.stamp`)."""
    from perflab import timing
    from perflab.labs import homework

    wanted = homework.change_groups(lab06.baseline_config(ctx.mode), final)
    found = []
    for entry in ctx.measured_at_home or ():
        key, value = entry.get("key"), entry.get("value")
        if entry.get("kind") != "lab06.ablation" or not isinstance(key, Mapping) or not isinstance(value, Mapping):
            continue
        names, steps = key.get("names"), key.get("changes")
        if not (isinstance(names, list) and len(names) >= 2 and isinstance(steps, list)
                and all(isinstance(step, list) for step in steps)
                and sorted({str(group) for step in steps for group in step}) == wanted
                and isinstance(value.get("where"), Mapping)):
            continue
        try:
            times = value["times"]
            comparison = timing.Comparison(tuple(times[names[0]]), tuple(times[names[-1]]),
                                           int(value.get("block_steps", 1)), quantile=QUANTILE)
            found.append((comparison.ci().low, value["where"]))
        except (TypeError, ValueError, KeyError):
            continue
    return found


def not_contradicted(final: TrainConfig, observed: Mapping[str, Any], ctx: Context) -> None:
    """Suspicious (0 points, flagged) where the home ablation that timed FINAL, made on this machine and
    workload, reads faster than the grader's re-measurement of FINAL allows (`homework.contradicted`)."""
    from perflab.labs import homework

    if ctx.measured_at_home is None or final == lab06.baseline_config(ctx.mode):
        return
    homework.hold_against(recorded_ablations(final, ctx),
                          lambda: remeasured(final, ctx.observed("test_final_verified"), ctx),
                          lab06.baseline_config(ctx.mode), "FINAL")


def judge_final_verified(observed: Any, ctx: Context) -> Mark:
    from perflab.labs import common

    final = config_of(observed.get("final"), "FINAL")
    problems = lab06.final_problems(final, mode=ctx.mode)
    assert not problems, problems[0]
    verdict, expectation = remeasured(final, observed, ctx)
    return common.mark_of(verdict, expectation)


def judge_accuracy(observed: Any, ctx: Context) -> None:
    """The grader trains the baseline and FINAL itself (fixed seeds) and compares their accuracy."""
    final = config_of(observed.get("final"), "FINAL")
    problems = lab06.final_problems(final, mode=ctx.mode)
    assert not problems, problems[0]
    s = lab06.sizes(ctx.mode)
    acc = lab06_measure.accuracy_run(lab06.baseline_config(ctx.mode), final, s.accuracy_steps,
                                     image_size=s.accuracy_image_size)
    problems = lab06.accuracy_problems(acc)
    assert not problems, problems[0]


def judge_report(observed: Any, ctx: Context) -> None:
    import tempfile

    report, results = observed.get("report"), observed.get("results")
    assert isinstance(report, str), f"{lab06.REPORT_FILE}: no report written (render it with perflab.report.write_report)"
    assert isinstance(results, str), "the results file the report was made from could not be read"
    with tempfile.TemporaryDirectory(prefix="perflab-report-") as tmp:
        report_path, results_path = Path(tmp) / lab06.REPORT_FILE, Path(tmp) / f"{lab06.LAB}.json"
        report_path.write_text(report, encoding="utf-8")
        results_path.write_text(results, encoding="utf-8")
        problems = lab06_checks.report_problems(report_path, results_path)
    assert not problems, problems[0].replace(str(report_path), lab06.REPORT_FILE)


JUDGES = {
    "test_final_config": judge_final_config,
    "test_cumulative_visible": judge_cumulative_visible,
    "test_cumulative_hidden": judge_cumulative_hidden,
    "test_ablation_table": judge_ablation_table,
    "test_final_verified": judge_final_verified,
    "test_accuracy": judge_accuracy,
    "test_report": judge_report,
    **{f"test_predict_{key}": predict.judger(name, why) for key, (name, why) in lab06.PREDICTIONS.items()},
}


def check(grade_id: str, namespace: Mapping[str, Any], seed: int = 0) -> None:
    """A solution notebook's hidden block: this cell's probe and judge, in this process."""
    check_here(lab06.LAB, grade_id, namespace, seed)


if __name__ == "__main__":
    print(f"wrote {write_visible_cumulative()}")
