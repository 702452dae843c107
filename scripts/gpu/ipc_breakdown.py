"""Where an IPC round trip's time goes (issue 33: bench/multi_gpu.py's round trip of 64 MiB took about twice
CuPy's): the exporter's export(), and in a second process the handle's open() and the buffer's close(),
each timed alone, beside CuPy's ipcGetMemHandle / ipcOpenMemHandle / ipcCloseMemHandle on the same machine.
The handles travel through a pipe, untimed. Medians over rounds, in microseconds.

    PYTHONPATH=gpu-site CUDACORE_BACKEND=cuda python3 -P scripts/gpu/ipc_breakdown.py [--size BYTES] [--rounds N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

# The second process is the benchmark's own (bench/multi_gpu.py), which replies open and close apart.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from multi_gpu import _ipc_worker


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=64 << 20)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    import cudacore as cc

    ctx = mp.get_context("spawn")
    parent, other = ctx.Pipe()
    proc = ctx.Process(target=_ipc_worker, args=(other,))
    proc.start()
    d = cc.Device(0)
    rows: dict[str, list[tuple[float, float, float]]] = {}
    try:
        sb = d.allocate_shareable(args.size, kind="ipc")
        try:
            import cupy

            with cupy.cuda.Device(0):
                mem = cupy.cuda.runtime.malloc(args.size)
        except ImportError:
            cupy, mem = None, None
        for r in range(args.rounds + 2):  # two warm-up rounds
            t0 = time.perf_counter()
            h = sb.export()
            t1 = time.perf_counter()
            parent.send(("cudacore", h))
            h.close()
            opened, closed = parent.recv()
            if r >= 2:
                rows.setdefault("cudacore (ipc)", []).append((t1 - t0, opened, closed))
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
    print(f"{'contender':<16}{'export':>10}{'open':>10}{'close':>10}{'total':>10}")
    for name, xs in rows.items():
        e, o, c = (statistics.median(x[i] for x in xs) * 1e6 for i in range(3))
        print(f"{name:<16}{e:10.1f}{o:10.1f}{c:10.1f}{e + o + c:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
