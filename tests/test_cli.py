"""The `perflab` command as a shell user meets it."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """`perflab env | head -1`: the pipe closes before perflab has written; it stops quietly."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    # Buffered output, as in a shell (the test suite itself may run unbuffered).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        proc = subprocess.run([sys.executable, "-c", "import sys; from perflab.cli import main; sys.exit(main(['env']))"],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 141


def test_a_broken_pipe_elsewhere_is_not_taken_for_a_reader_that_stopped(monkeypatch, capsys) -> None:
    """Only standard output's reader going away is quiet: another broken pipe is an error to see."""
    import pytest

    from perflab import cli

    def broken(args):
        raise BrokenPipeError("a subprocess's pipe")

    parser = cli.build_parser()
    args = parser.parse_args(["env"])
    monkeypatch.setattr(args, "func", broken, raising=False)
    monkeypatch.setattr(cli, "build_parser", lambda: type("P", (), {"parse_args": lambda self, argv: args})())
    monkeypatch.setattr(cli, "_stdout_closed", lambda: False)
    with pytest.raises(BrokenPipeError):
        cli.main(["env"])
