"""Threads: total throughput of allocation and of small copies with 1, 2, 4, 8 and 16 Python threads.

    python bench/threads.py               # GPU machine: cudacore against CuPy, one run
    CUDACORE_BACKEND=sim python bench/threads.py --quick

Each thread works on its own stream for a fixed time per round (bench/alloc.py's `rate`); rounds rotate
the contenders; the table gives medians over rounds of the total operations per second, in millions, and
the 8-thread total relative to the 1-thread total. "small copy" is a 4 KiB host-to-device copy from pinned
memory, asynchronous on the thread's stream, with a synchronize every 64 copies.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from collections.abc import Callable

from alloc import rate

import cudacore as cc

Run = Callable[[int], None]
SMALL = 4096


def cudacore_copy() -> Run:
    d = cc.Device(0)
    local = threading.local()

    def run(n: int) -> None:
        if not hasattr(local, "stream"):
            local.stream = d.create_stream(non_blocking=True)
            local.host = d.allocate_pinned(SMALL)
            local.buf = d.allocate(SMALL, stream=local.stream)
        s, host, buf = local.stream, local.host, local.buf
        copy = buf.copy_from
        for i in range(n):
            copy(host, stream=s)
            if i % 64 == 63:
                s.synchronize()
        s.synchronize()

    return run


def cupy_copy() -> Run | None:
    try:
        import cupy
        import cupyx
    except ImportError:
        return None
    local = threading.local()

    def run(n: int) -> None:
        if not hasattr(local, "stream"):
            local.stream = cupy.cuda.Stream(non_blocking=True)
            local.host = cupyx.empty_pinned((SMALL,), dtype="uint8")
            local.dev = cupy.empty((SMALL,), dtype="uint8")
        s, host, dev = local.stream, local.host, local.dev
        for i in range(n):
            dev.set(host, stream=s)
            if i % 64 == 63:
                s.synchronize()
        s.synchronize()

    return run


def cudacore_alloc() -> Run:
    d = cc.Device(0)
    alloc = d.allocate

    def run(n: int) -> None:
        for _ in range(n):
            alloc(1 << 20).close()

    return run


def cupy_alloc() -> Run | None:
    try:
        import cupy
    except ImportError:
        return None
    pool = cupy.cuda.MemoryPool()

    def run(n: int) -> None:
        malloc = pool.malloc
        for _ in range(n):
            malloc(1 << 20)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    seconds = 0.05 if args.quick else 0.3
    rounds = 2 if args.quick else args.rounds
    counts = [int(t) for t in args.threads.split(",")]
    peers = cc.backend() == "cuda"
    made = {
        "alloc+free 1 MiB: cudacore": cudacore_alloc(),
        "alloc+free 1 MiB: CuPy MemoryPool": cupy_alloc() if peers else None,
        "small copy: cudacore": cudacore_copy(),
        "small copy: CuPy ndarray.set": cupy_copy() if peers else None,
    }
    runs = {k: v for k, v in made.items() if v is not None}
    print(f"threads on {cc.backend()} ({cc.Device(0).name}), Python {sys.version.split()[0]}; {rounds} rounds of "
          f"{seconds:g} s; medians, M operations/s in all")
    names = list(runs)
    for run in runs.values():
        run(256)
    samples: dict[tuple[str, int], list[float]] = {(n, t): [] for n in names for t in counts}
    for r in range(rounds):
        for t in counts:
            for name in names[r % len(names) :] + names[: r % len(names)]:
                samples[(name, t)].append(rate(runs[name], t, seconds) / 1e6)
    print(f"{'':<36}" + "".join(f"{t:>9}" for t in counts) + f"{'8 vs 1':>9}")
    for name in names:
        med = [statistics.median(samples[(name, t)]) for t in counts]
        ratio = f"{med[counts.index(8)] / med[counts.index(1)]:.2f}x" if 1 in counts and 8 in counts else ""
        print(f"{name:<36}" + "".join(f"{m:>9.3f}" for m in med) + f"{ratio:>9}")


if __name__ == "__main__":
    main()
