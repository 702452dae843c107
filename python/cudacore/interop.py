"""cudacore with CuPy, PyTorch and Numba in one process.

Zero-copy exchange
------------------
- A :class:`cudacore.Buffer` exports ``__cuda_array_interface__`` (v3, with its stream) and DLPack
  (``__dlpack__`` / ``__dlpack_device__``), so ``cupy.asarray(buf)``, ``cupy.from_dlpack(buf)``,
  ``torch.from_dlpack(buf)`` and ``numba.cuda.as_cuda_array(buf)`` view it without a copy (as bytes; use
  ``.view(dtype)`` there).
- :func:`asbuffer` (also ``Device.from_array``) goes the other way: it takes a CuPy/PyTorch/Numba array
  (anything with ``__cuda_array_interface__`` or ``__dlpack__``) as an :class:`ExternalBuffer`, a
  :class:`cudacore.Buffer` that views the memory, keeps its owner alive and frees nothing. It is accepted
  wherever cudacore takes a Buffer (copies, kernel arguments).

Allocators drawing from cudacore's pools, statistics and out-of-memory handling
-------------------------------------------------------------------------------
- CuPy: ``cupy.cuda.set_allocator(cudacore.interop.cupy_allocator())``.
- PyTorch: ``cudacore.interop.use_torch_allocator()`` (before the first CUDA tensor), or
  ``torch.cuda.memory.change_current_allocator(cudacore.interop.torch_allocator())``.
- Numba: ``NUMBA_CUDA_MEMORY_MANAGER=cudacore.interop`` in the environment, or
  ``numba.cuda.set_memory_manager(cudacore.interop.NumbaMemoryManager)``.
- cuda.core: ``cudacore.interop.cuda_core_memory_resource(device)``, a ``cuda.core.MemoryResource``:
  ``mr.allocate(n, stream=s)`` or ``device.memory_resource = mr``.

Their memory shows in ``Device.memory_stats()`` and counts against ``Device.memory_limit``.

NCCL's zero-copy path (user buffer registration)
------------------------------------------------
:func:`nccl_mem_pool` makes a ``torch.cuda.MemPool`` whose memory comes from cudacore, and
:func:`register_nccl_pool` registers it with a ``torch.distributed`` NCCL process group where NCCL can
take cudacore's memory without a copy, and says which path collectives on it take
(:func:`nccl_memory_path`; docs/guide/multi-gpu.md, "NCCL's zero-copy path").

One pool for every library, natively
------------------------------------
:func:`cudacore.share_pool` makes one memory pool the device's current pool and wires PyTorch, CuPy, RMM
and Numba to it with no call into cudacore per allocation (docs/guide/one-pool.md says which route to take
when).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _accounts, _external, _tables
from ._api import core
from ._device import Device
from ._errors import error, typed_error
from ._external import ExternalBuffer, asbuffer, from_dlpack

# Arrays in (zero-copy) live in _external, a layer below, because Device.from_array uses them too. Its
# DLPack constants and ABI structures (generated: _tables.py) stay reachable here, where they were (tests
# build capsules with them).
kDLCPU, kDLCUDA, kDLCUDAHost = _external.kDLCPU, _external.kDLCUDA, _external.kDLCUDAHost
kDLCUDAManaged = _external.kDLCUDAManaged
_DLDevice, _DLDataType, _DLTensor = _tables.DLDevice, _tables.DLDataType, _tables.DLTensor
_DLManagedTensor, _DLPackVersion = _tables.DLManagedTensor, _tables.DLPackVersion
_DLManagedTensorVersioned = _tables.DLManagedTensorVersioned

__all__ = [
    "ExternalBuffer",
    "NcclPath",
    "NcclRegistration",
    "NumbaMemoryManager",
    "asbuffer",
    "cuda_core_memory_resource",
    "cupy_allocator",
    "extension_path",
    "from_dlpack",
    "last_error",
    "nccl_mem_pool",
    "nccl_memory_path",
    "register_nccl_pool",
    "torch_allocator",
    "use_torch_allocator",
]


def extension_path() -> str:
    """The file of cudacore's extension module: the one shared library holding the Go runtime, the Python
    bindings and the C entry points other frameworks load (``cudacore_torch_alloc``, ``cudacore_torch_free``)."""
    return str(sys.modules["cudacore._gopy._core"].__file__)


# -- allocators -----------------------------------------------------------------------------------------


def _device(device: Device | int | None) -> Device:
    if device is None:
        return Device(0)
    if isinstance(device, Device):
        return device
    return Device(device)


def cupy_allocator(device: Device | int | None = None) -> Callable[[int], Any]:
    """An allocator for ``cupy.cuda.set_allocator`` drawing from cudacore's allocator.

    Each CuPy allocation is a :class:`cudacore.Buffer` on CuPy's current stream, wrapped in a
    ``cupy.cuda.MemoryPointer`` over a ``cupy.cuda.UnownedMemory`` whose owner is that Buffer: the memory
    is freed (in stream order) when CuPy drops its last reference. The Buffer holds CuPy's stream object
    until then (CuPy destroys a stream when the object is collected), so the free always finds its stream
    alive (docs/guide/memory.md, "Streams of other libraries"). ``device`` (default: CuPy's current
    device at each call) picks the cudacore device.

    Out of memory raises :class:`cudacore.OutOfMemoryError` (a ``MemoryError``), not
    ``cupy.cuda.memory.OutOfMemoryError``: code that catches CuPy's class must catch ``MemoryError`` too.
    """
    import cupy

    fixed = None if device is None else _device(device)
    memory = cupy.cuda.memory
    opened: set[int] = set()  # the devices this allocator has told cudacore about (_opened)

    def allocate(size: int) -> Any:
        dev = fixed if fixed is not None else _device(cupy.cuda.runtime.getDevice())
        # CuPy's current stream, as the object: the Buffer holds it until freed, and cudacore watches it, so
        # that its handle never reaches the driver after CuPy destroyed it (docs/guide/memory.md).
        stream = cupy.cuda.get_current_stream()
        if dev.device_id not in opened:
            _opened(dev.device_id, opened, int(getattr(stream, "ptr", 0) or 0))
        if size == 0:
            return memory.MemoryPointer(memory.UnownedMemory(0, 0, None, dev.device_id), 0)
        buf = dev.allocate(size, stream=stream)
        return memory.MemoryPointer(memory.UnownedMemory(buf.ptr, size, buf, dev.device_id), 0)

    return allocate


def _opened(ordinal: int, opened: set[int], stream: int = 0) -> None:
    """Tell cudacore that a library's allocator allocates on device ``ordinal``, on the library's
    ``stream`` handle (0: not known): the devices such allocators use get peer access to each other's
    memory, cudacore's pools included, as that library expects of memory from cudaMalloc once it enables
    peer access (docs/guide/multi-gpu.md). Added to ``opened`` once done (not while a capture runs)."""
    if core.LibraryAllocates(ordinal, stream):
        opened.add(ordinal)


def last_error() -> Exception | None:
    """The error the last failed call of the PyTorch allocator entry points (``cudacore_torch_alloc`` /
    ``cudacore_torch_free``) recorded, as a typed cudacore exception (for example
    :class:`cudacore.OutOfMemoryError`), and forget it; None when there is none. Process-wide."""
    text = core.InteropLastError()
    if not text:
        return None
    typed = typed_error(text)
    return typed if typed is not None else RuntimeError(text)


def torch_live_allocations() -> int:
    """How many allocations made through cudacore's PyTorch allocator are alive."""
    return int(core.TorchLive())


def torch_allocator() -> Any:
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over cudacore's allocator.

    It loads ``cudacore_torch_alloc`` and ``cudacore_torch_free`` from cudacore's own extension module
    (:func:`extension_path`), so PyTorch and cudacore share one Go runtime and one allocator per device.
    On out of memory the allocation raises ``RuntimeError`` with cudacore's message (PyTorch does not check
    a pluggable allocator's NULL, so ``cudacore_torch_alloc`` throws the C++ exception PyTorch turns into
    one), and :func:`last_error` returns the typed :class:`~cudacore.OutOfMemoryError`. Frees are stream-ordered on the stream PyTorch allocated on; PyTorch's
    ``record_stream`` is not honoured (as with any pluggable allocator).
    """
    import torch

    return torch.cuda.memory.CUDAPluggableAllocator(extension_path(), "cudacore_torch_alloc", "cudacore_torch_free")


def use_torch_allocator() -> Any:
    """Make cudacore PyTorch's CUDA allocator (``change_current_allocator``); returns the allocator.

    PyTorch allows this only before its CUDA caching allocator has been used in the process.

    ``torch.backends.cudnn.benchmark = True`` does not work with this (or any) pluggable allocator: cuDNN's
    autotuner asks PyTorch's allocator for its largest cached block (``cacheInfo``), which PyTorch's
    ``CUDAPluggableAllocator`` refuses, and PyTorch has no hook through which cudacore could answer. A
    warning says so when benchmark mode is on here; leave it off (PyTorch's default, which picks
    algorithms by heuristics).
    """
    import torch

    if torch.backends.cudnn.benchmark:
        warnings.warn(
            "torch.backends.cudnn.benchmark is on: with cudacore's (or any pluggable) allocator, PyTorch's cuDNN "
            "autotuner fails with 'CUDAPluggableAllocator does not yet support cacheInfo'; set it to False",
            RuntimeWarning,
            stacklevel=2,
        )
    alloc = torch_allocator()
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


# -- NCCL's user buffers -----------------------------------------------------------------------------------

#: NCCL's environment variable that lets it register cuMemAlloc memory through cuIpc handles.
NCCL_LEGACY_REGISTER = "NCCL_LEGACY_CUDA_REGISTER"
#: The first NCCL release that registers user buffers with the peers of one host (NCCL's documentation:
#: "General Buffer Registration", 2.23).
NCCL_INTRA_NODE_REGISTRATION = (2, 23)
_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


@dataclass(frozen=True)
class NcclPath:
    """Which path NCCL takes with cudacore's memory on a device, and why.

    ``path`` is ``"cumem"`` (memory mapped with the driver's cuMem calls and exportable as a file
    descriptor: NCCL registers it with its peers, zero-copy), ``"legacy_ipc"`` (cuMemAlloc memory with
    ``NCCL_LEGACY_CUDA_REGISTER=1``: NCCL registers it through cuIpc handles, zero-copy) or ``"copy"``
    (NCCL cannot register it: collectives stage through NCCL's own buffers, as for any unregistered
    tensor). ``memory`` is the driver's answer for a fresh allocation of cudacore's: ``retain`` ("ok" or
    the driver's refusal of ``cuMemRetainAllocationHandle``), ``handle_types`` and ``legacy_ipc``.
    """

    device: int
    path: str
    reason: str
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def zero_copy(self) -> bool:
        """Whether NCCL can take this memory without a copy (``path`` is not ``"copy"``)."""
        return self.path != "copy"


def nccl_memory_path(device: Device | int | None = None) -> NcclPath:
    """Which path NCCL can take with memory cudacore allocates on ``device`` (default 0).

    It allocates one block from the device's allocator, asks the driver what NCCL asks before it registers
    a buffer (``cuMemRetainAllocationHandle``, the allocation's handle types, whether it is cuMemAlloc
    memory), frees the block, and reads ``NCCL_LEGACY_CUDA_REGISTER`` from this process's environment
    (NCCL reads it there). No torch or NCCL is needed. It allocates, so a stream capture that forbids
    allocating outside it refuses it as it refuses an allocation.
    """
    dev = _device(device)
    buf = dev.allocate(2 << 20)
    try:
        memory = dict(json.loads(core.NCCLMemoryProbe(dev.device_id, buf.ptr)))
    finally:
        buf.close()
    strategy = dev.allocation_strategy
    if memory["retain"] == "ok" and memory["handle_types"] & _POSIX_FD:
        return NcclPath(dev.device_id, "cumem", "cuMem memory exportable as a file descriptor: NCCL registers it with its peers", memory)
    if memory["legacy_ipc"]:
        if os.environ.get(NCCL_LEGACY_REGISTER) == "1":
            return NcclPath(
                dev.device_id, "legacy_ipc",
                f"cuMemAlloc memory (the {strategy} strategy) with {NCCL_LEGACY_REGISTER}=1: NCCL registers it through cuIpc "
                "handles (NCCL documents this path as able to hang when a peer fails)",
                memory,
            )
        return NcclPath(
            dev.device_id, "copy",
            f"cuMemAlloc memory (the {strategy} strategy): NCCL registers it only with {NCCL_LEGACY_REGISTER}=1 in the "
            "environment of every rank",
            memory,
        )
    return NcclPath(
        dev.device_id, "copy",
        f"memory of a stream-ordered pool (the {strategy} strategy) has neither a cuMem allocation handle ({memory['retain']}) "
        f"nor a cuIpc handle, so NCCL cannot register it; CUDACORE_ALLOCATOR=sync with {NCCL_LEGACY_REGISTER}=1 makes "
        "registrable memory",
        memory,
    )


def nccl_mem_pool(device: Device | int | None = None) -> Any:
    """A ``torch.cuda.MemPool`` on ``device`` (default 0) whose memory comes from cudacore's allocator.

    Tensors made inside ``with torch.cuda.use_mem_pool(pool):`` are carved by PyTorch's caching allocator
    out of segments it asks cudacore for (through :func:`torch_allocator`'s entry points): they show in
    ``Device.memory_stats()``, count against ``Device.memory_limit``, and run out with cudacore's error.
    Register the pool with a process group with :func:`register_nccl_pool`.

    The pool lives in PyTorch's native caching allocator, so PyTorch must be allocating with it: not after
    :func:`use_torch_allocator` (or any ``change_current_allocator``), nor with the ``cudaMallocAsync``
    backend. Where PyTorch cannot (no ``torch.cuda.MemPool``, another allocator) this raises
    :class:`cudacore.NotSupportedError` saying why.
    """
    import torch

    dev = _device(device)
    pool_class = getattr(torch.cuda, "MemPool", None)
    if pool_class is None:
        raise error("CUDA_ERROR_NOT_SUPPORTED", f"PyTorch {torch.__version__} has no torch.cuda.MemPool: a pool of cudacore's memory for NCCL needs a newer PyTorch", op="cudacore.nccl_mem_pool")
    backend = torch.cuda.get_allocator_backend()
    if backend != "native":
        raise error(
            "CUDA_ERROR_NOT_SUPPORTED",
            f"PyTorch allocates with its {backend!r} allocator, and a torch.cuda.MemPool lives in the native caching allocator: "
            "leave PyTorch's allocator as it is in this process (no use_torch_allocator, no backend:cudaMallocAsync) to use "
            "a pool of cudacore's memory",
            op="cudacore.nccl_mem_pool",
        )
    alloc = torch_allocator()
    with torch.cuda.device(dev.device_id):  # a MemPool belongs to the device current when it is made
        try:
            return pool_class(alloc.allocator())
        except TypeError:  # PyTorch releases whose MemPool took the CUDAPluggableAllocator itself
            return pool_class(alloc)


@dataclass
class NcclRegistration:
    """What :func:`register_nccl_pool` did: the pool, whether it is registered with the group's NCCL
    communicator, and the path collectives on its memory take (:class:`NcclPath`)."""

    pool: Any
    backend: Any
    registered: bool
    path: NcclPath

    def deregister(self) -> None:
        """Deregister the pool from the communicator (``deregister_mem_pool``), before the pool or the
        process group goes; idempotent, and nothing to do where it was not registered."""
        if self.registered:
            self.backend.deregister_mem_pool(self.pool)
            self.registered = False

    def __str__(self) -> str:
        state = "registered with NCCL" if self.registered else "not registered"
        return f"pool on device {self.path.device}: {state}, path {self.path.path!r}: {self.path.reason}"


def register_nccl_pool(pool: Any, group: Any = None) -> NcclRegistration:
    """Register ``pool`` (from :func:`nccl_mem_pool`) with the NCCL communicator of ``group`` (default: the
    world), where NCCL can take cudacore's memory without a copy.

    The path is decided from the driver's answer for cudacore's memory on the pool's device
    (:func:`nccl_memory_path`) and NCCL's version: where it is ``"copy"`` the pool is left unregistered
    (registering memory NCCL cannot map gains nothing, and newer NCCL releases refuse it), and collectives on
    its tensors still work, through NCCL's buffers. Otherwise ``register_mem_pool`` registers the pool's
    segments and, through PyTorch's allocator hooks, those it makes later. Every rank must make the same
    choice (NCCL requires registered buffers on all ranks of a collective or on none): run every rank with
    the same cudacore strategy and environment.

    The group's NCCL communicator must exist: pass ``device_id`` to ``init_process_group`` (or run one
    collective first). A group that is not NCCL, or a PyTorch without ``register_mem_pool``, raises
    :class:`cudacore.NotSupportedError`.
    """
    import torch
    import torch.distributed as dist

    ordinal = int(pool.device) if hasattr(pool, "device") else torch.cuda.current_device()
    pg = group if group is not None else dist.group.WORLD
    try:
        backend = pg._get_backend(torch.device("cuda", ordinal))
    except RuntimeError as exc:
        raise error("CUDA_ERROR_NOT_SUPPORTED", f"the process group has no CUDA backend for device {ordinal}: {exc}", op="cudacore.register_nccl_pool") from None
    if not hasattr(backend, "register_mem_pool"):
        raise error(
            "CUDA_ERROR_NOT_SUPPORTED",
            f"the group's backend {type(backend).__name__} has no register_mem_pool (an NCCL process group of PyTorch with "
            "memory-pool registration is needed)",
            op="cudacore.register_nccl_pool",
        )
    path = nccl_memory_path(ordinal)
    raw = torch.cuda.nccl.version()  # (2, 27, 5); an int (22705) in older PyTorch releases
    version = tuple(raw[:2]) if isinstance(raw, tuple) else (raw // 10000, raw // 100 % 100)
    if path.zero_copy and version < NCCL_INTRA_NODE_REGISTRATION:
        path = NcclPath(path.device, "copy", f"NCCL {'.'.join(map(str, version))} registers user buffers between the GPUs of one host from 2.23 on", path.memory)
    if not path.zero_copy:
        return NcclRegistration(pool, backend, False, path)
    backend.register_mem_pool(pool)
    return NcclRegistration(pool, backend, True, path)


# -- cuda.core ------------------------------------------------------------------------------------------


def _cuda_core_stream(stream: Any) -> int:
    """The driver handle of a cuda.core Stream (or GraphBuilder, or anything with ``handle``); 0 for None."""
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    handle = getattr(stream, "handle", None)
    if handle is None:
        raise TypeError(f"stream must be a cuda.core Stream, a stream handle or None, not {type(stream).__name__}")
    return int(handle)


def _cuda_core_resource_class() -> type:
    try:
        from cuda.core import Buffer as CoreBuffer
        from cuda.core import MemoryResource
    except ImportError:  # cuda.core before 1.0
        from cuda.core.experimental import Buffer as CoreBuffer
        from cuda.core.experimental import MemoryResource

    class CudacoreMemoryResource(MemoryResource):  # type: ignore[misc, valid-type]
        """A ``cuda.core.MemoryResource`` that allocates from cudacore: its pools, statistics, memory limit
        and :class:`~cudacore.OutOfMemoryError` (a ``MemoryError``) apply to cuda.core's buffers.

        Each allocation is a :class:`cudacore.Buffer` on the allocating stream, kept by the resource until
        cuda.core deallocates it. A deallocation on another stream is ordered on that stream (the
        allocating stream may be gone by then), as cuda.core's own resources do.
        """

        def __init__(self, device: Device) -> None:
            self._device = device
            self._live: dict[int, Any] = {}  # address -> cudacore Buffer

        def allocate(self, size: int, stream: Any = None) -> Any:
            handle = _cuda_core_stream(stream)
            buf = self._device.allocate(size, stream=handle or None)
            self._live[buf.ptr] = buf
            return CoreBuffer.from_handle(buf.ptr, size, mr=self)

        def deallocate(self, ptr: Any, size: int, stream: Any = None) -> None:
            addr = int(ptr)
            buf = self._live.get(addr)
            if buf is None or buf.size != size:
                raise error("CUDA_ERROR_INVALID_VALUE", f"{addr:#x} ({size} bytes) was not allocated by this cudacore resource, or was deallocated already", op="cudacore.deallocate")
            handle = _cuda_core_stream(stream)
            if handle:
                # Freed in the order of the stream cuda.core names in this call, which is alive now; the
                # allocating stream may be gone already (cuda.core does not tell), and its handle must not
                # reach the driver.
                core.FreeNamed(self._device.device_id, addr, size, handle)
                buf._void()
            else:
                buf.close()
            del self._live[addr]

        @property
        def device_id(self) -> int:
            return self._device.device_id

        @property
        def is_device_accessible(self) -> bool:
            return True

        @property
        def is_host_accessible(self) -> bool:
            return False

        def __repr__(self) -> str:
            return f"<cudacore.interop.CudacoreMemoryResource device {self._device.device_id}, {len(self._live)} live>"

    return CudacoreMemoryResource


_cuda_core_class: type | None = None


def cuda_core_memory_resource(device: Device | int | None = None) -> Any:
    """A ``cuda.core.MemoryResource`` (cuda.core 0.3 or newer) backed by cudacore's allocator on ``device``
    (default 0): ``mr.allocate(n, stream=s)``, or ``cuda.core.Device(i).memory_resource = mr`` so that
    cuda.core allocates from cudacore. Its buffers show in ``Device.memory_stats()`` and count against
    ``Device.memory_limit``; out of memory raises :class:`cudacore.OutOfMemoryError`."""
    global _cuda_core_class
    if _cuda_core_class is None:
        _cuda_core_class = _cuda_core_resource_class()
    return _cuda_core_class(_device(device))


# -- Numba ------------------------------------------------------------------------------------------------


def _numba_manager_class() -> type:
    from numba import cuda
    from numba.cuda.cudadrv import driver as nbdriver

    base = getattr(cuda, "HostOnlyCUDAMemoryManager", None) or nbdriver.HostOnlyCUDAMemoryManager

    def device_pointer(ptr: int) -> Any:
        if getattr(nbdriver, "USE_NV_BINDING", False) or not hasattr(nbdriver, "drvapi"):
            binding = getattr(nbdriver, "binding", None)
            if binding is not None and hasattr(binding, "CUdeviceptr"):
                return binding.CUdeviceptr(ptr)
        return ctypes.c_uint64(ptr)

    def _pointer_value(p: Any) -> int:
        value = getattr(p, "value", None)
        return int(value) if value is not None else int(p)

    class NumbaMemoryManager(base):  # type: ignore[misc, valid-type]
        """A Numba External Memory Manager (EMM) drawing device memory from cudacore's allocator.

        Use ``NUMBA_CUDA_MEMORY_MANAGER=cudacore.interop`` or
        ``numba.cuda.set_memory_manager(cudacore.interop.NumbaMemoryManager)``. Host (pinned, mapped)
        memory stays Numba's own. Out of memory raises :class:`cudacore.OutOfMemoryError`.
        """

        def initialize(self) -> None:
            super().initialize()

        def _cudacore_device(self) -> Device:
            return _device(int(self.context.device.id))

        def memalloc(self, size: int) -> Any:
            dev = self._cudacore_device()
            opened = self.__dict__.setdefault("_cudacore_opened", set())
            if dev.device_id not in opened:
                _opened(dev.device_id, opened)
            buf = dev.allocate(size)
            ordinal = dev.device_id
            # Numba's bytes are a part of cudacore's allocator's: the split by library of memory_stats()
            # moves them into a row of their own (cudacore._accounts).
            _accounts.count_inside(ordinal, "numba", size)

            def release() -> None:
                # The finalizer holds the Buffer: Numba calls it when the memory is released.
                buf.close()
                _accounts.count_inside(ordinal, "numba", -size)

            return cuda.MemoryPointer(self.context, device_pointer(buf.ptr), size, owner=None, finalizer=release)

        def get_memory_info(self) -> Any:
            free, total = self._cudacore_device().memory_info()
            return cuda.MemoryInfo(free=free, total=total)

        def get_ipc_handle(self, memory: Any) -> Any:
            """A Numba ``IpcHandle`` for ``memory`` (``DeviceNDArray.get_ipc_handle`` lands here).

            It holds the allocation's cuIpcMemHandle, so the other process opens it with Numba alone
            (``IpcArrayHandle.open``), cudacore or not. That needs cuMemAlloc memory: the device's allocation
            strategy must be ``"sync"`` (``CUDACORE_ALLOCATOR=sync``); pool memory has no cuIpc handle.
            """
            dev = self._cudacore_device()
            if dev.allocation_strategy != "sync":
                raise error(
                    "CUDA_ERROR_NOT_SUPPORTED",
                    f"device {dev.device_id} allocates from a memory pool, whose blocks have no cuIpc handle: for Numba IPC "
                    "set CUDACORE_ALLOCATOR=sync (or share a cudacore SharedBuffer, Device.allocate_shareable)",
                    op="cudacore.numba_ipc",
                )
            base = _pointer_value(memory.owner.handle)
            offset = _pointer_value(memory.handle) - base
            info = json.loads(core.ShareExport(dev.device_id, base, "ipc"))
            raw = bytes.fromhex(info["handle"])
            # Numba's own rebuild makes the handle of its driver binding from these bytes (signed for ctypes).
            ary: Any = raw if getattr(nbdriver, "USE_NV_BINDING", False) else tuple(b - 256 if b > 127 else b for b in raw)
            handle = nbdriver.IpcHandle._rebuild(ary, memory.size, self.context.device.get_device_identity(), offset)
            handle.base = memory  # as Numba does: the exporting process must not open it
            return handle

        def reset(self) -> None:
            super().reset()
            self._cudacore_device().release_cached_memory()

        @property
        def interface_version(self) -> int:
            return 1

    return NumbaMemoryManager


_numba_class: type | None = None
#: The Numba EMM class (made on first access; importing this module never imports numba).
NumbaMemoryManager: type


def __getattr__(name: str) -> Any:
    # numba imports the module named by NUMBA_CUDA_MEMORY_MANAGER and reads _numba_memory_manager; the
    # class is made on first access so that importing cudacore.interop never imports numba.
    global _numba_class
    if name in ("NumbaMemoryManager", "_numba_memory_manager"):
        if _numba_class is None:
            _numba_class = _numba_manager_class()
        return _numba_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
