"""The ``cudacore`` command line (also ``python -m cudacore``).

Each command is a subparser: its module gives ``configure_parser(parser)`` (its flags) and
``run(args, out, err) -> int`` (the exit status), so a command or a flag is added in one place.

Exit statuses: 0 success, 1 the command failed (for example no CUDA driver), 2 a usage error. A reader that
closes the pipe early (``cudacore doctor | head -1``) ends the output quietly, with status 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from . import _doctor
from ._version import __version__


def build_parser() -> argparse.ArgumentParser:
    """The parser of the whole command line."""
    parser = argparse.ArgumentParser(
        prog="cudacore",
        description="cudacore: the CUDA memory and execution core for Python.",
        epilog="CUDACORE_BACKEND=sim runs every command on the simulator (no GPU needed).",
    )
    parser.add_argument("--version", action="version", version=f"cudacore {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="<command>")
    doctor = commands.add_parser(
        "doctor",
        help="report the versions, the CUDA driver and every device with its limits",
        description=_doctor.DESCRIPTION,
    )
    _doctor.configure_parser(doctor)
    doctor.set_defaults(run=_doctor.run)
    return parser


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(err)
            return 2
        status: int = args.run(args, out, err)
        out.flush()
    except SystemExit as exc:  # argparse: --help, --version (0) and usage errors (2)
        code = exc.code
        return code if isinstance(code, int) else 0 if code is None else 1
    except BrokenPipeError:
        _quiet_stdout(out)
        return 0
    return status


def _quiet_stdout(out: TextIO) -> None:
    """The reader went away: send what is still buffered (and the interpreter's flush at exit) to
    /dev/null, so that no BrokenPipeError is printed on the way out."""
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
