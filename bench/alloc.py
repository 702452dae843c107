"""Allocation from Python: alloc+free pairs through cudacore and its peers, measured in one run.

    python bench/alloc.py                 # on a GPU machine (peers: CuPy, cuda.bindings, PyTorch)
    CUDACORE_BACKEND=sim python bench/alloc.py --quick    # cudacore alone on the simulator (smoke test)

Three tables. (1) One thread: microseconds per alloc+free pair at 256 B, 1 MiB and 64 MiB, each contender
returning its own object (cudacore a Buffer, CuPy a MemoryPointer, PyTorch a pointer or tensor), with the
ratio to CuPy's MemoryPool. (2) Threads: total pairs per second (millions) with 1, 2, 4, 8 and 16 threads at
1 MiB, each thread allocating on its own for a fixed time (0.3 s a round). (3) The lanes users walk, at
1 MiB: cudacore on the legacy stream, on its own stream passed as stream=s, under ``with s:`` and while a
captured graph is alive, each against CuPy's MemoryPool on the matching lane. Every round runs every contender once, in an order that rotates
from round to round, so drift of a shared machine hits all alike; the tables give medians over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable

import cudacore as cc

Pair = Callable[[int], None]  # runs n alloc+free pairs


def cudacore_pair(size: int) -> Pair:
    d = cc.Device(0)
    alloc = d.allocate

    def run(n: int) -> None:
        for _ in range(n):
            alloc(size).close()

    return run


def cupy_pool(size: int, kind: str) -> Pair | None:
    try:
        import cupy
    except ImportError:
        return None
    pool = cupy.cuda.MemoryPool() if kind == "pool" else cupy.cuda.MemoryAsyncPool()

    def run(n: int) -> None:
        malloc = pool.malloc
        for _ in range(n):
            malloc(size)  # the MemoryPointer dies at once and goes back to the pool

    return run


def bindings_pair(size: int) -> Pair | None:
    try:
        from cuda.bindings import driver
    except ImportError:
        return None

    def check(result: tuple) -> object:
        err, *rest = result
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuda.bindings: {err}")
        return rest[0] if rest else None

    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(0))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    stream = driver.CUstream(0)

    def run(n: int) -> None:
        check(driver.cuCtxSetCurrent(ctx))  # per thread: a new thread has no current context
        alloc, free = driver.cuMemAllocAsync, driver.cuMemFreeAsync
        for _ in range(n):
            _, p = alloc(size, stream)
            free(p, stream)

    return run


def torch_pair(size: int) -> Pair | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete

    def run(n: int) -> None:
        for _ in range(n):
            delete(alloc(size, 0))

    return run


def lanes(with_peers: bool) -> dict[str, Pair]:
    """1 MiB alloc+free pairs on the lanes CuPy and PyTorch users walk: the legacy stream, a stream of
    their own passed explicitly, the current stream under ``with s:``, and the legacy stream while a
    captured graph (one 4 KiB copy) is alive; CuPy's MemoryPool on its null stream, on its own stream
    made current, and with a CuPy graph alive, beside them."""
    size = 1 << 20
    d = cc.Device(0)
    s = d.create_stream()
    alloc = d.allocate
    out: dict[str, Pair] = {}

    def legacy(n: int) -> None:
        for _ in range(n):
            alloc(size).close()

    def explicit(n: int) -> None:
        for _ in range(n):
            alloc(size, stream=s).close()

    def current(n: int) -> None:
        with s:
            for _ in range(n):
                alloc(size).close()

    small, pinned = d.allocate(4096, stream=s), d.allocate_pinned(4096)

    def graph_alive(n: int) -> None:
        # The graph lives while this lane runs (made and destroyed around the burst, a negligible part of
        # it), so that the other lanes run with no graph alive.
        with s.capture() as graph:
            small.copy_from(pinned, stream=s)
        for _ in range(n):
            alloc(size).close()
        graph.destroy()

    out.update({"cudacore, legacy stream": legacy, "cudacore, stream=s": explicit, "cudacore, with s:": current,
                "cudacore, a graph alive": graph_alive})
    if with_peers:
        try:
            import cupy
        except ImportError:
            return out
        pool = cupy.cuda.MemoryPool()
        cs = cupy.cuda.Stream(non_blocking=True)

        def cupy_null(n: int) -> None:
            malloc = pool.malloc
            for _ in range(n):
                malloc(size)

        def cupy_own(n: int) -> None:
            malloc = pool.malloc
            with cs:
                for _ in range(n):
                    malloc(size)

        dst = cupy.empty(4096, dtype=cupy.uint8)
        src = cupy.cuda.alloc_pinned_memory(4096)
        gs = cupy.cuda.Stream(non_blocking=True)

        def cupy_graph(n: int) -> None:
            with gs:
                gs.begin_capture()
                cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ptr, 4096, 1, gs.ptr)
                cgraph = gs.end_capture()
            cupy_null(n)
            del cgraph

        out.update({"CuPy MemoryPool, null stream": cupy_null, "CuPy MemoryPool, with s:": cupy_own,
                    "CuPy MemoryPool, a graph alive": cupy_graph})
    return out


def contenders(size: int, with_peers: bool) -> dict[str, Pair]:
    made: dict[str, Pair | None] = {"cudacore Device.allocate": cudacore_pair(size)}
    if with_peers:
        made["CuPy MemoryPool"] = cupy_pool(size, "pool")
        made["CuPy MemoryAsyncPool"] = cupy_pool(size, "async")
        made["cuda.bindings cuMemAllocAsync"] = bindings_pair(size)
        made["PyTorch caching allocator"] = torch_pair(size)
    return {k: v for k, v in made.items() if v is not None}


def timed(run: Pair, n: int, threads: int) -> float:
    """Seconds of wall time for `threads` threads each running n pairs."""
    if threads == 1:
        t0 = time.perf_counter()
        run(n)
        return time.perf_counter() - t0
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def worker() -> None:
        barrier.wait()
        try:
            run(n)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def rate(run: Pair, threads: int, seconds: float) -> float:
    """Pairs per second in all while `threads` threads each run pairs in chunks until the time is up.

    Time-based rather than a fixed count per thread: with a fixed count, thread start-up and the uneven
    finish of the last thread weigh differently at each thread count.
    """
    chunk = 500
    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []
    deadline = 0.0

    def worker(i: int) -> None:
        barrier.wait()
        try:
            while time.perf_counter() < deadline:
                run(chunk)
                counts[i] += chunk
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    barrier.wait()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(counts) / wall


def fmt_size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} B"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pairs", type=int, default=20_000, help="pairs per contender per round (per thread)")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--quick", action="store_true", help="few rounds and pairs: a smoke test")
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.pairs = 2, 500
    with_peers = not args.no_peers and cc.backend() == "cuda"
    d = cc.Device(0)
    print(f"cudacore {cc.__version__} on {cc.backend()}: {d.name}; Python {sys.version.split()[0]}")
    print(f"{args.rounds} rounds, {args.pairs} pairs per contender per round; medians over rounds\n")

    sizes = [256, 1 << 20, 64 << 20]
    print(f"{'one thread, us per alloc+free pair':<36}" + "".join(f"{fmt_size(s):>22}" for s in sizes))
    table: dict[str, dict[int, float]] = {}
    for size in sizes:
        runs = contenders(size, with_peers)
        for run in runs.values():
            run(200)  # warm up: pools grow, first-call costs
        samples: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                samples[name].append(timed(runs[name], args.pairs, 1) / args.pairs * 1e6)
        for name, v in samples.items():
            table.setdefault(name, {})[size] = statistics.median(v)
    ref = table.get("CuPy MemoryPool")
    for name, row in table.items():
        cells = []
        for s in sizes:
            ratio = f" ({row[s] / ref[s]:.2f}x)" if ref and name != "CuPy MemoryPool" else ""
            cells.append(f"{row[s]:.2f}{ratio}")
        print(f"{name:<36}" + "".join(f"{c:>22}" for c in cells))
    if ref:
        print("(x: time relative to CuPy MemoryPool in the same run; below 1 is faster)")

    runs = lanes(with_peers)
    for run in runs.values():
        run(200)
    samples3: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples3[name].append(timed(runs[name], args.pairs, 1) / args.pairs * 1e6)
    print(f"\n{'lanes, 1 MiB, us per alloc+free pair':<36}{'us':>10}{'vs CuPy':>10}")
    cupy_ref = {"legacy stream": "null stream", "stream=s": "with s:", "with s:": "with s:", "a graph alive": "a graph alive"}
    for name in names:
        med = statistics.median(samples3[name])
        lane = name.split(", ", 1)[1]
        ref_name = f"CuPy MemoryPool, {cupy_ref.get(lane, lane)}"
        ratio = f"{med / statistics.median(samples3[ref_name]):.2f}x" if name.startswith("cudacore") and ref_name in samples3 else ""
        print(f"{name:<36}{med:>10.2f}{ratio:>10}")

    counts = [int(t) for t in args.threads.split(",")]
    size = 1 << 20
    runs = contenders(size, with_peers)
    samples2: dict[tuple[str, int], list[float]] = {(n, t): [] for n in runs for t in counts}
    names = list(runs)
    seconds = 0.05 if args.quick else 0.3
    for r in range(args.rounds):
        for t in counts:
            for name in names[r % len(names) :] + names[: r % len(names)]:
                samples2[(name, t)].append(rate(runs[name], t, seconds) / 1e6)
    print(f"\n{'threads, 1 MiB, M pairs/s in all':<36}" + "".join(f"{t:>10}" for t in counts) + f"{'8 vs 1':>10}")
    for name in names:
        med = [statistics.median(samples2[(name, t)]) for t in counts]
        ratio = ""
        if 1 in counts and 8 in counts:
            ratio = f"{med[counts.index(8)] / med[counts.index(1)]:.2f}x"
        print(f"{name:<36}" + "".join(f"{m:>10.3f}" for m in med) + f"{ratio:>10}")
    stats = d.memory_stats()
    print(f"\ncudacore memory_stats after the run: in_use={stats['in_use']} allocations={stats['allocations']} "
          f"frees={stats['frees']} ooms={stats['ooms']}")


if __name__ == "__main__":
    main()
