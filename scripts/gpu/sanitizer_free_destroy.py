"""Whether compute-sanitizer's leak check sees a stream-ordered free whose stream is destroyed right after
it (before the free has run), with the driver alone (cuda.bindings): what CuPy does when it destroys its
stream just after cudacore freed a block on it.

    compute-sanitizer --tool memcheck --leak-check full python3 -P scripts/gpu/sanitizer_free_destroy.py now|busy|runtime|synced

``now`` destroys each stream right after the free; ``busy`` does too, with the stream still busy with a
1 GiB memset queued before the free (so the free runs after the destroy call returned, as when CuPy
destroys a stream with kernels still queued); ``runtime`` does as ``busy`` with a blocking stream made and
destroyed through the runtime API (cudaStreamCreate / cudaStreamDestroy), as CuPy's default Stream() is;
``synced`` synchronizes it first. All leave the pool
with nothing in use (printed at the end); a leak reported for ``now`` only is the sanitizer's, not the
program's.
"""

from __future__ import annotations

import sys

from cuda.bindings import driver as drv


def ok(res):  # type: ignore[no-untyped-def]
    err, *rest = res if isinstance(res, tuple) else (res,)
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else rest


mode = sys.argv[1]
ok(drv.cuInit(0))
dev = ok(drv.cuDeviceGet(0))
ctx = ok(drv.cuDevicePrimaryCtxRetain(dev))
ok(drv.cuCtxSetCurrent(ctx))
pool = ok(drv.cuDeviceGetMemPool(dev))
scratch = ok(drv.cuMemAlloc(1 << 30)) if mode in ("busy", "runtime") else None
for _ in range(5):
    if mode == "runtime":
        from cuda.bindings import runtime as rt

        s = ok(rt.cudaStreamCreate())
    else:
        s = ok(drv.cuStreamCreate(1))
    p = ok(drv.cuMemAllocFromPoolAsync(8192, pool, s))
    if scratch is not None:
        for _ in range(8):
            ok(drv.cuMemsetD8Async(scratch, 1, 1 << 30, s))
    ok(drv.cuMemFreeAsync(p, s))
    if mode == "synced":
        ok(drv.cuStreamSynchronize(s))
    if mode == "runtime":
        ok(rt.cudaStreamDestroy(s))
    else:
        ok(drv.cuStreamDestroy(s))
ok(drv.cuCtxSynchronize())
ok(drv.cuMemPoolTrimTo(pool, 0))
if scratch is not None:
    ok(drv.cuMemFree(scratch))
used = ok(drv.cuMemPoolGetAttribute(pool, drv.CUmemPool_attribute.CU_MEMPOOL_ATTR_USED_MEM_CURRENT))
print(mode, "pool used after", int(used))
