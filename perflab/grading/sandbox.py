"""Run one command in a sandbox: its own folder, resource limits, no network, nothing else in reach.

    run(argv, workdir=..., limits=Limits(wall_s=60), hide=[course, solutions]) -> SandboxRun

How strong the sandbox is depends on what the OS allows, and `isolation()` says which applies:

    root     running as root: new network, mount and PID namespaces (`unshare`), the folders in
             `hide` covered by empty read-only tmpfs mounts, a private /tmp, /var/tmp and /dev/shm,
             then the command runs as the unprivileged user `perflab-sandbox` (created on first
             use), which owns only `workdir`. RLIMIT_NPROC counts that user's processes.
    userns   not root, but unprivileged user namespaces work: the same namespaces and mounts, the
             command keeps the caller's uid (so RLIMIT_NPROC counts the caller's processes).
    none     neither: limits and a process tree killed on timeout, but the network stays reachable
             and nothing is hidden; `perflab grade grade` refuses it unless told `--unisolated`.

In both namespace kinds every other mount is then made read-only inside the sandbox (the grader's
home, the virtual environment, the checkout, /dev, /sys...): the work folder and the private temp
folders are the only places a submission can write. With `userns` that
is what stops the grader's own uid from writing the grader's files. $PERFLAB_SANDBOX_KIND=userns
asks for `userns` where `root` is possible (how CI, running as root, tests the non-root path).

Limits (setrlimit, inherited by every process the command starts): address space (RLIMIT_AS),
process count (RLIMIT_NPROC), file size (RLIMIT_FSIZE), and a wall clock enforced from outside
(the whole PID namespace is killed). The command's result travels back on a private pipe
(fd number in $PERFLAB_RESULT_FD), never through a file the sandboxed code could rewrite.

This module is the parent's side (probe what the OS allows, start the run, watch it, kill it);
what runs inside the new namespaces before the command (mounts, read-only remounts, dropping
privileges, rlimits) is `perflab.grading.sandbox_boot`, the module the run boots with.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perflab.grading.sandbox_boot import PRIVATE_TMP, SPEC_ENV, outermost

log = logging.getLogger(__name__)

SANDBOX_USER = "perflab-sandbox"
# Where world-writable folders are looked for, and how deep: the places an OS puts shared scratch space.
WRITABLE_ROOTS = ("/tmp", "/var", "/run", "/dev", "/home", "/srv", "/opt", "/mnt", "/media")
WRITABLE_DEPTH = 3
# The bytes of console output kept from a sandboxed run (its tail; the rest is dropped unread).
OUTPUT_TAIL_BYTES = 64 * 1024
# The result pipe carries at most this much (a notebook with capped outputs fits easily).
RESULT_MAX_BYTES = 64 * 1024 * 1024
# Concurrent sandboxes on one machine, each under its own uid (RLIMIT_NPROC is counted per uid,
# so one student's fork bomb cannot starve another's kernel of processes).
UID_SLOTS = 64
# Uids of the extra slots: far above any account a system hands out.
EXTRA_UID_BASE = 1_900_000_000
GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use. None switches a limit off."""

    wall_s: float = 900.0
    # The submission's memory: all its processes together in its cgroup, where the machine has cgroups,
    # and each process's address space (RLIMIT_AS) unless `address_space` is off. torch's CPU import maps
    # ~1.5 GiB; 8 GiB leaves room for real training steps while a runaway allocation fails fast.
    memory_bytes: int | None = 8 * GiB
    # Also cap each process's address space at `memory_bytes`. Off for a job that may use CUDA
    # (`grading.devices.job_limits`): the driver reserves far more address space than it uses, and under
    # the cap CUDA cannot start at all.
    address_space: bool = True
    # Processes and threads of the sandbox user (a kernel with torch runs ~40 threads).
    processes: int | None = 512
    # Largest file the command may write (a results JSON, a trace, a notebook with capped outputs).
    file_bytes: int | None = 256 * MiB
    # CPU cores the run is pinned to (None: all); the local pool gives each job its own.
    cpus: tuple[int, ...] | None = None
    # Size of each private tmpfs (the work folder, /tmp and every other world-writable folder): what a
    # submission can write at all, in RAM, never on the host's disk.
    disk_bytes: int | None = 2 * GiB

    def __post_init__(self) -> None:
        if self.wall_s <= 0:
            raise ValueError(f"wall_s: must be positive, got {self.wall_s}")
        for name in ("memory_bytes", "processes", "file_bytes", "disk_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}: must be at least 1 or None, got {value}")


@dataclass(frozen=True)
class Isolation:
    """Which sandbox this machine can give (see the module docstring)."""

    kind: str  # root | userns | none
    notes: tuple[str, ...] = ()

    @property
    def network_isolated(self) -> bool:
        return self.kind in ("root", "userns")


@dataclass(frozen=True)
class SandboxRun:
    """What came back from one sandboxed command."""

    returncode: int
    timed_out: bool
    wall_s: float
    result: bytes  # what the command wrote to $PERFLAB_RESULT_FD
    output_tail: str  # the end of its stdout and stderr, together
    isolation: Isolation
    notes: tuple[str, ...] = field(default=())

    @property
    def signal(self) -> int | None:
        """The signal that ended the command, if one did."""
        if self.returncode < 0:
            return -self.returncode
        return self.returncode - 128 if self.returncode > 128 else None


@functools.cache
def world_writable_folders() -> tuple[str, ...]:
    """Every world-writable folder under `WRITABLE_ROOTS` (to `WRITABLE_DEPTH`), outermost only, plus
    `PRIVATE_TMP`: each gets a fresh private tmpfs in the sandbox, so nothing written there outlives it."""
    import stat

    found = {p for p in PRIVATE_TMP if os.path.isdir(p)}
    for root in WRITABLE_ROOTS:
        if not os.path.isdir(root) or os.path.islink(root):
            continue
        base = root.rstrip("/").count("/")
        for dirpath, dirnames, _ in os.walk(root):
            depth = dirpath.rstrip("/").count("/") - base
            keep = []
            for name in dirnames:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if not stat.S_ISDIR(st.st_mode) or path.startswith(("/dev/pts", "/proc", "/sys")):
                    continue
                if st.st_mode & stat.S_IWOTH:
                    found.add(path)
                elif depth + 1 < WRITABLE_DEPTH:
                    keep.append(name)
            dirnames[:] = keep
    return tuple(outermost(sorted(found)))


# ---------------------------------------------------------------------------------------------
# Limits for the whole sandbox (every process together), where the machine's cgroups allow it

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Cgroups:
    """How per-submission memory and process limits are enforced here: "v2", "v1" or "none"."""

    kind: str
    note: str = ""


@functools.cache
def cgroups() -> Cgroups:
    """Probe once whether this process can make cgroups that limit a whole sandbox."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return Cgroups("none", "memory and processes are limited per process only (RLIMIT_AS, RLIMIT_NPROC): "
                               "cgroups need root")
    probe = f"perflab-probe-{os.getpid()}"
    try:
        if (CGROUP_ROOT / "cgroup.controllers").is_file():
            controllers = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
            if {"memory", "pids"} <= set(controllers):
                path = CGROUP_ROOT / probe
                path.mkdir()
                ok = (path / "memory.max").exists() and (path / "pids.max").exists()
                path.rmdir()
                if ok:
                    return Cgroups("v2")
        elif (CGROUP_ROOT / "memory").is_dir() and (CGROUP_ROOT / "pids").is_dir():
            for controller in ("memory", "pids"):
                (CGROUP_ROOT / controller / probe).mkdir()
                (CGROUP_ROOT / controller / probe).rmdir()
            return Cgroups("v1")
    except OSError as exc:
        return Cgroups("none", f"memory and processes are limited per process only: cgroups cannot be made "
                               f"here ({exc.strerror or exc})")
    return Cgroups("none", "memory and processes are limited per process only: no memory and pids cgroup controllers")


class SandboxCgroup:
    """One sandbox's cgroup(s): every process in it shares `memory_bytes` and `processes`."""

    def __init__(self, kind: str, name: str, memory_bytes: int | None, processes: int | None) -> None:
        self.kind = kind
        if kind == "v2":
            self.paths = [CGROUP_ROOT / name]
            self.paths[0].mkdir()
            self._write(self.paths[0] / "memory.max", memory_bytes)
            self._write(self.paths[0] / "memory.swap.max", 0 if memory_bytes else None)
            self._write(self.paths[0] / "pids.max", processes)
        else:
            self.paths = [CGROUP_ROOT / "memory" / name, CGROUP_ROOT / "pids" / name]
            for path in self.paths:
                path.mkdir()
            self._write(self.paths[0] / "memory.limit_in_bytes", memory_bytes)
            self._write(self.paths[1] / "pids.max", processes)

    @staticmethod
    def _write(path: Path, value: int | None) -> None:
        if value is not None and path.exists():
            with contextlib.suppress(OSError):
                path.write_text(str(value))

    def procs_files(self) -> list[str]:
        return [str(p / "cgroup.procs") for p in self.paths]

    def peak_bytes(self) -> int | None:
        for name in ("memory.peak", "memory.max_usage_in_bytes"):
            with contextlib.suppress(OSError, ValueError):
                return int((self.paths[0] / name).read_text())
        return None

    def close(self) -> None:
        """Kill whatever is left in the cgroup and remove it."""
        for path in self.paths:
            with contextlib.suppress(OSError):
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
        for path in self.paths:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


def _join_cgroups(procs_files: Sequence[str]) -> Callable[[], None]:
    """A preexec_fn that moves the new process into the sandbox's cgroups, then arms the parent-death signal."""
    def join() -> None:
        for path in procs_files:
            with open(path, "w") as handle:
                handle.write(str(os.getpid()))
        _die_with_parent()

    return join


# Asks for a weaker namespace kind than this machine allows (only "userns", and only as root).
KIND_ENV = "PERFLAB_SANDBOX_KIND"


def isolation() -> Isolation:
    """What this machine allows (probed once): root namespaces, user namespaces, or nothing."""
    requested = os.environ.get(KIND_ENV, "")
    if requested not in ("", "userns"):
        raise ValueError(f"{KIND_ENV}: {requested!r} is not a kind one can ask for (only userns)")
    return _isolation(requested)


@functools.cache
def _isolation(requested: str) -> Isolation:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return Isolation("none", ("no network isolation: this OS has no unshare(1); "
                                  "the sandbox only limits resources",))
    if os.geteuid() == 0 and requested != "userns":
        probe = ["unshare", "--net", "--mount", "--pid", "--fork", "true"]
        kind = "root"
    else:
        probe = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "true"]
        kind = "userns"
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if ok:
        return Isolation(kind)
    return Isolation("none", (f"no network isolation: `{' '.join(probe[:-1])}` is not permitted here; "
                              "the sandbox only limits resources",))


def describe() -> list[str]:
    """What this machine's sandbox enforces, one line each (for `perflab grade status`)."""
    iso, cg = isolation(), cgroups()
    kinds = {"root": "network, mount and PID namespaces, read-only but for its own folders; runs as an "
                     "unprivileged user",
             "userns": "network, mount and PID namespaces in a user namespace, read-only but for its own "
                       "folders; runs as the grader's uid",
             "none": "no namespaces: the network stays reachable and no folder is hidden"}
    lines = [f"sandbox      {iso.kind}: {kinds[iso.kind]}"]
    if cg.kind != "none":
        lines.append(f"limits       memory and processes for the whole submission (cgroup {cg.kind}), "
                     "address space and file size per process")
    else:
        lines.append(f"limits       {cg.note}")
    if iso.kind != "none":
        lines.append(f"private      a sized tmpfs for the work folder and {len(world_writable_folders())} "
                     f"world-writable folder(s): {', '.join(world_writable_folders())}")
    return lines


def missing_isolation() -> list[str]:
    """What `--require-isolation` finds missing on this machine (empty when all is enforced)."""
    out = list(isolation().notes)
    if cgroups().kind == "none":
        out.append(cgroups().note)
    return out


def sandbox_user() -> pwd.struct_passwd:
    """The unprivileged user sandboxed code runs as when perflab runs as root (created if missing)."""
    try:
        return pwd.getpwnam(SANDBOX_USER)
    except KeyError:
        pass
    if os.geteuid() != 0:
        raise PermissionError(f"user {SANDBOX_USER!r} does not exist and only root can create it")
    subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                    "--shell", "/usr/sbin/nologin", SANDBOX_USER], check=True, capture_output=True)
    log.info("created the unprivileged user %s for sandboxed grading", SANDBOX_USER)
    return pwd.getpwnam(SANDBOX_USER)


def run(argv: Sequence[str], *, workdir: Path, limits: Limits, hide: Sequence[Path] = (),
        env: Mapping[str, str] | None = None, binds: Mapping[str, str] | None = None) -> SandboxRun:
    """Run `argv` in `workdir` under `limits`, with the folders in `hide` out of reach.

    `binds` maps a host file to a path inside `workdir` where the same file appears. The run never
    raises for what the command does: a crash, a signal or a timeout is described in the returned
    `SandboxRun`.
    """
    iso = isolation()
    workdir = Path(workdir).resolve()
    notes = list(iso.notes)
    uid = gid = None
    slot = contextlib.ExitStack()
    if iso.kind == "root":
        try:
            user = sandbox_user()
            uid, gid = slot.enter_context(_uid_slot(workdir.parent, user)), user.pw_gid
            _chown_tree(workdir, uid, gid)
        except (OSError, subprocess.CalledProcessError, PermissionError) as exc:
            notes.append(f"could not drop privileges ({exc}); the sandbox runs as root without a process limit")
    group = None
    cg = cgroups()
    if cg.kind != "none":
        try:
            group = SandboxCgroup(cg.kind, f"perflab-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}",
                                  limits.memory_bytes, limits.processes and limits.processes + 64)
        except OSError as exc:
            notes.append(f"could not make the sandbox's cgroup ({exc}); memory is limited per process only")
    else:
        notes.append(cg.note)
    if limits.memory_bytes and not limits.address_space and group is None:
        notes.append("memory is not limited for this run: it may use CUDA, which an address-space limit stops, "
                     "and this machine gives it no cgroup")
    spec = {
        "argv": list(argv), "workdir": str(workdir), "uid": uid, "gid": gid,
        "private": list(world_writable_folders()) if iso.kind != "none" else [],
        "disk_bytes": limits.disk_bytes,
        "mounts": iso.kind != "none", "hide": [str(Path(p).resolve()) for p in hide if Path(p).exists()],
        "binds": dict(binds or {}),
        "data": [str(Path(p).resolve()) for p in data_folders()],  # kept, read-only, inside a private /tmp
        "expose": _unreachable(needed_paths(), uid, gid) if uid is not None else [],
        "rlimits": {"AS": limits.memory_bytes if limits.address_space else None, "NPROC": limits.processes,
                    "FSIZE": limits.file_bytes},
        "cpus": list(limits.cpus) if limits.cpus else None,
        "env": dict(env or {}),
    }
    boot = [sys.executable, "-m", "perflab.grading.sandbox_boot"]
    if iso.kind == "root":
        cmd = ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc", *boot]
    elif iso.kind == "userns":
        cmd = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork",
               "--kill-child=SIGKILL", "--mount-proc", *boot]
    else:
        cmd = boot
    for note in notes:
        log.warning("sandbox: %s", note)

    read_fd, write_fd = os.pipe()
    spec["result_fd"] = write_fd
    result_chunks: list[bytes] = []
    tail: deque[bytes] = deque()
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        pass_fds=(write_fd,), start_new_session=True,
        preexec_fn=_join_cgroups(group.procs_files()) if group else _die_with_parent,
        env={**_base_env(), SPEC_ENV: json.dumps(spec)}, cwd=str(workdir))
    os.close(write_fd)
    readers = [threading.Thread(target=_drain, args=(read_fd, result_chunks, RESULT_MAX_BYTES), daemon=True),
               threading.Thread(target=_tail, args=(proc.stdout, tail), daemon=True)]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        proc.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
    except BaseException:
        _kill(proc)
        raise
    finally:
        for reader in readers:
            reader.join(timeout=10)
        with contextlib.suppress(OSError):
            os.close(read_fd)
        if group is not None:
            group.close()
        slot.close()
    wall = time.perf_counter() - started
    return SandboxRun(returncode=proc.returncode, timed_out=timed_out, wall_s=wall,
                      result=b"".join(result_chunks),
                      output_tail=b"".join(tail).decode("utf-8", "replace"),
                      isolation=iso, notes=tuple(notes))


# ---------------------------------------------------------------------------------------------
# Parent side


def needed_paths() -> list[Path]:
    """What any sandboxed grading run must be able to read: this interpreter and perflab."""
    import perflab

    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
             Path(perflab.__file__).resolve().parents[1], *(Path(p).resolve() for p in data_folders())}
    return sorted(paths)


def data_folders() -> list[str]:
    """The folders of data a sandboxed run reads besides the kit's own `datasets/build`, read-only like
    everything outside its work folder: $PERFLAB_DATA_DIR (where the sizes are built) and the course's
    ImageFolder ($PERFLAB_DATA where it is a folder; `cifar10:PATH`'s PATH)."""
    from perflab.env import course_data

    data = course_data() or ""
    data = data[len("cifar10:"):] if data.startswith("cifar10:") else data
    return [str(Path(p).expanduser()) for p in (os.environ.get("PERFLAB_DATA_DIR"), data)
            if p and Path(p).expanduser().is_dir()]


def _unreachable(paths: Sequence[Path], uid: int, gid: int) -> list[tuple[str, str]]:
    """(ancestor, path) for each path that `uid` cannot reach because `ancestor` (the highest
    folder on its way without search permission for it) is closed; the sandbox mounts a tmpfs
    over that ancestor and binds only `path` back in."""
    out = []
    for path in paths:
        for ancestor in reversed(path.parents):
            st = ancestor.stat()
            bit = 0o010 if st.st_gid == gid else 0o001
            if st.st_uid != uid and not st.st_mode & bit:
                out.append((str(ancestor), str(path)))
                break
    return out


def _base_env() -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")
    return {k: os.environ[k] for k in keep if k in os.environ}


def _die_with_parent() -> None:
    """If the process that started the sandbox dies (a killed Ray worker), the sandbox dies too."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _uid_slot(base: Path, user: pwd.struct_passwd):
    """A uid no other running sandbox has, so each gets its own RLIMIT_NPROC count: the first is
    `perflab-sandbox` itself, the others numbered uids in its group (held by a lock file)."""
    import fcntl

    for slot in range(UID_SLOTS):
        handle = open(base / f".uid-slot-{slot}.lock", "a+")  # noqa: SIM115 (held while the sandbox runs)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield user.pw_uid if slot == 0 else EXTRA_UID_BASE + slot
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        return
    raise OSError(f"all {UID_SLOTS} sandbox uids are in use")


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def _drain(fd: int, chunks: list[bytes], limit: int) -> None:
    size = 0
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            return
        if not data:
            return
        if size < limit:
            chunks.append(data[: limit - size])
        size += len(data)


def _tail(stream, tail: deque[bytes]) -> None:
    size = 0
    for chunk in iter(lambda: stream.read1(1 << 16), b""):
        tail.append(chunk)
        size += len(chunk)
        while size > OUTPUT_TAIL_BYTES and len(tail) > 1:
            size -= len(tail.popleft())


def _kill(proc: subprocess.Popen) -> None:
    """Kill the sandbox: its process group, and (without a PID namespace) every descendant."""
    try:
        import psutil

        descendants = psutil.Process(proc.pid).children(recursive=True)
    except Exception:
        descendants = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in descendants:
        with contextlib.suppress(Exception):
            child.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
