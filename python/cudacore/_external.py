"""Other libraries' device arrays as cudacore Buffers, without a copy: :class:`ExternalBuffer`,
:func:`asbuffer` and :func:`from_dlpack` (public in :mod:`cudacore.interop`; ``Device.from_array`` uses
:func:`asbuffer`).
"""

from __future__ import annotations

import ctypes
import operator
from typing import TYPE_CHECKING, Any

from . import _tables
from ._copy import readonly_error, register_protocols
from ._errors import error
from ._handles import stream_handle
from ._memory import Buffer
from ._native import fast
from ._stream import StreamLike, uninterrupted
from ._tables import DLManagedTensor as _DLManagedTensor
from ._tables import DLManagedTensorVersioned as _DLManagedTensorVersioned
from ._tables import DLTensor as _DLTensor

if TYPE_CHECKING:
    from ._device import Device

__all__ = ["ExternalBuffer", "asbuffer", "from_dlpack", "kDLCPU", "kDLCUDA", "kDLCUDAHost", "kDLCUDAManaged"]

kDLCPU = _tables.kDLCPU
kDLCUDA = _tables.kDLCUDA
kDLCUDAHost = _tables.kDLCUDAHost
kDLCUDAManaged = _tables.kDLCUDAManaged


class ExternalBuffer(Buffer):
    """A :class:`cudacore.Buffer` viewing device memory that another library owns (a CuPy array, a torch
    tensor, a Numba device array, a DLPack capsule's producer).

    It keeps :attr:`owner` alive until :meth:`close` (or until it is garbage collected) and never frees the
    memory itself. Made by :func:`asbuffer` / ``Device.from_array``.

    Attributes
    ----------
    readonly : bool
        The owner declared the memory read-only (the CUDA Array Interface's ``data=(ptr, True)``, DLPack's
        read-only flag): cudacore refuses to write into it (:meth:`copy_from`, ``device_to_device`` with it
        as the destination) with :class:`InvalidValueError`, and says so again when it hands the memory on
        through ``__cuda_array_interface__``. A kernel launch cannot say whether it writes through a
        pointer argument, so that is not checked.
    """

    __slots__ = ("_readonly",)

    @property
    def readonly(self) -> bool:
        """Whether the owner declared the memory read-only (see the class notes)."""
        return bool(getattr(self, "_readonly", False))

    def copy_from(
        self, src: Any, stream: StreamLike = None, *, nbytes: int | None = None, offset: int = 0, src_offset: int = 0
    ) -> None:
        """Copy into this buffer, as :meth:`cudacore.Buffer.copy_from` (``nbytes=``, ``offset=``,
        ``src_offset=`` too).

        Raises
        ------
        InvalidValueError
            If the memory is read-only (:attr:`readonly`).
        """
        if self.readonly:
            raise readonly_error(self, "cudacore.copy_from")
        super().copy_from(src, stream, nbytes=nbytes, offset=offset, src_offset=src_offset)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """As :attr:`cudacore.Buffer.__cuda_array_interface__`, with the owner's read-only flag."""
        cai = super().__cuda_array_interface__
        cai["data"] = (cai["data"][0], self.readonly)
        return cai

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self.ptr:x}"
        ro = ", read-only" if self.readonly else ""
        return f"<cudacore.ExternalBuffer {state}, {self.size} bytes{ro}, device {self.device_id}, owner {type(self.owner).__name__}>"


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


def _device_arg(device: Any) -> int | None:
    """asbuffer's device argument as an ordinal: None, an int (numpy's too) or an object with device_id."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise TypeError("asbuffer: device must be a Device or an int ordinal, not bool")
    ordinal = getattr(device, "device_id", device)
    try:
        return operator.index(ordinal)
    except TypeError:
        raise TypeError(f"asbuffer: device must be a Device or an int ordinal, not {type(device).__name__}") from None


def _from_cai(obj: Any, cai: dict[str, Any], device: int | None) -> ExternalBuffer:
    if cai.get("mask") is not None:
        raise ValueError("asbuffer: masked arrays (__cuda_array_interface__ 'mask') are not supported")
    data = cai["data"]
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError(
            f"asbuffer: {type(obj).__name__}.__cuda_array_interface__['data'] must be a (pointer, read_only) pair, not {data!r}"
        )
    try:
        ptr = operator.index(data[0])
    except TypeError:
        raise ValueError(
            f"asbuffer: {type(obj).__name__}.__cuda_array_interface__['data'][0] must be an int (the device "
            f"pointer), not {type(data[0]).__name__}"
        ) from None
    readonly = bool(data[1])
    shape = tuple(int(x) for x in cai["shape"])
    strides = cai.get("strides")
    nbytes = _contiguous_nbytes(shape, None if strides is None else tuple(strides), _itemsize(cai["typestr"]), "asbuffer")
    stream = cai.get("stream")
    handle = 0 if stream in (None, 1) else int(stream)
    ordinal = device if device is not None else _array_device(obj)
    buf = fast.borrow(ExternalBuffer, ordinal, ptr, nbytes, handle, obj)
    buf._readonly = readonly
    return buf


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


# The structs (_DLTensor, ...) are generated with the C producer's (_tables.py, from
# cudacore/internal/tablegen): imported at the top of this module.


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
    """Holds a consumed DLPack tensor; calls its deleter once, when released or collected."""

    __slots__ = ("__weakref__", "_addr", "_deleter", "producer")

    def __init__(self, addr: int, deleter: int, producer: Any) -> None:
        self._addr = addr
        # The C function is made here, so that release() makes no call between taking it and calling it.
        self._deleter = _DELETER(deleter) if deleter else None
        self.producer = producer

    def release(self) -> None:
        """Call the tensor's deleter now (once): the producer may free the memory afterwards.

        The deleter leaves the owner and is called with no point in between where Python handles a
        signal (taking it is no call), so a Ctrl-C comes before (the owner still holds it, and calls it
        when released again or collected) or once it ran (never a second time)."""
        deleter, self._deleter = self._deleter, None
        if deleter is not None:
            deleter(self._addr)

    def __del__(self) -> None:
        self.release()


def _take(capsule: Any, addr: int, deleter: int, versioned: bool, producer: Any) -> _DLPackOwner:
    """Consume ``capsule``: rename it (its destructor then leaves the tensor to the consumer) and hand the
    tensor's deleter to an owner, with keyboard interrupts held back from the one to the other
    (:func:`cudacore._stream.uninterrupted`). A Ctrl-C between the two would lose the tensor: no one would
    call its deleter, and its producer would hold it for good (a cudacore Buffer then refuses to close)."""

    def take() -> _DLPackOwner:
        _api.PyCapsule_SetName(capsule, _USED_VERSIONED if versioned else _USED)
        return _DLPackOwner(addr, deleter, producer)

    return uninterrupted(take)


#: DLPack 1.x's flag of a tensor its producer does not allow to be written.
_DLPACK_READ_ONLY = _tables.DLPACK_FLAG_BITMASK_READ_ONLY


def _parse_capsule(capsule: Any) -> tuple[_DLTensor, int, int, bool, bool]:
    """The tensor, its address, its deleter, whether it is versioned and whether it is read-only (only a
    versioned tensor can say so)."""
    if _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        addr = _api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        mv = _DLManagedTensorVersioned.from_address(addr)
        if mv.version.major != 1:
            raise BufferError(f"DLPack version {mv.version.major}.{mv.version.minor} is not supported (1.x is)")
        return mv.dl_tensor, addr, int(mv.deleter or 0), True, bool(mv.flags & _DLPACK_READ_ONLY)
    if _api.PyCapsule_IsValid(capsule, b"dltensor"):
        addr = _api.PyCapsule_GetPointer(capsule, b"dltensor")
        m = _DLManagedTensor.from_address(addr)
        return m.dl_tensor, addr, int(m.deleter or 0), False, False
    raise ValueError("not a DLPack capsule, or one already consumed (its name is not 'dltensor')")


def from_dlpack(obj: Any, *, stream: int | None = None) -> ExternalBuffer:
    """Take an object with ``__dlpack__`` (or a raw DLPack capsule) as an :class:`ExternalBuffer`.

    The tensor must be on a CUDA device and C-contiguous; one its producer flags read-only (DLPack 1.x)
    gives a read-only buffer (:attr:`ExternalBuffer.readonly`). ``stream`` is the stream cudacore will use it on
    (None: the current stream of the tensor's device, as ``__dlpack_device__`` names it; the current
    device's when the producer has no ``__dlpack_device__``), passed to the producer so that it orders its
    work before.
    """
    producer = obj
    if hasattr(obj, "__dlpack__"):
        ordinal = None
        if hasattr(obj, "__dlpack_device__"):
            kind, ordinal = obj.__dlpack_device__()
            if int(kind) not in (kDLCUDA, kDLCUDAManaged):
                raise ValueError(
                    f"from_dlpack: the tensor is on DLPack device type {int(kind)}, not CUDA (2)"
                    + (": it is host memory; upload it with Device.to_device(array) or Buffer.copy_from(array)" if int(kind) in (kDLCPU, kDLCUDAHost) else "")
                )
        if stream is None:
            # DLPack names the legacy default stream 1 (its 0 is ambiguous).
            stream = stream_handle(None, None if ordinal is None else int(ordinal)) or 1
        try:
            capsule = obj.__dlpack__(stream=stream, max_version=(1, 0))
        except TypeError:  # a producer older than the max_version keyword
            capsule = obj.__dlpack__(stream=stream)
    else:
        capsule, producer = obj, None
    t, addr, deleter, versioned, readonly = _parse_capsule(capsule)
    if t.device.device_type not in (kDLCUDA, kDLCUDAManaged):
        raise ValueError(f"from_dlpack: the tensor is on DLPack device type {t.device.device_type}, not CUDA (2)")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] * ((t.dtype.bits * t.dtype.lanes + 7) // 8) for i in range(t.ndim))
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    nbytes = _contiguous_nbytes(shape, strides, itemsize, "from_dlpack")
    ptr = (t.data or 0) + t.byte_offset
    ordinal = t.device.device_id
    owner = _take(capsule, addr, deleter, versioned, producer)
    buf = fast.borrow(ExternalBuffer, ordinal, ptr, nbytes, 0, owner)
    buf._readonly = readonly
    return buf


def _host_dlpack(obj: Any, op: str, writable: bool) -> tuple[str, Any, Any]:
    """A host DLPack tensor (kDLCPU, kDLCUDAHost) as bytes with the buffer protocol, for one copy: the
    tensor is held (its deleter not yet called) until the returned release runs."""
    try:
        capsule = obj.__dlpack__(stream=None, max_version=(1, 0))
    except TypeError:  # a producer older than the max_version keyword
        capsule = obj.__dlpack__(stream=None)
    t, addr, deleter, versioned, readonly = _parse_capsule(capsule)
    owner = _take(capsule, addr, deleter, versioned, obj)
    try:
        if t.device.device_type not in (kDLCPU, kDLCUDAHost):
            raise ValueError(f"{op}: the tensor is on DLPack device type {t.device.device_type}, not the host (1) or pinned host (3)")
        if writable and readonly:
            raise error(
                "CUDA_ERROR_INVALID_VALUE",
                f"{op}: the destination is read-only: its producer ({type(obj).__name__}) set DLPack's read-only flag; "
                "copy into a writable array instead",
                op=op,
            )
        shape = tuple(t.shape[i] for i in range(t.ndim))
        itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
        strides = None if not t.strides else tuple(t.strides[i] * itemsize for i in range(t.ndim))
        nbytes = _contiguous_nbytes(shape, strides, itemsize, op)
    except BaseException:
        owner.release()
        raise
    ptr = (t.data or 0) + t.byte_offset
    # The exporter vouches for these bytes while its tensor is held (owner, released after the copy).
    memory: Any = (ctypes.c_char * nbytes).from_address(ptr) if nbytes else bytearray()
    return "host", memory, owner


def _convert_for_copy(obj: Any, ordinal: int, stream: object, op: str, writable: bool) -> tuple[str, Any, Any] | None:
    """The other side of a Buffer.copy_from / copy_to that is neither a Buffer nor buffer-protocol memory
    (cudacore._copy.transfer): a CUDA DLPack tensor (ordered on the copy's stream by its producer, as the
    protocol asks), an array of the CUDA Array Interface, or a host DLPack tensor; None for anything else."""
    kind = None
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        kind = int(obj.__dlpack_device__()[0])
    if kind in (kDLCUDA, kDLCUDAManaged):
        handle = stream_handle(stream, ordinal) if stream is not None else None
        buf: ExternalBuffer = from_dlpack(obj, stream=handle or None)
        return "device", buf, buf.close
    if hasattr(obj, "__cuda_array_interface__"):
        buf = asbuffer(obj)  # type: ignore[assignment]
        return "device", buf, buf.close
    if kind in (kDLCPU, kDLCUDAHost):
        what, memory, owner = _host_dlpack(obj, op, writable)
        # The tensor's deleter runs when owner goes: after the copy, once release drops the last reference.
        return what, memory, owner.release
    return None


register_protocols(_convert_for_copy)


def asbuffer(obj: Any, *, device: Device | int | None = None) -> Buffer:
    """``obj`` as a cudacore Buffer, without a copy.

    A :class:`cudacore.Buffer` comes back as it is. Anything else with ``__cuda_array_interface__``
    (CuPy, PyTorch CUDA tensors, Numba device arrays) or ``__dlpack__`` (or a DLPack capsule) becomes an
    :class:`ExternalBuffer` over its memory (C-contiguous only), holding ``obj`` alive. The buffer's size
    is the array's size in bytes; its stream is the one the interface names (CAI v3). An array the
    interface declares read-only gives a read-only buffer (:attr:`ExternalBuffer.readonly`).

    Raises
    ------
    TypeError
        If ``obj`` offers neither interface.
    ValueError
        If the array is not C-contiguous or not on a CUDA device, or its ``__cuda_array_interface__`` is
        malformed (a key missing, ``data`` not a ``(pointer, read_only)`` pair).
    """
    if isinstance(obj, Buffer):
        return obj
    ordinal = _device_arg(device)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        if not isinstance(cai, dict):
            raise TypeError(
                f"asbuffer: {type(obj).__name__}.__cuda_array_interface__ must be a dict, not {type(cai).__name__}"
            )
        missing = [k for k in ("data", "shape", "typestr") if k not in cai]
        if missing:
            raise ValueError(
                f"asbuffer: {type(obj).__name__}.__cuda_array_interface__ lacks {', '.join(map(repr, missing))}"
            )
        return _from_cai(obj, cai, ordinal)
    if hasattr(obj, "__dlpack__") or type(obj).__name__ == "PyCapsule":
        return from_dlpack(obj)
    raise TypeError(
        f"asbuffer: {type(obj).__name__} is not a device array: it has neither __cuda_array_interface__ nor __dlpack__"
    )
