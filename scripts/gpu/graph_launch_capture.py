"""What the real driver answers to cuGraphLaunch of an executable graph on a stream that captures, in each
capture mode, for a graph of one copy node and for an empty graph, and whether the capture survives it
(cuStreamEndCapture afterwards). Run on the GPU machine: python3 scripts/gpu/graph_launch_capture.py
"""

from __future__ import annotations

from cuda.bindings import driver as cu


def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return r[1] if isinstance(r, tuple) and len(r) > 1 else None


ok(cu.cuInit(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
ok(cu.cuCtxSetCurrent(ctx))
s1, s2 = ok(cu.cuStreamCreate(1)), ok(cu.cuStreamCreate(1))
a, b = ok(cu.cuMemAlloc(1 << 20)), ok(cu.cuMemAlloc(1 << 20))
M = cu.CUstreamCaptureMode
for body in ("copy", "empty"):
    ok(cu.cuStreamBeginCapture(s1, M.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    if body == "copy":
        ok(cu.cuMemcpyDtoDAsync(b, a, 1 << 20, s1))
    g = ok(cu.cuStreamEndCapture(s1))
    x = ok(cu.cuGraphInstantiate(g, 0))
    for mode in ("GLOBAL", "THREAD_LOCAL", "RELAXED"):
        ok(cu.cuStreamBeginCapture(s2, getattr(M, f"CU_STREAM_CAPTURE_MODE_{mode}")))
        r = cu.cuGraphLaunch(x, s2)[0]
        e, outer = cu.cuStreamEndCapture(s2)
        print(f"{body:5s} graph, {mode:12s} capture: cuGraphLaunch {r.name}, then cuStreamEndCapture {e.name}", flush=True)
        if e == cu.CUresult.CUDA_SUCCESS and outer:
            ok(cu.cuGraphDestroy(outer))
