"""Where the time of copy + synchronize goes at small sizes, on the GPU machine: the same copy waited on
through Stream.synchronize, through the wait door alone, through a query loop, and through the driver's
cuStreamSynchronize, beside raw cuda.bindings' copy and wait; interleaved rounds, medians in µs per
iteration. Also the cost of one query of an idle stream."""

import statistics
import sys
import time

import numpy as np
from cuda.bindings import driver as drv

import cudacore as cc
from cudacore._native import fast


def ok(r):
    if r[0] != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(r[0])
    return r[1] if len(r) == 2 else r[1:]


d = cc.Device(0)
s = d.create_stream()
hs = drv.CUstream(s.handle)
bs = ok(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING))
ROUNDS, REPS = 9, 2000


def contenders(n: int, pinned: bool) -> dict:
    buf = d.allocate(n, stream=s)
    host = d.allocate_pinned(n) if pinned else np.ones(n, np.uint8)
    src = host.ptr if pinned else host.ctypes.data
    dptr = ok(drv.cuMemAlloc(n))
    dev, h = d.device_id, s.handle

    def c_sync():
        buf.copy_from(host, stream=s)
        s.synchronize()

    def c_door():
        buf.copy_from(host, stream=s)
        while not fast.stream_wait(dev, h, 50):
            pass

    def c_query():
        buf.copy_from(host, stream=s)
        while not fast.stream_query(dev, h):
            pass

    def c_drv():
        buf.copy_from(host, stream=s)
        drv.cuStreamSynchronize(hs)

    def b_sync():
        drv.cuMemcpyHtoDAsync(dptr, src, n, bs)
        drv.cuStreamSynchronize(bs)

    def b_query():
        drv.cuMemcpyHtoDAsync(dptr, src, n, bs)
        while drv.cuStreamQuery(bs)[0] != drv.CUresult.CUDA_SUCCESS:
            pass

    def b_into_cudacore():
        drv.cuMemcpyHtoDAsync(buf.ptr, src, n, hs)
        drv.cuStreamSynchronize(hs)

    return {"cudacore copy + Stream.synchronize": c_sync, "cudacore copy + stream_wait door": c_door,
            "cudacore copy + stream_query loop": c_query, "cudacore copy + cuStreamSynchronize": c_drv,
            "bindings copy + cuStreamSynchronize": b_sync, "bindings copy + cuStreamQuery loop": b_query,
            "bindings copy, cudacore's memory and stream": b_into_cudacore}


def measure(fns: dict, reps: int = REPS) -> dict:
    res = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            f()
            t0 = time.perf_counter()
            for _i in range(reps):
                f()
            res[k].append((time.perf_counter() - t0) / reps * 1e6)
    return {k: statistics.median(v) for k, v in res.items()}


idle = measure({"fast.stream_query (idle)": lambda: fast.stream_query(d.device_id, s.handle),
                "bindings cuStreamQuery (idle)": lambda: drv.cuStreamQuery(bs),
                "Stream.synchronize (idle)": s.synchronize,
                "bindings cuStreamSynchronize (idle)": lambda: drv.cuStreamSynchronize(bs)}, 20000)
for k, v in idle.items():
    print(f"{k:<45} {v:8.3f} µs")
for pinned in (True, False):
    for n in (4 << 10, 64 << 10):
        print(f"\n{'pinned' if pinned else 'pageable'} {n >> 10} KiB H2D async, µs per iteration (median of {ROUNDS})")
        r = measure(contenders(n, pinned))
        base = r["bindings copy + cuStreamSynchronize"]
        for k, v in r.items():
            print(f"  {k:<43} {v:8.3f}  {base / v:5.2f}x")
sys.stdout.flush()
