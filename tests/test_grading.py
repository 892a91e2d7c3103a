"""Unit tests of the autograder's parts: static checks, collect, state, feedback scrubbing, sandbox."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from perflab.grading import (
    checks,
    collect,
    feedback,
    feedback_pages,
    pipeline,
    sandbox,
    state,
    workfolders,
)
from perflab.grading import nbgrader_api as nbapi

FIXTURE = Path(__file__).parent / "fixtures" / "grading"
SOURCE = FIXTURE / "solutions" / "lab00_fixture" / "lab00_fixture.ipynb"


def _release():
    """The student copy of the fixture, made the way nbgrader does (solutions and hidden tests cut)."""
    nb = nbformat.read(SOURCE, as_version=4)
    for cell in nb.cells:
        cell.source = feedback._HIDDEN_REGION.sub("", cell.source)
    return nb


# ---------------------------------------------------------------------------------------------
# static checks


@pytest.mark.parametrize("code, needle", [
    ("import time\ntime.perf_counter = lambda: 0.0", "time.perf_counter"),
    ("import time as t\nt.time = lambda: 0.0", "time.time"),
    ("from time import perf_counter\nimport time\nsetattr(time, 'perf_counter', perf_counter)", "setattr on time"),
    ("import sys\nsys.modules['perflab.verify'] = object()", "sys.modules.perflab.verify"),
    ("import perflab.grading.timelock as tl\ntl.report_verdict = print", "perflab.grading.timelock.report_verdict"),
    ("import torch\ntorch.cuda.Event = object", "torch.cuda.Event"),
    ("get_ipython().ast_transformers.append(object())", "kernel hooks (ast_transformers)"),
    ("ip = get_ipython()\nip.events.register('pre_run_cell', print)", "kernel hooks (events.register)"),
    ("import sys\nsys.settrace(print)", "kernel hooks (settrace)"),
    ("import os\nos.environ['PERFLAB_EXPECTATIONS'] = 'mine'", "PERFLAB_EXPECTATIONS"),
    ("import os as o\no.environ.update(PYTHONPATH='x')", "os.environ.update"),
    ("%env PERFLAB_MODE=tiny", "PERFLAB_MODE"),
    ("open('../../solutions/lab01.py').read()", "reads outside its folder"),
    ("import perflab, os\nos.listdir(os.path.dirname(perflab.__file__))", "perflab package's own files"),
    ("from perflab import mystery\nDIAGNOSIS = [p.lines for p in mystery.for_student(STUDENT_ID).planted]",
     "what perflab planted"),
    ("import perflab.mystery.catalogue as c\nbugs = c.CATALOGUE", "what perflab planted"),
    ("from perflab.mystery import draw\nbugs = draw('me')", "perflab.mystery.draw"),
    ("from perflab import mystery\nlight = mystery.light_dose('me')", "perflab.mystery.light_dose"),
    # The kit's private renderer, which tells where each planted snippet lands (the kit returns no truth).
    ("from perflab import mystery\nw = []\nmystery._render('me', None, mystery._plan('me'), lambda k, n: w.append(n))",
     "perflab.mystery._render"),
    ("from perflab.mystery import _draw\nbugs = _draw('me')", "perflab.mystery._draw"),
    ("import importlib\nm = importlib.import_module('perflab.mystery')\nf = getattr(m, '_doses')", "perflab.mystery._doses"),
    # The log of what the notebook measured, which makes a typed saving count as measured.
    ("from perflab.labs.lab01 import mystery as lab01_mystery\nlab01_mystery._MEASURED.append({'saves': 0.3})",
     "perflab.labs.lab01.mystery._MEASURED"),
    ("from perflab.labs.lab01.mystery import _remember\n_remember('p.py', ['c.py'], [0.3])",
     "perflab.labs.lab01.mystery._remember"),
    # The planted truth by a spelling no text names: a computed module name, getattr, sys.modules.
    ("import importlib\nm = importlib.import_module('perflab.' + 'mys' + 'tery')\n"
     "case = getattr(m, 'for_' + 'student')('me')", "whose name it computes"),
    ("from importlib import import_module\nm = import_module('perflab.mystery')\nf = getattr(m, 'for_student')",
     "perflab.mystery.for_student"),
    ("import importlib\nm = importlib.import_module('perflab.mystery')\nbugs = m.draw('me')", "perflab.mystery.draw"),
    ("import sys\nm = sys.modules['perflab.' + 'mystery']", "sys.modules by a computed name"),
    ("import importlib\nc = importlib.import_module('perflab.mystery.catalogue')", "what perflab planted"),
    ("import perflab.labs.lab01.mystery as lm\nname = 'load_' + 'pipeline'\nf = getattr(lm, name)",
     "whose name it computes"),
])
def test_scan_code_flags_patching_hooks_environment_and_reads_outside(code, needle):
    messages = checks.scan_code(code)
    assert any(needle in m for m in messages), messages


@pytest.mark.parametrize("code", [
    "claimed_speedup = best_time(slow) / best_time(fast)",
    "CLAIM = 1.0  # what lab 3 tells a student to write when the baseline is kept",
    "X, CLAIM = 2, 9.0\nresults = {'speedup': 2.5}",  # claims are held to the re-measurement, not read as text
    "import os\nos.environ['OMP_NUM_THREADS'] = '2'",
    "open('results/lab01.json').read()",
    "from time import perf_counter\nperf_counter = None",  # a local name, not the module's clock
    "import time\nstart = time.perf_counter()",
    "def f(:\n  broken",  # unparseable code is scored by running it, not here
    "n_steps = 10",
    "from perflab import mystery\nfrom perflab.labs.lab01 import mystery as lab01_mystery\nSTUDENT_ID = mystery.student_id(MY_ID)\n"
    "PIPELINE = lab01_mystery.write_pipeline(STUDENT_ID)\ncosts = lab01_mystery.line_costs(PIPELINE)",
    "import importlib\nlm = importlib.import_module('perflab.labs.lab01.mystery')\nsaves = lm.saving('a.py', 'b.py')",
    "import torch\ndtype = getattr(torch, 'bfloat' + '16')",
])
def test_scan_code_leaves_honest_code_alone(code):
    assert checks.scan_code(code) == []


@pytest.mark.parametrize(("code", "needle"), [
    ("lab02.accepted = lambda outcome: True", "line 1: the code replaces perflab.labs.lab02.accepted"),
    ("x = 1\nlab03 = type('P', (), {'__getattr__': lambda s, n: print})()", "line 2: the code rebinds lab03"),
    ("setattr(common, 'accepted', print)", "line 1: the code calls setattr on perflab.labs.common"),
])
def test_a_cell_using_names_an_earlier_cell_imported_is_scanned_with_them(code, needle):
    """The setup cell (locked, never scanned itself) imports the lab's modules; a later cell rebinding them
    without importing anything is flagged, with the line, because one kernel runs every cell."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    setup = new_code_cell("from perflab.labs import common, lab02, lab03\n")
    setup.metadata["nbgrader"] = {"grade_id": "setup", "locked": True, "solution": False, "grade": False}
    nb = new_notebook(cells=[setup, new_code_cell(code)])
    release = new_notebook(cells=[setup])
    findings = checks.scan_notebook(nbformat.from_dict(nb), nbformat.from_dict(release))
    assert any(needle in f.message and f.flag for f in findings), [f.message for f in findings]
    assert checks.scan_code(code) == [] or "setattr" in code  # alone, the cell names nothing perflab


def test_inspect_rejects_what_is_not_a_notebook():
    release = _release()
    nb, findings = checks.inspect_submission(b"{not json", release)
    assert nb is None and findings[0].fatal and "not valid JSON" in findings[0].message
    nb, findings = checks.inspect_submission(b"\xff\xfe\x00", release)
    assert nb is None and "not UTF-8" in findings[0].message
    nb, findings = checks.inspect_submission(b'{"a": 1}', release)
    assert nb is None and "not a Jupyter notebook" in findings[0].message
    nb, findings = checks.inspect_submission(b'{"cells": [], "nbformat": 2}', release)
    assert nb is None and "nbformat=2" in findings[0].message


def test_inspect_upgrades_v3_and_reports_cell_tampering():
    release = _release()
    v3 = nbformat.writes(nbformat.convert(copy.deepcopy(release), 3)).encode()
    nb, findings = checks.inspect_submission(v3, release)
    assert nb is not None and nb.nbformat == 4
    assert any("nbformat 3" in f.message for f in findings)

    tampered = copy.deepcopy(release)
    tampered.cells = [c for c in tampered.cells if checks.grade_id(c) != "test_fast_sum"]
    mean_test = next(c for c in tampered.cells if checks.grade_id(c) == "test_mean")
    tampered.cells.append(copy.deepcopy(mean_test))
    mean_test.source = "assert True"
    _, findings = checks.inspect_submission(nbformat.writes(tampered).encode(), release)
    by_cell = {(f.cell, f.message.split(";")[0]) for f in findings}
    assert ("test_fast_sum", "the graded cell was deleted (or its nbgrader metadata removed)") in by_cell
    assert any(f.cell == "test_mean" and "appears 2 times" in f.message for f in findings)
    edited = [f for f in findings if f.cell == "test_mean" and "edited" in f.message]
    assert edited and edited[0].flag


# ---------------------------------------------------------------------------------------------
# collect


@pytest.mark.parametrize("name, expected", [
    ("doejane_12345_67890_lab00_fixture.ipynb", ("doejane-12345", "lab00_fixture")),
    ("doejane_LATE_12345_67890_lab00_fixture-1.ipynb", ("doejane-12345", "lab00_fixture")),
    ("doejane_777_67891_lab00_fixture.ipynb", ("doejane-777", "lab00_fixture")),  # another Jane Doe
    ("Jane Doe_4321_assignsubmission_file_lab00_fixture.ipynb", ("jane.doe-4321", "lab00_fixture")),
    ("Jane Doe_4321_assignsubmission_file_/lab00_fixture.ipynb", ("jane.doe-4321", "lab00_fixture")),
    ("Lab 0_jdoe_attempt_2026-01-02-10-00-00_lab00_fixture.ipynb", ("jdoe", "lab00_fixture")),
    ("jdoe/lab00_fixture.ipynb", ("jdoe", "lab00_fixture")),
    ("jdoe/anything.ipynb", "no known lab"),
    ("lab00_fixture.ipynb", ("lab00", "lab00_fixture")),  # documented: the id is what precedes "_"
    ("notes.txt", "not a notebook"),
    ("justaname.ipynb", "no student id"),
    ("bad!id_lab00_fixture.ipynb", "not a usable student id"),
])
def test_match_reads_student_and_lab_from_names(name, expected):
    found = collect.match(name, ["lab00_fixture"])
    if isinstance(expected, tuple):
        assert found == expected
    else:
        assert isinstance(found, str) and expected in found


def test_match_with_pattern_and_lab_override():
    pattern = collect.re.compile(r"^(?P<student>[a-z]+)-hw\.ipynb$")
    assert collect.match("alice-hw.ipynb", ["lab00_fixture"], "lab00_fixture", pattern) == ("alice", "lab00_fixture")
    assert "does not match" in collect.match("alice.ipynb", ["lab00_fixture"], "lab00_fixture", pattern)


def test_collect_from_an_lms_zip_lists_what_it_could_not_use(tmp_path):
    course = nbapi.make_course(tmp_path / "course")
    nbapi.add_source(course, "lab00_fixture", SOURCE)
    release = nbformat.writes(_release()).encode()
    download = tmp_path / "download.zip"
    with zipfile.ZipFile(download, "w") as zf:
        zf.writestr(zipfile.ZipInfo("alice_111_222_lab00_fixture.ipynb", (2026, 1, 1, 10, 0, 0)), release)
        zf.writestr(zipfile.ZipInfo("alice_111_333_lab00_fixture-1.ipynb", (2026, 1, 2, 10, 0, 0)), release + b" ")
        zf.writestr("bob_444_555_lab00_fixture.ipynb", release)
        zf.writestr(zipfile.ZipInfo("alice_999_666_lab00_fixture.ipynb", (2026, 1, 3, 10, 0, 0)), release + b"  ")
        zf.writestr("carol_notes.txt", "hi")
        zf.writestr("__MACOSX/._bob_444_555_lab00_fixture.ipynb", "junk")
        zf.writestr("mystery.ipynb", release)
    report = collect.collect(course, download)
    # Two users named alice stay two students; one user's two hand-ins keep the newest, and say so.
    assert sorted((c.student, c.lab) for c in report.collected) == [
        ("alice-111", "lab00_fixture"), ("alice-999", "lab00_fixture"), ("bob-444", "lab00_fixture")]
    reasons = dict(report.unmatched)
    assert "older copy" in reasons["alice_111_222_lab00_fixture.ipynb"]
    assert {c.student: c.display for c in report.collected}["alice-999"] == "alice"
    assert "not a notebook" in reasons["carol_notes.txt"] and "no student id" in reasons["mystery.ipynb"]
    kept = course / "submitted" / "alice-111" / "lab00_fixture" / "lab00_fixture.ipynb"
    assert kept.read_bytes().endswith(b"} ")  # the newer copy of alice-111, not alice-999's
    assert (kept.parent / "timestamp.txt").is_file()
    with pytest.raises(ValueError, match="--lab lab99"):
        collect.collect(course, download, lab="lab99")


# ---------------------------------------------------------------------------------------------
# state


def _record(student="alice", digest="abc", score=1.0):
    cell = state.CellResult("test_mean", score, 2.0, verdict="inconclusive", speedup=1.02, code="undecided")
    return state.Record(student, "lab00_fixture", digest, "graded", (cell,), notes=("a note",))


def test_state_round_trips_and_knows_what_is_done(tmp_path):
    st = state.State.load(tmp_path)
    st.put(_record())
    again = state.State.load(tmp_path)
    assert again.get("lab00_fixture", "alice") == _record()
    assert again.done("lab00_fixture", "alice", "abc") and not again.done("lab00_fixture", "alice", "changed")
    assert again.get("lab00_fixture", "alice").inconclusive
    (tmp_path / ".perflab" / "state.json").write_text("{broken")
    with pytest.raises(ValueError, match="grading state is unreadable"):
        state.State.load(tmp_path)


def test_a_state_file_written_before_cells_kept_the_verifiers_code_still_loads(tmp_path):
    st = state.State.load(tmp_path)
    st.put(_record())
    path = tmp_path / ".perflab" / "state.json"
    doc = json.loads(path.read_text())
    for record in doc["records"].values():
        for cell in record["cells"]:
            del cell["code"]
    path.write_text(json.dumps(doc))
    assert state.State.load(tmp_path).get("lab00_fixture", "alice").cells[0].code is None


def test_the_verification_record_keeps_the_verifiers_code() -> None:
    from perflab.labs import common
    from perflab.verify import Verdict
    from perflab.verify.expectations import Expectation

    verdict = Verdict("fail", "below_bar", "re-measured speedup 0.88x ... is below the expected 0.90x", 0.9,
                      baseline_times=(1.0, 1.0, 1.01), candidate_times=(1.13, 1.14, 1.15))
    expectation = Expectation("lab06_final", 0.9, "parity", "cpu-bf16", True, "calibrated here")
    mark = common.mark_of(verdict, expectation)
    assert mark.verdict["code"] == "below_bar" and mark.verdict["verdict"] == "fail" and mark.fraction == 0.0


def test_one_writer_at_a_time(tmp_path):
    with state.lock(tmp_path), pytest.raises(state.BusyError, match="another `perflab grade` run"), state.lock(tmp_path):
        pass


# ---------------------------------------------------------------------------------------------
# feedback


def test_scrub_removes_hidden_tests_and_what_could_quote_them():
    source = nbformat.read(SOURCE, as_version=4)
    guarded = feedback.hidden_lines(source.cells)
    assert set(guarded) == {"test_mean", "test_fast_sum"}
    nb = copy.deepcopy(source)
    test_mean = next(c for c in nb.cells if checks.grade_id(c) == "test_mean")
    test_mean.outputs = [new_output("stream", name="stdout", text="printing a hidden input 1e6"),
                         new_output("error", ename="AssertionError", evalue="hidden: large values that cancel",
                                    traceback=["assert abs(mean([1e6, -1e6, 5.0]) - 5 / 3) < 1e-9"])]
    with pytest.raises(feedback.HiddenTestLeak):
        feedback.assert_nothing_hidden(nbformat.writes(nb), guarded, "test")
    feedback.scrub(nb, guarded)
    text = nbformat.writes(nb)
    feedback.assert_nothing_hidden(text, guarded, "test")
    assert "hidden: large values" not in text and "1e6" not in text
    assert test_mean.outputs[0].ename == "AssertionError"
    assert "assert mean([1, 2, 3]) == 2" in test_mean.source  # the visible test stays
    feedback.add_notes(nb, ["cell 3: MemoryError"], "lab00_fixture, alice")
    feedback.add_notes(nb, ["cell 3: MemoryError"], "lab00_fixture, alice")
    assert sum(c.get("id") == feedback.NOTES_CELL_ID for c in nb.cells) == 1


def test_failure_page_escapes_and_scores():
    cells = [state.CellResult("test_mean", 0.0, 2.0), state.CellResult("essay", None, 3.0)]
    page = feedback.failure_page("alice", "lab00_fixture", ["not valid JSON <script>"], cells)
    assert "&lt;script&gt;" in page and "Score: 0 / 5" in page


# ---------------------------------------------------------------------------------------------
# the sandbox


def _sandboxed(tmp_path, code: str, limits: sandbox.Limits | None = None, hide=()):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    program = ("import json, os, sys\n" + code +
               "\nos.write(int(os.environ['PERFLAB_RESULT_FD']), json.dumps(out).encode())\n")
    return sandbox.run([sys.executable, "-c", program], workdir=work,
                       limits=limits or sandbox.Limits(wall_s=30), hide=hide, env={"HOME": str(work)})


def test_sandbox_returns_its_result_on_a_private_pipe(tmp_path):
    run = _sandboxed(tmp_path, "out = {'uid': os.getuid(), 'cwd': os.getcwd()}")
    assert run.returncode == 0 and not run.timed_out
    out = json.loads(run.result)
    assert out["cwd"] == str((tmp_path / "work").resolve())
    if os.geteuid() == 0:
        assert out["uid"] != 0  # ran as the unprivileged sandbox user


@pytest.mark.skipif(not sandbox.isolation().network_isolated, reason="this OS allows no network namespace")
def test_sandbox_has_no_network_and_cannot_see_hidden_folders(tmp_path):
    secret = tmp_path / "course"
    secret.mkdir()
    (secret / "gradebook.db").write_text("grades")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3); net = 'open'\n"
            f"except OSError as exc:\n    net = type(exc).__name__\n"
            f"out = {{'net': net, 'seen': os.path.exists({str(secret / 'gradebook.db')!r})}}\n"
            f"try:\n    open({str(secret / 'x')!r}, 'w'); out['write'] = 'ok'\n"
            f"except OSError as exc:\n    out['write'] = type(exc).__name__\n")
    out = json.loads(_sandboxed(tmp_path, code, hide=[secret]).result)
    assert out["net"] != "open" and not out["seen"] and out["write"] != "ok"
    with pytest.raises(BlockingIOError):
        server.accept()  # nobody knocked
    assert not (secret / "x").exists()


@pytest.mark.skipif(not sandbox.isolation().network_isolated, reason="this OS allows no mount namespace")
def test_a_hidden_package_imports_in_the_sandbox_as_an_absent_one(tmp_path):
    """A lab's grader-only `judges/` hidden by an empty folder imported as an empty namespace package, so a
    notebook that falls back where the grader's side is missing (lab 6's decisions) broke on AttributeError.
    Hidden, it imports as it does in the student's kit, where it is absent."""
    from perflab.labs import registry

    judges = registry.folder("lab06_together") / "judges"
    before = (judges / "__init__.py").read_bytes()
    code = ("out = {}\ntry:\n    import perflab.labs.lab06.judges as j\n    out['import'] = sorted(vars(j))[:3]\n"
            "except ModuleNotFoundError as exc:\n    out['import'] = exc.name\n"
            f"out['seen'] = sorted(os.listdir({str(judges)!r}))\n")
    out = json.loads(_sandboxed(tmp_path, code, hide=registry.grader_only_folders()).result)
    assert out == {"import": "perflab.labs.lab06.judges", "seen": ["__init__.py"]}
    assert (judges / "__init__.py").read_bytes() == before  # the kit's own copy untouched


@pytest.mark.skipif(not sandbox.isolation().network_isolated, reason="this OS allows no mount namespace")
def test_nothing_written_in_a_world_writable_folder_outlives_the_sandbox(tmp_path):
    folders = sandbox.world_writable_folders()
    assert "/tmp" in folders
    if os.path.isdir("/run/lock"):
        assert "/run/lock" in folders  # found, not listed by hand
    names = [os.path.join(f, f"perflab-escape-{os.getpid()}") for f in folders]
    code = ("out = {}\n" + "".join(f"try:\n    open({n!r}, 'w').write('x'); out[{n!r}] = 'written'\n"
                                   f"except OSError as exc:\n    out[{n!r}] = type(exc).__name__\n" for n in names))
    out = json.loads(_sandboxed(tmp_path, code).result)
    assert "written" in out.values()  # the folders are writable inside, privately
    assert [n for n in names if os.path.exists(n)] == []


def _probe_outside(tmp_path, course: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Run a submission that writes the grader's home, site-packages and checkout and reads the
    course; returns (what it got per target, the targets)."""
    import sysconfig

    tag = f"perflab-probe-{os.getpid()}"
    targets = {"home": str(Path.home() / f"{tag}.txt"),
               "site-packages": str(Path(sysconfig.get_paths()["purelib"]) / f"{tag}.pth"),
               "checkout": str(Path(pipeline.REPO) / "perflab" / f"{tag}.py"),
               "work folder": str((tmp_path / "work" / f"{tag}.txt").resolve()), "tmp": f"/tmp/{tag}.txt"}
    code = ("out = {}\n"
            f"for name, path in {targets!r}.items():\n"
            "    try:\n        open(path, 'w').write('import os')\n        out[name] = 'written'\n"
            "    except OSError as exc:\n        out[name] = type(exc).__name__\n"
            f"try:\n    out['course'] = open({str(course / 'gradebook.db')!r}).read()\n"
            "except OSError as exc:\n    out['course'] = type(exc).__name__\n")
    try:
        run = _sandboxed(tmp_path, code, hide=[course])
        return json.loads(run.result or b"{}") or {"failed": run.output_tail[-500:]}, targets
    finally:
        for name, path in targets.items():
            if name not in ("work folder", "tmp") and os.path.exists(path):
                os.remove(path)
                targets[name] = f"LEFT ON THE HOST: {path}"


@pytest.mark.skipif(sandbox._isolation("userns").kind != "userns", reason="no user namespaces here")
def test_userns_sandbox_cannot_write_the_graders_files_nor_read_the_course(tmp_path, monkeypatch):
    """With `userns` a submission keeps the grader's uid: only the read-only mounts stop it writing the
    grader's home, a .pth in site-packages (run by every later Python of the grader) or the checkout.
    As root (CI), $PERFLAB_SANDBOX_KIND=userns drives the same path with the same uid semantics."""
    monkeypatch.setenv(sandbox.KIND_ENV, "userns")
    course = tmp_path / "course"
    course.mkdir()
    (course / "gradebook.db").write_text("grades")
    out, targets = _probe_outside(tmp_path, course)
    assert out == {"home": "OSError", "site-packages": "OSError", "checkout": "OSError",
                   "work folder": "written", "tmp": "written", "course": "FileNotFoundError"}, out
    assert not any(t.startswith("LEFT ON THE HOST") for t in targets.values()), targets


@pytest.mark.skipif(os.geteuid() != 0 or sandbox.isolation().kind != "root", reason="needs root namespaces")
def test_root_sandbox_is_read_only_too(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    (course / "gradebook.db").write_text("grades")
    out, targets = _probe_outside(tmp_path, course)
    assert {k: v for k, v in out.items() if k not in ("work folder", "tmp")} == {
        "home": "OSError", "site-packages": "OSError", "checkout": "OSError", "course": "FileNotFoundError"}, out
    assert out["work folder"] == "written" and out["tmp"] == "written"


def test_a_kind_nobody_can_ask_for_is_one_line(monkeypatch):
    monkeypatch.setenv(sandbox.KIND_ENV, "chroot")
    with pytest.raises(ValueError, match="PERFLAB_SANDBOX_KIND: 'chroot' is not a kind one can ask for"):
        sandbox.isolation()


@pytest.mark.skipif(not sandbox.isolation().network_isolated, reason="this OS allows no mount namespace")
def test_the_work_folder_and_tmp_are_sized(tmp_path):
    code = ("import errno, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nout = {}\n"
            "for where in ('filler', '/tmp/filler'):\n"
            "    try:\n"
            "        with open(where, 'wb') as f:\n"
            "            for _ in range(64):\n"
            "                f.write(b'x' * 8 * 1024**2)\n"
            "        out[where] = 'ok'\n"
            "    except OSError as exc:\n"
            "        out[where] = errno.errorcode.get(exc.errno, str(exc.errno))\n")
    limits = sandbox.Limits(wall_s=60, disk_bytes=128 * 1024**2)
    out = json.loads(_sandboxed(tmp_path, code, limits).result)
    assert out == {"filler": "ENOSPC", "/tmp/filler": "ENOSPC"}, out
    assert not (tmp_path / "work" / "filler").exists()  # written in RAM, never on the host's disk


@pytest.mark.skipif(sandbox.cgroups().kind == "none", reason="no cgroups here: limits are per process only")
def test_memory_is_limited_for_the_whole_sandbox_not_per_process(tmp_path):
    # Three processes of 900 MiB each under a 2 GiB sandbox: each is under the per-process limit
    # (RLIMIT_AS, off here), together they are over the whole sandbox's.
    code = ("import subprocess, time\n"
            "hog = 'b = bytearray(900 * 1024**2)\\nfor i in range(0, len(b), 4096): b[i] = 1\\nimport time; time.sleep(6)'\n"
            "procs = [subprocess.Popen([sys.executable, '-c', hog]) for _ in range(3)]\n"
            "codes = [p.wait() for p in procs]\n"
            "out = {'killed': sum(c < 0 for c in codes)}\n")
    limits = sandbox.Limits(wall_s=90, memory_bytes=2 * 1024**3)
    run = _sandboxed(tmp_path, code, limits)
    out = json.loads(run.result) if run.result else {"killed": "the sandbox itself"}
    assert out["killed"] != 0, out


def test_processes_are_limited_for_the_whole_sandbox(tmp_path):
    # Each child is one process under any per-process limit; together they are over the sandbox's.
    code = ("import subprocess\nprocs, refused = [], None\n"
            "for _ in range(200):\n"
            "    try:\n"
            "        procs.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']))\n"
            "    except OSError as exc:\n"
            "        refused = type(exc).__name__\n"
            "        break\n"
            "for p in procs:\n    p.kill()\n    p.wait()\n"
            "out = {'started': len(procs), 'refused': refused}\n")
    limits = sandbox.Limits(wall_s=120, processes=24)
    run = _sandboxed(tmp_path, code, limits)
    out = json.loads(run.result)
    assert out["refused"] is not None and out["started"] < 24 + 64, out  # 64: the cgroup's margin for threads


def test_sandbox_wall_limit_kills_the_whole_tree(tmp_path):
    import psutil

    code = ("import subprocess\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            "start_new_session=True)\nimport time\ntime.sleep(600)\nout = {}")
    before = {p.pid for p in psutil.process_iter()}
    run = _sandboxed(tmp_path, code, sandbox.Limits(wall_s=3))
    assert run.timed_out and run.wall_s < 40 and run.result == b""
    left = [p for p in psutil.process_iter(["cmdline"])
            if p.pid not in before and "time.sleep(600)" in " ".join(p.info["cmdline"] or [])]
    assert left == []


def test_limits_and_settings_reject_nonsense():
    with pytest.raises(ValueError, match="wall_s"):
        sandbox.Limits(wall_s=0)
    with pytest.raises(ValueError, match="memory_bytes"):
        sandbox.Limits(memory_bytes=0)
    with pytest.raises(ValueError, match="must be shorter"):
        pipeline.Settings(limits=sandbox.Limits(wall_s=10), cell_timeout=10)


def test_default_pool_never_shares_cores_with_timed_work():
    assert pipeline.default_jobs(cores=2) == 1
    assert pipeline.default_jobs(cores=3) == 1
    assert pipeline.default_jobs(cores=8) == 4
    assert pipeline.default_jobs(cores=64, gpus=2) == 2


def test_release_refuses_to_ship_a_solution(tmp_path):
    course = nbapi.make_course(tmp_path / "course")
    (course / "release" / "lab00_fixture").mkdir(parents=True)
    nb = new_notebook(cells=[new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")])
    nbformat.write(nb, course / "release" / "lab00_fixture" / "lab00_fixture.ipynb")
    with pytest.raises(ValueError, match="BEGIN SOLUTION"):
        pipeline.release(course)


def test_the_inconclusive_policy_reaches_every_sandbox(monkeypatch):
    from perflab.grading import pipeline

    monkeypatch.delenv("PERFLAB_INCONCLUSIVE", raising=False)
    assert pipeline.with_instructor_policy(pipeline.Settings()).env["PERFLAB_INCONCLUSIVE"] == "credit"
    monkeypatch.setenv("PERFLAB_INCONCLUSIVE", "no-credit")
    settings = pipeline.with_instructor_policy(pipeline.Settings(env={"PERFLAB_MODE": "grade"}))
    assert settings.env == {"PERFLAB_INCONCLUSIVE": "no-credit", "PERFLAB_MODE": "grade"}
    monkeypatch.setenv("PERFLAB_INCONCLUSIVE", "maybe")
    with pytest.raises(ValueError, match="PERFLAB_INCONCLUSIVE: 'maybe' is not one of credit, no-credit"):
        pipeline.with_instructor_policy(pipeline.Settings())


def test_work_folders_left_by_a_killed_grader_are_removed_by_the_next_run(tmp_path, monkeypatch):
    monkeypatch.setattr(workfolders, "sandbox_base", lambda: tmp_path)
    abandoned = tmp_path / "lab00_fixture-dead"
    (abandoned / "notebook").mkdir(parents=True)
    (abandoned / "notebook" / "submission.ipynb").write_text("{}")
    (tmp_path / "lab00_fixture-dead.lock").touch()  # nobody holds it: its grader was killed
    with pipeline.work_folder("lab00_fixture-") as live:
        (live / "job.json").write_text("{}")
        removed = pipeline.remove_abandoned(tmp_path)
        assert removed == [abandoned] and not abandoned.exists()
        assert (live / "job.json").exists()  # a running grade keeps its folder
    assert not live.exists() and list(tmp_path.iterdir()) == []


def test_a_killed_grader_leaves_no_work_folder_even_when_a_child_keeps_its_lock(tmp_path, monkeypatch):
    """kill -9 of a grader whose forked child (a data loader worker, say) lives on holding the work
    folder's lock: the next run still sees the grader is gone and removes the folder."""
    import signal
    import subprocess
    import time

    program = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from perflab.grading import pipeline, workfolders\n"
        f"workfolders.sandbox_base = lambda: Path({str(tmp_path)!r})\n"
        "with pipeline.work_folder('lab00_fixture-') as work:\n"
        "    (work / 'submission.ipynb').write_text('{}')\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        time.sleep(120)\n"
        "        os._exit(0)\n"
        "    print(work, child, flush=True)\n"
        "    time.sleep(120)\n")
    monkeypatch.setattr(workfolders, "sandbox_base", lambda: tmp_path)
    grader = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        folder, child_pid = grader.stdout.readline().split()
        work, child = Path(folder), int(child_pid)
        assert work.is_dir()
        os.kill(grader.pid, signal.SIGKILL)
        grader.wait(timeout=30)
        time.sleep(0.2)
        with pipeline.work_folder("lab00_fixture-") as live:  # a grade running now keeps its folder
            assert pipeline.remove_abandoned(tmp_path) == [work]
            assert not work.exists() and live.exists()
    finally:
        for pid in (grader.pid, child):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_grading_builds_the_data_sets_its_labs_train_on_before_any_notebook_runs(tmp_path, monkeypatch) -> None:
    """A sandboxed notebook may read the data sets but must not spend its cells drawing one: the grader
    builds each missing set the graded labs need (at the mode they are graded in) once, up front."""
    from perflab import dataset, env

    if env.pick_device().type == "cpu":
        assert pipeline.data_sizes(["lab02_feed", "lab03_amp"], pipeline.Settings()) == ["photo", "small", "tiny"]
    monkeypatch.setenv(dataset.DATA_DIR_ENV, str(tmp_path))
    tiny = pipeline.Settings(env={"PERFLAB_MODE": "tiny"})
    assert pipeline.data_sizes(["lab02_feed"], tiny) == ["tiny"]
    pipeline.build_data(["lab02_feed"], tiny)
    assert dataset.is_built("tiny") and (tmp_path / "tiny" / dataset.MANIFEST).is_file()
    assert not (tmp_path / "photo").exists()


# ---------------------------------------------------------------------------------------------
# safe by default: no namespaces, no grading unless the instructor says --unisolated

NO_UNSHARE = sandbox.Isolation("none", ("no network isolation: this OS has no unshare(1); "
                                        "the sandbox only limits resources",))


def test_grading_without_namespaces_is_refused_in_one_line_unless_unisolated(tmp_path, monkeypatch, capsys):
    from perflab.cli import main

    monkeypatch.setattr(sandbox, "isolation", lambda: NO_UNSHARE)
    assert main(["grade", "grade", "--course", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", captured
    assert lines[0].startswith("perflab grade grade: refusing to run student code without Linux namespaces")
    assert "--unisolated" in lines[0] and "container" in lines[0] and "no unshare(1)" in lines[0]
    with pytest.raises(pipeline.Unisolated):
        pipeline.grade(tmp_path, pipeline.Settings())  # the API is safe by default too
    # With --unisolated the refusal is gone: what stops it now is that there is no course folder here.
    assert main(["grade", "grade", "--course", str(tmp_path), "--unisolated"]) == 2
    assert "no course folder here" in capsys.readouterr().err
    assert pipeline.check_isolation(pipeline.Settings(unisolated=True)).kind == "none"
    # A Ray node without namespaces runs nothing either: that submission's line, not student code.
    job = pipeline.Job("s1", "lab00_fixture", tmp_path / "missing.ipynb", "0")
    info = pipeline.LabInfo("lab00_fixture", "lab00_fixture.ipynb",
                            ({"grade_id": "test_mean", "max_score": 2.0, "hidden": False, "manual": False},), {})
    result = pipeline.grade_one(job, info, tmp_path, pipeline.Settings())
    assert "cannot isolate a submission" in result.error and result.cells[0].score == 0


def test_an_unisolated_grade_is_recorded_and_shown(tmp_path, monkeypatch):
    from perflab.grading import export as export_mod
    from perflab.report import classreport

    summary = pipeline.Summary(graded=("lab00_fixture/a",), isolation="none")
    assert "UNISOLATED" in summary.line()
    assert "UNISOLATED" not in pipeline.Summary(graded=("lab00_fixture/a",), isolation="userns").line()
    monkeypatch.setattr(collect, "submissions", lambda course, *a, **k: [])
    st = state.State.load(tmp_path)
    cell = state.CellResult("test_mean", 2.0, 2.0, hardware_class="cpu-test")
    for student, kind in (("a", "none"), ("b", "root")):
        st.put(state.Record(student, "lab00_fixture", "x", "graded", (cell,), isolation=kind))
    assert export_mod.status(tmp_path)["unisolated"] == ["lab00_fixture/a"]
    csv_path, json_path = export_mod.export(tmp_path, tmp_path / "export")
    doc = json.loads(json_path.read_text())
    assert {s["student"]: s["isolation"] for s in doc["submissions"]} == {"a": "none", "b": "root"}
    assert [r["isolation"] for r in doc["rows"]] == ["none", "root"]
    rendered = classreport.render_class(classreport.load_export(csv_path))
    assert 'id="unisolated"' in rendered.html and "lab00_fixture/a" in rendered.html
    assert any("--unisolated" in w for w in rendered.warnings)


def test_feedback_is_written_one_submission_at_a_time(tmp_path, monkeypatch, capsys):
    """nbgrader failing on one notebook costs that student their rendered page only (a minimal page
    with the score instead, and one line); a submission no page can be written for is counted, and
    the command then exits 1; everyone else gets their page."""
    from perflab.cli import main

    lab = "lab00_fixture"
    info = pipeline.LabInfo(lab, f"{lab}.ipynb", ({"grade_id": "test_mean", "max_score": 2.0, "hidden": False,
                                                  "manual": False},), {})
    monkeypatch.setattr(feedback_pages, "lab_info", lambda course, name: info)
    st = state.State.load(tmp_path)
    for student in ("ann", "bob", "cid"):
        st.put(state.Record(student, lab, "x", "graded", (state.CellResult("test_mean", 2.0, 2.0),)))
        if student != "cid":
            folder = tmp_path / "autograded" / student / lab
            folder.mkdir(parents=True)
            (folder / f"{lab}.ipynb").write_text("{}")

    def generate(course, name, student):
        if student == "bob":
            raise nbapi.GradingError(f"nbgrader generate_feedback of {name} for bob failed: MissingEntry: No such "
                                     f"taskcomment: {name}/{name}/lab99_answer for bob\nTraceback (most recent ...")
        feedback.write_page(tmp_path / "feedback" / student / name, name, "<html>rendered</html>")

    real_write = feedback.write_page

    def write(folder, name, page):
        if "cid" in str(folder):
            raise OSError(28, "No space left on device")
        return real_write(folder, name, page)

    monkeypatch.setattr(nbapi, "generate_feedback", generate)
    monkeypatch.setattr(feedback, "write_page", write)
    lines: list[str] = []
    run = pipeline.feedback(tmp_path, on_problem=lines.append)
    assert [p.parent.parent.name for p in run.pages] == ["ann", "bob"]
    assert run.minimal == (f"{lab}/bob: nbgrader could not render the graded notebook; wrote a minimal page "
                           f"(MissingEntry: No such taskcomment: {lab}/{lab}/lab99_answer for bob)",)
    assert run.failed == (f"{lab}/cid: no feedback page (OSError: [Errno 28] No space left on device)",)
    assert lines == [*run.minimal, *run.failed]
    page = (tmp_path / "feedback" / "bob" / lab / f"{lab}.html").read_text()
    assert "could not be rendered" in page and "Score: 2 / 2" in page
    assert main(["grade", "feedback", "--course", str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("wrote 2 feedback page(s), 1 of them minimal (the notebook could not be rendered); "
                              "1 submission(s) got no page")
    assert [ln.split(":")[0] for ln in out[:-1]] == [f"feedback {lab}/bob", f"feedback {lab}/cid"]


def test_the_worker_starts_without_the_iri_grammar_and_still_validates_notebooks():
    """The worker keeps `rfc3987_syntax` (about 1 s of grammar building per start) out of its process;
    nbformat's validation, which it does not need for, still rejects a malformed notebook."""
    import subprocess

    code = (
        "import sys\n"
        "import perflab.grading.worker\n"
        "import nbformat\n"
        "assert sys.modules.get('rfc3987_syntax') is None, 'the IRI grammar was built'\n"
        "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('1')])\n"
        "nbformat.validate(nb)\n"
        "nb.cells[0]['cell_type'] = 'not a cell type'\n"
        "try:\n"
        "    nbformat.validate(nb)\n"
        "except nbformat.ValidationError:\n"
        "    print('rejected')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "rejected"


def test_each_new_gradebook_holds_nbgraders_migration_head_read_once_per_process(tmp_path):
    """nbgrader starts the `alembic` command for every gradebook it creates (a course, a lab's template); the
    head it reads is the installed nbgrader's, so the grader asks once and each gradebook still records it."""
    import sqlite3

    import nbgrader.api

    heads = []
    for name in ("a", "b"):
        course = nbapi.make_course(tmp_path / name)
        nbapi.add_source(course, "lab00_fixture", SOURCE)
        nbapi.generate_assignment(course, "lab00_fixture")
        with contextlib.closing(sqlite3.connect(course / "gradebook.db")) as db:
            heads += [row[0] for row in db.execute("SELECT version_num FROM alembic_version")]
    asked = nbgrader.api.get_alembic_version
    assert asked.cache_info().misses == 1 and asked.cache_info().hits >= 1
    with nbapi._tools_on_path():
        assert heads == [asked.__wrapped__()] * 2  # what the command itself says, in both gradebooks
