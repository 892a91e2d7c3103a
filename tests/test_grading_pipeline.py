"""End to end: a class of the fixture lab (good, partial, blank and every bad input) through
`perflab grade setup / collect / grade / feedback / export / status` in a real course folder."""

from __future__ import annotations

import contextlib
import csv
import html
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from perflab.cli import main
from perflab.grading import export as export_mod
from perflab.grading import pipeline, sandbox
from perflab.grading.state import State

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "grading"))
import cases  # noqa: E402

pytestmark = pytest.mark.slow

SOLUTIONS = Path(__file__).parent / "fixtures" / "grading" / "solutions"
LAB = cases.LAB
HIDDEN_TEXT = ("hidden: large values that cancel", "hidden: fast_sum disagrees", "BEGIN HIDDEN TESTS")
# Small limits keep the class inside the test budget: a cell gets 6 s, a submission 40 s.
GRADE_ARGS = ["--wall", "40", "--cell-timeout", "6", "--memory-gb", "4", "--processes", "256",
              "--solutions", str(SOLUTIONS), *(["--unisolated"] if sandbox.isolation().kind == "none" else [])]


def outside_targets() -> list[Path]:
    """The grader's own files a submission must never write: its home, site-packages (a .pth there runs
    in every later Python of the grader) and the checkout."""
    import sysconfig

    tag = f"perflab-writeout-{os.getpid()}"
    return [Path.home() / f"{tag}.txt", Path(sysconfig.get_paths()["purelib"]) / f"{tag}.pth",
            pipeline.REPO / "perflab" / f"{tag}.py"]


def cli(*args: object) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([str(a) for a in args])
    return code, out.getvalue()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    course = root / "course"
    assert cli("grade", "setup", "--course", course, "--solutions", SOLUTIONS)[0] == 0
    code, text = cli("grade", "release", "--course", course, "--to", root / "labs")
    with zipfile.ZipFile(text.split(": ", 1)[1].strip()) as zf:
        shipped = b"".join(zf.read(n) for n in zf.namelist())
    assert code == 0 and b"BEGIN SOLUTION" not in shipped and b"hidden: large" not in shipped

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    # The escape case tries these, in order: the gradebook, another student's hand-in, a new file.
    other = course / "submitted" / "sol" / LAB / f"{LAB}.ipynb"
    forbidden = [course / "gradebook.db", other, root / "outside.txt"]
    release = course / "release" / LAB / f"{LAB}.ipynb"
    outside = outside_targets()
    expected = cases.make_class(release, SOLUTIONS / LAB / f"{LAB}.ipynb", root / "class",
                                port=server.getsockname()[1], forbidden=forbidden, outside=outside)
    download = root / "download.zip"
    with zipfile.ZipFile(download, "w") as zf:
        for path in sorted((root / "class").iterdir()):
            zf.write(path, path.name)
        zf.writestr("README.txt", "not a submission")
        zf.writestr("nobody.ipynb", "{}")
    code, collected = cli("grade", "collect", "--course", course, download)
    assert code == 0
    before = {p: p.read_bytes() for p in forbidden if p.exists()}

    started = time.perf_counter()
    code, graded_out = cli("grade", "grade", "--course", course, "--jobs", "2", *GRADE_ARGS)
    print(f"graded {len(expected)} submissions in {time.perf_counter() - started:.0f} s")
    assert code == 0, graded_out
    code, feedback_out = cli("grade", "feedback", "--course", course)
    assert code == 0, feedback_out
    assert cli("grade", "export", "--course", course)[0] == 0
    try:
        yield {"course": course, "expected": expected, "collected": collected, "graded": graded_out,
               "feedback": feedback_out, "server": server, "forbidden": forbidden, "before": before,
               "root": root, "outside": outside}
    finally:
        server.close()
        for path in outside:
            path.unlink(missing_ok=True)


def _grades(course: Path) -> dict:
    return json.loads((course / "export" / "grades.json").read_text())


def test_collect_lists_what_it_could_not_match(graded):
    text = graded["collected"]
    assert f"collected {len(graded['expected'])} submission(s)" in text
    assert "README.txt: not a notebook" in text and "nobody.ipynb: no student id" in text


def test_every_submission_gets_the_right_score(graded):
    doc = _grades(graded["course"])
    got = {s["student"]: s for s in doc["submissions"]}
    assert set(got) == set(graded["expected"])
    wrong = {student: (got[student]["score"], exp.score) for student, exp in graded["expected"].items()
             if got[student]["score"] != exp.score}
    assert wrong == {}, f"(got, expected): {wrong}"
    for student, exp in graded["expected"].items():
        assert got[student]["flagged"] == exp.flagged, (student, got[student]["flags"])
        assert (got[student]["outcome"] == "failed") == exp.failed, student


def test_feedback_has_a_clear_line_for_each_and_never_a_hidden_test(graded):
    course = graded["course"]
    for student, exp in graded["expected"].items():
        page = course / "feedback" / student / LAB / f"{LAB}.html"
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))
        assert exp.note in text, f"{student}: feedback lacks {exp.note!r}"
        for secret in HIDDEN_TEXT:
            assert secret not in text, f"{student}: feedback shows {secret!r}"
        autograded = course / "autograded" / student / LAB / f"{LAB}.ipynb"
        if autograded.exists():
            assert not any(s in autograded.read_text() for s in HIDDEN_TEXT)


def test_feedback_goes_on_past_notebooks_nbgrader_cannot_render(graded):
    """Another lab's notebook and one with a pasted foreign cell: nbgrader cannot render either; each is
    one line naming the student and the reason and a minimal page with its score, the class gets its pages."""
    course, text = graded["course"], graded["feedback"]
    problems = [line for line in text.splitlines() if line.startswith("feedback ")]
    assert sorted(line.split(":")[0] for line in problems) == [f"feedback {LAB}/otherlab", f"feedback {LAB}/unrendered"]
    assert all("MissingEntry: No such" in line for line in problems), problems
    n = len(graded["expected"])
    assert f"wrote {n} feedback page(s), 2 of them minimal" in text and "0 submission(s) got no page" in text
    page = (course / "feedback" / "unrendered" / LAB / f"{LAB}.html").read_text(encoding="utf-8")
    assert "Score: 10 / 10" in page


def test_the_graders_own_files_are_out_of_reach(graded):
    """The write-outside case tried the grader's home, site-packages and checkout: nothing is there."""
    assert [p for p in graded["outside"] if p.exists()] == []
    notebook = graded["course"] / "autograded" / "writeout" / LAB / f"{LAB}.ipynb"
    assert notebook.read_text().count("refused ") == 3


def test_gradebook_intact_and_nothing_escaped_the_sandbox(graded):
    from nbgrader.api import Gradebook

    course, expected = graded["course"], graded["expected"]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "perflab") as gb:
        assert sorted(s.id for s in gb.students) == sorted(expected)
        for student, exp in expected.items():
            assert gb.find_submission(LAB, student).score == exp.score
    for path, data in graded["before"].items():
        if path.name != "gradebook.db":  # the gradebook changed: by its one writer, checked above
            assert path.read_bytes() == data, f"{path} was modified"
    assert not (graded["root"] / "outside.txt").exists()
    with pytest.raises(BlockingIOError):
        graded["server"].accept()  # the network case never reached the host


def test_export_documents_cells_with_verdicts(graded):
    course = graded["course"]
    with open(course / "export" / "grades.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == export_mod.COLUMNS
    assert len(rows) == 3 * len(graded["expected"])
    cell = {(r["student"], r["cell"]): r for r in rows}
    good = cell[("sol", "test_speedup")]
    assert good["verdict"] == "pass" and float(good["speedup"]) > 1.5 and good["hardware_class"]
    assert good["code"] == "clears_bar", good  # the verifier's named reason travels with its verdict
    assert cell[("claim", "test_speedup")]["verdict"] == "fail"
    assert cell[("claim", "test_speedup")]["code"] not in ("", "clears_bar"), cell[("claim", "test_speedup")]
    assert cell[("notjson", "test_mean")]["code"] == ""
    assert cell[("claim", "test_speedup")]["flagged"] == "1"
    assert "not valid JSON" in cell[("notjson", "test_mean")]["error"]
    students = _grades(course)["students"]
    assert students["sol"] == {"score": 10.0, "max_score": 10.0, "labs": {LAB: 10.0}}


def test_status_and_a_rerun_grades_nothing_twice(graded):
    course = graded["course"]
    code, text = cli("grade", "status", "--course", course)
    counts = {line.split()[0]: int(line.split()[1]) for line in text.splitlines()
              if len(line.split()) > 1 and line.split()[1].isdigit()}
    assert "sandbox " in text and "limits " in text  # what this machine enforces, stated once
    n = len(graded["expected"])
    assert counts["pending"] == 0 and counts["graded"] + counts["failed"] == n and counts["failed"] == 1
    assert counts["flagged"] == sum(e.flagged for e in graded["expected"].values())
    before = State.load(course).records
    code, text = cli("grade", "grade", "--course", course, *GRADE_ARGS)
    assert f"graded 0 submission(s) (0 could not be run), {n} already graded" in text
    assert State.load(course).records == before
    assert all(r.merges == 1 for r in before.values())


def test_a_run_killed_half_way_resumes_without_regrading(graded):
    course, root = graded["course"], graded["root"]
    late = root / "late"
    late.mkdir()
    for name in ("late1", "late2"):
        (late / f"{name}_{LAB}.ipynb").write_bytes((root / "class" / f"blank_{LAB}.ipynb").read_bytes())
    assert cli("grade", "collect", "--course", course, late)[0] == 0
    late_args = ["--student", "late1", "--student", "late2"]
    cmd = [sys.executable, "-c", "import sys; from perflab.cli import main; sys.exit(main())", "grade", "grade",
           "--course", str(course), "--jobs", "1", *late_args, *GRADE_ARGS]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            done = [k for k in State.load(course).records if k.startswith(f"{LAB}/late")]
            if done:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run finished before it could be stopped"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    first = {k: v for k, v in State.load(course).records.items() if k.startswith(f"{LAB}/late")}
    assert len(first) == 1
    base = pipeline.sandbox_base()
    left = [lock.with_suffix("") for lock in base.glob(f"{LAB}-*.lock")
            if lock.read_text().split()[:1] == [str(proc.pid)]]  # the killed grader's work folders
    code, text = cli("grade", "grade", "--course", course, *late_args, *GRADE_ARGS)
    assert "graded 1 submission(s)" in text and "1 already graded" in text
    for folder in left:
        assert not folder.exists() and f"removed {folder}" in text, text
    after = State.load(course).records
    for key, record in first.items():
        assert after[key] == record  # not graded again
    assert all(after[f"{LAB}/{s}"].score == 0 and after[f"{LAB}/{s}"].merges == 1 for s in ("late1", "late2"))


def test_a_fault_while_recording_one_submission_never_stops_the_batch(graded, monkeypatch):
    """Any exception while recording one result (gradebook, feedback copy, state) is that submission's
    line and the batch goes on; a recorded failure is not repeated by the next run, and a result that
    could not be recorded at all stays pending for it."""
    from perflab.grading import pipeline

    course, root = graded["course"], graded["root"]
    folder = root / "faults"
    folder.mkdir()
    students = ("boom1", "boom2", "calm")
    for name in students:
        (folder / f"{name}_{LAB}.ipynb").write_bytes((root / "class" / f"blank_{LAB}.ipynb").read_bytes())
    assert cli("grade", "collect", "--course", course, folder)[0] == 0
    real = pipeline.merge

    def faulty(course, job, info, result, state, **kw):
        if job.student == "boom1" and not result.error:
            raise RuntimeError("the disk is full")  # the result fails, recording the failure works
        if job.student == "boom2":
            raise RuntimeError("the gradebook is locked")  # nothing can be recorded
        return real(course, job, info, result, state, **kw)

    monkeypatch.setattr(pipeline, "merge", faulty)
    selection = [arg for s in students for arg in ("--student", s)]
    code, text = cli("grade", "grade", "--course", course, "--jobs", "1", *selection, *GRADE_ARGS)
    assert code == 0 and "graded 1 submission(s) (2 could not be run)" in text, text
    records = State.load(course).records
    assert records[f"{LAB}/calm"].outcome == "graded" and records[f"{LAB}/calm"].score == 0
    boom = records[f"{LAB}/boom1"]
    assert boom.outcome == "failed" and any("could not record this result (RuntimeError)" in n for n in boom.notes)
    assert "the disk is full" not in " ".join(boom.notes)  # a grader fault, never the grader's traceback
    assert f"{LAB}/boom2" not in records

    monkeypatch.setattr(pipeline, "merge", real)
    code, text = cli("grade", "grade", "--course", course, "--jobs", "1", *selection, *GRADE_ARGS)
    assert "graded 1 submission(s) (0 could not be run), 2 already graded" in text, text
    after = State.load(course).records
    assert after[f"{LAB}/boom1"] == boom and after[f"{LAB}/boom2"].score == 0


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The plain `nbgrader` command of this environment, run in the course folder as an instructor would."""
    scripts = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(scripts / "nbgrader"), *args], cwd=course, env=env, capture_output=True, text=True,
                          timeout=180, check=False)


def test_plain_nbgrader_works_in_the_course_folder(graded):
    """The nbgrader_config.py the kit copies into a course folder (here one made with --course) makes that
    folder nbgrader's course: its gradebook, its assignments, its feedback."""
    from nbgrader.api import Gradebook

    course = graded["course"]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "perflab") as gb:
        students = sorted(s.id for s in gb.students)
    listed = _nbgrader(course, "db", "student", "list")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert f"There are {len(students)} students in the database" in listed.stdout + listed.stderr
    assignments = _nbgrader(course, "db", "assignment", "list")
    assert assignments.returncode == 0 and f"{LAB} (due: None)" in assignments.stdout + assignments.stderr
    page = course / "feedback" / "sol" / LAB / f"{LAB}.html"
    page.unlink()
    made = _nbgrader(course, "generate_feedback", LAB, "--student", "sol", "--force")
    assert made.returncode == 0 and page.is_file(), made.stderr[-2000:]


@contextlib.contextmanager
def _formgrader(course: Path):
    """A Jupyter server started in the course folder (formgrader is its nbgrader extension), on a free
    port of 127.0.0.1 with a token; yields (base url, token) and stops it."""
    import secrets
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_hex(16)
    log = course.parent / "formgrader.log"
    cmd = [str(Path(sys.executable).parent / "jupyter-server"), "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.token={token}", f"--ServerApp.root_dir={course}", "--ServerApp.port_retries=0",
           *(["--allow-root"] if os.geteuid() == 0 else [])]  # CI's container runs as root
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=course, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                request = urllib.request.Request(f"{base}/formgrader/api/status",
                                                 headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(request, timeout=5):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        yield base, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _api(base: str, token: str, path: str, body: dict | None = None) -> object:
    import urllib.request

    request = urllib.request.Request(f"{base}/formgrader/api/{path}", method="GET" if body is None else "PUT",
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def test_formgrader_in_the_course_folder_shows_the_graded_lab_its_flags_and_takes_a_manual_score(graded, tmp_path):
    """Formgrader, served from the course folder, lists the graded lab; its Manual Grading table (rendered by
    headless Chromium) shows each submission and flags those the kit flagged, the reasons in the comment of
    the first answer cell; a score a TA enters there is what `perflab grade export` reports."""
    import urllib.parse

    from test_report_browser import run_chromium

    from perflab.grading.merge import FLAG_COMMENT_HEADER

    course = graded["course"]
    records = {r.student: r for r in State.load(course).records.values() if r.lab == LAB}
    with _formgrader(course) as (base, token):
        assignments = _api(base, token, "assignments")
        assert [a["name"] for a in assignments] == [LAB] and assignments[0]["num_submissions"] >= len(records)
        table = {s["student"]: s for s in _api(base, token, f"submitted_notebooks/{LAB}/{LAB}")}
        # nbgrader lists a submission that has an autograded notebook: not one that could not be read, nor
        # one whose outputs quote hidden tests (the kit keeps no copy of it; `perflab grade status` lists both).
        listed = {s for s in records if (course / "autograded" / s / LAB / f"{LAB}.ipynb").is_file()}
        assert set(table) >= listed and len(listed) >= len(records) - 3, sorted(set(records) - listed)
        flagged = {s for s in listed if records[s].flagged}  # what the kit flagged (most of the class)
        assert {s for s in listed if table[s]["flagged"]} == flagged and len(flagged) >= 5
        who = sorted(flagged)[0]
        comments = _api(base, token, f"comments?submission_id={table[who]['id']}")
        first = next(c for c in comments if c["name"] == "mean_answer")  # the lab's first answer cell
        assert first["auto_comment"].startswith(FLAG_COMMENT_HEADER), first
        assert all(flag in first["auto_comment"] for flag in records[who].flags)

        # Logging in through the server's /login (a cookie for the whole site, which formgrader's own pages
        # do not set) lets the page's requests to formgrader's API through, as a TA's browser does.
        page = urllib.parse.quote(f"/formgrader/gradebook/{LAB}/{LAB}")
        dom = run_chromium(tmp_path, "--virtual-time-budget=30000", "--dump-dom",
                           f"{base}/login?token={token}&next={page}").stdout
        rows = re.findall(r"<tr[^>]*>(.*?)</tr>", dom, re.S)
        # A row links its submission twice: "Submission #N" (names hidden) and the student's name.
        shown = {m.group(1): row for row in rows if (m := re.search(r'<a class="name-shown"[^>]*>([^<]+)</a>', row))}
        assert listed <= set(shown), f"formgrader's table lists {sorted(shown)}"
        assert {s for s in listed if "glyphicon-flag" in shown[s]} == flagged

        grades = {g["name"]: g for g in _api(base, token, f"grades?submission_id={table[who]['id']}")}
        _api(base, token, f"grade/{grades['test_speedup']['id']}", {"manual_score": 2.5})
    try:
        assert cli("grade", "export", "--course", course, "--lms", "canvas")[0] == 0
        with open(course / "export" / "canvas_grades.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        row = next(r for r in rows if r["SIS Login ID"] == who)
        autograded = sum(c.score or 0.0 for c in records[who].cells if c.grade_id != "test_speedup")
        assert (row[f"{LAB} manual"], row[LAB]) == ("2.5", f"{autograded + 2.5:g}")
        assert "flagged" in row[f"{LAB} status"]
    finally:
        _set_manual(course, who, "test_speedup", None)


def _set_manual(course: Path, student: str, cell: str, score: float | None, comment: str | None = None) -> None:
    """Enter (or, with None, take back) a manual score and comment the way formgrader does: nbgrader's API."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "perflab") as gb:
        grade = gb.find_grade(cell, LAB, LAB, student)
        grade.manual_score = score
        if comment is not None:
            gb.find_comment("fast_sum_answer", LAB, LAB, student).manual_comment = comment
        gb.db.commit()


def test_a_manual_score_and_comment_entered_in_the_gradebook_are_what_export_reports(graded):
    course = graded["course"]
    _set_manual(course, "partial", "test_fast_sum", 1.5, comment="right idea, wrong axis")
    try:
        assert cli("grade", "export", "--course", course, "--lms", "canvas")[0] == 0
        with open(course / "export" / "grades.csv", newline="") as handle:
            cells = {(r["student"], r["cell"]): r for r in csv.DictReader(handle)}
        assert cells[("partial", "test_fast_sum")]["score"] == "1.5"
        partial = next(s for s in _grades(course)["submissions"] if s["student"] == "partial")
        assert partial["comments"] == {"fast_sum_answer": "right idea, wrong axis"}  # an answer cell's comment
        with open(course / "export" / "canvas_grades.csv", newline="") as handle:
            partial = next(r for r in csv.DictReader(handle) if r["SIS Login ID"] == "partial")
        assert partial[f"{LAB} manual"] == "1.5"
    finally:
        _set_manual(course, "partial", "test_fast_sum", None, comment="")


@pytest.mark.skipif(sandbox._isolation("userns").kind != "userns", reason="no user namespaces here")
def test_the_write_outside_probe_is_refused_under_userns_too(graded, monkeypatch):
    """The same case graded again with `userns` (the grader's own uid; as root, asked for by
    $PERFLAB_SANDBOX_KIND): only the read-only mounts stand between it and the grader's files.
    Last in this file: it grades one submission a second time."""
    course = graded["course"]
    monkeypatch.setenv(sandbox.KIND_ENV, "userns")
    code, text = cli("grade", "grade", "--course", course, "--student", "writeout", "--force", *GRADE_ARGS)
    assert code == 0 and "graded 1 submission(s)" in text, text
    record = State.load(course).records[f"{LAB}/writeout"]
    assert record.isolation == "userns" and record.score == 10
    assert [p for p in graded["outside"] if p.exists()] == []
    notebook = course / "autograded" / "writeout" / LAB / f"{LAB}.ipynb"
    assert notebook.read_text().count("refused ") == 3
