"""Where the host time of a hot call goes, on the GPU machine: the public method, the generated door
alone, and the raw driver entry through cuda.bindings (and CuPy where it has one), interleaved over
rounds; medians in ns per call. The differences say what Python, the door and Go each add."""

import statistics
import sys
import time

import numpy as np

import cudacore as cc
from cudacore._native import core, fast

PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry empty4(.param .u64 a, .param .u64 b, .param .u32 n, .param .f32 x)
{
    ret;
}
"""

d = cc.Device(0)
s = d.create_stream()
a, b = d.allocate(4096, stream=s), d.allocate(4096, stream=s)
pinned = d.allocate_pinned(4096)
with s.capture() as g:
    cc.device_to_device(b, a, stream=s)
g.upload(s)
k = d.load_module(PTX).function("empty4")
args = (a, b, 7, 1.5)
packed = k.encode_args(args)
s.synchronize()

groups: dict[str, dict] = {
    "graph launch": {
        "Graph.launch": lambda: g.launch(s),
        "fast.graph_launch": lambda: fast.graph_launch(g._id, 0, s.handle),
    },
    "4 KiB pinned H2D async": {
        "Buffer.copy_from": lambda: a.copy_from(pinned, stream=s),
        "fast.copy_to_device_held": lambda: fast.copy_to_device_held(0, a.ptr, pinned, 4096, s.handle),
    },
    "kernel launch": {
        "Kernel.launch": lambda: k.launch(1, 1, args, stream=s),
        "fast.function_launch (packed)": lambda: fast.function_launch(k._handle, 1, 1, 1, 1, 1, 1, 0, s.handle, packed),
    },
    "stream query": {"fast.stream_query": lambda: fast.stream_query(0, s.handle)},
    "door floor": {
        "fast.noop": lambda: fast.noop(1),
        "call(core.Noop)": lambda: fast.call(core.Noop, 1),
        "core.Noop (generated wrapper)": lambda: core.Noop(1),
    },
}
try:
    from cuda.bindings import driver as drv

    hs = drv.CUstream(s.handle)
    groups["stream query"]["bindings cuStreamQuery"] = lambda: drv.cuStreamQuery(hs)
    groups["4 KiB pinned H2D async"]["bindings cuMemcpyHtoDAsync"] = lambda: drv.cuMemcpyHtoDAsync(a.ptr, pinned.ptr, 4096, hs)
    err, mod = drv.cuModuleLoadData(PTX)
    err, fn = drv.cuModuleGetFunction(mod, b"empty4")
    kargs = (np.array([a.ptr], dtype=np.uint64), np.array([b.ptr], dtype=np.uint64), np.array([7], dtype=np.uint32),
             np.array([1.5], dtype=np.float32))
    kptrs = np.array([x.ctypes.data for x in kargs], dtype=np.uint64)
    groups["kernel launch"]["bindings cuLaunchKernel"] = lambda: drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, hs, kptrs.ctypes.data, 0)
except Exception as exc:  # noqa: BLE001 - an optional peer
    print(f"(cuda.bindings skipped: {type(exc).__name__}: {exc})", file=sys.stderr)
try:
    import cupy

    cs = cupy.cuda.Stream(non_blocking=True)
    dst = cupy.empty(4096, dtype=cupy.uint8)
    src = cupy.cuda.alloc_pinned_memory(4096)
    with cs:
        cs.begin_capture()
        cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ptr, 4096, 1, cs.ptr)
        cg = cs.end_capture()
    cg.launch(cs)
    groups["graph launch"]["CuPy Graph.launch"] = lambda: cg.launch(cs)
    groups["4 KiB pinned H2D async"]["CuPy memcpyAsync"] = lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ptr, 4096, 1, cs.ptr)
    groups["stream query"]["CuPy Stream.done"] = lambda: cs.done
except Exception as exc:  # noqa: BLE001 - an optional peer
    print(f"(CuPy skipped: {type(exc).__name__}: {exc})", file=sys.stderr)

N = 2000
for group, variants in groups.items():
    res: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(9):
        for name, f in variants.items():
            f()
            t0 = time.perf_counter()
            for _i in range(N):
                f()
            res[name].append((time.perf_counter() - t0) / N * 1e9)
            s.synchronize()
            d.synchronize()
    for name, v in res.items():
        print(f"{group:<24} {name:<32} {statistics.median(v):8.0f} ns")
