"""How much of the 8-threads-against-1 loss of the allocation benchmark is the GIL's own. With the GIL
held through every call, 8 threads run one at a time, so their throughput can only match one thread's,
less what the hand-offs cost. This runs, interleaved over several rounds, cudacore's alloc+free pair
(bench/alloc.py), CuPy's pool where installed, and two controls that never leave the interpreter's own
code, with 1 and 8 threads, and prints each one's median rate, the 8-vs-1 ratio and the context switches
per thousand calls at 8 threads. A control with the same ratio says the loss is the interpreter's.

    python scripts/gpu/gil_threads.py [--rounds 7] [--seconds 0.3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from alloc import Pair, cudacore_pair, cupy_pool, rate


def python_loop(n: int) -> None:
    x: list[int] = []
    for i in range(n):
        x.append(i)
        x.pop()


def builtin_calls(n: int) -> None:
    for _ in range(n):
        bytearray(64)


def switches() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_nvcsw + r.ru_nivcsw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.3)
    args = ap.parse_args()
    work: dict[str, Pair] = {"cudacore alloc+free 1 MiB": cudacore_pair(1 << 20)}
    cupy = cupy_pool(1 << 20, "pool")
    if cupy is not None:
        work["CuPy MemoryPool 1 MiB"] = cupy
    work["control: Python list append+pop"] = python_loop
    work["control: bytearray(64)"] = builtin_calls
    for run in work.values():
        run(2000)  # warm up
    rates: dict[tuple[str, int], list[float]] = {(k, t): [] for k in work for t in (1, 8)}
    csw: dict[str, list[float]] = {k: [] for k in work}
    names = list(work)
    for r in range(args.rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            for t in (1, 8) if r % 2 == 0 else (8, 1):
                before = switches()
                per_s = rate(work[k], t, args.seconds)
                rates[(k, t)].append(per_s)
                if t == 8:
                    csw[k].append((switches() - before) / (per_s * args.seconds) * 1000)
    print(f"{'M calls/s (median of ' + str(args.rounds) + ')':<36}{'1 thread':>10}{'8 threads':>10}{'8 vs 1':>8}{'switches/1k':>13}")
    for k in work:
        one, eight = statistics.median(rates[(k, 1)]), statistics.median(rates[(k, 8)])
        print(f"{k:<36}{one / 1e6:>10.3f}{eight / 1e6:>10.3f}{eight / one:>8.2f}{statistics.median(csw[k]):>13.2f}")


if __name__ == "__main__":
    main()
