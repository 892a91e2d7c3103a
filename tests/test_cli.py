"""The `perflab` command as a shell user meets it."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """`perflab env | head -1`: the pipe closes before perflab has written; it stops quietly."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        proc = subprocess.run([sys.executable, "-c", "import sys; from perflab.cli import main; sys.exit(main(['env']))"],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 141
