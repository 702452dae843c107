"""A false leak of compute-sanitizer: graph memory freed inside its capture and allocated again there.

Within one capture, an allocation freed by a free node leaves its address to the next allocation of the
capture. The program below does only that with the raw driver (allocate 80 KiB, free it, allocate 256
bytes, which gets the same address), launches the graph once, frees the launch's allocation, and
destroys everything; every call succeeds. Run under the sanitizer with ``reuse``, it reports the 256
bytes as leaked at that address; with ``plain`` (no free inside the capture, so two addresses) it
reports nothing. The fuzzer's programs do this, so a sanitizer run over them can show such a leak that
is not one. On the GPU machine:

    compute-sanitizer --tool memcheck --leak-check full python3 scripts/gpu/graph_memory_reuse.py reuse
"""

from __future__ import annotations

import sys

from cuda.bindings import driver as cu


def ok(r: object) -> object:
    """Assert that a driver call (its result, or a (result, value...) tuple) succeeded; return the value."""
    err = r[0] if isinstance(r, tuple) else r
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return r[1] if isinstance(r, tuple) and len(r) > 1 else None


def main(reuse: bool) -> None:
    ok(cu.cuInit(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
    ok(cu.cuCtxSetCurrent(ctx))
    s = ok(cu.cuStreamCreate(1))
    ok(cu.cuStreamBeginCapture(s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    first = ok(cu.cuMemAllocAsync(80 << 10, s))
    if reuse:
        ok(cu.cuMemFreeAsync(first, s))
    second = ok(cu.cuMemAllocAsync(256, s))
    same = "(the same address)" if int(first) == int(second) else ""
    print("first", hex(int(first)), "second", hex(int(second)), same)
    g = ok(cu.cuStreamEndCapture(s))
    x = ok(cu.cuGraphInstantiate(g, 0))
    ok(cu.cuGraphLaunch(x, s))
    ok(cu.cuStreamSynchronize(s))
    if not reuse:
        ok(cu.cuMemFreeAsync(first, s))
    ok(cu.cuMemFreeAsync(second, s))
    ok(cu.cuStreamSynchronize(s))
    ok(cu.cuGraphExecDestroy(x))
    ok(cu.cuGraphDestroy(g))
    ok(cu.cuStreamDestroy(s))
    print("every call succeeded")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "reuse"
    if mode not in ("reuse", "plain"):
        sys.exit("usage: graph_memory_reuse.py [reuse|plain]")
    main(mode == "reuse")
