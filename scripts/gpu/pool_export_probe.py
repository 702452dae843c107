"""Where does exporting a block of cudacore's exportable pool fail? Each step of cudacore's sequence, made
with raw cuda.bindings, then cudacore's own calls, on the GPU machine:

    python scripts/gpu/pool_export_probe.py

Raw variants (a fresh pool each): the conformance case's order (allocate on the legacy stream, synchronize,
export), then with each of cudacore's differences added: the release threshold at its maximum, a
non-blocking stream, a larger block, no synchronize before the export. Then cudacore: allocate_shareable
and export at two sizes, on the legacy stream and on a stream.
"""

from __future__ import annotations

import os
import sys


def raw() -> None:
    from cuda.bindings import driver as cu

    def ok(r):  # (err, *values) -> values
        err, *vals = r if isinstance(r, tuple) else (r,)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(cu.cuGetErrorName(err)[1].decode())
        return vals[0] if len(vals) == 1 else vals

    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    for name, threshold, nonblocking, size, sync in [
        ("conformance order", False, False, 1000, True),
        ("+ release threshold max", True, False, 1000, True),
        ("+ non-blocking stream", True, True, 1000, True),
        ("+ 1 MiB", True, True, 1 << 20, True),
        ("+ no synchronize", True, True, 1 << 20, False),
        ("legacy, 1 MiB, no sync", False, False, 1 << 20, False),
    ]:
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.handleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = 0
        pool = ok(cu.cuMemPoolCreate(props))
        try:
            if threshold:
                ok(cu.cuMemPoolSetAttribute(pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, cu.cuuint64_t(2**64 - 1)))
            stream = ok(cu.cuStreamCreate(1)) if nonblocking else cu.CUstream(0)
            p = ok(cu.cuMemAllocFromPoolAsync(size, pool, stream))
            if sync:
                ok(cu.cuStreamSynchronize(stream))
            try:
                ok(cu.cuMemPoolExportPointer(p))
                verdict = "exported"
            except RuntimeError as exc:
                verdict = f"FAILED {exc}"
            ok(cu.cuMemFreeAsync(p, stream))
            ok(cu.cuStreamSynchronize(stream))
            if nonblocking:
                ok(cu.cuStreamDestroy(stream))
        finally:
            ok(cu.cuMemPoolDestroy(pool))
        print(f"raw   {name:<28} {verdict}")


def cudacore() -> None:
    import cudacore as cc

    d = cc.Device(0)
    s = d.create_stream()
    print(f"cudacore strategy {d.allocation_strategy}, share kind {cc._api.call(cc._api.core.ShareKind, 0)}")
    for size in (1000, 1 << 20):
        for stream in (None, s):
            sb = d.allocate_shareable(size, stream)
            try:
                sb.export()
                verdict = "exported"
            except cc.CUDAError as exc:
                verdict = f"FAILED {exc.name}"
            try:
                (stream or cc.Stream.legacy(d)).synchronize()
                sb.export()
                verdict += ", after a synchronize exported"
            except cc.CUDAError as exc:
                verdict += f", after a synchronize FAILED {exc.name}"
            print(f"cc    {size:>8} B on {'a stream' if stream else 'legacy  '}          {verdict}")
            sb.close()


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which == "raw":
        raw()
    elif which == "cudacore":
        cudacore()
    else:  # each in a process of its own
        for part in ("raw", "cudacore"):
            os.system(f"{sys.executable} {__file__} {part}")
