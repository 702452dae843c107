"""Stand-ins, on the simulator, for the libraries that share cudacore's pool (tests/test_one_pool.py and
the simulator mode of bench/one_pool.py).

``torch`` and ``cupy`` here are module-shaped: installed in ``sys.modules`` under those names, they have
the parts of the real modules that ``cudacore.share_pool`` and ``cudacore.explain_oom`` touch. Like
PyTorch's ``cudaMallocAsync`` backend and CuPy's ``MemoryAsyncPool`` they allocate from the device's
current pool (the simulator's ``cuMemAllocAsync``, through ``SimPoolAllocate``), publish no count of
their bytes, and fail with errors of their own, worded as the real libraries word them (the formats are
in docs/contributing/driver-facts.md). The RMM stand-in allocates from the pool by handle, as
``CudaAsyncViewMemoryResource`` does, counts its bytes as RMM's statistics adaptor does, and fails with
RMM's ``MemoryError``.
"""

from __future__ import annotations

import types
from typing import Any

import cudacore as cc
from cudacore._api import core

MiB = 1 << 20


def c10_format_size(n: int) -> str:
    """A size as PyTorch's messages write it (c10's format_size)."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1 << 20:
        return f"{n / 1024:.2f} KiB"
    if n <= 1 << 30:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


class _Library:
    """Blocks allocated from device ``ordinal``'s pool, natively: from the current pool (``pool`` 0) or
    from the pool given."""

    def __init__(self, ordinal: int = 0, pool: int = 0) -> None:
        self.ordinal, self.pool = ordinal, pool
        self.live: dict[int, int] = {}

    def _allocate(self, n: int) -> int:
        p = core.SimPoolAllocate(self.ordinal, n, self.pool)
        self.live[p] = n
        return p

    def free(self, p: int) -> None:
        core.SimPoolFree(self.ordinal, p)
        del self.live[p]

    def free_all(self) -> None:
        for p in list(self.live):
            self.free(p)

    def bytes_in_use(self) -> int:
        return sum(self.live.values())


class TorchOutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError's stand-in."""


class Torch(types.ModuleType, _Library):
    """``torch`` with the cudaMallocAsync backend: ``empty(n)`` allocates n bytes from the current pool."""

    OutOfMemoryError = TorchOutOfMemoryError

    def __init__(self, ordinal: int = 0) -> None:
        types.ModuleType.__init__(self, "torch")
        _Library.__init__(self, ordinal)
        self.cuda = types.SimpleNamespace(
            OutOfMemoryError=TorchOutOfMemoryError,
            get_allocator_backend=lambda: "cudaMallocAsync",
            current_stream=lambda device=None: types.SimpleNamespace(cuda_stream=0),
        )

    def empty(self, n: int) -> int:
        try:
            return self._allocate(n)
        except cc.OutOfMemoryError:
            free, total = cc.Device(self.ordinal).memory_info()
            raise TorchOutOfMemoryError(
                f"Allocation on device {self.ordinal} would exceed allowed memory. (out of memory)"
                f"\nCurrently allocated     : {c10_format_size(self.bytes_in_use())}"
                f"\nRequested               : {c10_format_size(n)}"
                f"\nDevice limit            : {c10_format_size(total)}"
                f"\nFree (according to CUDA): {c10_format_size(free)}"
                "\nPyTorch limit (set by user-supplied memory fraction)"
                f"\n                        : {c10_format_size((1 << 64) - 1)}"
            ) from None


class CupyOutOfMemoryError(MemoryError):
    """cupy.cuda.memory.OutOfMemoryError's stand-in: (size, total, limit), as CuPy's."""

    def __init__(self, size: int, total: int, limit: int = 0) -> None:
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes).")
        self._size, self._total, self._limit = size, total, limit


class CUDARuntimeError(RuntimeError):
    """cupy.cuda.runtime.CUDARuntimeError's stand-in (``status``, the cudaError_t)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


class Cupy(types.ModuleType):
    """``cupy`` with MemoryAsyncPool: its pools allocate from the current pool; ``cupy.cuda.set_allocator``
    picks CuPy's allocator, and ``alloc(n)`` allocates n bytes with it."""

    def __init__(self, ordinal: int = 0) -> None:
        super().__init__("cupy")
        self.library = _Library(ordinal)
        self._allocator: Any = self._default
        library = self.library

        class MemoryAsyncPool:
            def __init__(self, pool_handles: Any = "current") -> None:
                self.pool_handles = pool_handles

            def malloc(self, size: int) -> int:
                try:
                    return library._allocate(size)
                except cc.OutOfMemoryError:
                    raise CupyOutOfMemoryError(size, -1, 0) from None

        self.cuda = types.SimpleNamespace(
            MemoryAsyncPool=MemoryAsyncPool,
            set_allocator=self._set_allocator,
            get_current_stream=lambda: types.SimpleNamespace(ptr=0),
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, getDevice=lambda: ordinal, CUDARuntimeError=CUDARuntimeError),
            memory=types.SimpleNamespace(OutOfMemoryError=CupyOutOfMemoryError, get_allocator=lambda: self._allocator),
        )

    def _default(self, size: int) -> int:
        raise AssertionError("the stand-in's own allocator is not used")

    def _set_allocator(self, allocator: Any) -> None:
        self._allocator = allocator

    def alloc(self, n: int) -> int:
        return int(self._allocator(n))


class Rmm(_Library):
    """An RMM resource on the pool by handle, with its statistics: ``allocate(n)``, ``bytes_in_use()``."""

    def allocate(self, n: int) -> int:
        try:
            return self._allocate(n)
        except cc.OutOfMemoryError:
            raise MemoryError(
                f"std::bad_alloc: out_of_memory: CUDA error (failed to allocate {n} bytes) at: "
                "cuda_async_view_memory_resource.cpp:42: cudaErrorMemoryAllocation out of memory"
            ) from None
