"""Where the memory of clean_exit.py --cupy stands at each step, on the GPU machine: cudacore's books
(in_use, cached, reserved, orphaned), the Buffers still alive, and the pool's own used/reserved bytes as
the driver reports them (cuda.bindings), after the loop, after CuPy lets go of cudacore's allocator, and
after release_cached_memory.

    python3 -P scripts/gpu/cupy_exit_probe.py
"""

from __future__ import annotations

import gc

import cupy

import cudacore as cc
from cudacore import interop

d = cc.Device(0)


def pool_bytes() -> str:
    try:
        from cuda.bindings import driver as drv

        pool = drv.cuDeviceGetMemPool(0)[1]
        a = drv.CUmemPool_attribute
        used = drv.cuMemPoolGetAttribute(pool, a.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)[1]
        res = drv.cuMemPoolGetAttribute(pool, a.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)[1]
        return f"current pool used {int(used)} reserved {int(res)}"
    except Exception as exc:  # noqa: BLE001 - a probe: say why and go on
        return f"(pool unread: {exc})"


def show(step: str) -> None:
    s = d.memory_stats()
    alive = sum(1 for o in gc.get_objects() if type(o).__name__ == "Buffer")
    print(f"{step}: in_use {s['in_use']} cached {s['cached']} reserved {s['reserved']} orphaned {s['orphaned']} "
          f"allocations {s['allocations']} frees {s['frees']} buffers alive {alive}; {pool_bytes()}", flush=True)


cupy.cuda.set_allocator(interop.cupy_allocator())
for i in range(5):
    cs = cupy.cuda.Stream()
    cs.use()
    x = cupy.arange(1000) + i
    del cs
    gc.collect()
    cupy.cuda.Stream.null.use()
    del x
    gc.collect()
show("after the loop")
cupy.cuda.set_allocator(None)
gc.collect()
show("after set_allocator(None)")
d.release_cached_memory()
show("after release_cached_memory")
