"""The sandbox's inside: what runs in the new namespaces before the command, then the command.

    python -m perflab.grading.sandbox_boot        (started by `sandbox.run`, never by hand)

It reads its instructions from $PERFLAB_SANDBOX_SPEC (written by `sandbox.run`: the command, the work
folder, what to hide, bind and expose, the private temp folders, the limits, the uid to become), then:
puts the work folder on a sized tmpfs (`_size_workdir`), binds the files it is given into it, covers
each hidden folder with an empty read-only tmpfs, gives every world-writable folder a fresh private
tmpfs, remounts everything else read-only (`read_only_elsewhere`), brings the loopback up, pins the
CPUs, drops to the sandbox's uid, sets the rlimits and runs the command, reaping orphans as PID 1 of
the namespace until it ends. The command's result goes to the pipe fd the spec names.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# Folders every sandbox gets fresh and empty, whatever else is world-writable on the host
# (`sandbox.world_writable_folders` finds the rest: /run/lock, /var/crash, ...).
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
# The variable `sandbox.run` passes the spec in.
SPEC_ENV = "PERFLAB_SANDBOX_SPEC"


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


# What a hidden Python package holds instead: an empty folder would import as an empty namespace package
# (a lab's `judges/` answering AttributeError where the student's kit answers ModuleNotFoundError).
HIDDEN_PACKAGE = ('raise ModuleNotFoundError(f"No module named {__name__!r} (the grading sandbox hides it)", '
                  'name=__name__)\n')


def _hide(path: str) -> None:
    """Cover `path` with an empty read-only tmpfs; a package keeps an `__init__` that refuses its import."""
    package = os.path.isfile(os.path.join(path, "__init__.py"))
    _mount("-t", "tmpfs", "-o", "size=64k,mode=0755", "perflab-hidden", path)
    if package:
        Path(path, "__init__.py").write_text(HIDDEN_PACKAGE, encoding="utf-8")
    _mount("-o", "remount,ro", path)


def _loopback_up() -> None:
    """A new network namespace has its loopback down; kernels talk to nbclient over it."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 0x1))  # SIOCSIFFLAGS |= IFF_UP


def _isolate_files(workdir: str, hide: Sequence[str], binds: Mapping[str, str],
                   expose: Sequence[tuple[str, str]], private: Sequence[str] = PRIVATE_TMP,
                   disk_bytes: int | None = None, data: Sequence[str] = ()) -> None:
    size = f",size={disk_bytes}" if disk_bytes else ""
    _size_workdir(workdir, size)
    if not size:
        _mount("--bind", workdir, workdir)  # its own mount, so it stays writable when the rest is not
    groups: dict[str, list[str]] = {}
    for ancestor, path in expose:
        groups.setdefault(ancestor, []).append(path)
    for i, (ancestor, paths) in enumerate(groups.items()):
        staged = []
        for j, path in enumerate(paths):
            stage = os.path.join(workdir, ".stage", f"{i}-{j}")
            os.makedirs(stage)
            _mount("--rbind", path, stage)
            staged.append((stage, path))
        _mount("-t", "tmpfs", "-o", "mode=0755", "perflab-expose", ancestor)
        for stage, path in staged:
            os.makedirs(path, exist_ok=True)
            _mount("--move", stage, path)
    targets = []
    for src, dst in binds.items():
        target = os.path.join(workdir, dst)
        Path(target).touch()
        _mount("--bind", src, target)
        targets.append(target)
    for path in hide:
        _hide(path)
    # What must stay visible inside a private /tmp: the work folder, and the interpreter, the kit and the
    # data folders when they live there (a checkout cloned under /tmp, as CI does; a course's ImageFolder).
    keep = outermost([workdir, sys.prefix, str(Path(__file__).resolve().parents[2]), *data])
    fresh_tmps = []
    for n, tmp in enumerate(private):
        if not os.path.isdir(tmp):
            continue
        fresh_tmps.append(tmp)
        inside = [p for p in keep if p == tmp or p.startswith(tmp.rstrip("/") + "/")]
        if inside:
            # Mount the fresh tmpfs beside the work folder, bind each kept folder into it at the
            # same path, then move it over `tmp`: those folders stay, the rest of `tmp` goes.
            fresh = os.path.join(workdir, f".private-tmp-{n}")
            os.makedirs(fresh, exist_ok=True)
            _mount("-t", "tmpfs", "-o", f"mode=1777{size}", "perflab-tmp", fresh)
            for path in inside:
                inner = os.path.join(fresh, os.path.relpath(path, tmp))
                os.makedirs(inner, exist_ok=True)
                _mount("--rbind", path, inner)
            _mount("--move", fresh, tmp)
        else:
            _mount("-t", "tmpfs", "-o", f"mode=1777{size}", "perflab-tmp", tmp)
    read_only_elsewhere([workdir, *fresh_tmps, *targets])


# mount(2) flags (linux/mount.h): what a read-only remount sets, and the per-mount flags it must keep
# (a user namespace may not clear nosuid, nodev, noexec or the atime flags of a mount it inherited).
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
KEPT_MOUNT_FLAGS = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
                    "relatime": 1 << 21, "strictatime": 1 << 24}
# Mounts left as they are: the PID namespace's own /proc (mounted fresh; its files have their own checks).
UNTOUCHED_MOUNTS = ("/proc",)


def mounts() -> list[tuple[str, str]]:
    """(mount point, per-mount options) of every mount this process sees, from /proc/self/mountinfo."""
    import re

    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            out.append((point, fields[5]))
    return out


def read_only_elsewhere(writable: Sequence[str]) -> None:
    """Remount every mount but the `writable` ones (and /proc) read-only in this mount namespace:
    the grader's home, its virtual environment, the checkout and every other host folder. Fails
    (and so does the sandbox) when a mount it can reach cannot be made read-only."""
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    keep = {os.path.realpath(p) for p in writable}
    for point, options in mounts():
        opts = options.split(",")
        if point in keep or "ro" in opts or any(point == u or point.startswith(u + "/") for u in UNTOUCHED_MOUNTS):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in opts:
            flags |= KEPT_MOUNT_FLAGS.get(opt, 0)
        if libc.mount(None, point.encode(), None, flags, None) != 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.EACCES):  # under a covered or closed folder: out of reach already
                continue
            raise OSError(err, f"could not make {point} read-only in the sandbox: {os.strerror(err)}")


def _size_workdir(workdir: str, size: str) -> None:
    """Put the work folder on a sized tmpfs holding a copy of what the parent laid out in it: what the
    submission writes is bounded and never reaches the host's disk."""
    if not size:
        return
    stage = workdir.rstrip("/") + ".stage"
    os.makedirs(stage, exist_ok=True)
    _mount("--bind", workdir, stage)
    st = os.stat(workdir)
    _mount("-t", "tmpfs", "-o", f"mode=0700{size}", "perflab-work", workdir)
    for name in os.listdir(stage):
        if name == ".stage":
            continue
        source, target = os.path.join(stage, name), os.path.join(workdir, name)
        if os.path.isdir(source) and not os.path.islink(source):
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)
    os.chown(workdir, st.st_uid, st.st_gid)
    for dirpath, dirnames, filenames in os.walk(workdir):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), st.st_uid, st.st_gid)
    subprocess.run(["umount", "-l", stage], check=False)
    with contextlib.suppress(OSError):
        os.rmdir(stage)


def outermost(paths: Sequence[str]) -> list[str]:
    """The given folders without those inside another one of them."""
    real = sorted({os.path.realpath(p) for p in paths})
    return [p for p in real if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in real)]


def _set_limits(rlimits: Mapping[str, int | None]) -> None:
    for name, value in rlimits.items():
        if value is not None:
            kind = getattr(resource, f"RLIMIT_{name}")
            resource.setrlimit(kind, (value, value))


def _boot() -> int:
    spec = json.loads(os.environ.pop(SPEC_ENV))
    workdir = spec["workdir"]
    if spec["mounts"]:
        _isolate_files(workdir, spec["hide"], spec["binds"], spec["expose"], spec["private"] or PRIVATE_TMP,
                       spec.get("disk_bytes"), spec.get("data", ()))
        _loopback_up()
    if spec["cpus"]:
        os.sched_setaffinity(0, spec["cpus"])
    if spec["uid"] is not None:
        os.setgroups([])
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
    env = {**os.environ, **spec["env"], "PERFLAB_RESULT_FD": str(spec["result_fd"]),
           "PERFLAB_SANDBOX_PIDNS": "1" if spec["mounts"] else "0"}
    _set_limits(spec["rlimits"])
    child = subprocess.Popen(spec["argv"], cwd=workdir, env=env, pass_fds=(spec["result_fd"],))
    os.close(spec["result_fd"])
    # As PID 1 of the namespace this process reaps every orphan until the command ends; its exit
    # then ends everything left in the namespace.
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status) if status else 0


if __name__ == "__main__":
    code = _boot()
    sys.exit(128 - code if code < 0 else code)
