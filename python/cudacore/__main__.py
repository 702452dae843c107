"""The ``cudacore`` command line (also ``python -m cudacore``)."""

from __future__ import annotations

import sys

from ._doctor import main as doctor

USAGE = """usage: cudacore <command> [options]

commands:
  doctor [--json]   report the CUDA driver and every device (CUDACORE_BACKEND=sim: the simulator)
    --verify        run tiny real probes of what each device supports, instead of reading attributes
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    if args[0] == "doctor":
        return doctor(args[1:])
    sys.stderr.write(f"cudacore: unknown command {args[0]!r}\n{USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
