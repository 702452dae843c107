"""What the driver probes in this folder share: a prelude that opens device 0 through cuda.bindings, and
running one case in a fresh interpreter, where a crash is the answer rather than a failure of the probe."""

from __future__ import annotations

import subprocess
import sys

#: Python source that every case starts with: ``cu`` (cuda.bindings.driver), ``ok`` (asserts success and
#: returns the result's value), the primary context of device 0 made current, and ``s``, a non-blocking
#: stream.
DRIVER_PRELUDE = """
from cuda.bindings import driver as cu
def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return r[1] if isinstance(r, tuple) and len(r) > 1 else None
ok(cu.cuInit(0)); dev = ok(cu.cuDeviceGet(0)); ctx = ok(cu.cuDevicePrimaryCtxRetain(dev)); ok(cu.cuCtxSetCurrent(ctx))
s = ok(cu.cuStreamCreate(1))
"""


def run_case(code: str) -> tuple[int, str]:
    """Run ``code`` in a fresh interpreter; return its exit code and the last line it printed (of stderr
    when it printed nothing, as after a crash)."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    out = (p.stdout.strip().splitlines() or [p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""])[-1]
    return p.returncode, out
