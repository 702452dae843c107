"""Cost of one call into Go from Python: gopy with the GIL held, gopy releasing it, and the fast path.

    PYTHONPATH=python python bench/gil_calls.py [--threads 8] [--rounds 7] [--calls 200000]

Each round times every variant once, in an order that rotates from round to round, so slow drift of the
machine (frequency, other load) hits all variants alike; the table shows medians over the rounds. With N
threads, each thread makes `calls` calls and the per-call cost is wall time / (N * calls): what a call costs
the process when threads call at once (a GIL convoy shows up here).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from cudacore._native import core, fast


def _noop_hold(n: int) -> None:
    f = core.Noop
    for _ in range(n):
        f(1)


def _noop_release(n: int) -> None:
    f = core.NoopReleased
    for _ in range(n):
        f(0)


def _fast_noop(n: int) -> None:
    f = fast.noop
    for _ in range(n):
        f(1)


def _query_hold(n: int) -> None:
    # A device query through gopy with the GIL held: cuMemGetInfo.
    f = core.DeviceFreeMemory
    for _ in range(n):
        f(0)


def _query_release(n: int) -> None:
    # A device query through gopy that releases the GIL: cuDeviceGetCount.
    f = core.DeviceCount
    for _ in range(n):
        f()


def _query_api(n: int) -> None:
    # The public API on top: Device.memory_info() (error translation, tuple).
    import cudacore

    f = cudacore.Device(0).memory_info
    for _ in range(n):
        f()


def _empty(n: int) -> None:
    # The loop alone, subtracted from nothing: shown so the reader can see the floor.
    for _ in range(n):
        pass


VARIANTS = {
    "core.Noop (GIL held)": _noop_hold,
    "core.NoopReleased(0) (GIL released)": _noop_release,
    "fast.noop (METH_FASTCALL)": _fast_noop,
    "core.DeviceFreeMemory (query, GIL held)": _query_hold,
    "core.DeviceCount (query, GIL released)": _query_release,
    "Device.memory_info() (public API, held)": _query_api,
    "empty loop": _empty,
}


def run_once(fn, calls: int, threads: int) -> float:
    """Seconds per call, wall time over all threads."""
    if threads == 1:
        t0 = time.perf_counter()
        fn(calls)
        return (time.perf_counter() - t0) / calls
    barrier = threading.Barrier(threads + 1)

    def worker() -> None:
        barrier.wait()
        fn(calls)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return (time.perf_counter() - t0) / (calls * threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200_000, help="calls per thread per round")
    args = ap.parse_args()

    assert core.Noop(5) == 5 and core.NoopReleased(0) == 0 and fast.noop(5) == 5
    names = list(VARIANTS)
    configs = [1, args.threads] if args.threads > 1 else [1]
    results: dict[tuple[str, int], list[float]] = {(n, t): [] for n in names for t in configs}
    for fn in VARIANTS.values():  # warm up: first-call costs, thread creation in Go
        fn(1000)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for threads in configs:
            for name in order:
                results[(name, threads)].append(run_once(VARIANTS[name], args.calls, threads))

    print(f"Python {sys.version.split()[0]}, {args.rounds} rounds x {args.calls} calls/thread, medians (min..max)")
    header = f"{'call':<42}" + "".join(f"{f'{t} thread' + ('s' if t > 1 else ''):>26}" for t in configs)
    print(header)
    print("-" * len(header))
    for name in names:
        cells = []
        for t in configs:
            v = [x * 1e9 for x in results[(name, t)]]
            cells.append(f"{statistics.median(v):>9.0f} ns ({min(v):.0f}..{max(v):.0f})")
        print(f"{name:<42}" + "".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    main()
