"""What the real driver does to a GLOBAL capture on one stream when this thread works on another stream that
does not capture: which calls invalidate the capture (the driver's "potentially unsafe" calls) and which
leave it going.

Each case runs in a fresh interpreter and prints the call's result, the capture's status just after it
(cuStreamGetCaptureInfo on the capturing stream) and what cuStreamEndCapture answers. Run on the GPU
machine: python3 scripts/gpu/global_capture_probe.py
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from _probe import DRIVER_PRELUDE, run_case

# s (from the prelude) is a non-blocking stream that captures in GLOBAL mode; u is another non-blocking
# stream that does not capture. `block` is a pool block allocated and freed on u before the capture.
SETUP = DRIVER_PRELUDE + """
u = ok(cu.cuStreamCreate(1))
block = ok(cu.cuMemAllocAsync(1 << 20, u)); ok(cu.cuStreamSynchronize(u))
def status():
    r = cu.cuStreamGetCaptureInfo(s)
    return r[1].name if r[0] == cu.CUresult.CUDA_SUCCESS else r[0].name
notes = []
def report(result):
    res = result[0] if isinstance(result, tuple) else result
    st = status()
    end = cu.cuStreamEndCapture(s)[0].name
    print(" ".join(notes), f"call {res.name}; capture then {st}; end {end}")
ok(cu.cuStreamBeginCapture(s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
"""

JOINED = textwrap.dedent("""
    r = ok(cu.cuStreamCreate(1))
    ok(cu.cuStreamBeginCapture(r, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
    e1 = ok(cu.cuEventCreate(2)); e2 = ok(cu.cuEventCreate(2))
    ok(cu.cuEventRecord(e1, r)); ok(cu.cuStreamWaitEvent(u, e1, 0))
    ok(cu.cuEventRecord(e2, u)); ok(cu.cuStreamWaitEvent(r, e2, 0))
    g = ok(cu.cuStreamEndCapture(r))
    notes.append("after r's end: " + status() + ";")
""")

CASES = {
    "nothing (control)": "report((cu.CUresult.CUDA_SUCCESS,))",
    "stream synchronize on u (control)": "report(cu.cuStreamSynchronize(u))",
    "cuMemFreeAsync on u": "report(cu.cuMemFreeAsync(block, u))",
    "cuMemAllocAsync on u": "report(cu.cuMemAllocAsync(1 << 20, u))",
    "cuStreamDestroy of idle u": "report(cu.cuStreamDestroy(u))",
    "cuMemFreeAsync then cuStreamDestroy of u": "ok(cu.cuMemFreeAsync(block, u)); report(cu.cuStreamDestroy(u))",
    "cuStreamCreate": "report(cu.cuStreamCreate(1))",
    "cuEventRecord on u": "e = ok(cu.cuEventCreate(2)); report(cu.cuEventRecord(e, u))",
    "cuStreamQuery of u": "report(cu.cuStreamQuery(u))",
    # The sequence of tests/test_capture_join.py::test_closed_joined_with_other_capture_global: a second,
    # RELAXED capture on r that u joins and is joined back from, ended (JOINED); then u is destroyed, or
    # freed on.
    "u joined a RELAXED capture that ended, then destroyed": JOINED + "report(cu.cuStreamDestroy(u))",
    "u joined a RELAXED capture that ended, then freed on": JOINED + "report(cu.cuMemFreeAsync(block, u))",
    "a RELAXED capture on r begun and ended, u untouched": textwrap.dedent("""
        r = ok(cu.cuStreamCreate(1))
        ok(cu.cuStreamBeginCapture(r, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
        g = ok(cu.cuStreamEndCapture(r))
        report((cu.CUresult.CUDA_SUCCESS,))
    """),
    "cuGraphDestroy of an ended capture's graph": textwrap.dedent("""
        r = ok(cu.cuStreamCreate(1))
        ok(cu.cuStreamBeginCapture(r, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
        g = ok(cu.cuStreamEndCapture(r))
        report(cu.cuGraphDestroy(g))
    """),
}

for name, body in CASES.items():
    rc, out = run_case(SETUP + "\n" + textwrap.dedent(body))
    print(f"{name:55s} exit {rc:3d}  {out[:140]}")

# The rule for stream-ordered allocation and free on a stream outside the capture, by capture mode and by
# the thread that makes the call: s captures, begun on the main thread; the call runs on the main thread
# or on a second thread (with the context made current there). Streams: u (non-blocking), the legacy
# stream, and the per-thread default stream. The pool: the device's default one and a pool of our own.
MATRIX = DRIVER_PRELUDE + """
import threading
u = ok(cu.cuStreamCreate(1))
props = cu.CUmemPoolProps(); props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE; props.location.id = 0
own = ok(cu.cuMemPoolCreate(props))
MODE = {"global": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
        "thread_local": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        "relaxed": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED}
STREAM = {"u": u, "legacy": cu.CUstream(0), "per-thread": cu.CUstream(2)}
def one(mode, where, what, st):
    h = STREAM[st]
    block = ok(cu.cuMemAllocFromPoolAsync(1 << 20, own, u)); ok(cu.cuStreamSynchronize(u))
    ok(cu.cuStreamBeginCapture(s, MODE[mode]))
    out = []
    def call():
        ok(cu.cuCtxSetCurrent(ctx))
        if what == "alloc default pool": r = cu.cuMemAllocAsync(1 << 20, h)
        elif what == "alloc own pool": r = cu.cuMemAllocFromPoolAsync(1 << 20, own, h)
        else: r = cu.cuMemFreeAsync(block, h)
        out.append(r[0].name.replace("CUDA_ERROR_", "").replace("CUDA_", ""))
    if where == "this thread": call()
    else:
        t = threading.Thread(target=call); t.start(); t.join()
    st_ = cu.cuStreamGetCaptureInfo(s)[1].name.replace("CU_STREAM_CAPTURE_STATUS_", "")
    r = cu.cuStreamEndCapture(s)
    if r[0] == cu.CUresult.CUDA_SUCCESS: ok(cu.cuGraphDestroy(r[1]))
    ok(cu.cuCtxSynchronize())
    return out[0] + "/" + st_
for what in ("alloc default pool", "alloc own pool", "free"):
    for mode in MODE:
        for where in ("this thread", "other thread"):
            print(f"{what:20s} {mode:13s} {where:13s}", "  ".join(f"{k}: {one(mode, where, what, k):28s}" for k in STREAM))
"""
matrix = subprocess.run([sys.executable, "-c", MATRIX], capture_output=True, text=True, timeout=300, check=False)
print(matrix.stdout, matrix.stderr[-2000:], "exit", matrix.returncode)
