"""Host time of the hot paths, cudacore against its peers, in one table.

Each contender runs a burst of calls per round; rounds interleave the contenders (the GPU machine's speed
drifts between runs: compare within one run), and the table gives the median over rounds of the host
time per call and the ratio to the first peer of each row (lower is better).

    python bench/hot_paths.py             # on the GPU machine (CuPy and cuda.core are optional peers)
    python bench/hot_paths.py --sim       # smoke test on the simulator: cudacore's non-kernel rows only

Rows: Kernel.launch of an empty kernel with 4 arguments (2 pointers, an int, a float) against CuPy's
RawKernel and cuda.core's launch (with numpy scalars, as their users write them), with the int and float
given as Python numbers, numpy scalars and cudacore typed values, and with stream=None under ``with s:``
(CuPy's with no stream under its own ``with stream:``); Graph.launch of a one-node graph against CuPy's
Graph.launch, with an explicit stream and under ``with stream:``; a 4 KiB
pinned host-to-device asynchronous copy against CuPy's memcpyAsync; a 64 KiB pageable host-to-device copy,
synchronous (against CuPy's runtime.memcpy) and asynchronous (against CuPy's ndarray.set, which returns once the
data is staged); Stream.query and Stream.synchronize of an idle stream against CuPy's; the cold door (a
gopy call through the C guard), beside what the timing loop itself costs per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

PTX = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry empty4(.param .u64 a, .param .u64 b, .param .u32 n, .param .f32 x)
{
    ret;
}
"""


def contenders(sim: bool) -> dict[str, list[tuple[str, Callable[[], object], Callable[[], object]]]]:
    """row -> [(name, call, drain)]; a peer that cannot be set up is left out of its row."""
    import numpy as np

    import cudacore as cc
    from cudacore._native import core

    d = cc.Device(0)
    s = d.create_stream()
    rows: dict[str, list] = {
        k: []
        for k in ("kernel launch", "launch, numpy scalars", "launch, typed values", "launch, CuPy arrays", "launch, torch tensors",
                  "launch, under with s:", "graph launch", "graph launch, with s:", "4 KiB pinned H2D async",
                  "4 KiB pinned, with s: sync", "64 KiB pageable H2D sync",
                  "64 KiB pageable H2D async", "stream query, idle", "stream synchronize, idle", "cold door call")
    }  # fmt: skip
    a, b = d.allocate(1 << 20, stream=s), d.allocate(1 << 20, stream=s)
    pinned = d.allocate_pinned(4 << 10)
    pageable = np.ones(64 << 10, dtype=np.uint8)
    small = d.allocate(4 << 10, stream=s)
    with s.capture() as g:
        small.copy_from(pinned, stream=s)
    g.launch(s)
    s.synchronize()
    rows["graph launch"].append(("cudacore Graph.launch", lambda: g.launch(s), s.synchronize))
    rows["graph launch, with s:"].append(("cudacore Graph.launch()", lambda: _under(s, g.launch), lambda: _leave(s)))
    rows["4 KiB pinned H2D async"].append(("cudacore Buffer.copy_from", lambda: small.copy_from(pinned, stream=s), s.synchronize))
    # The same copy with no stream argument inside `with s:`, beside the explicit stream: a current stream
    # must cost no more than naming it. A copy given no stream returns when the data has arrived, so its
    # peer is the explicit copy and a wait for it.
    rows["4 KiB pinned, with s: sync"].append(("cudacore copy_from(s) + sync", lambda: (small.copy_from(pinned, stream=s), s.synchronize()), lambda: None))
    rows["4 KiB pinned, with s: sync"].append(("cudacore copy_from(), with s:", lambda: _under(s, lambda: small.copy_from(pinned)), lambda: _leave(s)))
    rows["64 KiB pageable H2D sync"].append(("cudacore Buffer.copy_from", lambda: a.copy_from(pageable, nbytes=pageable.nbytes), lambda: None))
    rows["64 KiB pageable H2D async"].append(("cudacore copy_from(stream=s)", lambda: a.copy_from(pageable, stream=s, nbytes=pageable.nbytes), s.synchronize))
    rows["stream query, idle"].append(("cudacore Stream.query", s.query, lambda: None))
    rows["stream synchronize, idle"].append(("cudacore Stream.synchronize", s.synchronize, lambda: None))
    rows["cold door call"].append(("cudacore core.Noop", lambda: core.Noop(1), lambda: None))
    # What the timing loop itself costs per call (a Python call of a no-op), to subtract from the row above.
    rows["cold door call"].append(("the loop alone (no-op)", lambda: None, lambda: None))
    if not sim:
        # Arrays of other libraries, by row: (first, second, how their users read a pointer at each call).
        foreign: dict[str, tuple[object, object, Callable[[object], int]]] = {}
        k = d.load_module(PTX.encode()).function("empty4")
        args = (a, b, 7, 1.5)
        rows["kernel launch"].append(("cudacore Kernel.launch", lambda: k.launch(1, 1, args, stream=s), s.synchronize))
        # The argument forms CuPy and PyTorch users write, each beside the same peers.
        np_args = (a, b, np.uint32(7), np.float32(1.5))
        typed = (a, b, cc.uint32(7), cc.float32(1.5))
        rows["launch, numpy scalars"].append(("cudacore Kernel.launch", lambda: k.launch(1, 1, np_args, stream=s), s.synchronize))
        rows["launch, typed values"].append(("cudacore Kernel.launch", lambda: k.launch(1, 1, typed, stream=s), s.synchronize))
        rows["launch, under with s:"].append(("cudacore launch(stream=None)", lambda: _under(s, lambda: k.launch(1, 1, args)), lambda: _leave(s)))
        try:
            import cupy

            # CuPy's view of cudacore's stream, through the stream protocol where this CuPy has it.
            from_external = getattr(cupy.cuda.Stream, "from_external", None)
            cs = from_external(s) if from_external is not None else cupy.cuda.ExternalStream(s.handle)
            mod = _cupy_module(cupy)
            ck = mod.get_function("empty4")
            ca, cb = cupy.empty(1 << 18, dtype=cupy.float32), cupy.empty(1 << 18, dtype=cupy.float32)
            cargs = (ca, cb, np.uint32(7), np.float32(1.5))
            for row in ("kernel launch", "launch, numpy scalars", "launch, typed values", "launch, CuPy arrays"):
                rows[row].insert(0, ("CuPy RawKernel", lambda: ck((1,), (1,), cargs, stream=cs), cs.synchronize))
            # The "with s:" rows run each peer as its users write it there: no stream argument, inside the
            # peer's own `with stream:` block, through the same wrapper as cudacore's row.
            rows["launch, under with s:"].insert(0, ("CuPy RawKernel, no stream", lambda: _under(cs, lambda: ck((1,), (1,), cargs)), lambda: _leave(cs)))
            arr_args = (ca, cb, 7, 1.5)  # arrays of another library, by __cuda_array_interface__
            rows["launch, CuPy arrays"].append(("cudacore Kernel.launch", lambda: k.launch(1, 1, arr_args, stream=s), s.synchronize))
            foreign["launch, CuPy arrays"] = (ca, cb, lambda t: t.data.ptr)  # type: ignore[attr-defined]
            cg_stream = cupy.cuda.Stream(non_blocking=True)
            dst = cupy.empty(4 << 10, dtype=cupy.uint8)
            src = cupy.cuda.alloc_pinned_memory(4 << 10)
            with cg_stream:
                cg_stream.begin_capture()
                cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ptr, 4 << 10, 1, cg_stream.ptr)
                cgraph = cg_stream.end_capture()
            rows["graph launch"].insert(0, ("CuPy Graph.launch", lambda: cgraph.launch(cg_stream), cg_stream.synchronize))
            rows["graph launch, with s:"].insert(0, ("CuPy Graph.launch()", lambda: _under(cg_stream, cgraph.launch), lambda: _leave(cg_stream)))
            rows["4 KiB pinned H2D async"].insert(0, ("CuPy memcpyAsync", lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.ptr, 4 << 10, 1, cg_stream.ptr), cg_stream.synchronize))
            big = cupy.empty(64 << 10, dtype=cupy.uint8)
            # ndarray.set(stream=) is an asynchronous copy on that stream (a non-blocking one, as cudacore's
            # s is): it returns once the driver has staged the data, not once it has arrived, so it is the
            # peer of the asynchronous row; runtime.memcpy is CuPy's synchronous copy.
            rows["64 KiB pageable H2D sync"].insert(0, ("CuPy runtime.memcpy", lambda: cupy.cuda.runtime.memcpy(big.data.ptr, pageable.ctypes.data, 64 << 10, 1), lambda: None))
            rows["64 KiB pageable H2D async"].insert(0, ("CuPy ndarray.set(stream=)", lambda: big.set(pageable, stream=cg_stream), cg_stream.synchronize))
            rows["stream query, idle"].insert(0, ("CuPy Stream.done", lambda: cg_stream.done, lambda: None))
            rows["stream synchronize, idle"].insert(0, ("CuPy Stream.synchronize", cg_stream.synchronize, lambda: None))
        except Exception as exc:  # noqa: BLE001 - an optional peer
            print(f"  (CuPy skipped: {type(exc).__name__}: {exc})", file=sys.stderr)
        try:
            import torch

            ta, tb = torch.empty(1 << 18, device="cuda"), torch.empty(1 << 18, device="cuda")
            targs = (ta, tb, 7, 1.5)  # tensors of another library, by __cuda_array_interface__ / DLPack
            rows["launch, torch tensors"].append(("cudacore Kernel.launch", lambda: k.launch(1, 1, targs, stream=s), s.synchronize))
            foreign["launch, torch tensors"] = (ta, tb, lambda t: t.data_ptr())  # type: ignore[attr-defined]
            if "cupy" in sys.modules and rows["kernel launch"][0][0] == "CuPy RawKernel":
                # CuPy's RawKernel takes no tensors: its users pass data_ptr(), read at each call.
                rows["launch, torch tensors"].insert(0, ("CuPy RawKernel, data_ptr()", lambda: ck((1,), (1,), (ta.data_ptr(), tb.data_ptr(), np.uint32(7), np.float32(1.5)), stream=cs), cs.synchronize))
        except Exception as exc:  # noqa: BLE001 - an optional peer
            print(f"  (torch skipped: {type(exc).__name__}: {exc})", file=sys.stderr)
        try:
            from cuda.core import Device as CDevice
            from cuda.core import LaunchConfig, ObjectCode, launch

            cd = CDevice(0)
            cd.set_current()
            kern = ObjectCode.from_ptx(PTX.encode()).get_kernel("empty4")
            cst = cd.create_stream()
            cfg = LaunchConfig(grid=1, block=1)
            cargs2 = (a.ptr, b.ptr, np.uint32(7), np.float32(1.5))
            for row in ("kernel launch", "launch, numpy scalars", "launch, typed values", "launch, under with s:"):
                rows[row].insert(1, ("cuda.core launch", lambda: launch(cst, cfg, kern, *cargs2), cst.sync))
            # cuda.core takes no arrays of other libraries: its users pass the pointers, read at each call.
            for row, (x, y, ptr) in foreign.items():
                rows[row].append(("cuda.core launch, pointers", lambda x=x, y=y, ptr=ptr: launch(cst, cfg, kern, ptr(x), ptr(y), np.uint32(7), np.float32(1.5)), cst.sync))
        except Exception as exc:  # noqa: BLE001 - an optional peer
            print(f"  (cuda.core skipped: {type(exc).__name__}: {exc})", file=sys.stderr)
    return rows


_open: list[object] = []


def _under(s: object, call: Callable[[], object]) -> None:
    """call() inside ``with s:``, as a user's loop body runs: the first call of a burst enters the block
    and the row's drain (_leave) leaves it, so the burst times the call with stream=None, not the block,
    and no other row runs inside it."""
    if not _open:
        s.__enter__()  # type: ignore[attr-defined]
        _open.append(s)
    call()


def _leave(s: object) -> None:
    s.synchronize()  # type: ignore[attr-defined]
    if _open:
        _open.pop().__exit__(None, None, None)  # type: ignore[attr-defined]


def _cupy_module(cupy):  # type: ignore[no-untyped-def]
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(PTX)
    return cupy.RawModule(path=f.name)


# Rows that queue no GPU work run longer bursts: a burst of a fraction of a millisecond after the GPU rows'
# waits measures a host core still clocked down (on the GPU machine such a burst of cold calls took over
# twice as long per call as a burst of tens of milliseconds). Rows that queue work keep short bursts, so
# that they measure the host side and not a full launch queue.
LONGER = {"stream query, idle": 10, "stream synchronize, idle": 10, "cold door call": 50}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", action="store_true", help="smoke test on the simulator")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=2000)
    opts = ap.parse_args()
    if opts.sim:
        os.environ["CUDACORE_BACKEND"] = "sim"
        opts.rounds, opts.calls = 3, 50
    rows = contenders(opts.sim)
    print(f"{'path':<26} {'contender':<28} {'us/call':>9} {'ratio':>7}")
    for row, cs in rows.items():
        if not cs:
            continue
        calls = opts.calls * LONGER.get(row, 1)
        times: dict[str, list[float]] = {name: [] for name, _, _ in cs}
        for _ in range(opts.rounds):
            for name, fn, drain in cs:
                fn()
                drain()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[name].append((time.perf_counter() - t0) / calls * 1e6)
                drain()
        base = statistics.median(times[cs[0][0]])
        for name, _, _ in cs:
            med = statistics.median(times[name])
            print(f"{row:<26} {name:<28} {med:>9.2f} {med / base:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
