"""What the real driver does when a captured graph names device memory that was freed before it is
instantiated: the device memory of a copy or memset node, freed with cuMemFree or back into the stream-ordered
pool. Each case runs in a fresh interpreter (a crash there is the answer, not a failure of this
script), three times, and prints the exit code or the driver's results for instantiate, launch and the
synchronize after it. Run on the GPU machine: python3 scripts/gpu/freed_memory_nodes.py
"""

from __future__ import annotations

import textwrap

from _probe import DRIVER_PRELUDE, run_case

SETUP = DRIVER_PRELUDE + """N = 64481
def alloc(pool):
    if pool:
        p = ok(cu.cuMemAllocAsync(N, s)); ok(cu.cuStreamSynchronize(s)); return p
    return ok(cu.cuMemAlloc(N))
def free(p, pool):
    if pool:
        ok(cu.cuMemFreeAsync(p, s)); ok(cu.cuStreamSynchronize(s))
    else:
        ok(cu.cuMemFree(p))
def capture(op):
    ok(cu.cuStreamBeginCapture(s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    op()
    return ok(cu.cuStreamEndCapture(s))
def report(g):
    r = cu.cuGraphInstantiate(g, 0)
    print("instantiate", r[0].name, end=" ", flush=True)
    if r[0] == cu.CUresult.CUDA_SUCCESS:
        print("launch", cu.cuGraphLaunch(r[1], s)[0].name, "sync", cu.cuStreamSynchronize(s)[0].name, flush=True)
"""

CASES = {
    # name: body; `pool` chooses the allocator, `freed` whether the memory is freed before instantiating
    "d2d onto itself": "p = alloc(pool); g = capture(lambda: ok(cu.cuMemcpyDtoDAsync(p, p, N, s)))",
    "d2d, source freed": "p, q = alloc(pool), alloc(False); g = capture(lambda: ok(cu.cuMemcpyDtoDAsync(q, p, N, s)))",
    "d2d, destination freed": "p, q = alloc(pool), alloc(False); g = capture(lambda: ok(cu.cuMemcpyDtoDAsync(p, q, N, s)))",
    "memset": "p = alloc(pool); g = capture(lambda: ok(cu.cuMemsetD8Async(p, 7, N, s)))",
    "h2d from pinned": "h = ok(cu.cuMemHostAlloc(N, 0)); p = alloc(pool); g = capture(lambda: ok(cu.cuMemcpyHtoDAsync(p, h, N, s)))",
    "d2h into pinned": "h = ok(cu.cuMemHostAlloc(N, 0)); p = alloc(pool); g = capture(lambda: ok(cu.cuMemcpyDtoHAsync(h, p, N, s)))",
}

for name, body in CASES.items():
    for pool in (False, True):
        for freed in (False, True):
            code = SETUP + f"\npool = {pool}\n" + textwrap.dedent(body) + ("\nfree(p, pool)" if freed else "") + "\nreport(g)"
            for _ in range(3 if freed else 1):  # a use after free may or may not crash: say how often it did
                rc, out = run_case(code)
                label = f"{name}, {'pool' if pool else 'cuMemAlloc'}, {'freed' if freed else 'live'}"
                print(f"{label:45s} exit {rc:4d}  {out[:110]}", flush=True)
