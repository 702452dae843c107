"""What the real driver does when handed the handle of a destroyed event, graph or executable graph.

Each case runs in a fresh interpreter (a crash there is the answer, not a failure of this script) and
prints the exit code or the driver's result. Run on the GPU machine: python3 scripts/gpu/dead_handles.py
"""

from __future__ import annotations

import textwrap

from _probe import DRIVER_PRELUDE, run_case

SETUP = DRIVER_PRELUDE + """def graph():
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
        rc, out = run_case(code)
        print(f"{name:20s} exit {rc:4d}  {out[:120]}")
