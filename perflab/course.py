"""The course file, `perflab-course.toml`: one course's labs in order, its model and its data set.

`perflab grade setup` writes one into the course folder (or keeps the one there), the release ships it
beside the student notebooks, and the repo's root holds the kit's own. A process reads the course file of
its working folder or the nearest folder above it; `$PERFLAB_MODEL` and `$PERFLAB_DATA` override what the
file says, and the grader puts its course's file in force for every process of a grading run:

    labs = ["labNN_name", ...]               # the labs' folders, in the order students take them
    model = "resnet18"                         # a torchvision classification model
    data = "imagenette"                        # a built size (tiny, small, photo, full) or an ImageFolder
                                               # (relative to this file's folder); left out: each mode's own

This module reads no torch: `perflab.env` reads it before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "perflab-course.toml"
DEFAULT_MODEL = "resnet18"
MODEL_ENV = "PERFLAB_MODEL"
DATA_ENV = "PERFLAB_DATA"
FILE_ENV = "PERFLAB_COURSE_FILE"  # the course file a parent process read, for the processes it starts
_LAB = re.compile(r"^lab\d\d_\w+$")
_KEYS = ("labs", "model", "data")


@dataclass(frozen=True)
class Course:
    """What a course file holds. `data` is None where each mode chooses its own data set; a folder is
    absolute once read (every process of a grading job reads the same one)."""

    labs: tuple[str, ...] = ()
    model: str = DEFAULT_MODEL
    data: str | None = None

    def to_toml(self) -> str:
        lines = ["# perflab course: the labs in order, the model and the data set (see perflab/course.py)",
                 "labs = [" + ", ".join(f'"{lab}"' for lab in self.labs) + "]",
                 f'model = "{self.model}"']
        lines.append(f"data = {_quoted(self.data)}" if self.data else
                     "# data = \"path/to/imagefolder\"  # a built size or an ImageFolder; unset: each mode's own")
        return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def read(path: Path) -> Course:
    """The course in file `path`; ValueError in one line naming the file and what is wrong."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the course file ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not TOML ({exc})") from None
    unknown = sorted(set(doc) - set(_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}; a course file holds {', '.join(_KEYS)}")
    labs = doc.get("labs", [])
    if not isinstance(labs, list) or not all(isinstance(lab, str) and _LAB.match(lab) for lab in labs):
        raise ValueError(f"{path}: labs must be a list of lab names (labNN_name), got {labs!r}")
    if len(set(labs)) != len(labs):
        raise ValueError(f"{path}: labs names a lab twice: {labs!r}")
    model = doc.get("model", DEFAULT_MODEL)
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"{path}: model must be a torchvision model's name, got {model!r}")
    data = doc.get("data")
    if data is not None and (not isinstance(data, str) or not data.strip()):
        raise ValueError(f"{path}: data must be a data set's size or a folder, got {data!r}")
    return Course(tuple(labs), model.strip(), _resolved(data.strip(), path.parent) if data else None)


def _resolved(data: str, base: Path) -> str:
    """A folder's absolute path (relative ones from the course file's folder); a size's name as it is."""
    folder = (base / Path(data).expanduser()).resolve()
    return str(folder) if ("/" in data or os.sep in data or folder.is_dir()) else data


def write(folder: Path, course: Course) -> Path:
    """Write `course` as `folder`'s course file; its path."""
    path = Path(folder) / FILE_NAME
    path.write_text(course.to_toml(), encoding="utf-8")
    read(path)  # what is written reads back
    return path


def find(start: Path | None = None) -> Path | None:
    """The course file of `start` (default: the working folder) or of the nearest folder above it."""
    try:
        here = Path(start or os.getcwd()).resolve()
        for folder in (here, *here.parents):
            path = folder / FILE_NAME
            if path.is_file():
                return path
    except OSError:  # a working folder removed under the process, or one it may not read
        pass
    return None


@functools.cache
def _cached(path: Path, stamp: tuple[int, int]) -> Course:
    return read(path)


def current() -> Course:
    """The course in force here: the nearest course file's, else the one a parent process read (a child the
    kit starts in a folder of its own, e.g. a verifier's fresh process, trains the kernel's course), else the
    kit's defaults. The file found is passed on to the processes this one starts ($PERFLAB_COURSE_FILE)."""
    path = find()
    if path is not None:
        os.environ[FILE_ENV] = str(path)
    else:
        inherited = os.environ.get(FILE_ENV, "").strip()
        path = Path(inherited) if inherited else None
    if path is None:
        return Course()
    try:
        info = path.stat()
    except OSError:  # a parent's file this process cannot see (a sandbox): the kit's defaults
        return Course()
    return _cached(path, (info.st_mtime_ns, info.st_size))


def model() -> str:
    """The course's model: $PERFLAB_MODEL, else the course file's, else DEFAULT_MODEL."""
    return os.environ.get(MODEL_ENV, "").strip() or current().model


def data() -> str | None:
    """The course's data set: $PERFLAB_DATA (a size, or a folder made absolute), else the course file's;
    None where each mode chooses its own."""
    value = os.environ.get(DATA_ENV, "").strip()
    if value:
        folder = os.path.expanduser(value)
        return os.path.abspath(folder) if os.path.isdir(folder) else value
    return current().data


@contextlib.contextmanager
def in_force(course: Course) -> Iterator[None]:
    """`course`'s model and data set in this process's environment (and so in every process it starts)
    while the block runs; a variable already set wins, as it does over a course file."""
    before = {name: os.environ.get(name) for name in (MODEL_ENV, DATA_ENV)}
    wanted = {MODEL_ENV: course.model, DATA_ENV: course.data}
    for name, value in wanted.items():
        if value and not (before[name] or "").strip():
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def of_folder(folder: Path, labs: Sequence[str] = ()) -> Course:
    """The course file in `folder` where there is one; else a course of `labs` with the model and data set in
    force here."""
    path = Path(folder) / FILE_NAME
    return read(path) if path.is_file() else Course(tuple(labs), model(), data())
