"""A seventh lab, written as solutions/README.md says, as one folder the kit never saw: its notebook, its
public module (`probes.py`: probes, MANIFEST, bar) and its grader's side (`judges.py`: judges, the pair its
bar is calibrated on). The real pipeline grades it in grade mode with no edit under perflab/: the bar no
folder has is calibrated first, as the kit's six are, the reference earns every autograded mark, the
baseline kept earns no re-measured speedup where the bar is a gain, and the copy as released scores 0."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from perflab.grading import nbgrader_api, pipeline, sandbox, self_calibration, state
from perflab.grading.job import Settings
from perflab.labs import registry
from perflab.verify import expectations, load_expectation

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures" / "grading"))
import cases  # noqa: E402

LAB = "lab07_workers"
PUBLIC = '''"""Lab 7's public module: what the notebook imports and what the grader reads of it."""

from perflab import env
from perflab.grading.probing import outcome
from perflab.workload import TrainConfig

MANIFEST = {
    "lab": "lab07_workers",
    "title": "Lab 7 - Workers, as a course would add them",
    "workloads": {"grade": {"cpu": ("photo", 32, 16)}},
    "bars": "graded_bars",
}
EXPECTATION = "lab07_workers"
HIDDEN_CASES = (1, 3, 8, 64)


def baseline_config(mode=None):
    """Everything in the training process, on one torch thread, at the lab's own workload where it has one."""
    s = env.mode_sizes(mode)
    data, side, batch = MANIFEST["workloads"].get(s.mode, {}).get(env.pick_device().type,
                                                                   (s.data, s.image_size, s.batch_size))
    return TrainConfig(data=data, image_size=side, batch_size=batch, threads=1)


def graded_bars(mode):
    return [(EXPECTATION, baseline_config(mode))]


PROBES = {
    "test_workers_for_visible": lambda answers, seed: outcome(answers["workers_for"], 2),
    "test_workers_for_hidden": lambda answers, seed: [outcome(answers["workers_for"], n) for n in HIDDEN_CASES],
    "test_best_verified": lambda answers, seed: {"config": answers["BEST"].to_dict()},
}
'''
JUDGES = '''"""Lab 7's grader's side: its judges and the pair its bar is calibrated on (never released)."""

from pathlib import Path

from perflab.labs import common, registry
from perflab.workload import TrainConfig

public = registry.load_file(Path(__file__).with_name("probes.py"), "lab07_workers_public")


def reference_workers(cores):
    return max(1, min(cores - 1, 4))


def judge_visible(observed, ctx):
    assert observed == {"value": 1}, f"workers_for(2) gave {observed}, expected 1"


def judge_hidden(observed, ctx):
    want = [{"value": reference_workers(n)} for n in public.HIDDEN_CASES]
    assert observed == want, f"workers_for{public.HIDDEN_CASES} gave {observed}, expected {want}"


def calibration_pair(mode="grade"):
    base = public.baseline_config(mode)
    return base, base.replace(num_workers=2)


def judge_best(observed, ctx):
    assert isinstance(observed, dict) and isinstance(observed.get("config"), dict), "BEST could not be read"
    best = TrainConfig.from_dict(dict(observed["config"]))
    base = public.baseline_config(ctx.mode)
    assert best.replace(num_workers=0) == base, "BEST may change only the loader's worker count"
    verdict, bar = common.verify_against_bar(base, best, public.EXPECTATION, decision=True)
    return common.mark_of(verdict, bar)


JUDGES = {"test_workers_for_visible": judge_visible, "test_workers_for_hidden": judge_hidden,
          "test_best_verified": judge_best}
'''


def _meta(grade_id: str, *, grade: bool = False, solution: bool = False, locked: bool = False,
          points: int | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def notebook() -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell("# Lab 7: loader workers\n\nWrite `workers_for`, then decide `BEST`: the grader "
                          "re-measures it against the bar calibrated on its own machine.",
                          metadata=_meta("intro", locked=True)),
        new_code_cell("from perflab import env\nfrom probes import baseline_config\n\nMODE = env.run_mode()\n"
                      "BASELINE = baseline_config(MODE)", metadata=_meta("setup", locked=True)),
        new_code_cell('def workers_for(cores):\n    """Loader workers for `cores` cores: one core stays with '
                      'training, 4 at most."""\n    ### BEGIN SOLUTION\n    return max(1, min(cores - 1, 4))\n'
                      "    ### END SOLUTION", metadata=_meta("workers_for_answer", solution=True)),
        new_code_cell("assert workers_for(2) == 1",
                      metadata=_meta("test_workers_for_visible", grade=True, locked=True, points=2)),
        new_code_cell('assert workers_for(8) >= 1\n### BEGIN HIDDEN TESTS\nassert workers_for(64) == 4, "hidden: '
                      '4 at most"\n### END HIDDEN TESTS',
                      metadata=_meta("test_workers_for_hidden", grade=True, locked=True, points=3)),
        new_code_cell("### BEGIN SOLUTION\nBEST = BASELINE.replace(num_workers=2)\n### END SOLUTION",
                      metadata=_meta("best_answer", solution=True)),
        new_code_cell('assert BEST.replace(num_workers=0) == BASELINE, "BEST changes only the worker count"',
                      metadata=_meta("test_best_verified", grade=True, locked=True, points=5)),
        new_markdown_cell("Why does a worker help here?\n\n=== BEGIN MARK SCHEME ===\nDecoding moves off the "
                          "training process's core.\n=== END MARK SCHEME ===",
                          metadata=_meta("answer_why", grade=True, solution=True, points=2)),
    ]
    return new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                              "language": "python"}})


def write_lab(folder: Path) -> None:
    folder.mkdir(parents=True)
    nbformat.write(notebook(), folder / f"{LAB}.ipynb")
    (folder / "probes.py").write_text(PUBLIC, encoding="utf-8")
    (folder / "judges.py").write_text(JUDGES, encoding="utf-8")


@pytest.mark.slow
def test_a_seventh_lab_written_as_one_folder_is_graded_like_the_kits_own(tmp_path, monkeypatch) -> None:
    solutions = tmp_path / "solutions"
    write_lab(solutions / LAB)
    assert registry.find(LAB) is None  # not the kit's: nothing under perflab/ names it
    course = tmp_path / "course"
    pipeline.setup(course, solutions, labs=[LAB])
    released = course / "release" / LAB
    assert (released / "probes.py").is_file() and not (released / "judges.py").exists()
    release = nbformat.read(released / f"{LAB}.ipynb", as_version=4)
    source = nbformat.read(solutions / LAB / f"{LAB}.ipynb", as_version=4)
    handed = {"reference": cases.solved(release, source),
              "lazy": cases.solved(release, source, {"best_answer": "BEST = BASELINE"}),
              "blank": release}
    for student, nb in handed.items():
        path = tmp_path / "class" / student / f"{LAB}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
        nbgrader_api.submit(course, LAB, student, path)

    # No committed bar for this machine, and one calibration run (as test_self_calibration does).
    monkeypatch.setenv(expectations.EXPECTATIONS_ENV, str(tmp_path / "no-file-for-this-machine"))
    monkeypatch.setattr(self_calibration, "REPEATS", 1)
    settings = Settings(limits=sandbox.Limits(wall_s=1500), cell_timeout=300, env={"PERFLAB_MODE": "grade"},
                        unisolated=sandbox.isolation().kind == "none")
    summary = pipeline.grade(course, settings, labs=[LAB], students=list(handed), force=True, solutions=solutions)
    print(summary.line())
    assert LAB in summary.calibration and not summary.uncalibrated, summary.line()
    public = registry.load_file(solutions / LAB / "probes.py", "seventh_public")
    bar = load_expectation("lab07_workers", directory=self_calibration.folder(course),
                           workload=public.baseline_config("grade"))
    assert bar.calibrated, bar.reason

    got = {s: {c.grade_id: c for c in nbgrader_api.scores(course, LAB, s) if not c.manual} for s in handed}
    records = {s: state.State.load(course).get(LAB, s) for s in handed}
    assert all(r.outcome == "graded" and r.uncalibrated == () for r in records.values()), records
    assert set(got["reference"]) == {"test_workers_for_visible", "test_workers_for_hidden", "test_best_verified"}
    print({s: {g: c.score for g, c in cells.items()} for s, cells in got.items()}, bar.reason)
    assert all(c.score == 0 for c in got["blank"].values()), got["blank"]
    for student in ("reference", "lazy"):
        assert got[student]["test_workers_for_visible"].score == 2 and got[student]["test_workers_for_hidden"].score == 3
    if bar.kind == "gain":  # two workers gain here: the reference clears the bar, the baseline kept does not
        assert got["reference"]["test_best_verified"].score == 5, records["reference"]
        assert got["lazy"]["test_best_verified"].score == 0, records["lazy"]
    else:  # another process kept the second core: nothing to gain, and keeping the baseline is right
        assert got["lazy"]["test_best_verified"].score == 5, records["lazy"]
