"""Where the Go side of a hot call spends its time, on the GPU machine: a CPU profile (runtime/pprof) of
one workload, written to OUT/<workload>.pprof, with the recorder on or off.

    python scripts/gpu/profile.py OUT [--recorder on|off] [--seconds 3]

Read a profile on the development machine with ``go tool pprof -top OUT/alloc.pprof``; the function names
are in the profile itself. Samples in C (Python, the driver) show as external code.
"""

from __future__ import annotations

import argparse
import os
import time

import cudacore as cc
from cudacore._api import call
from cudacore._native import core


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--recorder", choices=["on", "off"], default="on")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cc.configure_flight_recorder(enabled=args.recorder == "on", python_stacks=False)
    d = cc.Device(0)
    s = d.create_stream()
    alloc = d.allocate
    for _ in range(10000):
        alloc(256).close()
    workloads = {
        "alloc": lambda: alloc(256).close(),
        "alloc_stream": lambda: alloc(256, s).close(),
    }
    for name, fn in workloads.items():
        path = os.path.join(args.out, f"{name}-recorder-{args.recorder}.pprof")
        call(core.ProfileCPU, path)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            for _ in range(1000):
                fn()
            n += 1000
        call(core.ProfileCPU, "")
        print(f"{name}: {(time.perf_counter() - t0) / n * 1e6:.3f} us a call, profile {path}")


if __name__ == "__main__":
    main()
