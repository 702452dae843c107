"""Does cuMemHostAlloc hang under compute-sanitizer while another thread captures? (issue 28: tests/stress.py
with two threads hangs under the sanitizer, one thread inside cuMemHostAlloc, which never returns.) Raw
cuda.bindings, no cudacore: one thread allocates and frees pinned memory over and over, the other captures
stream-ordered allocations and copies on its own stream (relaxed or thread-local mode) into graphs it
launches and destroys. Prints how many of each ran, or, past the time limit, the threads' stacks.

    compute-sanitizer --leak-check full python3 -P scripts/gpu/sanitizer_hostalloc_capture.py [relaxed|thread_local] [SECONDS]
"""

from __future__ import annotations

import faulthandler
import sys
import threading
import time

from cuda.bindings import driver as drv


def ok(res):  # type: ignore[no-untyped-def]
    err, *rest = res if isinstance(res, tuple) else (res,)
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else (rest or None)


mode_name = sys.argv[1] if len(sys.argv) > 1 else "relaxed"
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
mode = {
    "relaxed": drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
    "thread_local": drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
}[mode_name]
faulthandler.dump_traceback_later(seconds + 60, exit=True)
ok(drv.cuInit(0))
dev = ok(drv.cuDeviceGet(0))
ctx = ok(drv.cuDevicePrimaryCtxRetain(dev))
pool = ok(drv.cuDeviceGetMemPool(dev))
counts = {"host_allocs": 0, "captures": 0}
stop = time.monotonic() + seconds


def pinned() -> None:
    ok(drv.cuCtxSetCurrent(ctx))
    while time.monotonic() < stop:
        p = ok(drv.cuMemHostAlloc(4096, 0))
        ok(drv.cuMemFreeHost(p))
        counts["host_allocs"] += 1


def capture() -> None:
    ok(drv.cuCtxSetCurrent(ctx))
    s = ok(drv.cuStreamCreate(1))
    while time.monotonic() < stop:
        ok(drv.cuStreamBeginCapture(s, mode))
        p = ok(drv.cuMemAllocFromPoolAsync(4096, pool, s))
        ok(drv.cuMemsetD8Async(p, 1, 4096, s))
        ok(drv.cuMemFreeAsync(p, s))
        g = ok(drv.cuStreamEndCapture(s))
        e = ok(drv.cuGraphInstantiate(g, 0))
        ok(drv.cuGraphLaunch(e, s))
        ok(drv.cuStreamSynchronize(s))
        ok(drv.cuGraphExecDestroy(e))
        ok(drv.cuGraphDestroy(g))
        counts["captures"] += 1
    ok(drv.cuStreamDestroy(s))


threads = [threading.Thread(target=pinned), threading.Thread(target=capture)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(mode_name, counts)
