"""Where an IPC round trip's time goes (issue 33: bench/multi_gpu.py's round trip of 64 MiB took about twice
CuPy's): the exporter's export(), and in a second process the handle's open() and the buffer's close(),
each timed alone, beside CuPy's ipcGetMemHandle / ipcOpenMemHandle / ipcCloseMemHandle on the same machine.
The handles travel through a pipe, untimed. Medians over rounds, in microseconds.

Rows: ``cudacore (KIND)`` is the public path (export, IpcHandle.open, ImportedBuffer.close);
``cudacore Go (KIND)`` opens and closes the same handles through cudacore's Go entries alone
(core.ShareImport, core.OwnedFree: the driver's calls and Go's bookkeeping), so that the difference between
the two rows is what the Python layer (the lease, the owners) costs, and the difference between the Go row
and CuPy's what Go adds to the driver. CuPy's row needs CuPy, and ``--kind ipc`` memory is what it compares
with (cuMemAlloc memory, a cuIpcMemHandle).

    PYTHONPATH=gpu-site CUDACORE_BACKEND=cuda python3 -P scripts/gpu/ipc_breakdown.py [--size BYTES] [--rounds N] [--kind ipc|pool]
    CUDACORE_BACKEND=sim python3 -P scripts/gpu/ipc_breakdown.py     # the simulator: the Python layer's share
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

# The second process is the benchmark's own (bench/multi_gpu.py), which replies open and close apart.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from multi_gpu import _ipc_worker


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=64 << 20)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--kind", choices=["ipc", "pool"], default="ipc", help="the SharedBuffer's kind (default ipc)")
    args = ap.parse_args()
    import cudacore as cc

    ctx = mp.get_context("spawn")
    parent, other = ctx.Pipe()
    proc = ctx.Process(target=_ipc_worker, args=(other,))
    proc.start()
    d = cc.Device(0)
    rows: dict[str, list[tuple[float, float, float]]] = {}

    def cudacore_trip(sb: Any, how: str) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        h = sb.export()
        t1 = time.perf_counter()
        parent.send((how, h))
        opened, closed = parent.recv()
        h.close()  # after the reply: this process stays idle while the other one is timed, as for CuPy
        return t1 - t0, opened, closed

    try:
        sb = d.allocate_shareable(args.size, kind=args.kind)
        try:
            import cupy

            with cupy.cuda.Device(0):
                mem = cupy.cuda.runtime.malloc(args.size)
        except ImportError:
            cupy, mem = None, None
        for r in range(args.rounds + 2):  # two warm-up rounds
            for name, how in ((f"cudacore ({args.kind})", "cudacore"), (f"cudacore Go ({args.kind})", "cudacore-go")):
                trip = cudacore_trip(sb, how)
                if r >= 2:
                    rows.setdefault(name, []).append(trip)
            if cupy is not None:
                t0 = time.perf_counter()
                ch = cupy.cuda.runtime.ipcGetMemHandle(mem)
                t1 = time.perf_counter()
                parent.send(("cupy", ch))
                opened, closed = parent.recv()
                if r >= 2:
                    rows.setdefault("cupy", []).append((t1 - t0, opened, closed))
        sb.close()
    finally:
        parent.send(None)
        proc.join(30)
    print(f"IPC round trip of {args.size} bytes, {args.rounds} rounds, medians in us")
    print(f"{'contender':<20}{'export':>10}{'open':>10}{'close':>10}{'total':>10}")
    for name, xs in rows.items():
        e, o, c = (statistics.median(x[i] for x in xs) * 1e6 for i in range(3))
        print(f"{name:<20}{e:10.1f}{o:10.1f}{c:10.1f}{e + o + c:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
