"""A program that closes everything it allocated: under
``compute-sanitizer --tool memcheck --leak-check full python3 scripts/gpu/clean_exit.py`` it must show 0
bytes leaked (docs/contributing/gpu-testing.md, "compute-sanitizer"). It allocates on a stream, copies, captures a
copy, launches the graph and closes everything, and with ``--cupy`` does the same through CuPy on
cudacore's allocator, a CuPy stream destroyed before an array allocated on it is freed included.
"""

from __future__ import annotations

import sys

import cudacore as cc

d = cc.Device(0)
s = d.create_stream()
buf = d.allocate(1 << 20, stream=s)
pinned = d.allocate_pinned(1 << 20)
buf.copy_from(pinned, stream=s)
with s.capture() as graph:
    buf.copy_to(pinned, stream=s)
graph.launch(s)
s.synchronize()
graph.destroy()
buf.close()
pinned.close()
s.close()

if "--cupy" in sys.argv:
    import gc

    import cupy

    from cudacore import interop

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
    cupy.cuda.set_allocator(None)
    gc.collect()
print("in_use", d.memory_stats()["in_use"], "orphaned", d.memory_stats()["orphaned"])
