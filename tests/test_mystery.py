"""Lab 1's mystery pipeline: a pipeline per student id with planted bugs, the reference investigation
that finds them with the lab's tools, and the grader's judges (diagnosis, re-measured fix, trace)."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import labs_helpers as H
import pytest

from perflab import mystery
from perflab.grading import judging
from perflab.grading.probing import run_probes
from perflab.labs.lab01 import mystery as lab01_mystery
from perflab.labs.lab01.judges import mystery as judges
from perflab.labs.lab01.judges import mystery_truth as truths
from perflab.labs.lab01.judges.mystery_truth import BY_KEY, CATALOGUE
from perflab.mystery import KINDS, TOOLS

LAB = "lab01_measure"
IDS = ("alice", "bob", "carol")


def _ctx(student: str, observations: dict[str, Any], mode: str = "tiny") -> judging.Context:
    return judging.Context(LAB, 11, mode, observations, student=student)


def _log(planted: Any, findings: Any, digest: str) -> list[dict[str, Any]]:
    """What `lab01_mystery.savings` logs in a notebook that timed, for each finding at a planted bug, a
    copy changing that bug's lines alone, and read the finding's `saves`."""
    out = []
    for f in findings if isinstance(findings, list) else []:
        line = f.get("line") if isinstance(f, dict) else None
        hit = next((p for p in planted if isinstance(line, int) and line in p.accepted_lines), None)
        if hit is not None and isinstance(f.get("saves"), (int, float)):
            out.append({"planted": digest, "lines": list(hit.lines), "saves": float(f["saves"])})
    return out


def _mark(grade_id: str, namespace: dict[str, Any], student: str, measured: bool = True) -> judging.Mark:
    """`grade_id`'s mark for `namespace`; with `measured`, as if the notebook's run had measured each
    finding's saving (`_log`); without, as if it typed them."""
    case = truths.truth(student, "tiny")
    log = _log(case.planted, namespace.get("DIAGNOSIS"), lab01_mystery.text_digest(case.source)) if measured else []
    lab01_mystery._MEASURED[:] = log
    try:
        observations = run_probes({grade_id: lab01_mystery.PROBES[grade_id]}, namespace, 11)
    finally:
        lab01_mystery._MEASURED.clear()
    return judging.judge_cell(grade_id, judges.JUDGES[grade_id], _ctx(student, observations))


def _score(findings: list[dict[str, Any]], planted: Any, savings: dict[str, float] | None) -> judges.DiagnosisScore:
    """`score_diagnosis` of findings whose savings the notebook's run measured."""
    return judges.score_diagnosis(findings, planted, savings, _log(planted, findings, "d"), "d")


def _finding(line: int, kind: str, function: str = "Trainer.step", saves: float = 0.1) -> dict[str, Any]:
    return {"line": line, "function": function, "kind": kind, "tool": "line_profiler",
            "evidence": "it took most of the step", "fix": "removed it", "saves": saves}


def _right_answers(student: str) -> list[dict[str, Any]]:
    """Every planted bug at its line, its type, and the saving the grader measures (as an honest
    notebook, re-run on the grading machine, measures it)."""
    savings = judges.measured_savings(student, "tiny")  # a memory-only bug is not timed: it saves nothing
    return [_finding(p.lines[-1], p.kind, p.function, round(savings.get(p.key, 0.0), 3))
            for p in truths.truth(student).planted]


# ---------------------------------------------------------------------------------------------
# The catalogue and the draw


def test_the_catalogue_holds_eight_bugs_of_every_type_each_shown_by_a_tool() -> None:
    assert len(CATALOGUE) >= 8
    assert {b.kind for b in CATALOGUE} == set(KINDS)
    assert len({b.tool for b in CATALOGUE}) >= 4 and {b.tool for b in CATALOGUE} <= set(TOOLS)
    assert len({b.key for b in CATALOGUE}) == len(CATALOGUE)


def test_each_id_draws_its_own_pipeline_and_the_same_one_every_time() -> None:
    cases = {sid: truths.truth(sid) for sid in IDS}
    assert {sid: c.source for sid, c in cases.items()} == {sid: mystery.for_student(sid).source for sid in IDS}
    sets = {frozenset(p.key for p in c.planted) for c in cases.values()}
    assert len(sets) == len(IDS), "three ids, three different bug sets"
    for case in cases.values():
        assert len(case.planted) == mystery.BUGS_PER_PIPELINE and len({p.kind for p in case.planted}) >= 2
        lines = case.source.splitlines()
        for planted in case.planted:
            bug = next(b for b in CATALOGUE if b.key == planted.key)
            assert [lines[n - 1].strip() for n in planted.lines] == [
                t.strip() for t in bug.code(planted.dose, mystery._amounts(case.student))]
        compile(case.source, "mystery", "exec")
    # Over many ids every bug is drawn, and where a bug sits moves with the id.
    drawn = {p.key for i in range(60) for p in truths.truth(f"s{i}").planted}
    assert drawn == {b.key for b in CATALOGUE}
    assert len({c.planted[0].lines for c in cases.values()}) > 1


def test_the_student_id_is_the_graders_first(monkeypatch) -> None:
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    monkeypatch.delenv(mystery.STUDENT_ENV, raising=False)
    with pytest.raises(ValueError, match="MY_ID"):
        mystery.student_id("")
    assert mystery.student_id(" alice ") == "alice"
    monkeypatch.setenv(mystery.STUDENT_ENV, "bob")
    assert mystery.student_id("alice") == "bob"


def test_every_planted_bug_trains_exactly_as_the_clean_pipeline(tiny_data) -> None:
    """A bug only costs time: the planted pipeline's losses and samples are the clean one's, so the
    grader can hold a fixed copy to the planted pipeline's training."""
    def run(bugs: tuple[str, ...], light: str | None = None) -> tuple[list[float], list[list[int]]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = truths.pipeline("clean", "tiny", bugs=bugs, light=light).module().make_step(3)
            out = [step() for _ in range(3)]
        return [float(loss) for loss, _ in out], [list(i) for _, i in out]

    clean = run(())
    for bug in CATALOGUE:
        assert run((bug.key,)) == clean, bug.key
        if bug.light:
            assert run((bug.key,), light=bug.key) == clean, f"{bug.key} at its light dose"


def test_each_pipeline_plants_one_bug_that_costs_time_at_a_light_dose_and_the_others_at_a_full_one() -> None:
    """So the savings of a pipeline's bugs are clearly apart (what each dose costs: make bench-mystery),
    and one guessed saving for every bug cannot agree with all of them."""
    for i in range(200):
        case = truths.truth(f"s{i}")
        timed = [p for p in case.planted if BY_KEY[p.key].costs_time]
        assert [p.dose for p in timed].count("light") == 1, (case.student, timed)
        for p in timed:
            bug = BY_KEY[p.key]
            assert p.dose == "light" if bug.always_light else (p.dose == "full" or bool(bug.light)), p
        # A copy with one bug left out keeps the others' doses (the grader's savings copies).
        key = timed[0].key
        copy = truths.pipeline(case.student, bugs=tuple(p.key for p in case.planted if p.key != key))
        assert {p.key: p.dose for p in copy.planted} == {p.key: p.dose for p in case.planted if p.key != key}


def _differing(a: str, b: str) -> set[int]:
    """Lines (1-based) of `a` that a line diff against `b` does not match."""
    import difflib

    ops = difflib.SequenceMatcher(None, a.splitlines(), b.splitlines(), autojunk=False).get_opcodes()
    return {n + 1 for tag, i1, i2, _, _ in ops if tag != "equal" for n in range(i1, i2)}


def test_the_grader_recomputes_the_truth_with_exact_lines_from_the_pipeline_the_kit_writes() -> None:
    """The kit writes the pipeline and says nothing of what it carries; the grader renders the same source
    and keeps its own account. Its lines point at the bug's code, and an id's pipeline differs from its
    own clean copy (the same harmless edits) at exactly the planted lines."""
    for i in range(40):
        student = f"s{i}"
        case = truths.truth(student)
        assert case.source == mystery.for_student(student).source and case.run_id == mystery.for_student(student).run_id
        lines = case.source.splitlines()
        for p in case.planted:
            assert [lines[n - 1].strip() for n in p.lines] == [t.strip() for t in BY_KEY[p.key].code(p.dose, mystery._amounts(case.student))], p
        assert _differing(case.source, truths.pipeline(student, bugs=()).source) == {
            n for p in case.planted for n in p.lines}, student


def test_two_ids_pipelines_differ_where_nothing_is_planted() -> None:
    """Diffing one's pipeline against a classmate's lists lines that are no bug: two ids that drew the same
    bugs at the same doses still differ beyond their name and run (harmless edits: names of locals,
    comments, docstrings, a logging interval, the order of helpers), and every such line of either is
    outside its planted lines. The truth's line numbers still hold the bugs' code."""
    plans: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for i in range(400):
        plans.setdefault(mystery._plan(f"s{i}"), []).append(f"s{i}")
    pairs = [ids[:2] for ids in plans.values() if len(ids) > 1][:5]
    assert len(pairs) >= 3
    for a, b in pairs:
        ta, tb = truths.truth(a), truths.truth(b)
        for case, other in ((ta, tb), (tb, ta)):
            lines = case.source.splitlines()
            by_id = {n for n, text in enumerate(lines, 1) if case.student in text or str(case.run_id) in text}
            planted = {n for p in case.planted for n in p.accepted_lines}
            # Planted lines may differ too (each id draws how much work a bug takes: `_amounts`).
            harmless = _differing(case.source, other.source) - by_id - planted
            assert len([n for n in harmless if lines[n - 1].strip()]) >= 3, (case.student, other.student)
            for p in case.planted:
                assert [lines[n - 1].strip() for n in p.lines] == [t.strip() for t in BY_KEY[p.key].code(p.dose, mystery._amounts(case.student))]
    # Over ids, every kind of harmless edit is drawn: locals, the logging constant, comments.
    sources = [mystery.for_student(f"s{i}").source for i in range(30)]
    for name, options in mystery.template.CHOICES.items():
        if name.startswith("doc_"):
            assert all(any(o in s for s in sources) for o in options), name
        else:
            assert len({o for o in options for s in sources if re.search(rf"\b{o}\b", s)}) >= 2, name
    assert len({n for s in sources for n in mystery.template.NOTES if n in s}) >= 5


def test_what_a_bug_costs_is_drawn_per_id_not_a_property_of_the_catalogue() -> None:
    """Each id draws how much of the work its bugs take (`catalogue.AMOUNTS`: columns or rows per
    operation of the row loop, which parameters get a histogram, how many images the accuracy runs on,
    a call per channel or per pixel, whether the snapshot copies the optimizer's state or the whole
    optimizer), so five of the six bugs that cost time at a full dose cost what the id drew: two ids that
    planted the same bug at the same dose pay different costs for it, and only measuring one's own
    pipeline tells what fixing it saves. Copies of one id's pipeline keep its amounts."""
    from perflab.mystery.catalogue import AMOUNTS

    drawn = {name: {mystery._amounts(f"s{i}")[name] for i in range(60)} for name in AMOUNTS}
    assert drawn == {name: set(options) for name, options in AMOUNTS.items()}
    used = {name for snippet in CATALOGUE for line in snippet.code("full") + snippet.code("light")
            for name in re.findall(r"<<(\w+)>>", line)}
    assert used == set(AMOUNTS), "every amount is one a snippet takes"
    for key in ("row_loop", "grad_histograms", "eval_accuracy", "pixel_list", "snapshot"):
        codes = {BY_KEY[key].code("full", mystery._amounts(f"s{i}")) for i in range(60)}
        assert len(codes) >= 2, key
        assert not any("<<" in line for code in codes for line in code), key
    for i in range(20):  # the grader's copies of a pipeline (one bug left out) keep the others' amounts
        case = truths.truth(f"s{i}")
        for p in case.planted:
            copy = truths.pipeline(case.student, bugs=tuple(q.key for q in case.planted if q.key != p.key))
            for q in copy.planted:
                mine = next(r for r in case.planted if r.key == q.key)
                assert [copy.source.splitlines()[n - 1] for n in q.lines] == \
                    [case.source.splitlines()[n - 1] for n in mine.lines], (case.student, q.key)


def test_every_drawn_amount_trains_exactly_as_the_clean_pipeline(tiny_data) -> None:
    """Whatever amount an id drew, the bug only costs time: its losses and samples are the clean one's."""
    from perflab.mystery.catalogue import AMOUNTS

    def run(student: str, bugs: tuple[str, ...], light: str | None = None) -> tuple[list[float], list[list[int]]]:
        source = truths.pipeline(student, "tiny", bugs=bugs, light=light).source
        source = re.sub(r"(?m)^RUN_ID = \d+", "RUN_ID = 7", source)
        import types

        module = types.ModuleType("mystery_check")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(source, "mystery_check", "exec"), module.__dict__)  # noqa: S102 - perflab's own code
            step = module.make_step(3)
            out = [step() for _ in range(3)]
        return [float(loss) for loss, _ in out], [list(i) for _, i in out]

    uses = {"row_part": ("row_loop", None), "row_block": ("row_loop", "row_loop"),
            "histogram_every": ("grad_histograms", None), "accuracy_seen": ("eval_accuracy", None),
            "pixel_read": ("pixel_list", None), "snapshot_state": ("snapshot", None)}
    assert set(uses) == set(AMOUNTS)
    for name, options in AMOUNTS.items():
        key, light = uses[name]
        for option in options:
            student = next(f"s{i}" for i in range(500) if mystery._amounts(f"s{i}")[name] == option)
            assert run(student, (key,), light) == run(student, ()), (name, option)


def test_the_harmless_edits_train_as_the_plain_script(tiny_data) -> None:
    """Two ids' clean copies differ by harmless edits and by RUN_ID; given one RUN_ID they train the
    same losses on the same samples (so a fixed copy trains as the planted pipeline whatever was drawn)."""
    def run(source: str) -> tuple[list[float], list[list[int]]]:
        import types

        module = types.ModuleType("mystery_check")
        exec(compile(source, "mystery_check", "exec"), module.__dict__)  # noqa: S102 - perflab's own code
        step = module.make_step(5)
        out = [step() for _ in range(3)]
        return [float(loss) for loss, _ in out], [list(i) for _, i in out]

    base = truths.pipeline("alice", "tiny", bugs=())
    others = [truths.pipeline(s, "tiny", bugs=()) for s in ("s1", "s2", "s3")]
    assert all(_differing(base.source, o.source) for o in others)
    want = run(base.source)
    for other in others:
        same_run = re.sub(r"(?m)^RUN_ID = \d+", f"RUN_ID = {base.run_id}", other.source)
        assert run(same_run) == want, other.student


# ---------------------------------------------------------------------------------------------
# The diagnosis


def test_a_right_diagnosis_earns_everything_and_each_mistake_costs_its_share() -> None:
    student = "erin"  # three bugs that cost step time: each a third
    planted = truths.truth(student).planted
    right = _right_answers(student)
    assert _mark("mystery_diagnosis", {"DIAGNOSIS": right}, student).fraction == 1.0
    # One bug left out: two thirds.
    assert _mark("mystery_diagnosis", {"DIAGNOSIS": right[:2]}, student).fraction == pytest.approx(2 / 3)
    # The wrong bottleneck type for one: half of that bug's share lost.
    wrong_kind = [dict(right[0], kind=next(k for k in KINDS if k != planted[0].kind)), *right[1:]]
    mark = _mark("mystery_diagnosis", {"DIAGNOSIS": wrong_kind}, student)
    assert mark.fraction == pytest.approx(5 / 6) and "type right for 2 of them" in mark.message
    # The wrong line for one: that bug's share lost, and the stray finding costs as much again.
    taken = {n for p in planted for n in p.accepted_lines}
    wrong_line = [dict(right[0], line=next(n for n in range(10, 200) if n not in taken)), *right[1:]]
    mark = _mark("mystery_diagnosis", {"DIAGNOSIS": wrong_line}, student)
    assert mark.fraction == pytest.approx(1 / 3) and "with no planted bug" in mark.message


def test_knowing_where_the_bugs_are_without_measuring_what_they_cost_earns_the_locations_only(monkeypatch) -> None:
    """The planted truth (read from the kit, or a classmate's pipeline diffed) gives lines and types; with
    the gate on, a finding's type counts only with a saving the notebook's own run measured that agrees
    with the grader's measurement. Typed savings, whatever they are (a constant, a catalogue's typical
    cost for each dose, the grader's own figures), earn the locations and nothing more. The memory-only
    bug (batch_history) saves no step time to agree on, so it earns no share at all."""
    monkeypatch.setattr(judges, "GATE_ON_SAVINGS", True)
    student = "bob"  # grad_histograms at a light dose (about 0.01 of a step), row_loop (about 0.4), batch_history
    case = truths.truth(student, "tiny")
    right = _right_answers(student)
    assert _mark("mystery_diagnosis", {"DIAGNOSIS": right}, student).fraction == 1.0
    typical = {"full": 0.3, "light": 0.03}
    catalogue_typical = [dict(f, saves=typical[p.dose]) for p, f in zip(case.planted, right, strict=True)]
    constants = [[dict(f, saves=guess) for f in right] for guess in (0.0, 0.02, 0.2, 0.5, 0.9)]
    for findings in [*constants, catalogue_typical, right]:  # right: the grader's own figures, typed in
        mark = _mark("mystery_diagnosis", {"DIAGNOSIS": findings}, student, measured=False)
        assert mark.fraction == judges.LOCATION_WORTH, (findings, mark.message)
        assert "did not measure" in mark.message and "lab01_mystery.saving" in mark.message
    # Measured, a constant ties the bug planted light with the one planted full: neither type counts.
    for guess in (0.02, 0.2):
        mark = _mark("mystery_diagnosis", {"DIAGNOSIS": [dict(f, saves=guess) for f in right]}, student)
        assert mark.fraction == judges.LOCATION_WORTH
        assert "disagrees with the grader's measurement" in mark.message
    # The right magnitudes in the wrong order: the two clearly apart lose their types.
    by_key = {p.key: f for p, f in zip(case.planted, right, strict=True)}
    swapped = dict(by_key, grad_histograms=dict(by_key["grad_histograms"], saves=by_key["row_loop"]["saves"]),
                   row_loop=dict(by_key["row_loop"], saves=by_key["grad_histograms"]["saves"]))
    assert _mark("mystery_diagnosis", {"DIAGNOSIS": list(swapped.values())}, student).fraction == judges.LOCATION_WORTH
    # Without a saving at all the form is wrong: the visible check says what is missing.
    bare = [{k: v for k, v in f.items() if k != "saves"} for f in right]
    mark = _mark("mystery_diagnosis", {"DIAGNOSIS": bare}, student)
    assert mark.fraction == 0.0 and "saves should be" in mark.message


def test_a_saving_counts_as_measured_only_from_a_copy_that_fixes_its_bug_alone_in_this_pipeline() -> None:
    """`measured_in_run`: the notebook's log must hold a reading of a copy changing this bug's lines and no
    other planted bug's, timed against this id's planted text; the saving may be rounded, or the mean or
    median of several such readings. A fix-everything copy's saving, or a reading against another
    pipeline, measures no one bug."""
    planted = truths.truth("bob").planted
    row, hist = (next(p for p in planted if p.key == k) for k in ("row_loop", "grad_histograms"))
    others = [p for p in planted if p is not row]

    def entry(lines: list[int], saves: float, digest: str = "d") -> dict[str, Any]:
        return {"planted": digest, "lines": lines, "saves": saves}

    near = row.lines[0] - 1  # an insertion before the bug's first line touches it too
    assert judges.measured_in_run(0.412, row, others, [entry(list(row.lines), 0.4123)], "d")
    assert judges.measured_in_run(0.41, row, others, [entry([near, row.lines[0]], 0.4123)], "d")  # rounded
    readings = [entry(list(row.lines), v) for v in (0.38, 0.40, 0.45)]
    assert judges.measured_in_run(0.41, row, others, readings, "d")  # their mean
    assert judges.measured_in_run(0.40, row, others, readings, "d")  # their median
    assert not judges.measured_in_run(0.42, row, others, readings, "d")  # between them: typed
    assert not judges.measured_in_run(0.4123, row, others, [entry(list(row.lines), 0.4123, "other")], "d")
    both = entry([*row.lines, *hist.lines], 0.4123)  # a copy that fixes two bugs
    assert not judges.measured_in_run(0.4123, row, others, [both], "d")
    assert not judges.measured_in_run(0.4123, row, others, [entry([1], 0.4123)], "d")  # a line of no bug
    for forged in ([{"planted": "d", "lines": "all", "saves": 0.4}], [{"planted": "d", "lines": [row.lines[0]]}],
                   ["x"], [entry(list(row.lines), float("nan"))]):
        assert not judges.measured_in_run(0.4, row, others, forged, "d"), forged


def test_the_labs_saving_logs_the_lines_its_copy_changes_for_the_probe(tiny_data, tmp_path) -> None:
    """`lab01_mystery.saving` logs, for the diagnosis probe, the planted text it timed against and the lines
    its copy changed: a copy without one bug reads as that bug's planted lines alone."""
    student = "erin"
    case = truths.truth(student, "tiny")
    planted = case.write(tmp_path / "planted.py")
    bug = next(p for p in case.planted if BY_KEY[p.key].costs_time)
    only = truths.pipeline(student, "tiny", bugs=tuple(q.key for q in case.planted if q.key != bug.key))
    lab01_mystery._MEASURED.clear()
    try:
        saved = lab01_mystery.saving(planted, only.write(tmp_path / "only.py"), rounds=2)
        observed = lab01_mystery.probe_diagnosis({"DIAGNOSIS": []}, 0)["measured"]
    finally:
        lab01_mystery._MEASURED.clear()
    assert observed == [{"planted": lab01_mystery.text_digest(case.source), "lines": observed[0]["lines"],
                         "saves": saved}]
    assert set(observed[0]["lines"]) & set(bug.lines) and set(observed[0]["lines"]) <= set(
        bug.lines) | {min(bug.lines) - 1, max(bug.lines) + 1}, (observed, bug.lines)
    others = [p for p in case.planted if p.key != bug.key]
    assert judges.measured_in_run(round(saved, 3), bug, others, observed, lab01_mystery.text_digest(case.source))


def test_the_grader_measures_savings_in_a_process_of_its_own_and_a_failed_measurement_costs_the_student_nothing(
        monkeypatch, capfd) -> None:
    """The savings are measured in processes forked from one measuring server (torch's thread count is one
    per process, and the grader grades notebooks on threads): the server is started once and serves every
    measurement after, and nothing of it reaches this process's output (in a notebook's kernel that is the
    test cell's stderr). When a measurement fails, a finding is judged on line and type, the mark says the
    savings were not checked, and the next measurement starts a new server."""
    import os
    import threading
    import time

    import psutil

    from perflab.labs import measuring_server
    from perflab.labs.lab01.judges import savings_server

    judging.warm_up(LAB, "tiny")  # what a grading run does before its first notebook
    judging.warm_up("lab00_fixture")  # a lab whose judges need nothing started: nothing happens
    server = measuring_server._Server.process
    assert server is not None and server.pid != os.getpid()
    judges.measured_savings.cache_clear()
    savings = judges.measured_savings("dave", "tiny")
    # The bugs that cost step time (dave's batch_history only holds memory: it earns no share, so it is not timed).
    assert set(savings) == {p.key for p in truths.truth("dave", "tiny").planted if p.key != "batch_history"}
    assert all(0.0 <= value < 1.0 for value in savings.values()), savings
    assert judges.measured_savings("dave", "tiny", 1).keys() == savings.keys()
    assert measuring_server._Server.process is server and server.poll() is None  # one server for both
    assert capfd.readouterr() == ("", "")

    judges.measured_savings.cache_clear()
    monkeypatch.setattr(judges, "GATE_ON_SAVINGS", True)
    monkeypatch.setattr(judges, "SAVING_TIMEOUT_S", 0.01)
    right = [_finding(p.lines[-1], p.kind, p.function, 0.5) for p in truths.truth("dave").planted]
    mark = _mark("mystery_diagnosis", {"DIAGNOSIS": right}, "dave")
    assert mark.fraction == 1.0 and "savings not checked" in mark.message and "ran past" in mark.message
    assert server.poll() is not None and measuring_server._Server.process is None  # stopped with its measurement

    monkeypatch.setattr(judges, "SAVING_TIMEOUT_S", 180.0)
    judges.measured_savings.cache_clear()
    assert judges.measured_savings("dave", "tiny").keys() == savings.keys()  # a new server
    server = measuring_server._Server.process

    def kill_the_measurement() -> None:  # the measuring process dies (out of memory, say) mid-measurement
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for child in psutil.Process(server.pid).children():
                child.kill()
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_the_measurement)
    killer.start()
    judges.measured_savings.cache_clear()
    with pytest.raises(savings_server.SavingsUnmeasured, match="killed by signal SIGKILL without a result"):
        judges.measured_savings("dave", "tiny")
    killer.join()
    assert measuring_server._Server.process is server and server.poll() is None  # the server serves on
    server.kill()  # and if the server itself dies between two measurements, the next one starts another
    server.wait()
    judges.measured_savings.cache_clear()
    assert judges.measured_savings("dave", "tiny").keys() == savings.keys()
    assert measuring_server._Server.process is not server
    judges.measured_savings.cache_clear()


def test_a_negative_saving_reads_as_none_and_a_memory_only_bug_neither_earns_nor_costs() -> None:
    """Fixing a bug cannot slow a step: an honest reading below zero is noise around a cheap bug. A bug
    that only holds memory (batch_history) saves no step time to agree on: what its fix saves is the
    allocator's page faults, which depend on the process (the demo's reference read -0.007 in its kernel
    where the grader's fresh process read 0.10, and the marker -0.105 against 0.05). Nothing the grader
    can measure tells a finding of it from the planted truth read off the kit, so the diagnosis's marks
    are shared among the bugs that cost step time, and a finding at it neither earns nor costs."""
    planted = truths.truth("bob").planted
    cheap = next(p for p in planted if p.key == "grad_histograms")  # planted light
    costly = next(p for p in planted if p.key == "row_loop")
    memory_only = next(p for p in planted if p.key == "batch_history")
    assert not BY_KEY[memory_only.key].costs_time and all(BY_KEY[p.key].costs_time for p in (cheap, costly))
    savings = {cheap.key: 0.05, costly.key: 0.4, memory_only.key: 0.10}
    findings = [_finding(p.lines[-1], p.kind, p.function, savings[p.key]) for p in planted]
    assert _score(findings, planted, savings).fraction == 1.0
    noisy = [dict(f, saves=-0.105) if f["line"] in (cheap.lines[-1], memory_only.lines[-1]) else f for f in findings]
    assert _score(noisy, planted, savings).fraction == 1.0
    wrong = [dict(f, saves=-0.105) if f["line"] == costly.lines[-1] else f for f in findings]
    assert costly.key in _score(wrong, planted, savings).disagreeing
    at_memory_only = [f for f in findings if f["line"] == memory_only.lines[-1]]
    without_it = [f for f in findings if f["line"] != memory_only.lines[-1]]
    for graded in (savings, None):  # measured, and judged on line and type alone
        only = _score(at_memory_only, planted, graded)
        assert (only.fraction, only.stray, only.planted) == (0.0, [], 2)
        assert _score(without_it, planted, graded).fraction == 1.0


def test_a_constant_guess_orders_no_two_bugs_whose_costs_differ_clearly() -> None:
    """A guessed constant can sit in two bugs' bands (0.2 for bugs costing 0.1 and 0.3 of a step); where
    the two costs differ clearly, a tie orders neither, so both lose their counts, while the measured
    savings (any two distinct readings in the right order) keep them."""
    planted = truths.truth("bob").planted
    cheap, costly, memory_only = (next(p for p in planted if p.key == k)
                                  for k in ("grad_histograms", "row_loop", "batch_history"))
    savings = {cheap.key: 0.1, costly.key: 0.3, memory_only.key: 0.0}
    assert judges.saving_agrees(0.2, 0.1) and judges.saving_agrees(0.2, 0.3)
    constant = [_finding(p.lines[-1], p.kind, p.function, 0.2) for p in planted]
    score = _score(constant, planted, savings)  # even measured: the two readings tie
    assert set(score.disagreeing) == {cheap.key, costly.key} and score.fraction == judges.LOCATION_WORTH
    measured = [dict(f, saves={cheap.lines[-1]: 0.19, costly.lines[-1]: 0.21}.get(f["line"], 0.2)) for f in constant]
    assert _score(measured, planted, savings).fraction == 1.0


def test_two_bugs_read_near_each_other_keep_their_counts_in_either_order_but_not_tied_or_clearly_reversed() -> None:
    """Each pipeline plants one bug that costs time at a light dose. Where the grader's own readings are not
    clearly apart (here 0.05 and 0.12), a notebook that read the light one above the full one (its kernel
    shares the machine with other work) keeps both: the demo's reference under load read 0.2 beside 0.164
    where the grader read 0.07 and 0.13. Where they are clearly apart, a reading slightly the other way
    round keeps both too (bench-id-44's honest notebook read 0.107 beside 0.097 where the grader read 0.005
    and 0.106); a tie, or a reading clearly the other way round, loses both."""
    case = next(c for c in (truths.truth(f"s{i}") for i in range(200))
                if sum(BY_KEY[p.key].costs_time for p in c.planted) == 2)
    light, full = sorted((p for p in case.planted if BY_KEY[p.key].costs_time), key=lambda p: p.dose != "light")
    assert (light.dose, full.dose) == ("light", "full")

    def score(own: dict[str, float], savings: dict[str, float]) -> judges.DiagnosisScore:
        findings = [_finding(p.lines[-1], p.kind, p.function, own.get(p.key, 0.0)) for p in case.planted]
        return _score(findings, case.planted, savings)

    near = {light.key: 0.05, full.key: 0.12}
    assert not judges._clearly_apart(0.05, 0.12)
    assert score({light.key: 0.03, full.key: 0.09}, near).fraction == 1.0
    assert score({light.key: 0.09, full.key: 0.07}, near).fraction == 1.0  # read the other way round: kept
    apart = {light.key: 0.02, full.key: 0.30}
    assert judges._clearly_apart(0.02, 0.30)
    assert score({light.key: 0.03, full.key: 0.25}, apart).fraction == 1.0
    assert score({light.key: 0.16, full.key: 0.15}, apart).fraction == 1.0  # slightly reversed: noise
    assert set(score({light.key: 0.15, full.key: 0.15}, apart).disagreeing) == {light.key, full.key}  # a tie
    near_floor = {light.key: 0.02, full.key: 0.12}  # apart, and each band reaches past the other's reading
    assert judges._clearly_apart(0.02, 0.12) and judges._clearly_apart(0.19, 0.02)
    assert judges.saving_agrees(0.19, 0.02) and judges.saving_agrees(0.02, 0.12)
    assert set(score({light.key: 0.19, full.key: 0.02}, near_floor).disagreeing) == {light.key, full.key}


def test_a_finding_loses_its_count_only_when_two_independent_measurements_disagree_with_it(monkeypatch) -> None:
    """The grader measures once; where a finding disagrees, it measures again in a fresh process and judges
    each finding against the better of the two (a noisy grader reading costs an honest student nothing)."""
    planted = truths.truth("bob", "tiny").planted
    first = {"grad_histograms": 0.02, "row_loop": 0.4, "batch_history": 0.0}  # a noisy first reading
    second = {"grad_histograms": 0.12, "row_loop": 0.38, "batch_history": 0.0}
    calls: list[int] = []

    def fake(student: str, mode: str | None, attempt: int = 0) -> dict[str, float]:
        calls.append(attempt)
        return (first, second)[attempt]

    monkeypatch.setattr(judges, "GATE_ON_SAVINGS", True)
    monkeypatch.setattr(judges, "measured_savings", fake)
    honest = [_finding(p.lines[-1], p.kind, p.function, {"grad_histograms": 0.2, "row_loop": 0.41}.get(p.key, 0.0))
              for p in planted]
    assert _mark("mystery_diagnosis", {"DIAGNOSIS": honest}, "bob").fraction == 1.0 and calls == [0, 1]
    calls.clear()
    guessed = [dict(f, saves=0.9) for f in honest]  # read off a copy that is not one fix alone, say
    mark = _mark("mystery_diagnosis", {"DIAGNOSIS": guessed}, "bob")
    assert mark.fraction == judges.LOCATION_WORTH and calls == [0, 1] and "measured here" in mark.message
    calls.clear()
    mark = _mark("mystery_diagnosis", {"DIAGNOSIS": guessed}, "bob", measured=False)
    assert mark.fraction == judges.LOCATION_WORTH and calls == [0]  # typed in: nothing to measure again
    calls.clear()
    assert _mark("mystery_diagnosis", {"DIAGNOSIS": [dict(f, saves={"grad_histograms": 0.02}.get(p.key, f["saves"]))
                                                     for p, f in zip(planted, honest, strict=True)]},
                 "bob").fraction == 1.0 and calls == [0]  # agrees with the first: no second measurement


def test_the_notebooks_saving_and_the_graders_are_measured_in_one_state_whatever_the_kernel_did(
        tiny_data, tmp_path) -> None:
    """A held-out honest diagnosis lost a finding where the notebook's kernel read a saving of 0.061 and the
    grader's fork read 0.22: one function, two processes in different states. Both now measure in a fork of
    the one measuring server (`measuring_server`): a kernel with torch's pool started at two threads, a
    profiler, tracemalloc and anomaly mode left on (each moves a reading: cProfile left on read an
    accuracy bug at 0.165 of a step where a fresh process read 0.232) measures as the grader does."""
    import cProfile
    import tracemalloc

    import torch

    from perflab.labs.lab01.judges import savings_server

    student = "dave"
    case = truths.truth(student, "tiny")
    planted = case.write(tmp_path / "planted.py")
    key = next(p.key for p in case.planted if BY_KEY[p.key].costs_time)
    only = truths.without(student, "tiny", key).write(tmp_path / "only.py")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    torch.ones(256, 256) @ torch.ones(256, 256)  # the pool started, as every kernel's is by part 10
    profiler = cProfile.Profile()
    tracemalloc.start()
    torch.autograd.set_detect_anomaly(True)
    profiler.enable()
    try:
        lab01_mystery.savings(planted, [only])
    finally:
        profiler.disable()
        tracemalloc.stop()
        torch.autograd.set_detect_anomaly(False)
        torch.set_num_threads(threads)
    notebook = dict(lab01_mystery.MEASURED_STATE)
    savings_server.measure(student, "tiny", "", 180.0)
    clean = {"forked_from_server": True, "torch_threads": 1, "tracer": False, "tracemalloc": False,
             "anomaly": False, "grad": True}
    assert notebook == savings_server.LAST_STATE == clean, (notebook, savings_server.LAST_STATE)


def test_an_honest_saving_measured_with_the_labs_helper_agrees_with_the_graders(tiny_data, tmp_path) -> None:
    """What `lab01_mystery.saving` measures of a copy with one fix is what the grader measures of that bug."""
    student = "erin"
    case = truths.truth(student, "tiny")
    planted = case.write(tmp_path / "planted.py")
    truth = judges.measured_savings(student, "tiny")
    for p in case.planted:
        only = truths.pipeline(student, "tiny", bugs=tuple(q.key for q in case.planted if q.key != p.key))
        measured = lab01_mystery.saving(planted, only.write(tmp_path / f"only_{p.key}.py"))
        assert judges.saving_agrees(measured, truth[p.key]), (p.key, measured, truth[p.key])


def test_a_bug_reported_line_by_line_counts_once_and_costs_nothing() -> None:
    student = next(f"s{i}" for i in range(200) if any(len(p.lines) > 1 for p in truths.truth(f"s{i}").planted))
    planted = truths.truth(student).planted
    savings = judges.measured_savings(student, "tiny")
    each_line = [_finding(n, p.kind, saves=savings[p.key]) for p in planted for n in p.lines]
    assert len(each_line) > len(planted)
    assert _mark("mystery_diagnosis", {"DIAGNOSIS": each_line}, student).fraction == 1.0


def test_a_finding_in_a_helper_only_the_bug_calls_counts() -> None:
    student = next(f"s{i}" for i in range(200) if any(p.helper_lines for p in truths.truth(f"s{i}").planted))
    planted = truths.truth(student).planted
    savings = judges.measured_savings(student, "tiny")
    answers = [_finding(p.helper_lines[-1] if p.helper_lines else p.lines[0], p.kind, saves=savings[p.key])
               for p in planted]
    assert _mark("mystery_diagnosis", {"DIAGNOSIS": answers}, student).fraction == 1.0


def test_a_diagnosis_by_diffing_classmates_pipelines_earns_no_more_than_the_locations(monkeypatch) -> None:
    """A reader who diffs their pipeline against classmates' and reports each differing line (or the
    lines where the classmates disagree with each other too) with typed savings: the harmless edits are
    strays that cost as much as a right finding earns, and a typed saving earns no type, so the diff
    earns at most the locations, and on every id here less."""
    monkeypatch.setattr(judges, "GATE_ON_SAVINGS", True)
    monkeypatch.setattr(judges, "measured_savings", lambda student, mode, attempt=0: dict.fromkeys(
        (p.key for p in truths.truth(student, "tiny").planted), 0.3))
    for student in ("alice", "bob", "carol", "erin"):
        own = truths.truth(student, "tiny")
        lines = own.source.splitlines()
        by_id = {n for n, text in enumerate(lines, 1) if student in text or str(own.run_id) in text}
        differing = set.intersection(*(_differing(own.source, truths.truth(o, "tiny").source)
                                       for o in ("s1", "s2", "s3") if o != student)) - by_id
        findings = [_finding(n, "data", saves=0.3) for n in sorted(differing) if lines[n - 1].strip()]
        assert any(f["line"] in p.accepted_lines for f in findings for p in own.planted)  # the diff finds bugs
        mark = _mark("mystery_diagnosis", {"DIAGNOSIS": findings}, student, measured=False)
        assert mark.fraction < judges.LOCATION_WORTH and "with no planted bug" in mark.message, (student, mark.message)


def test_listing_every_line_or_copying_another_ids_answers_earns_no_more_than_a_blank() -> None:
    student = "alice"
    n = len(mystery.for_student(student).source.splitlines())
    shotgun = [_finding(line, kind) for line in range(1, n + 1) for kind in ("data",)]
    assert _mark("mystery_diagnosis", {"DIAGNOSIS": shotgun}, student).fraction == 0.0
    for other in ("bob", "erin"):  # ids whose savings earlier tests measured (cached in this process)
        copied = _right_answers(other)
        assert _mark("mystery_diagnosis", {"DIAGNOSIS": copied}, student).fraction == 0.0, other
    blank = _mark("mystery_diagnosis", {}, student)
    assert blank.fraction == 0.0 and "defines no `DIAGNOSIS`" in blank.message


@pytest.mark.parametrize("forged", [None, True, "all of them", [], [{"line": 3}], {"findings": []},
                                    [{"line": "90", "function": "f", "kind": "data", "tool": "cProfile",
                                      "evidence": "x", "fix": "y"}]])
def test_malformed_diagnoses_earn_nothing_and_say_why(forged: Any) -> None:
    mark = judging.judge_cell("mystery_diagnosis", judges.JUDGES["mystery_diagnosis"],
                              _ctx("alice", {"mystery_diagnosis": {"observed": {"findings": forged}}}))
    assert mark.fraction == 0.0 and mark.message


def test_without_the_graders_student_id_nothing_is_judged() -> None:
    mark = judging.judge_cell("mystery_diagnosis", judges.JUDGES["mystery_diagnosis"],
                              _ctx("", {"mystery_diagnosis": {"observed": {"findings": _right_answers("alice")}}}))
    assert mark.fraction == 0.0 and "no student id" in mark.message


# ---------------------------------------------------------------------------------------------
# The trace


def _events(step_us: list[float], data: float, backward: float, nodes: dict[str, float],
            student: str = "alice") -> list[list[Any]]:
    out: list[list[Any]] = [[f"ProfilerStep#{i}", 1000 * i, d] for i, d in enumerate(step_us)]
    out += [["data", 0, data], ["forward", 0, 1.0], ["backward", 0, backward]]
    out += [[f"{lab01_mystery.RUN_LABEL}{mystery.for_student(student).run_id}", 0, data / 2]]
    out += [[lab01_mystery.BACKWARD_NODE + name, 0, t] for name, t in nodes.items()]
    return out


def test_trace_answers_are_checked_against_the_graders_parse_of_the_same_trace(monkeypatch) -> None:
    # Hand-made events test the parse; whether a file is torch.profiler's is tested on real traces below.
    monkeypatch.setattr(judges, "trace_not_genuine", lambda *args: None)
    events = _events([50_000, 70_000], data=48_000, backward=30_000,
                     nodes={"ConvolutionBackward0": 20_000, "AddmmBackward0": 500})
    facts = judges.trace_facts(events)
    assert (facts.steps, facts.step_ms, facts.data_share, facts.backward_share) == (2, 60.0, 0.4, 0.25)
    right = {"step_ms": 60.4, "data_share": 0.41, "backward_share": 0.25, "top_backward": "ConvolutionBackward0"}
    obs = {"mystery_trace": {"observed": {"answers": right, "events": events}}}
    assert judging.judge_cell("mystery_trace", judges.JUDGES["mystery_trace"], _ctx("alice", obs)).fraction == 1.0
    wrong = dict(right, step_ms=120.0, top_backward="AddmmBackward0")
    obs = {"mystery_trace": {"observed": {"answers": wrong, "events": events}}}
    mark = judging.judge_cell("mystery_trace", judges.JUDGES["mystery_trace"], _ctx("alice", obs))
    assert mark.fraction == 0.5 and "step_ms" in mark.message and "top_backward" in mark.message
    # A trace of another id's pipeline (its run label), however consistent the answers, earns nothing.
    theirs = _events([50_000, 70_000], 48_000, 30_000, {"ConvolutionBackward0": 20_000}, student="bob")
    obs = {"mystery_trace": {"observed": {"answers": right, "events": theirs}}}
    mark = judging.judge_cell("mystery_trace", judges.JUDGES["mystery_trace"], _ctx("alice", obs))
    assert mark.fraction == 0.0 and "not a trace of your pipeline" in mark.message
    for events_sent in (None, [], [["ProfilerStep#1", 0, 10]]):
        obs = {"mystery_trace": {"observed": {"answers": right, "events": events_sent}}}
        assert judging.judge_cell("mystery_trace", judges.JUDGES["mystery_trace"], _ctx("alice", obs)).fraction == 0.0


def test_the_trace_probe_reads_a_real_torch_profiler_trace(tmp_path, tiny_data) -> None:
    import torch

    step = mystery.for_student("alice", "tiny").module().make_step(0)
    path = tmp_path / "trace.json"
    with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
                                on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(3):
            step()
            prof.step()
    facts = judges.trace_facts(lab01_mystery.trace_events(path))
    assert facts.runs == {f"run {mystery.for_student('alice', 'tiny').run_id}"}
    assert facts.steps == 2 and facts.step_ms > 0 and 0 < facts.data_share < 1 and 0 < facts.backward_share < 1
    assert max(facts.backward_totals, key=facts.backward_totals.get).endswith("Backward0")
    assert json.loads(path.read_text())["traceEvents"]
    assert judges.trace_not_genuine(lab01_mystery.trace_summary(path), truths.truth("alice", "tiny"), "tiny") is None


def _profile(student: str, path: Path, **options: Any) -> Path:
    import torch

    step = mystery.for_student(student, "tiny").module().make_step(0)
    with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
                                on_trace_ready=lambda p: p.export_chrome_trace(str(path)), **options) as prof:
        for _ in range(3):
            step()
            prof.step()
    return path


@pytest.fixture(scope="module")
def real_traces(tmp_path_factory, tiny_data) -> dict[str, Path]:
    """torch.profiler's traces of two ids' planted pipelines with different planted ops (ivan: python_collate,
    eval_accuracy, grad_histograms; judy: anomaly, batch_history, snapshot), cheap to profile; and ivan's
    with the Python tracer on (its frames straddle the labels' spans)."""
    folder = tmp_path_factory.mktemp("traces")
    traces = {student: _profile(student, folder / f"{student}.json") for student in ("ivan", "judy")}
    traces["ivan_stack"] = _profile("ivan", folder / "ivan_stack.json", with_stack=True, record_shapes=True)
    return traces


def _trace_mark(student: str, path: Path) -> judging.Mark:
    obs = run_probes({"mystery_trace": lab01_mystery.PROBES["mystery_trace"]},
                     {"TRACE_FILE": str(path), "TRACE_ANSWERS": _answers_of(path)}, 11)
    return judging.judge_cell("mystery_trace", judges.JUDGES["mystery_trace"], _ctx(student, obs))


def _answers_of(path: Path) -> dict[str, Any]:
    """TRACE_ANSWERS computed from the file, as the reference notebook does (right for any file)."""
    facts = judges.trace_facts(lab01_mystery.trace_events(path))
    return {"step_ms": facts.step_ms, "data_share": facts.data_share, "backward_share": facts.backward_share,
            "top_backward": max(facts.backward_totals, key=facts.backward_totals.get)}


def test_only_torch_profilers_trace_of_the_students_own_pipeline_earns_the_trace_marks(real_traces, tmp_path):
    """A real trace passes; a hand-written one (the issue's: five ProfilerStep#, the phase labels, one
    backward node, the run label) and edited real ones fail with one line, whatever the answers."""
    ivan = mystery.for_student("ivan", "tiny")
    assert _trace_mark("ivan", real_traces["ivan"]).fraction == 1.0
    assert _trace_mark("judy", real_traces["judy"]).fraction == 1.0
    assert _trace_mark("ivan", real_traces["ivan_stack"]).fraction == 1.0

    events, ts = [], 0
    for k in range(5):
        events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}", "pid": 1, "tid": 1,
                    "ts": ts, "dur": 100_000},
                   {"ph": "X", "cat": "user_annotation", "name": "data", "pid": 1, "tid": 1, "ts": ts + 1, "dur": 40_000},
                   {"ph": "X", "cat": "user_annotation", "name": f"run {ivan.run_id}", "pid": 1, "tid": 1,
                    "ts": ts + 2, "dur": 39_000},
                   {"ph": "X", "cat": "user_annotation", "name": "forward", "pid": 1, "tid": 1, "ts": ts + 40_002,
                    "dur": 20_000},
                   {"ph": "X", "cat": "user_annotation", "name": "backward", "pid": 1, "tid": 1, "ts": ts + 60_003,
                    "dur": 30_000},
                   {"ph": "X", "cat": "cpu_op", "name": lab01_mystery.CONV_NODE, "pid": 1, "tid": 1,
                    "ts": ts + 60_004, "dur": 29_000}]
        ts += 100_001
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({"traceEvents": events}))
    real = json.loads(real_traces["ivan"].read_text())
    forged_meta = tmp_path / "forged_meta.json"  # the same, under a real trace's metadata
    forged_meta.write_text(json.dumps({**{k: v for k, v in real.items() if k != "traceEvents"},
                                       "traceEvents": events + [e for e in real["traceEvents"]
                                                               if e.get("ph") != "X" or e.get("cat") == "Trace"]}))
    theirs = json.loads(real_traces["judy"].read_text())  # another id's real trace, relabelled as ivan's
    judy_run = f"run {mystery.for_student('judy', 'tiny').run_id}"
    for e in theirs["traceEvents"]:
        if e.get("name") == judy_run:
            e["name"] = f"run {ivan.run_id}"
    relabelled = tmp_path / "relabelled.json"
    relabelled.write_text(json.dumps(theirs))
    shortened = json.loads(real_traces["ivan"].read_text())  # a step's duration edited to fit an answer:
    step = next(e for e in shortened["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#"))
    forward = next(e for e in shortened["traceEvents"] if e.get("name") == "forward" and e["ts"] >= step["ts"])
    step["dur"] = forward["ts"] + forward["dur"] / 2 - step["ts"]  # ends inside its forward label
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(shortened))
    halved = json.loads(real_traces["ivan"].read_text())  # halved: it may end between two labels
    step = next(e for e in halved["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#"))
    step["dur"] = step["dur"] / 2
    halved_path = tmp_path / "halved.json"
    halved_path.write_text(json.dumps(halved))
    stripped = tmp_path / "stripped.json"  # the real events without the profiler's metadata
    stripped.write_text(json.dumps({"traceEvents": real["traceEvents"]}))
    for path, why in ((forged, "metadata"), (forged_meta, "edited trace"), (relabelled, "another pipeline"),
                      (edited, "edited trace"), (stripped, "metadata"), (halved_path, "")):
        mark = _trace_mark("ivan", path)
        assert mark.fraction == 0.0 and "not torch.profiler's trace of your pipeline" in mark.message, (path, mark)
        assert why in mark.message and "\n" not in mark.message, mark.message
        assert mark.flag == mark.message  # a person should look: flagged, never what scores it


# ---------------------------------------------------------------------------------------------
# The fix, and the reference investigation end to end


def _fix_mark(student: str, source: str | None, claim: float | None = None) -> judging.Mark:
    obs = {"mystery_fix": {"observed": {"source": source, "claim": claim, "path": "mystery_fixed.py"}}}
    return judging.judge_cell("mystery_fix", judges.JUDGES["mystery_fix"], _ctx(student, obs))


def test_an_unchanged_copy_a_missing_one_or_a_fix_that_changes_the_training_earns_nothing(tiny_data) -> None:
    student = "bob"
    planted = mystery.for_student(student, "tiny").source
    mark = _fix_mark(student, planted, claim=2.0)
    assert mark.fraction == 0.0 and "no change" in mark.message
    mark = _fix_mark(student, None)
    assert mark.fraction == 0.0 and "from a cell of the notebook" in mark.message
    # Faster by learning less: a lower learning rate changes every loss after the first step.
    cheat = planted.replace("lr=0.01", "lr=0.001")
    assert cheat != planted
    mark = _fix_mark(student, cheat)
    assert mark.fraction == 0.0 and mark.verdict is not None and mark.verdict["verdict"] == "fail", mark.message


# Honest through the verifier's gate, then a forward pass only: no backward, no update (every planted
# bug kept). The cheat stops training from the 9th step; the variant skips every other step.
_FORWARD_ONLY = """        if {when}:  # from here on: the forward loss only
            self.steps += 1
            images, labels, indices = self.next_batch()
            with torch.no_grad():
                loss = self.criterion(self.model(images), labels)
            return loss, indices.tolist()
"""


@pytest.mark.parametrize("when", ["self.steps >= 8", "self.steps >= 4 and self.steps % 2"])
def test_a_fix_that_stops_training_after_the_gate_earns_nothing(when: str, tiny_data) -> None:
    student = "bob"
    planted = mystery.for_student(student, "tiny").source
    head = "    def step(self):\n"
    assert planted.count(head) == 1
    cheat = planted.replace(head, head + _FORWARD_ONLY.format(when=when))
    mark = _fix_mark(student, cheat, claim=2.09)
    assert mark.fraction == 0.0 and mark.verdict is not None, mark.message
    assert mark.verdict["verdict"] == "fail" and "(timed steps)" in mark.message, mark.message
    assert mark.flag, "work skipped after the gate is a cheat a person should see"


def test_another_ids_fixed_copy_does_not_train_as_this_pipeline(tiny_data) -> None:
    """Each id's pipeline seeds its own run (RUN_ID): a friend's fixed copy, however fast, trains on
    other samples from other weights, and the grader's correctness gate refuses it."""
    friends_fix = truths.pipeline("bob", "tiny", bugs=()).source
    mark = _fix_mark("alice", friends_fix, claim=1.5)
    assert mark.fraction == 0.0 and mark.verdict is not None and mark.verdict["verdict"] == "fail", mark.message
    own_fix = truths.pipeline("alice", "tiny", bugs=()).source
    mark = _fix_mark("alice", own_fix)
    assert mark.fraction == 1.0, mark.message


def _solution_cells() -> tuple[str, list[str]]:
    cells = [c for c in H.source_cells(LAB) if c.cell_type == "code"]
    start = next(i for i, c in enumerate(cells) if "MY_ID = " in c.source)
    stop = next(i for i, c in enumerate(cells) if 'RESULTS["mystery"]' in c.source)
    return cells[0].source, [c.source for c in cells[start:stop]]


# Two ids here (bob: a light histogram beside a full row loop; judy: anomaly on two lines, a light snapshot);
# the demo test's reference and the lab's graded solution run the same investigation under their own ids.
# PERFLAB_TEST_IDS="alice carol u9c3c3d" adds more (what a change to the draw or the reference re-runs).
INVESTIGATED = ("bob", "judy", *os.environ.get("PERFLAB_TEST_IDS", "").split())


@pytest.mark.parametrize("student", INVESTIGATED)
def test_the_reference_investigation_finds_every_planted_bug_and_its_fix_is_verified(
        student: str, tiny_data, tmp_path, monkeypatch) -> None:
    """The solution's part 10, run as `student` (its hidden blocks run the grader's judges in this
    process): every planted bug found with its type, the fixed copy re-measured faster with the same
    training, the trace answers right."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setenv(mystery.STUDENT_ENV, student)
    monkeypatch.setenv("PERFLAB_MODE", "tiny")
    monkeypatch.chdir(tmp_path)
    setup, cells = _solution_cells()
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(setup.replace("common.setup_notebook()", ""), "setup", "exec"), namespace)
    for source in cells:
        exec(compile(re.sub(r"(?m)^%.*$", "", source), "cell", "exec"), namespace)
    planted = truths.truth(student, "tiny").planted
    found = {f["line"] for f in namespace["DIAGNOSIS"]}
    assert all(found & p.accepted_lines for p in planted), (namespace["DIAGNOSIS"], planted)
    fixed = Path(namespace["FIXED_PIPELINE"]).read_text()
    mark = _fix_mark(student, fixed, namespace["FIX_SPEEDUP"])
    assert mark.fraction == 1.0 and mark.verdict["speedup"] > judges.FIX_BAR, mark.message



def test_a_submission_that_works_on_another_ids_pipeline_scores_no_more_than_a_blank(tiny_data, tmp_path) -> None:
    """Graded as 'mallory', the reference notebook with its kernel told to draw erin's pipeline (so it
    diagnoses, fixes and traces erin's, honestly and right) earns nothing of the investigation: the grader
    judges mallory's pipeline, whatever the kernel drew, and flags the changed id for a person."""
    import nbformat

    from perflab.labs import build

    victim, cheat = truths.truth("mallory"), truths.truth("erin")
    assert not ({n for p in cheat.planted for n in p.lines} & {n for p in victim.planted for n in p.accepted_lines})
    nb = build.read_notebook(build.source_notebook(LAB))
    cell = next(c for c in nb.cells if "MY_ID = " in c.source)
    cell.source = f'import os\nos.environ["{mystery.STUDENT_ENV}"] = "erin"\n' + cell.source
    path = tmp_path / f"{LAB}.ipynb"
    nbformat.write(nb, path)
    run = H.autograde(H.course_for(LAB), LAB, "mallory", path)
    scores = {s.grade_id: s.auto_score for s in run.autograded}
    assert scores["mystery_diagnosis"] == scores["mystery_fix"] == scores["mystery_trace"] == 0, run.shortfalls()
    assert scores["time_callable_hidden"] > 0  # the rest of the notebook was graded as usual
    assert run.record.flagged and any("PERFLAB_STUDENT_ID" in f for f in run.record.flags), run.record.flags


def test_writing_the_pipeline_builds_the_data_set_it_trains_on(tmp_path, monkeypatch) -> None:
    from perflab import dataset

    monkeypatch.setenv(dataset.DATA_DIR_ENV, str(tmp_path / "data"))
    monkeypatch.setenv("PERFLAB_MODE", "tiny")
    assert not dataset.is_built("tiny")
    path = lab01_mystery.write_pipeline("alice", tmp_path / "mystery_pipeline.py")
    assert dataset.is_built("tiny") and path.read_text() == mystery.for_student("alice", "tiny").source


TRUTH_READERS = {
    # The held-out cheat's spelling, against a kit that returns no planted truth: the kit's private
    # renderer, told where each planted snippet lands, reached through a computed import and getattr (the
    # bottleneck type a guess: the kit does not say it).
    "computed_import": (
        "import importlib\n"
        "_kit = importlib.import_module('perflab.' + 'mys' + 'tery')\n"
        "_where = {}\n"
        "getattr(_kit, '_ren' + 'der')(STUDENT_ID, None, getattr(_kit, '_pl' + 'an')(STUDENT_ID),\n"
        "                              lambda key, line: _where.setdefault(key, []).append(line))\n"
        "DIAGNOSIS = [{'line': lines[-1], 'function': 'Trainer.step', 'kind': 'data', 'tool': 'line_profiler',\n"
        "              'evidence': 'it was slow', 'fix': 'removed it', 'saves': {saves}}\n"
        "             for lines in _where.values()]\n"),
}


def test_reading_the_planted_truth_earns_less_than_measuring_and_is_flagged(tiny_data, tmp_path) -> None:
    """Graded for real: the reference notebook whose investigation cell ends by replacing DIAGNOSIS with
    the planted truth (lines right, a typed saving) is flagged for a person, and earns the locations of
    the diagnosis only, where the same notebook measuring earns it all."""
    import nbformat

    from perflab.labs import build

    student = "bob"  # grad_histograms planted light, row_loop full: a constant guess cannot order them
    nb = build.read_notebook(build.source_notebook(LAB))
    cell = next(c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "mystery_investigation")
    cell.source = cell.source.replace("### END SOLUTION", TRUTH_READERS["computed_import"].replace("{saves}", "0.1")
                                      + "### END SOLUTION")
    path = tmp_path / f"{LAB}.ipynb"
    nbformat.write(nb, path)
    run = H.autograde(H.course_for(LAB), LAB, student, path)
    scores = {s.grade_id: s.auto_score for s in run.autograded}
    if judges.GATE_ON_SAVINGS:
        # The locations and nothing more: the memory-only bug earns no share, and a typed saving is no
        # measurement, so no type counts; the flag brings a person.
        assert scores["mystery_diagnosis"] == pytest.approx(8 * judges.LOCATION_WORTH), run.shortfalls()
    assert scores["mystery_fix"] == 6 and scores["time_callable_hidden"] > 0  # the rest graded as usual
    assert run.record.flagged and any("computes" in f for f in run.record.flags), run.record.flags


def test_the_bench_states_what_a_truth_reader_earns_typed_and_as_if_measured(monkeypatch) -> None:
    """`make bench-mystery` reports, per id, the drawn amounts, the grader's savings and the most a reader of
    the planted truth earns with typed savings: the locations only (half), whatever it types. As if its
    run had read them, a constant earns nothing on a pipeline as drawn (its light bug and a full one tie)
    and a typical cost per dose earns all where the costs sit near the typical ones: what the measured-in-
    this-run check holds."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_mystery

    readings = {"bob": {"grad_histograms": 0.02, "row_loop": 0.39},  # clearly apart
                "alice": {"python_collate": 0.06, "row_loop": 0.15}}  # within one band
    monkeypatch.setattr(judges, "measured_savings", lambda student, mode, attempt=0: readings[student])
    for student in readings:
        got = bench_mystery.truth_readers(student)
        assert got["savings"] == readings[student]
        assert got["constant"][0] == got["typical"][0] == judges.LOCATION_WORTH  # typed: the locations
        assert set(got["amounts"]) == {p.key for p in truths.truth(student).planted}
    bob = bench_mystery.truth_readers("bob")
    assert bob["constant"][1] == judges.LOCATION_WORTH and bob["typical"][1] == 1.0
    assert bob["amounts"]["row_loop"] == {n: mystery._amounts("bob")[n] for n in bob["amounts"]["row_loop"]}
    assert bob["amounts"]["row_loop"]  # the row loop's drawn amount is stated
