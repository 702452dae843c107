"""Several GPUs and several processes (issue 13): cudacore against raw cuda.bindings, CuPy and PyTorch.

One run prints one table of three parts. Every contender is measured in every round, interleaved (a
machine's speed drifts between runs: compare within one run), and the table gives medians over rounds:

- peer copy bandwidth from device 0 to device 1 at 64 MiB and up: ``cudacore.device_to_device`` on a
  stream, against cuMemcpyPeerAsync through cuda.bindings and CuPy's ``memcpyPeerAsync``, on the same
  buffers and stream (ratio to cuda.bindings; target >= 0.95, and at least CuPy's);
- IPC round trip: export in this process, open and close in a second process (spawned once, fed handles
  through a pipe; the transport is not timed), for both kinds of shareable memory (an exportable pool's
  block; cuMemAlloc memory with a cuIpcMemHandle), against CuPy's ``ipcGetMemHandle`` /
  ``ipcOpenMemHandle`` / ``ipcCloseMemHandle`` (target: no slower than CuPy);
- all_reduce across 2 GPUs in 2 processes (torch.distributed, NCCL): of a cudacore buffer through DLPack,
  and of a tensor in a ``torch.cuda.MemPool`` of cudacore's memory registered with NCCL where NCCL can take
  it (``cudacore.interop.register_nccl_pool``; the row names the path), against a torch tensor of the same
  size on PyTorch's own allocator: time, bus bandwidth, and the ratio of bus bandwidths (target >= 0.95 at
  256 MiB). The all_reduce is in place, which NCCL never registers on one host: the pool's row measures
  cudacore's memory on NCCL's staged path (examples/torchrun_allreduce.py also times an all_gather, which
  NCCL does register).

    python bench/multi_gpu.py             # on the 2-GPU machine
    python bench/multi_gpu.py --sim       # smoke test on the simulator: tiny sizes, peers skipped unless
                                          # CUDACORE_SIM_DEVICES lists two (then the rows time host memcpy)

Contenders that are not installed, and parts the machine cannot run (one GPU: no peer copy, no
all_reduce), are skipped with the reason. NVLink multicast stays off in every process started here.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# Set before anything starts a process or loads NCCL: children inherit it.
for _key, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_key] = _value

PEER_SIZES = [64 << 20, 256 << 20, 1 << 30]
REDUCE_SIZES = [1 << 20, 64 << 20, 256 << 20]
SIM_IPC_SIZE = 1 << 16
SIM_PEER_SIZES = [1 << 20]


def fmt_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def interleave(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Median of each contender's measurements, every contender measured once per round."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, measure in contenders.items():
            samples[name].append(measure())
    return {name: statistics.median(v) for name, v in samples.items()}


# -- peer copies ---------------------------------------------------------------------------------------------


def peer_rows(rounds: int, sizes: list[int]) -> list[str]:
    import cudacore as cc

    if cc.device_count() < 2:
        return ["peer copy           skipped: needs 2 devices"]
    d0, d1 = cc.Device(0), cc.Device(1)
    if d0.can_access_peer(d1):
        d1.enable_peer_access(d0)
        d0.enable_peer_access(d1)
    rows = []
    for n in sizes:
        rows += _peer_size(d0, d1, n, rounds)
    return rows


def _peer_size(d0: Any, d1: Any, n: int, rounds: int) -> list[str]:
    """One size: device 0 to device 1 on a stream of device 1, each contender on the same buffers."""
    import cudacore as cc

    src, dst = d0.allocate(n), d1.allocate(n)
    s = d1.create_stream()
    reps = max(2, (1 << 30) // n)

    def timed(copy: Callable[[], None], sync: Callable[[], None]) -> float:
        copy()
        sync()
        t = time.perf_counter()
        for _ in range(reps):
            copy()
        sync()
        return reps * n / (time.perf_counter() - t) / 1e9

    contenders: dict[str, Callable[[], float]] = {
        "cudacore": lambda: timed(lambda: cc.device_to_device(dst, src, s), s.synchronize),
    }
    try:
        from cuda.bindings import driver as cu

        _, c0 = cu.cuDevicePrimaryCtxRetain(0)
        _, c1 = cu.cuDevicePrimaryCtxRetain(1)
        raw_stream = cu.CUstream(s.handle)
        contenders["cuda.bindings"] = lambda: timed(
            lambda: cu.cuMemcpyPeerAsync(dst.ptr, c1, src.ptr, c0, n, raw_stream), lambda: cu.cuStreamSynchronize(raw_stream)
        )
    except ImportError:
        pass
    try:
        import cupy

        contenders["cupy"] = lambda: timed(lambda: cupy.cuda.runtime.memcpyPeerAsync(dst.ptr, 1, src.ptr, 0, n, s.handle), s.synchronize)
    except ImportError:
        pass
    result = interleave(contenders, rounds)
    base = result.get("cuda.bindings")
    rows = []
    for name, gbs in result.items():
        ratio = f"{gbs / base:6.3f}" if base else "     -"
        rows.append(f"peer copy {fmt_size(n):>8}  {name:<22}{gbs:9.1f} GB/s   x{ratio}")
    src.close()
    dst.close()
    s.close()
    return rows


# -- IPC round trip ------------------------------------------------------------------------------------------


def _ipc_worker(conn: Any) -> None:
    """The second process: opens and closes each handle it is sent and replies the seconds each took, as
    (open, close) (scripts/gpu/ipc_breakdown.py shows them apart). A handle sent as ``"cudacore-go"`` is
    opened and closed by cudacore's Go entries alone (the driver's calls and Go's bookkeeping, without the
    lease or the Python objects): the breakdown's measure of what the Python layer adds."""
    import cudacore as cc

    cc.Device(0)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        kind, handle = msg
        if kind == "cudacore-go":  # what the Go entries take, made before the clock starts
            from cudacore._api import core
            from cudacore._owner import Owner

            owner = Owner()  # names the mapping in Go; core.OwnedFree(owner.token) unmaps it
            pool_fd = -1 if handle.pool_fd is None else handle.pool_fd
        t0 = time.perf_counter()
        if kind == "cupy":
            import cupy

            ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
            t1 = time.perf_counter()
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)
        elif kind == "cudacore-go":
            core.ShareImport(0, handle.kind, handle.handle, pool_fd, handle.pool_id, handle.size, owner.token)
            t1 = time.perf_counter()
            core.OwnedFree(owner.token)
        else:
            buf = handle.open()
            t1 = time.perf_counter()
            buf.close()
        t2 = time.perf_counter()
        if kind == "cudacore-go":
            owner.close()  # frees nothing more: the token's mapping is closed
        if kind != "cupy":
            handle.close()
        conn.send((t1 - t0, t2 - t1))


def ipc_rows(rounds: int, size: int) -> list[str]:
    import cudacore as cc

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    worker = ctx.Process(target=_ipc_worker, args=(child,))
    worker.start()
    try:
        d = cc.Device(0)
        # The kinds this device can export, as doctor's probe finds them: a driver may refuse the exportable
        # pool's pointers even where memory pools exist (docs/contributing/driver-facts.md).
        from cudacore._topology import topology

        probed = topology()["ipc"][0]
        kinds = [k for k, key in (("pool", "posix_fd"), ("ipc", "cuipc_mem")) if probed.get(key) == "ok"]
        if not kinds:
            return [f"  (no way of sharing memory with another process works here: {probed})"]
        shared = {kind: d.allocate_shareable(size, kind=kind) for kind in kinds}

        def cudacore_trip(buf: Any) -> float:
            t = time.perf_counter()
            h = buf.export()
            dt = time.perf_counter() - t
            parent.send(("cudacore", h))
            h.close()
            return dt + sum(parent.recv())

        contenders: dict[str, Callable[[], float]] = {
            f"cudacore ({kind})": (lambda buf=buf: cudacore_trip(buf)) for kind, buf in shared.items()
        }
        try:
            import cupy

            with cupy.cuda.Device(0):
                cupy_mem = cupy.cuda.runtime.malloc(size)

            def cupy_trip() -> float:
                t = time.perf_counter()
                h = cupy.cuda.runtime.ipcGetMemHandle(cupy_mem)
                dt = time.perf_counter() - t
                parent.send(("cupy", h))
                return dt + sum(parent.recv())

            contenders["cupy"] = cupy_trip
        except ImportError:
            cupy_mem = None
        for fn in contenders.values():  # the first open of a pool imports it: warm every contender up
            fn()
        result = interleave(contenders, rounds)
        base = result.get("cupy")
        rows = []
        for name, secs in result.items():
            ratio = f"{secs / base:6.3f}" if base else "     -"
            rows.append(f"ipc round trip {fmt_size(size):>8}  {name:<18}{secs * 1e6:9.1f} us     x{ratio}")
        for buf in shared.values():
            buf.close()
        if cupy_mem is not None:
            cupy.cuda.runtime.free(cupy_mem)
        return rows
    finally:
        parent.send(None)
        worker.join(30)


# -- all_reduce ----------------------------------------------------------------------------------------------


def _reduce_worker(rank: int, port: int, sizes: list[int], rounds: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    import cudacore as cc
    from cudacore import interop

    torch.cuda.set_device(rank)
    # device_id: the communicator is made now, as registering a pool needs.
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    d = cc.Device(rank)
    results = []
    buffers = []  # closed after the process group is gone: NCCL's bookkeeping may hold the DLPack views
    try:
        reg = interop.register_nccl_pool(interop.nccl_mem_pool(rank))
        pool_name = f"cudacore pool ({reg.path.path})"
    except cc.NotSupportedError as exc:  # this PyTorch cannot: the row says why on rank 0
        reg, pool_name = None, f"cudacore pool: {exc}"[:60]
    for n in sizes:
        buf = d.allocate(n)
        buffers.append(buf)
        view = torch.from_dlpack(buf).view(torch.float32)  # the Buffer's memory, no copy
        view.fill_(1.0)
        tensor = torch.ones(n // 4, dtype=torch.float32, device=f"cuda:{rank}")
        contenders = {"cudacore buffer": view, "torch tensor": tensor}
        if reg is not None:
            with torch.cuda.use_mem_pool(reg.pool):
                contenders[pool_name] = torch.ones(n // 4, dtype=torch.float32, device=f"cuda:{rank}")
        reps = max(5, (1 << 30) // n)

        def timed(t: Any, reps: int = reps) -> float:
            dist.all_reduce(t)
            torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(reps):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / reps

        med = interleave({name: (lambda t=t: timed(t)) for name, t in contenders.items()}, rounds)
        if reg is None:
            med[pool_name] = float("nan")
        results.append((n, med))
        del view, tensor, contenders
    if rank == 0:
        out.put(results)
    if reg is not None:
        reg.deregister()
    dist.destroy_process_group()
    import gc

    gc.collect()
    for buf in buffers:
        buf.close()


def reduce_rows(rounds: int) -> list[str]:
    import cudacore as cc

    if cc.backend() != "cuda" or cc.device_count() < 2:
        return ["all_reduce          skipped: needs 2 GPUs (the CUDA backend)"]
    try:
        import torch  # noqa: F401
    except ImportError:
        return ["all_reduce          skipped: torch is not installed"]
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_reduce_worker, args=(r, port, REDUCE_SIZES, rounds, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = out.get(timeout=600)
    for p in procs:
        p.join(60)
    rows = []
    for n, med in results:
        base = med["torch tensor"]
        for name, secs in med.items():
            # Bus bandwidth, as nccl-tests reports it: bytes / time x 2(ranks-1)/ranks, with 2 ranks.
            bus = n / secs / 1e9
            rows.append(f"all_reduce {fmt_size(n):>8}  {name:<22}{secs * 1e6:9.1f} us {bus:7.1f} GB/s bus   x{base / secs:6.3f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", action="store_true", help="run on the simulator: tiny sizes")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7, --sim 3)")
    args = ap.parse_args(argv)
    if args.sim:
        os.environ["CUDACORE_BACKEND"] = "sim"
    rounds = args.rounds or (3 if args.sim else 7)
    import cudacore as cc

    print(f"backend {cc.backend()}, {cc.device_count()} device(s), {rounds} interleaved rounds, medians")
    print(f"{'part':<30}{'contender':<22}{'result':>14}   {'ratio'}")
    rows: list[str] = []
    # On the simulator the peer rows exercise the code (with CUDACORE_SIM_DEVICES listing 2 devices); their
    # figures measure host memcpy, not a GPU.
    rows += peer_rows(rounds, SIM_PEER_SIZES if args.sim else PEER_SIZES)
    rows += ipc_rows(rounds, SIM_IPC_SIZE if args.sim else 64 << 20)
    rows += reduce_rows(rounds)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
