"""The `perflab` command. Each subcommand lives in its own module here and registers itself."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

# Subcommand modules, in the order `perflab --help` lists them. Each has `register(subparsers)`.
COMMANDS = ("env", "dataset", "profile", "calibrate", "report", "grade")


class UserError(Exception):
    """An error caused by the user's input: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perflab",
        description="Profile and speed up PyTorch training; the reference profiler of the perflab course kit.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is being done")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"perflab.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"perflab.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from perflab.results import ResultsError

    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, not in Python's flush at exit
        return code
    except (UserError, ValueError, FileNotFoundError, ResultsError) as exc:
        print(f"perflab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"perflab {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe broke (a subprocess's): an error to see, not a reader that stopped
        # The reader went away (`perflab grade status | head`): stop quietly, as `ls | head` does. Python's
        # own flush at exit would fail on the same pipe, so stdout goes to /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a program a closed pipe stopped


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader went away (poll reports an error on its end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLERR | select.POLLHUP)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows) or no file behind stdout
        return True


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
