"""Whose cost an IPC open and close is (issue 33): each way of opening, on each exporter's memory, in one
second process and one run.

ipc_breakdown.py finds cudacore's Go entries (core.ShareImport, core.OwnedFree) slower than CuPy's
ipcOpenMemHandle / ipcCloseMemHandle, but its rows differ in two things at once: the path that opens, and
the memory opened (cudacore's SharedBuffer against CuPy's own allocation). On the simulator those entries
make the driver's call and nothing else (cudacore/share_calls_test.go), so this crosses the two:

- openers: ``cudacore Go`` (core.ShareImport / core.OwnedFree: the door, Go's bookkeeping and the
  driver's call), ``cupy`` (the runtime's cudaIpcOpenMemHandle / cudaIpcCloseMemHandle), ``driver``
  (cuIpcOpenMemHandle_v2 with the lazy peer access flag, as cudacore calls it, and cuIpcCloseMemHandle,
  through ctypes: no Go, no runtime) and ``driver flags=0`` (the same without the flag);
- memory, 64 MiB each, exported by this process: ``cudacore`` (a SharedBuffer of kind "ipc"), ``cupy``
  (cupy.cuda.runtime.malloc) and ``driver`` (cuMemAlloc_v2 through ctypes), allocated in ``--order``.

Every round opens and closes each pair once, in a new random order (so no pair always follows the same
one); this process waits meanwhile. Medians over the rounds, in microseconds. Reading it: a column whose
openers agree and that stands apart from the others is the memory's doing (try another ``--order``); a row
apart from the ``driver`` row is its path's doing, and ``cudacore Go`` minus ``driver`` is what cudacore's
door and Go add to the driver's call.

    PYTHONPATH=gpu-site CUDACORE_BACKEND=cuda python3 -P scripts/gpu/ipc_cross.py [--size BYTES] [--rounds N] [--order cudacore,cupy,driver]

Without CuPy its row and column are left out. On the simulator (``CUDACORE_BACKEND=sim``) only cudacore's
row and column remain, a check of the script itself: its driver and CuPy are not there.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import random
import statistics
import time
from typing import Any

LAZY_PEER_ACCESS = 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


class _IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def _libcuda() -> Any:
    """libcuda with the entry points used here typed, and device 0's primary context (the one cudacore and
    CuPy use) current on this thread."""
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    cu.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_IpcMemHandle), ctypes.c_uint64]
    cu.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcMemHandle, ctypes.c_uint]
    cu.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
    ctx = ctypes.c_void_p()
    _ok(cu.cuInit(0), "cuInit")
    _ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    _ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return cu


def _ok(r: int, what: str) -> None:
    if r != 0:
        raise RuntimeError(f"{what} returned CUresult {r}")


def _worker(conn: Any) -> None:
    """The second process: opens and closes each handle it was sent by each opener, rounds times, and
    replies the medians as {(opener, memory): (open_us, close_us)}."""
    import cudacore as cc
    from cudacore._api import core
    from cudacore._owner import Owner

    cc.Device(0)
    handles, size, rounds, real = conn.recv()
    cu = _libcuda() if real else None
    try:
        import cupy
    except ImportError:
        cupy = None

    def go(h: bytes) -> tuple[int, int]:
        owner = Owner()  # names the mapping in Go
        t0 = time.perf_counter_ns()
        ptr = core.ShareImport(0, "ipc", h.hex(), -1, "", size, owner.token)
        t1 = time.perf_counter_ns()
        core.OwnedFree(owner.token)
        t2 = time.perf_counter_ns()
        owner.close()  # frees nothing more
        assert ptr
        return t1 - t0, t2 - t1

    def runtime(h: bytes) -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        ptr = cupy.cuda.runtime.ipcOpenMemHandle(h)
        t1 = time.perf_counter_ns()
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
        return t1 - t0, time.perf_counter_ns() - t1

    def driver(flags: int) -> Any:
        def trip(h: bytes) -> tuple[int, int]:
            raw = _IpcMemHandle.from_buffer_copy(h)
            ptr = ctypes.c_uint64()
            t0 = time.perf_counter_ns()
            _ok(cu.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), raw, flags), "cuIpcOpenMemHandle_v2")
            t1 = time.perf_counter_ns()
            _ok(cu.cuIpcCloseMemHandle(ptr.value), "cuIpcCloseMemHandle")
            return t1 - t0, time.perf_counter_ns() - t1

        return trip

    openers = {"cudacore Go": go}
    if real:
        openers.update({"driver": driver(LAZY_PEER_ACCESS), "driver flags=0": driver(0)})
    if real and cupy is not None:
        openers["cupy"] = runtime
    pairs = [(o, m) for o in openers for m in handles]
    times: dict[tuple[str, str], list[tuple[int, int]]] = {p: [] for p in pairs}
    for r in range(rounds + 2):  # two warm-up rounds
        random.shuffle(pairs)
        for opener, memory in pairs:
            t = openers[opener](handles[memory])
            if r >= 2:
                times[(opener, memory)].append(t)
    conn.send({p: tuple(statistics.median(x[i] for x in xs) / 1e3 for i in range(2)) for p, xs in times.items()})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=64 << 20)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--order", default="cudacore,cupy,driver", help="the order the exporter allocates in")
    args = ap.parse_args()
    import cudacore as cc

    order = args.order.split(",")
    if sorted(order) != ["cudacore", "cupy", "driver"]:
        ap.error("--order lists cudacore, cupy and driver, each once")
    d = cc.Device(0)
    real = os.environ.get("CUDACORE_BACKEND", "cuda") != "sim"
    cu = _libcuda() if real else None
    cupy = None
    if real:
        try:
            import cupy
        except ImportError:
            pass
    handles: dict[str, bytes] = {}
    keep: list[Any] = []
    driver_mem = ctypes.c_uint64()
    for memory in order:
        if memory == "cudacore":
            sb = d.allocate_shareable(args.size, kind="ipc")
            keep.append(sb)
            handles[memory] = bytes.fromhex(sb.export().handle)
        elif memory == "cupy" and cupy is not None:
            with cupy.cuda.Device(0):
                mem = cupy.cuda.runtime.malloc(args.size)
            keep.append(mem)
            handles[memory] = bytes(cupy.cuda.runtime.ipcGetMemHandle(mem))
        elif memory == "driver" and cu is not None:
            _ok(cu.cuMemAlloc_v2(ctypes.byref(driver_mem), args.size), "cuMemAlloc_v2")
            raw = _IpcMemHandle()
            _ok(cu.cuIpcGetMemHandle(ctypes.byref(raw), driver_mem.value), "cuIpcGetMemHandle")
            handles[memory] = bytes(raw.reserved)
    ctx = mp.get_context("spawn")
    parent, other = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(other,))
    proc.start()
    try:
        parent.send((handles, args.size, args.rounds, real))
        result = parent.recv()
    finally:
        proc.join(60)
        if driver_mem.value:
            _ok(cu.cuMemFree_v2(driver_mem.value), "cuMemFree_v2")
        for k in keep:
            if cupy is not None and isinstance(k, int):
                cupy.cuda.runtime.free(k)
            else:
                k.close()
    memories = [m for m in order if m in handles]
    print(f"IPC open and close of {args.size} bytes, {args.rounds} rounds, allocated in the order {','.join(order)}; medians in us")
    print(f"{'opener':<16}" + "".join(f"{m + ' open':>16}{m + ' close':>16}" for m in memories))
    for opener in dict.fromkeys(o for o, _ in result):
        print(f"{opener:<16}" + "".join(f"{result[(opener, m)][0]:16.1f}{result[(opener, m)][1]:16.1f}" for m in memories))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
