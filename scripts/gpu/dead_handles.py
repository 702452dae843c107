"""What the real driver does when handed the handle of a destroyed event, graph or executable graph.

Each case runs in a fresh interpreter (a crash there is the answer, not a failure of this script) and
prints the exit code or the driver's result. Run on the GPU machine: python3 scripts/gpu/dead_handles.py
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SETUP = """
from cuda.bindings import driver as cu
def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return r[1] if isinstance(r, tuple) and len(r) > 1 else None
ok(cu.cuInit(0)); dev = ok(cu.cuDeviceGet(0)); ctx = ok(cu.cuDevicePrimaryCtxRetain(dev)); ok(cu.cuCtxSetCurrent(ctx))
s = ok(cu.cuStreamCreate(1))
def graph():
    ok(cu.cuStreamBeginCapture(s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    p = ok(cu.cuMemAllocAsync(1 << 20, s)); ok(cu.cuMemFreeAsync(p, s))
    return ok(cu.cuStreamEndCapture(s))
"""

CASES = {
    "event record": "e = ok(cu.cuEventCreate(0)); ok(cu.cuEventDestroy(e)); print(cu.cuEventRecord(e, s))",
    "event query": "e = ok(cu.cuEventCreate(0)); ok(cu.cuEventDestroy(e)); print(cu.cuEventQuery(e))",
    "event synchronize": "e = ok(cu.cuEventCreate(0)); ok(cu.cuEventDestroy(e)); print(cu.cuEventSynchronize(e))",
    "stream wait event": "e = ok(cu.cuEventCreate(0)); ok(cu.cuEventDestroy(e)); print(cu.cuStreamWaitEvent(s, e, 0))",
    "graph instantiate": "g = graph(); ok(cu.cuGraphDestroy(g)); print(cu.cuGraphInstantiate(g, 0))",
    "graph exec launch": "g = graph(); x = ok(cu.cuGraphInstantiate(g, 0)); ok(cu.cuGraphExecDestroy(x)); print(cu.cuGraphLaunch(x, s))",
    "graph exec update": "g = graph(); x = ok(cu.cuGraphInstantiate(g, 0)); ok(cu.cuGraphExecDestroy(x)); print(cu.cuGraphExecUpdate(x, g))",
}

for name, body in CASES.items():
    code = SETUP + "\n" + textwrap.dedent(body)
    for _ in range(3):  # a use after free may or may not crash: say how often it did
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
        out = (p.stdout.strip().splitlines() or [p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""])[-1]
        print(f"{name:20s} exit {p.returncode:4d}  {out[:120]}")
