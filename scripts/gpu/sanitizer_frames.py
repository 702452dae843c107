"""Whether compute-sanitizer keeps the Python frame of a driver call alive (docs/contributing/driver-facts.md, "Tools on
the GPU machine"). Run it plain, under the sanitizer, and under the sanitizer with device backtraces only:

    CUDACORE_BACKEND=cuda python3 scripts/gpu/sanitizer_frames.py
    CUDACORE_BACKEND=cuda compute-sanitizer --tool memcheck --leak-check full python3 scripts/gpu/sanitizer_frames.py
    CUDACORE_BACKEND=cuda compute-sanitizer --tool memcheck --leak-check full --show-backtrace device \\
        python3 scripts/gpu/sanitizer_frames.py

Each case makes a plain object local to a function and returns a weak reference to it: the object outlives
the function only if something keeps the function's frame.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import cudacore as cc


class Marker:
    """A plain object whose life is its frame's."""


def with_driver_call(dev: cc.Device) -> weakref.ref[Marker]:
    m = Marker()
    b = dev.allocate(200_000)  # a driver call (a pool allocation) made in this frame
    b.close()
    return weakref.ref(m)


def without_driver_call() -> weakref.ref[Marker]:
    m = Marker()
    return weakref.ref(m)


def with_cupy_growth(cupy: Any) -> weakref.ref[Marker]:
    m = Marker()
    _a = cupy.empty(1 << 20, dtype=cupy.uint8)  # CuPy's first allocation grows its pool: cuMemAlloc
    return weakref.ref(m)


def main() -> None:
    dev = cc.Device(0)
    r1, r2 = with_driver_call(dev), without_driver_call()
    gc.collect()
    print(f"local alive after a driver call: {r1() is not None}; without one: {r2() is not None}")
    try:
        import cupy
    except ImportError:
        print("no CuPy")
        return
    r3 = with_cupy_growth(cupy)
    gc.collect()
    print(f"CuPy: local alive after its pool grew: {r3() is not None}; "
          f"pool used bytes {cupy.get_default_memory_pool().used_bytes()}")  # fmt: skip


if __name__ == "__main__":
    main()
