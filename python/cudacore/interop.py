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

Their memory shows in ``Device.memory_stats()`` and counts against ``Device.memory_limit``.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import from_runtime_error
from ._memory import Buffer
from ._native import fast

if TYPE_CHECKING:
    from ._device import Device

__all__ = [
    "ExternalBuffer",
    "NumbaMemoryManager",
    "asbuffer",
    "cupy_allocator",
    "extension_path",
    "from_dlpack",
    "last_error",
    "torch_allocator",
    "use_torch_allocator",
]

kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3
kDLCUDAManaged = 13


class ExternalBuffer(Buffer):
    """A :class:`cudacore.Buffer` viewing device memory that another library owns (a CuPy array, a torch
    tensor, a Numba device array, a DLPack capsule's producer).

    It keeps :attr:`owner` alive until :meth:`close` (or until it is garbage collected) and never frees the
    memory itself. Made by :func:`asbuffer` / ``Device.from_array``.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self.ptr:x}"
        return f"<cudacore.ExternalBuffer {state}, {self.size} bytes, device {self.device_id}, owner {type(self.owner).__name__}>"


def extension_path() -> str:
    """The file of cudacore's extension module: the one shared library holding the Go runtime, the Python
    bindings and the C entry points other frameworks load (``cudacore_torch_malloc``, ...)."""
    return str(sys.modules["cudacore._gopy._core"].__file__)


# -- arrays in ------------------------------------------------------------------------------------------


def _itemsize(typestr: str) -> int:
    try:
        return int(typestr[2:])
    except ValueError:
        raise TypeError(f"unsupported typestr {typestr!r} in __cuda_array_interface__") from None


def _contiguous_nbytes(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int, what: str) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    if strides is not None and n > 0:
        expect = itemsize
        for dim, stride in zip(reversed(shape), reversed(strides), strict=True):
            if dim != 1 and stride != expect:
                raise ValueError(f"{what}: only C-contiguous arrays can be taken as a buffer (shape {shape}, strides {strides})")
            expect *= int(dim)
    return n * itemsize


def _from_cai(obj: Any, cai: dict[str, Any], device: int | None) -> ExternalBuffer:
    if cai.get("mask") is not None:
        raise ValueError("asbuffer: masked arrays (__cuda_array_interface__ 'mask') are not supported")
    ptr = int(cai["data"][0])
    shape = tuple(int(x) for x in cai["shape"])
    strides = cai.get("strides")
    nbytes = _contiguous_nbytes(shape, None if strides is None else tuple(strides), _itemsize(cai["typestr"]), "asbuffer")
    stream = cai.get("stream")
    handle = 0 if stream in (None, 1) else int(stream)
    ordinal = device if device is not None else _array_device(obj)
    return fast.borrow(ExternalBuffer, ordinal, ptr, nbytes, handle, obj)


def _array_device(obj: Any) -> int:
    # The CUDA Array Interface does not name the device: ask the array (CuPy .device.id, torch
    # .device.index, DLPack's __dlpack_device__); 0 when it does not say (Numba arrays: pass device=).
    dev = getattr(obj, "device", None)
    for attr in ("id", "index"):  # cupy.cuda.Device.id, torch.device.index
        value = getattr(dev, attr, None)
        if isinstance(value, int):
            return value
    if hasattr(obj, "__dlpack_device__"):
        kind, ordinal = obj.__dlpack_device__()
        if int(kind) == kDLCUDA:
            return int(ordinal)
    return 0


# DLPack consumer (ctypes): parse a capsule, keep it, call its deleter when the ExternalBuffer goes.


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# PyCapsule_SetName keeps the pointer: these bytes objects live as long as the module.
_USED = b"used_dltensor"
_USED_VERSIONED = b"used_dltensor_versioned"


class _DLPackOwner:
    """Holds a consumed DLPack tensor; calls its deleter when collected."""

    __slots__ = ("__weakref__", "_addr", "_deleter", "producer")

    def __init__(self, addr: int, deleter: int, producer: Any) -> None:
        self._addr = addr
        self._deleter = deleter
        self.producer = producer

    def __del__(self) -> None:
        if self._deleter:
            _DELETER(self._deleter)(self._addr)
            self._deleter = 0


def _parse_capsule(capsule: Any) -> tuple[_DLTensor, int, int, bool]:
    if _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        addr = _api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        mv = _DLManagedTensorVersioned.from_address(addr)
        if mv.version.major != 1:
            raise BufferError(f"DLPack version {mv.version.major}.{mv.version.minor} is not supported (1.x is)")
        return mv.dl_tensor, addr, int(mv.deleter or 0), True
    if _api.PyCapsule_IsValid(capsule, b"dltensor"):
        addr = _api.PyCapsule_GetPointer(capsule, b"dltensor")
        m = _DLManagedTensor.from_address(addr)
        return m.dl_tensor, addr, int(m.deleter or 0), False
    raise ValueError("not a DLPack capsule, or one already consumed (its name is not 'dltensor')")


def from_dlpack(obj: Any, *, stream: int | None = None) -> ExternalBuffer:
    """Take an object with ``__dlpack__`` (or a raw DLPack capsule) as an :class:`ExternalBuffer`.

    The tensor must be on a CUDA device and C-contiguous. ``stream`` is the stream cudacore will use it on
    (None: the legacy default stream), passed to the producer so that it orders its work before.
    """
    producer = obj
    if hasattr(obj, "__dlpack__"):
        if hasattr(obj, "__dlpack_device__"):
            kind, _ = obj.__dlpack_device__()
            if int(kind) not in (kDLCUDA, kDLCUDAManaged):
                raise ValueError(f"from_dlpack: the tensor is on DLPack device type {int(kind)}, not CUDA (2)")
        try:
            capsule = obj.__dlpack__(stream=1 if stream is None else stream, max_version=(1, 0))
        except TypeError:  # a producer older than the max_version keyword
            capsule = obj.__dlpack__(stream=1 if stream is None else stream)
    else:
        capsule, producer = obj, None
    t, addr, deleter, versioned = _parse_capsule(capsule)
    if t.device.device_type not in (kDLCUDA, kDLCUDAManaged):
        raise ValueError(f"from_dlpack: the tensor is on DLPack device type {t.device.device_type}, not CUDA (2)")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] * ((t.dtype.bits * t.dtype.lanes + 7) // 8) for i in range(t.ndim))
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    nbytes = _contiguous_nbytes(shape, strides, itemsize, "from_dlpack")
    ptr = (t.data or 0) + t.byte_offset
    ordinal = t.device.device_id
    # Consumed: rename so that the capsule's destructor leaves the tensor to us.
    _api.PyCapsule_SetName(capsule, _USED_VERSIONED if versioned else _USED)
    owner = _DLPackOwner(addr, deleter, producer)
    return fast.borrow(ExternalBuffer, ordinal, ptr, nbytes, 0, owner)


def asbuffer(obj: Any, *, device: Device | int | None = None) -> Buffer:
    """``obj`` as a cudacore Buffer, without a copy.

    A :class:`cudacore.Buffer` comes back as it is. Anything else with ``__cuda_array_interface__``
    (CuPy, PyTorch CUDA tensors, Numba device arrays) or ``__dlpack__`` (or a DLPack capsule) becomes an
    :class:`ExternalBuffer` over its memory (C-contiguous only), holding ``obj`` alive. The buffer's size
    is the array's size in bytes; its stream is the one the interface names (CAI v3).

    Raises
    ------
    TypeError
        If ``obj`` offers neither interface.
    ValueError
        If the array is not C-contiguous or not on a CUDA device.
    """
    if isinstance(obj, Buffer):
        return obj
    ordinal = None if device is None else (device if isinstance(device, int) else device.device_id)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(obj, cai, ordinal)
    if hasattr(obj, "__dlpack__") or type(obj).__name__ == "PyCapsule":
        return from_dlpack(obj)
    raise TypeError(
        f"asbuffer: {type(obj).__name__} is not a device array: it has neither __cuda_array_interface__ nor __dlpack__"
    )


# -- allocators -----------------------------------------------------------------------------------------


def _device(device: Device | int | None) -> Device:
    from ._device import Device

    if device is None:
        return Device(0)
    if isinstance(device, Device):
        return device
    return Device(device)


def cupy_allocator(device: Device | int | None = None) -> Callable[[int], Any]:
    """An allocator for ``cupy.cuda.set_allocator`` drawing from cudacore's allocator.

    Each CuPy allocation is a :class:`cudacore.Buffer` on CuPy's current stream, wrapped in a
    ``cupy.cuda.MemoryPointer`` over a ``cupy.cuda.UnownedMemory`` whose owner is that Buffer: the memory
    is freed (in stream order) when CuPy drops its last reference. ``device`` (default: CuPy's current
    device at each call) picks the cudacore device.

    Out of memory raises :class:`cudacore.OutOfMemoryError` (a ``MemoryError``), not
    ``cupy.cuda.memory.OutOfMemoryError``: code that catches CuPy's class must catch ``MemoryError`` too.
    """
    import cupy

    fixed = None if device is None else _device(device)
    memory = cupy.cuda.memory

    def allocate(size: int) -> Any:
        dev = fixed if fixed is not None else _device(cupy.cuda.runtime.getDevice())
        if size == 0:
            return memory.MemoryPointer(memory.UnownedMemory(0, 0, None, dev.device_id), 0)
        stream = cupy.cuda.get_current_stream().ptr
        buf = dev.allocate(size, stream=stream or None)
        return memory.MemoryPointer(memory.UnownedMemory(buf.ptr, size, buf, dev.device_id), 0)

    return allocate


def _lib() -> ctypes.CDLL:
    # dlopen of the same path returns the same handle: the same Go runtime (one per process).
    lib = ctypes.CDLL(extension_path())
    lib.cudacore_torch_malloc.restype = ctypes.c_void_p
    lib.cudacore_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudacore_torch_free.restype = None
    lib.cudacore_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudacore_torch_live.restype = ctypes.c_int64
    lib.cudacore_torch_live.argtypes = []
    lib.cudacore_interop_last_error.restype = ctypes.c_void_p
    lib.cudacore_interop_last_error.argtypes = []
    return lib


_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None


def last_error() -> Exception | None:
    """The error the last failed call of the C allocator entry points (``cudacore_torch_malloc`` /
    ``cudacore_torch_free``) recorded, as a typed cudacore exception (for example
    :class:`cudacore.OutOfMemoryError`), and forget it; None when there is none. Process-wide."""
    raw = _lib().cudacore_interop_last_error()
    if not raw:
        return None
    try:
        text = ctypes.string_at(raw).decode("utf-8", "replace")
    finally:
        _libc.free(raw)
    typed = from_runtime_error(RuntimeError(text))
    return typed if isinstance(typed, Exception) else RuntimeError(text)


def torch_live_allocations() -> int:
    """How many allocations made through ``cudacore_torch_malloc`` are alive."""
    return int(_lib().cudacore_torch_live())


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
    """
    import torch

    alloc = torch_allocator()
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


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
            buf = self._cudacore_device().allocate(size)
            # The finalizer (a bound method) holds the Buffer: Numba calls it when the memory is released.
            return cuda.MemoryPointer(self.context, device_pointer(buf.ptr), size, owner=None, finalizer=buf.close)

        def get_memory_info(self) -> Any:
            free, total = self._cudacore_device().memory_info()
            return cuda.MemoryInfo(free=free, total=total)

        def get_ipc_handle(self, memory: Any) -> Any:
            raise NotImplementedError("cudacore's Numba memory manager does not export IPC handles")

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
