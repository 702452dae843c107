"""Copy bandwidth and graph-launch overhead: cudacore against raw cuda.bindings, CuPy and PyTorch (issue 4).

One run prints one table. Every contender is measured in every round, interleaved (the GPU machine's
speed drifts by 2x between runs: compare within one run), and the table gives medians over rounds and
each contender's ratio to raw cuda.bindings (bandwidth: higher is better; launch: lower is better).

    python bench/copies.py                # on the H100: Python 3.12 with numpy, cupy, cuda-bindings, torch
    python bench/copies.py --sim          # smoke test: cudacore only, on the simulator, tiny sizes

Peers that are not installed are skipped. Targets (issue 4): pinned copies at >= 95% of cuda.bindings,
pageable asynchronous copies no slower than the driver's own pageable copy, Graph.launch no slower than
CuPy's; issue 29: pageable copies from 64 MiB at >= 40 GB/s host to device and >= 35 GB/s device to host
on an H100 or H200, at 16 MiB >= 2x the driver's (scripts/gpu/pageable_probe.py sweeps the staging
settings and times another stream's copies meanwhile).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]
SIM_SIZES = [4 << 10, 64 << 10]


def fmt_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def reps_for(n: int) -> int:
    return max(1, min(200, (256 << 20) // n))


class Contender:
    """One way to do one operation: setup() -> a callable that runs it once (synchronized)."""

    def __init__(
        self,
        name: str,
        run: Callable[[], None],
        teardown: Callable[[], None] | None = None,
        drain: Callable[[], None] | None = None,
    ) -> None:
        self.name, self.run, self.teardown, self.drain = name, run, teardown, drain


# -- cudacore ---------------------------------------------------------------------------------------------


def cudacore_copy(n: int, pinned: bool, asynchronous: bool, driver_sync: bool = False, to_device: bool = True) -> Contender:
    """cudacore's copy (host to device, or device to host); asynchronous ones wait with Stream.synchronize, or
    with driver_sync with the driver's cuStreamSynchronize on the same stream (through cuda.bindings), which
    isolates the copy's own cost from the wait's: cudacore's wait queries in slices so that Ctrl-C can stop
    it."""
    import numpy as np

    import cudacore as cc

    d = cc.Device(0)
    s = d.create_stream()
    buf = d.allocate(n, stream=s)
    host_obj = d.allocate_pinned(n) if pinned else np.ones(n, np.uint8)
    stream = s if asynchronous else None
    wait = s.synchronize
    if driver_sync:
        drv = _drv()
        raw = drv.CUstream(s.handle)

        def wait() -> None:
            _ok(drv.cuStreamSynchronize(raw))

    move = buf.copy_from if to_device else buf.copy_to

    def run() -> None:
        move(host_obj, stream=stream)
        if asynchronous:
            wait()

    def teardown() -> None:
        buf.close()
        if pinned:
            host_obj.close()
        s.close()

    return Contender("cudacore, driver's sync" if driver_sync else "cudacore", run, teardown)


def cudacore_graph() -> tuple[Contender, int]:
    import cudacore as cc

    d = cc.Device(0)
    s = d.create_stream()
    a, b = d.allocate(4096, stream=s), d.allocate(4096, stream=s)
    with s.capture() as g:
        cc.device_to_device(b, a, stream=s)
    g.upload(s)
    launch = g.launch

    def run() -> None:
        launch(s)

    def teardown() -> None:
        s.synchronize()
        g.destroy()
        a.close()
        b.close()
        s.close()

    return Contender("cudacore Graph.launch", run, teardown, s.synchronize), 0


# -- cuda.bindings --------------------------------------------------------------------------------------------


def _drv():
    from cuda.bindings import driver

    return driver


def _ok(ret):
    err = ret[0] if isinstance(ret, tuple) else ret
    if int(err) != 0:
        raise RuntimeError(f"cuda.bindings call failed: {err}")
    return ret[1] if isinstance(ret, tuple) and len(ret) == 2 else ret


def bindings_init() -> None:
    drv = _drv()
    _ok(drv.cuInit(0))
    dev = _ok(drv.cuDeviceGet(0))
    ctx = _ok(drv.cuDevicePrimaryCtxRetain(dev))
    _ok(drv.cuCtxSetCurrent(ctx))


def bindings_copy(n: int, pinned: bool, asynchronous: bool, to_device: bool = True) -> Contender:
    import numpy as np

    drv = _drv()
    bindings_init()
    stream = _ok(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING))
    dptr = _ok(drv.cuMemAlloc(n))
    if pinned:
        hptr = _ok(drv.cuMemHostAlloc(n, 0))
        src = int(hptr)
    else:
        arr = np.ones(n, np.uint8)
        src = arr.ctypes.data

    keep = arr if not pinned else None  # the array must outlive the copies: src is only its address

    def run() -> None:
        _ = keep
        if asynchronous:
            if to_device:
                _ok(drv.cuMemcpyHtoDAsync(dptr, src, n, stream))
            else:
                _ok(drv.cuMemcpyDtoHAsync(src, dptr, n, stream))
            _ok(drv.cuStreamSynchronize(stream))
        elif to_device:
            _ok(drv.cuMemcpyHtoD(dptr, src, n))
        else:
            _ok(drv.cuMemcpyDtoH(src, dptr, n))

    def teardown() -> None:
        _ok(drv.cuMemFree(dptr))
        if pinned:
            _ok(drv.cuMemFreeHost(hptr))
        _ok(drv.cuStreamDestroy(stream))

    return Contender("cuda.bindings", run, teardown)


def bindings_graph() -> Contender:
    drv = _drv()
    bindings_init()
    stream = _ok(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING))
    a, b = _ok(drv.cuMemAlloc(4096)), _ok(drv.cuMemAlloc(4096))
    _ok(drv.cuStreamBeginCapture(stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    _ok(drv.cuMemcpyDtoDAsync(b, a, 4096, stream))
    graph = _ok(drv.cuStreamEndCapture(stream))
    exe = _ok(drv.cuGraphInstantiate(graph, 0))
    _ok(drv.cuGraphUpload(exe, stream))
    launch = drv.cuGraphLaunch

    def run() -> None:
        launch(exe, stream)

    def teardown() -> None:
        _ok(drv.cuStreamSynchronize(stream))
        _ok(drv.cuGraphExecDestroy(exe))
        _ok(drv.cuGraphDestroy(graph))
        _ok(drv.cuMemFree(a))
        _ok(drv.cuMemFree(b))
        _ok(drv.cuStreamDestroy(stream))

    return Contender("cuda.bindings cuGraphLaunch", run, teardown, lambda: _ok(drv.cuStreamSynchronize(stream)))


# -- CuPy and PyTorch ---------------------------------------------------------------------------------------


def cupy_copy(n: int, pinned: bool, asynchronous: bool, to_device: bool = True) -> Contender:
    import cupy
    import cupyx
    import numpy as np

    s = cupy.cuda.Stream(non_blocking=True)
    dev = cupy.empty(n, cupy.uint8)
    host = cupyx.empty_pinned(n, np.uint8) if pinned else np.ones(n, np.uint8)

    rt = cupy.cuda.runtime

    def run() -> None:
        if asynchronous:
            if to_device:
                dev.set(host, stream=s)
            else:
                dev.get(stream=s, out=host)
            s.synchronize()
        elif to_device:
            rt.memcpy(dev.data.ptr, host.ctypes.data, n, rt.memcpyHostToDevice)
        else:
            rt.memcpy(host.ctypes.data, dev.data.ptr, n, rt.memcpyDeviceToHost)

    return Contender("CuPy", run, None)


def cupy_graph() -> Contender:
    import cupy

    s = cupy.cuda.Stream(non_blocking=True)
    a, b = cupy.zeros(4096, cupy.uint8), cupy.zeros(4096, cupy.uint8)
    with s:
        s.begin_capture()
        b[...] = a
        g = s.end_capture()
    g.upload(s)

    def run() -> None:
        g.launch(s)

    return Contender("CuPy Graph.launch", run, None, s.synchronize)


def torch_graph() -> Contender:
    import torch

    a, b = torch.zeros(4096, dtype=torch.uint8, device="cuda"), torch.zeros(4096, dtype=torch.uint8, device="cuda")
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        b.copy_(a)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        b.copy_(a)
    replay = g.replay

    def run() -> None:
        replay()

    return Contender("torch CUDAGraph.replay", run, None, torch.cuda.synchronize)


# -- measurement ---------------------------------------------------------------------------------------------


def try_make(factory: Callable[..., Contender], *args) -> Contender | None:
    try:
        return factory(*args)
    except ImportError:
        return None
    except Exception as exc:  # noqa: BLE001 - a peer that fails to set up is reported and skipped
        print(f"  (skipped {factory.__name__}{args}: {type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def time_once(c: Contender, reps: int) -> float:
    c.run()  # warm
    t0 = time.perf_counter()
    for _ in range(reps):
        c.run()
    return (time.perf_counter() - t0) / reps


KINDS = ("pinned sync", "pinned async", "pageable sync", "pageable async")
DIRECTIONS = ("H2D", "D2H")


def parse_size(text: str) -> int:
    """'64K', '4M', '1G' or a byte count."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    shift = {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0)
    number = text[:-1] if shift else text
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 64K, 4M, 1G)")
    return int(number) << shift


def bandwidth_rows(
    sizes: list[int], rounds: int, peers: bool, kinds: tuple[str, ...] = KINDS, directions: tuple[str, ...] = DIRECTIONS
) -> list[tuple[str, str, str, float, float | None]]:
    rows = []
    for direction in directions:
        to_device = direction == "H2D"
        for pinned in (True, False):
            for asynchronous in (False, True):
                kind = f"{'pinned' if pinned else 'pageable'} {'async' if asynchronous else 'sync'}"
                if kind not in kinds:
                    continue
                for n in sizes:
                    contenders = [try_make(cudacore_copy, n, pinned, asynchronous, False, to_device)]
                    if peers:
                        contenders += [try_make(bindings_copy, n, pinned, asynchronous, to_device),
                                       try_make(cupy_copy, n, pinned, asynchronous, to_device)]
                        if asynchronous:
                            contenders.append(try_make(cudacore_copy, n, pinned, asynchronous, True, to_device))
                    contenders = [c for c in contenders if c is not None]
                    times: dict[str, list[float]] = {c.name: [] for c in contenders}
                    reps = reps_for(n)
                    for _ in range(rounds):
                        for c in contenders:
                            times[c.name].append(time_once(c, reps))
                    for c in contenders:
                        if c.teardown:
                            c.teardown()
                    base = statistics.median(times["cuda.bindings"]) if "cuda.bindings" in times else None
                    for name, ts in times.items():
                        med = statistics.median(ts)
                        gbps = n / med / 1e9
                        ratio = base / med if base else None
                        rows.append((f"{direction} {kind} {fmt_size(n)}", name, "GB/s", gbps, ratio))
    return rows


def launch_rows(rounds: int, peers: bool) -> list[tuple[str, str, str, float, float | None]]:
    made = [try_make(lambda: cudacore_graph()[0])]
    if peers:
        made += [try_make(bindings_graph), try_make(cupy_graph), try_make(torch_graph)]
    contenders = [c for c in made if c is not None]
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    reps = 2000
    for _ in range(rounds):
        for c in contenders:
            t = time_once(c, reps)
            if c.drain:
                c.drain()  # let the queued launches finish between contenders (not timed)
            times[c.name].append(t)
    for c in contenders:
        if c.teardown:
            c.teardown()
    base_name = "cuda.bindings cuGraphLaunch"
    base = statistics.median(times[base_name]) if base_name in times else None
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts) * 1e6
        rows.append(("graph launch, host time (4 KiB D2D)", name, "us", med, med / (base * 1e6) if base else None))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", action="store_true", help="cudacore only, on the simulator, tiny sizes (smoke test)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per measurement (default 7; 2 with --sim)")
    ap.add_argument("--sizes", type=lambda v: [parse_size(x) for x in v.split(",")], default=None,
                    help="comma-separated copy sizes, e.g. 64K,1M,16M (default: 4K to 1G; 4K,64K with --sim)")
    ap.add_argument("--kinds", type=lambda v: tuple(x.strip() for x in v.split(",")), default=KINDS,
                    help=f"comma-separated copy kinds among {', '.join(KINDS)} (default: all)")
    ap.add_argument("--directions", type=lambda v: tuple(x.strip().upper() for x in v.split(",")), default=DIRECTIONS,
                    help="comma-separated copy directions among H2D, D2H (default: both)")
    ap.add_argument("--no-launch", action="store_true", help="leave out the graph-launch rows")
    args = ap.parse_args()
    if unknown := [k for k in args.kinds if k not in KINDS]:
        ap.error(f"unknown copy kind(s) {unknown}; choose among {list(KINDS)}")
    if unknown := [k for k in args.directions if k not in DIRECTIONS]:
        ap.error(f"unknown direction(s) {unknown}; choose among {list(DIRECTIONS)}")
    if args.sim:
        os.environ["CUDACORE_BACKEND"] = "sim"
    rounds = args.rounds or (2 if args.sim else 7)
    sizes = args.sizes or (SIM_SIZES if args.sim else SIZES)
    peers = not args.sim

    import cudacore as cc

    d = cc.Device(0)
    print(f"# cudacore {cc.__version__} on {cc.backend()}: {d.name}; Python {sys.version.split()[0]}; {rounds} rounds, interleaved")
    rows = bandwidth_rows(sizes, rounds, peers, args.kinds, args.directions) + ([] if args.no_launch else launch_rows(rounds, peers))
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'contender':<28} {'median':>12}  {'vs cuda.bindings':>16}")
    for what, name, unit, value, ratio in rows:
        r = f"{ratio:.2f}x" if ratio is not None else "-"
        print(f"{what:<{width}}  {name:<28} {value:>9.2f} {unit:<4} {r:>14}")
    print("# bandwidth ratio: contender/bindings (higher is better); launch ratio: contender/bindings time (lower is better)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
