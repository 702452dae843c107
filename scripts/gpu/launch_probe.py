"""Host time against device throughput, on the GPU machine, for the hot calls whose burst figures
(bench/hot_paths.py) trail CuPy's.

A burst of back-to-back calls measures whichever is slower: the host call, or the device and the driver's
queue draining the work. A single call on an idle stream, timed alone, is the host cost. Each contender is
measured both ways, rounds interleaved; medians in ns per call. The "on cudacore's stream" rows put a peer's
call on cudacore's stream (and cudacore's on the peer's) so that a difference of the streams shows apart from
one of the calls.

    python scripts/gpu/launch_probe.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import cudacore as cc
from cudacore._native import fast

d = cc.Device(0)
s = d.create_stream()
pinned = d.allocate_pinned(4 << 10)
small = d.allocate(4 << 10, stream=s)
with s.capture() as g:
    small.copy_from(pinned, stream=s)
g.launch(s)
s.synchronize()

Row = tuple[str, Callable[[], object], Callable[[], object]]
groups: dict[str, list[Row]] = {
    "graph launch (4 KiB H2D node)": [
        ("cudacore Graph.launch", lambda: g.launch(s), s.synchronize),
        ("cudacore fast.graph_launch", lambda: fast.graph_launch(g._id, 0, s.handle), s.synchronize),
    ],
    "4 KiB pinned H2D async": [
        ("cudacore Buffer.copy_from", lambda: small.copy_from(pinned, stream=s), s.synchronize),
    ],
    "alloc+free 256 B": [
        ("cudacore allocate(stream=s)", lambda: d.allocate(256, stream=s).close(), lambda: None),
        ("cudacore allocate()", lambda: d.allocate(256).close(), lambda: None),
        ("cudacore fast.allocate", lambda: fast.allocate(0, 256, s.handle).close(), lambda: None),
    ],
}
try:
    from cuda.bindings import driver as drv

    hs = drv.CUstream(s.handle)
    groups["4 KiB pinned H2D async"].append(
        ("bindings cuMemcpyHtoDAsync", lambda: drv.cuMemcpyHtoDAsync(small.ptr, pinned.ptr, 4 << 10, hs), s.synchronize))
except Exception as exc:  # noqa: BLE001 - an optional peer
    print(f"(cuda.bindings skipped: {type(exc).__name__}: {exc})", file=sys.stderr)
try:
    import cupy

    cs = cupy.cuda.Stream(non_blocking=True)
    on_s = cupy.cuda.ExternalStream(s.handle)
    dst = cupy.empty(4 << 10, dtype=cupy.uint8)
    src = cupy.cuda.alloc_pinned_memory(4 << 10)
    with cs:
        cs.begin_capture()
        cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ptr, 4 << 10, 1, cs.ptr)
        cg = cs.end_capture()
    cg.launch(cs)
    cs.synchronize()
    groups["graph launch (4 KiB H2D node)"] += [
        ("CuPy Graph.launch", lambda: cg.launch(cs), cs.synchronize),
        ("CuPy Graph.launch on cudacore's stream", lambda: cg.launch(on_s), s.synchronize),
    ]
    groups["graph launch (4 KiB H2D node)"].append(
        ("cudacore Graph.launch on CuPy's stream", lambda: g.launch(cs.ptr), cs.synchronize))
    groups["4 KiB pinned H2D async"] += [
        ("CuPy memcpyAsync", lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ptr, 4 << 10, 1, cs.ptr), cs.synchronize),
        ("CuPy memcpyAsync cudacore's memory", lambda: cupy.cuda.runtime.memcpyAsync(small.ptr, pinned.ptr, 4 << 10, 1, s.handle), s.synchronize),
        ("cudacore copy of CuPy's memory", lambda: fast.copy_to_device_held(0, dst.data.ptr, np.frombuffer(src, dtype=np.uint8, count=4 << 10), 4 << 10, s.handle), s.synchronize),
    ]
    pool = cupy.cuda.MemoryPool()
    groups["alloc+free 256 B"].append(("CuPy MemoryPool", lambda: pool.malloc(256), lambda: None))
except Exception as exc:  # noqa: BLE001 - an optional peer
    print(f"(CuPy skipped: {type(exc).__name__}: {exc})", file=sys.stderr)

BURST = 2000
SINGLE = 300


def burst(fn: Callable[[], object], drain: Callable[[], object]) -> float:
    fn()
    drain()
    t0 = time.perf_counter_ns()
    for _ in range(BURST):
        fn()
    t = (time.perf_counter_ns() - t0) / BURST
    drain()
    return t


def single(fn: Callable[[], object], drain: Callable[[], object]) -> float:
    ts = []
    for _ in range(SINGLE):
        drain()
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    drain()
    return statistics.median(ts)


print(f"{'group':<30} {'contender':<42} {'burst ns':>9} {'single ns':>10}")
for group, rows in groups.items():
    b: dict[str, list[float]] = {n: [] for n, _, _ in rows}
    o: dict[str, list[float]] = {n: [] for n, _, _ in rows}
    for _ in range(7):
        for name, fn, drain in rows:
            try:
                b[name].append(burst(fn, drain))
                o[name].append(single(fn, drain))
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"  {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                break
    for name, _, _ in rows:
        if b[name]:
            print(f"{group:<30} {name:<42} {statistics.median(b[name]):9.0f} {statistics.median(o[name]):10.0f}")
