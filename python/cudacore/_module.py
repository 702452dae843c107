"""Kernel modules: load PTX, cubin or fatbin, look up kernels, launch them.

>>> mod = d.load_module("kernels/fill.ptx")
>>> k = mod.function("fill")
>>> k.launch(grid=4, block=256, args=(buf, 7, 1024))

Arguments are checked before the driver is called. For PTX the kernel's parameter list is read from its
``.entry`` declaration, so the number of arguments is checked and Python ints and floats are converted to
the declared types (an int for a ``.u32`` parameter becomes 4 bytes; an int for a ``.f32`` parameter, a
float). For cubin and fatbin kernels the driver cannot tell the parameters: pass typed wrappers
(:func:`int32`, :func:`float32`, ...) where the default (int64 for ints, float64 for floats) is wrong.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import operator
import os
import struct
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Union

from . import _api
from ._api import core
from ._errors import CUDAError, error
from ._handles import stream_handle
from ._native import fast
from ._stream import Stream as _Stream
from ._stream import StreamLike, uninterrupted
from ._tables import ARG_KINDS

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._device import Device
    from ._fast import Kernel as _CKernel
    from ._fast import KernelArg as _CKernelArg
    from ._fast import Module as _CModule
else:
    _CKernel, _CKernelArg, _CModule = fast.Kernel, fast.KernelArg, fast.Module

__all__ = [
    "Kernel",
    "KernelArg",
    "KernelAttributes",
    "Module",
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "load_module",
    "pointer",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
]

# kind -> (struct format, size, class)
_KINDS: dict[str, tuple[str, int, str]] = {
    "i8": ("<b", 1, "int"),
    "u8": ("<B", 1, "int"),
    "i16": ("<h", 2, "int"),
    "u16": ("<H", 2, "int"),
    "i32": ("<i", 4, "int"),
    "u32": ("<I", 4, "int"),
    "i64": ("<q", 8, "int"),
    "u64": ("<Q", 8, "int"),
    "f16": ("<e", 2, "float"),
    "f32": ("<f", 4, "float"),
    "f64": ("<d", 8, "float"),
    "ptr": ("<Q", 8, "int"),
}

_INT_KIND = {(1, True): "i8", (1, False): "u8", (2, True): "i16", (2, False): "u16",
             (4, True): "i32", (4, False): "u32", (8, True): "i64", (8, False): "u64"}  # fmt: skip
_FLOAT_KIND = {2: "f16", 4: "f32", 8: "f64"}


#: The kind codes of the packed launch arguments: the index in pkg/module.ArgCodes (append only there).
_ARG_CODES = {k: i for i, k in enumerate(ARG_KINDS)}  # Go's codes (pkg/module.ArgCodes), generated


def _invalid(message: str, **fields: str) -> CUDAError:
    return error("CUDA_ERROR_INVALID_VALUE", message, op="cudacore.launch", **fields)


def _int_range(kind: str) -> tuple[int, int]:
    size = _KINDS[kind][1] * 8
    if kind.startswith("i"):
        return -(1 << (size - 1)), (1 << (size - 1)) - 1
    return 0, (1 << size) - 1


class KernelArg(_CKernelArg):
    """A kernel argument of an explicit type; make one with :func:`int32`, :func:`float32`, ...."""

    # _code and _raw are what the launch packs in C, fields of the C base (cudacore/native/kernel.c): the
    # kind's code and the encoded value, made once here.
    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: Any) -> None:
        if kind not in _KINDS:
            raise ValueError(f"unknown argument kind {kind!r}: one of {', '.join(_KINDS)}")
        cls = _KINDS[kind][2]
        if isinstance(value, bool):
            raise TypeError(f"{kind} argument must be a number, not bool")
        if cls == "int":
            try:
                v: int | float = operator.index(value)
            except TypeError:
                raise TypeError(f"{kind} argument must be an int, not {type(value).__name__}") from None
            lo, hi = _int_range("u64" if kind == "ptr" else kind)
            if not lo <= v <= hi:
                raise _invalid(f"{v} does not fit in {kind} ({lo} to {hi})")
        else:
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"{kind} argument must be a float, not {type(value).__name__}") from None
        self.kind = kind
        self.value = v
        try:
            self._raw = struct.pack(_KINDS[kind][0], v)
        except OverflowError:
            raise _invalid(f"{v} is out of range for {kind}") from None
        self._code = _ARG_CODES[kind]

    def encode(self) -> bytes:
        return self._raw

    def __reduce__(self) -> tuple[Any, ...]:
        return (KernelArg, (self.kind, self.value))

    def __repr__(self) -> str:
        return f"cudacore.{_PUBLIC[self.kind]}({self.value!r})"


_PUBLIC = {"i8": "int8", "u8": "uint8", "i16": "int16", "u16": "uint16", "i32": "int32", "u32": "uint32",
           "i64": "int64", "u64": "uint64", "f16": "float16", "f32": "float32", "f64": "float64",
           "ptr": "pointer"}  # fmt: skip


def int8(x: int) -> KernelArg:
    """A signed 8-bit kernel argument."""
    return KernelArg("i8", x)


def uint8(x: int) -> KernelArg:
    """An unsigned 8-bit kernel argument."""
    return KernelArg("u8", x)


def int16(x: int) -> KernelArg:
    """A signed 16-bit kernel argument."""
    return KernelArg("i16", x)


def uint16(x: int) -> KernelArg:
    """An unsigned 16-bit kernel argument."""
    return KernelArg("u16", x)


def int32(x: int) -> KernelArg:
    """A signed 32-bit kernel argument (C ``int``)."""
    return KernelArg("i32", x)


def uint32(x: int) -> KernelArg:
    """An unsigned 32-bit kernel argument (C ``unsigned int``)."""
    return KernelArg("u32", x)


def int64(x: int) -> KernelArg:
    """A signed 64-bit kernel argument (C ``long long``)."""
    return KernelArg("i64", x)


def uint64(x: int) -> KernelArg:
    """An unsigned 64-bit kernel argument (C ``size_t``)."""
    return KernelArg("u64", x)


def float16(x: float) -> KernelArg:
    """A half-precision kernel argument (``__half``)."""
    return KernelArg("f16", x)


def float32(x: float) -> KernelArg:
    """A single-precision kernel argument (C ``float``)."""
    return KernelArg("f32", x)


def float64(x: float) -> KernelArg:
    """A double-precision kernel argument (C ``double``)."""
    return KernelArg("f64", x)


def pointer(x: int) -> KernelArg:
    """A device pointer given as an int (0 for NULL); buffers can be passed directly."""
    return KernelArg("ptr", x)


#: PyTorch's own tensor types, by name and module, whose address is read with ``data_ptr()``.
_TORCH_TYPES = {("Tensor", "torch"), ("Parameter", "torch.nn.parameter")}


def _torch_pointer(obj: Any) -> int | None:
    """A PyTorch tensor's address as its ``__cuda_array_interface__`` gives it (its first element's), read
    with ``data_ptr()`` for a dense CUDA tensor that does not require grad and is not empty, exactly as the C
    path (cudacore/native/launch.c, torch_tensor_ptr) reads it: ``is_cuda`` must be True, ``is_sparse`` and
    ``requires_grad`` False, ``numel()`` and ``data_ptr()`` exact ints (``numel()`` > 0, as a C long long).
    None for anything else, a read that raises an ordinary exception included: the object then goes by its
    interface, which decides and explains. A KeyboardInterrupt or a MemoryError is raised, never lost."""
    t = type(obj)
    if (t.__name__, t.__module__) not in _TORCH_TYPES:
        return None
    try:
        if obj.is_cuda is not True or obj.is_sparse is not False or obj.requires_grad is not False:
            return None
        n = obj.numel()
        if type(n) is not int or not 0 < n < 1 << 63:
            return None
        ptr = obj.data_ptr()
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - as C's clear_read_error: the interface decides
        return None
    return ptr if type(ptr) is int else None


def _device_pointer(obj: Any) -> int | None:
    """The device address of a buffer-like object (``.ptr`` or ``__cuda_array_interface__``), or None."""
    torch_ptr = _torch_pointer(obj)
    if torch_ptr is not None:
        return torch_ptr
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        data = cai.get("data") if isinstance(cai, dict) else None
        if not data:
            raise TypeError(f"{type(obj).__name__}.__cuda_array_interface__ has no 'data' entry")
        return int(data[0])
    ptr = getattr(obj, "ptr", None)
    if ptr is not None and not callable(ptr):
        return operator.index(ptr)
    return None


@dataclasses.dataclass(frozen=True)
class Param:
    """One kernel parameter, from the PTX ``.entry`` declaration."""

    name: str
    type: str
    count: int
    size: int

    @property
    def cls(self) -> str:
        return {"f": "float", "b": "bits"}.get(self.type[0], "int")

    def decl(self) -> str:
        return f".{self.type} {self.name}" + (f"[{self.count}]" if self.count != 1 else "")


def _convert(value: Any, index: int, param: Param | None, kernel: str) -> tuple[str, bytes]:
    """One argument as (kind, little-endian bytes), converted to ``param``'s type when it is known."""
    where = f"kernel {kernel}, argument {index}" + (f" (parameter {param.decl()})" if param else "")
    if isinstance(value, KernelArg):
        return value.kind, value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if not raw:
            raise _invalid(f"{where}: an empty bytes argument")
        return "raw", raw
    if isinstance(value, bool) or value is None:
        what = "None" if value is None else "a bool"
        raise TypeError(
            f"{where}: got {what}; pass cudacore.pointer(0) for NULL or cudacore.int32(...) for a flag"
        )
    ptr = _device_pointer(value)
    if ptr is not None:
        if param is not None and (param.size != 8 or param.cls == "float"):
            raise TypeError(f"{where}: got a device buffer, but the parameter is not a 64-bit pointer")
        return "ptr", KernelArg("ptr", ptr).encode()
    # Python and numpy numbers.
    dtype = getattr(value, "dtype", None)
    is_int = isinstance(value, int) or getattr(dtype, "kind", "") in ("i", "u")
    is_float = isinstance(value, float) or getattr(dtype, "kind", "") == "f"
    if not is_int and not is_float:
        raise TypeError(
            f"{where}: cannot pass {type(value).__name__}; pass an int, a float, a device buffer (.ptr or "
            "__cuda_array_interface__), bytes, or a typed value such as cudacore.int32(x)"
        )
    if param is None:
        if is_int:
            kind = _INT_KIND.get((dtype.itemsize, dtype.kind == "i"), "i64") if dtype is not None else "i64"
        else:
            kind = _FLOAT_KIND.get(dtype.itemsize, "f64") if dtype is not None else "f64"
        return kind, KernelArg(kind, value).encode()
    if param.count != 1:
        raise TypeError(
            f"{where}: the parameter is an array of {param.size} bytes (a struct by value); pass bytes"
        )
    if param.cls == "float":
        fkind = _FLOAT_KIND.get(param.size)
        if fkind is None:
            raise TypeError(f"{where}: unsupported float size {param.size}")
        return fkind, KernelArg(fkind, float(value)).encode()
    if is_float:
        raise TypeError(f"{where}: got float {value!r}, but the parameter takes an integer")
    v = operator.index(value)
    signed = param.type.startswith("s") or (param.cls == "bits" and v < 0)
    ikind = _INT_KIND[(param.size, signed)] if param.size in (1, 2, 4, 8) else None
    if ikind is None:
        raise TypeError(f"{where}: unsupported parameter size {param.size}")
    lo, hi = _int_range(ikind)
    if not lo <= v <= hi:
        raise _invalid(f"{where}: {v} does not fit in .{param.type} ({lo} to {hi})", param=param.name)
    return ikind, KernelArg(ikind, v).encode()


def _dims(value: Any, what: str) -> tuple[int, int, int]:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, not bool")
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items = list(value)
    else:
        items = [value]
    if not 1 <= len(items) <= 3:
        raise TypeError(f"{what} must have 1 to 3 dimensions, got {len(items)}")
    out = []
    for v in items:
        if isinstance(v, bool):
            raise TypeError(f"{what} dimensions must be ints, not bool")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise TypeError(f"{what} dimensions must be ints, not {type(v).__name__}") from None
    for i, v in enumerate(out):
        if v < 1:
            raise _invalid(f"{what} dimension {'xyz'[i]} is {v}; every dimension must be at least 1")
    while len(out) < 3:
        out.append(1)
    return out[0], out[1], out[2]


_launch = fast.launch
_launch_direct = fast.launch_direct


def _launch_spec(params: tuple[Param, ...] | None) -> bytes | None:
    """The spec cudacore._fast.launch packs by: per parameter its kind code, size and flags (1: a float,
    2: a Buffer may be passed for it). None when the parameters are unknown or any is not a scalar of 1, 2,
    4 or 8 bytes (half-precision floats included): such kernels take the general path, encode_args."""
    if params is None:
        return None
    out = bytearray()
    for p in params:
        is_float = p.cls == "float"
        if p.count != 1:
            return None
        kind = {4: "f32", 8: "f64"}.get(p.size) if is_float else _INT_KIND.get((p.size, p.type.startswith("s")))
        if kind is None:
            return None
        out += bytes((_ARG_CODES[kind], p.size, (1 if is_float else 0) | (2 if p.size == 8 and not is_float else 0)))
    return bytes(out)


@dataclasses.dataclass(frozen=True)
class KernelAttributes:
    """What the driver reports about a compiled kernel (``cuFuncGetAttribute``)."""

    num_regs: int
    shared_size_bytes: int
    const_size_bytes: int
    local_size_bytes: int
    max_threads_per_block: int
    ptx_version: int
    binary_version: int
    max_dynamic_shared_size_bytes: int

    @property
    def registers(self) -> int:
        """Registers per thread."""
        return self.num_regs

    @property
    def shared_memory(self) -> int:
        """Static shared memory per block, bytes."""
        return self.shared_size_bytes

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class Kernel(_CKernel):
    """A kernel function of a loaded :class:`Module`; get one with :meth:`Module.function`."""

    # The C base (cudacore/native/kernel.c) holds what the direct path reads: _direct, _module and _spec.
    __slots__ = ("_handle", "attributes", "name", "params")
    _module: Module
    _spec: bytes | None

    def __init__(self, module: Module, handle: int) -> None:
        info = json.loads(core.FunctionInfo(handle))
        self._handle = handle
        self._direct = 0  # the driver's function handle for the direct path, once Go has launched it
        self._module = module  # keeps the module loaded while the kernel is reachable
        self.name: str = info["name"]
        self.attributes = KernelAttributes(**info["attributes"])
        self.params: tuple[Param, ...] | None = (
            tuple(Param(p["name"], p["type"], p["count"], p["size"]) for p in info["params"])
            if info["params_known"]
            else None
        )
        self._spec = _launch_spec(self.params)

    @property
    def module(self) -> Module:
        return self._module

    def signature(self) -> str:
        """``"fill(.u64 p, .u32 v, .u64 n)"``, or ``"name(?)"`` when the parameters are not known."""
        if self.params is None:
            return f"{self.name}(?)"
        return f"{self.name}({', '.join(p.decl() for p in self.params)})"

    def encode_args(self, args: Sequence[Any]) -> bytes:
        """The arguments packed for the launch entry, converted and checked against the parameters: per
        argument one byte of kind code, its length in two bytes (little-endian), then its bytes (the form
        pkg/module.UnpackArgs reads). Packed once per call; no text crosses."""
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise TypeError(f"args must be a tuple or list, not {type(args).__name__}")
        if self.params is not None and len(args) != len(self.params):
            n = len(self.params)
            raise _invalid(
                f"kernel {self.name} takes {n} argument{'s' if n != 1 else ''}, got {len(args)}; "
                f"its signature is {self.signature()}",
                expected=str(n),
                given=str(len(args)),
            )
        parts = []
        for i, a in enumerate(args):
            kind, raw = _convert(a, i, self.params[i] if self.params is not None else None, self.name)
            n = len(raw)
            parts.append(bytes((_ARG_CODES[kind], n & 0xFF, n >> 8)))
            parts.append(raw)
        return b"".join(parts)

    def _launch(
        self,
        grid: int | Sequence[int] = 1,
        block: int | Sequence[int] = 1,
        args: Sequence[Any] = (),
        shared_mem: int = 0,
        stream: StreamLike = None,
    ) -> None:
        """The general path of :meth:`launch` (the C base's hot method), with the caller's arguments."""
        # The common case (int grid and block, a stream or None, plain numbers and buffers for known
        # parameters) is checked and packed in C; anything else, or any value out of range, takes the
        # general path, whose errors explain.
        if type(grid) is int and type(block) is int and grid > 0 and block > 0:
            g: tuple[int, int, int] = (grid, 1, 1)
            b: tuple[int, int, int] = (block, 1, 1)
        else:
            g = _dims(grid, "grid")
            b = _dims(block, "block")
        if type(shared_mem) is int and shared_mem >= 0:
            shm = shared_mem
        else:
            if isinstance(shared_mem, bool):
                raise TypeError("shared_mem must be an int, not bool")
            try:
                shm = operator.index(shared_mem)
            except TypeError:
                raise TypeError(f"shared_mem must be an int, not {type(shared_mem).__name__}") from None
            if shm < 0:
                raise _invalid(f"shared_mem is {shm}; it must be at least 0 bytes")
        # Once Go has launched the kernel, a launch on an open Stream this process owns, while nothing
        # captures and the module is loaded, goes to the driver from C (the direct path: cudacore/direct.go).
        # C makes those checks with the GIL held until the driver has the call; unload() and Stream.close()
        # clear what it reads before they reach Go. With an int grid and block, launch() in C has tried
        # that already; False: take the full path.
        if self._direct and _launch_direct(self, *g, *b, shm, stream, args):
            return
        h = stream._handle if type(stream) is _Stream else stream_handle(stream, self._module._device._ordinal)
        # Packed and launched in C; NotImplemented (nothing done) sends the arguments to the general path.
        if self._spec is not None:
            r = _launch(self._handle, *g, *b, shm, h, args, self._spec)
            if r is not NotImplemented:
                self._direct = r
                return
        self._direct = fast.function_launch(self._handle, *g, *b, shm, h, self.encode_args(args))

    def __copy__(self) -> Kernel:
        # Another object of the same function and module, as copy.copy made it of the slots before the C
        # base (whose fields object.__reduce_ex__ cannot see).
        k = object.__new__(type(self))
        k._handle, k._direct, k._module, k._spec = self._handle, self._direct, self._module, self._spec
        k.name, k.attributes, k.params = self.name, self.attributes, self.params
        return k

    def __reduce__(self) -> Any:
        # A kernel is a function of its Module, loaded in this process: it pickles as the module does (never).
        return self._module.__reduce__()

    def __call__(self, grid: Any, block: Any, *args: Any, shared_mem: int = 0, stream: StreamLike = None) -> None:
        """``k(grid, block, *args)``: the same as :meth:`launch`."""
        self.launch(grid=grid, block=block, args=args, shared_mem=shared_mem, stream=stream)

    def __repr__(self) -> str:
        return f"<cudacore.Kernel {self.signature()}, {self.attributes.num_regs} registers>"


def _unload(handle: int) -> None:
    if _api.forked():
        return
    try:
        core.ModuleUnload(handle)
    except CUDAError:
        pass


class Module(_CModule):
    """A loaded kernel image. Unload it with :meth:`unload` (or a ``with`` block); it is also unloaded when
    no longer referenced, and its kernels keep it referenced."""

    # The C base (cudacore/native/module.c) holds _device and _loaded, which the direct path checks before
    # it launches a kernel of the module; unload() clears _loaded before Go unloads it.
    __slots__ = ("_handle", "_kernels", "_lock", "_unloaded", "kernel_names", "kind")
    _device: Device

    def __init__(self, device: Device, handle: int) -> None:
        # The handle first: a Module cut short below (an error, a Ctrl-C) still unloads when collected.
        self._handle = handle
        self._unloaded = False
        self._device = device
        info = json.loads(core.ModuleInfo(handle))
        self.kind: str = info["kind"]
        #: The kernels the PTX declares; None for a cubin or fatbin (the driver cannot list them).
        self.kernel_names: tuple[str, ...] | None = (
            tuple(e["name"] for e in info["entries"]) if info["entries"] is not None else None
        )
        self._kernels: dict[str, Kernel] = {}
        self._lock = threading.Lock()
        self._loaded = True

    @property
    def device(self) -> Device:
        return self._device

    @property
    def closed(self) -> bool:
        return self._unloaded

    def function(self, name: str) -> Kernel:
        """The kernel called ``name``. Raises :class:`NotFoundError` naming the kernels the PTX declares."""
        if not isinstance(name, str):
            raise TypeError(f"kernel name must be a str, not {type(name).__name__}")
        k = self._kernels.get(name)
        if k is not None:
            return k
        handle = core.ModuleFunction(self._handle, name)
        with self._lock:
            k = self._kernels.get(name)
            if k is None:
                k = self._kernels[name] = Kernel(self, handle)
        return k

    get_function = function

    def unload(self) -> None:
        """Unload the module; its kernels can no longer be launched. A second call does nothing."""
        if not self._unloaded:
            uninterrupted(self._unload)

    def _unload(self) -> None:
        # With interrupts held back: a Ctrl-C between marking the module unloaded and Go's unload would
        # leave it loaded with nothing left to unload it.
        if not self._unloaded:
            self._loaded = False  # before Go unloads it: no direct launch of its kernels from now on
            self._unloaded = True
            core.ModuleUnload(self._handle)

    def _finalize(self) -> None:
        # Not at interpreter exit: the driver goes with the process (a fork child leaves it to _unload).
        if getattr(self, "_unloaded", True) or sys.is_finalizing():
            return
        self._loaded = False
        _unload(self._handle)  # again after a Ctrl-C: Go refuses a handle it unloaded, and _unload ignores that
        self._unloaded = True

    __del__ = fast.finalizer  # _finalize, called again where a Ctrl-C cut it short (cudacore._owner.Owner)

    close = unload

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unload()

    def __reduce__(self) -> Any:
        # A copy would share the loaded module: unloading it (or its collection) would leave this one's
        # kernels launching, from C, a function of an unloaded module.
        raise TypeError("a cudacore.Module cannot be pickled or copied: load the image again where it is needed")

    def __repr__(self) -> str:
        names = ", ".join(self.kernel_names) if self.kernel_names is not None else "?"
        state = "unloaded" if self.closed else f"device {self._device.device_id}"
        return f"<cudacore.Module {self.kind} [{names}] on {state}>"


ImageLike = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]


def _read_image(image: Any) -> bytes:
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, str):
        text = image.lstrip()
        # PTX source given as text rather than a path.
        if "\n" in image or text.startswith((".version", "//", "/*")):
            return image.encode()
        with open(image, "rb") as f:
            return f.read()
    if isinstance(image, os.PathLike):
        with open(image, "rb") as f:
            return f.read()
    raise TypeError(f"a module image must be bytes, PTX text or a path, not {type(image).__name__}")


def load_module(device: Device, image: ImageLike) -> Module:
    """Load PTX, a cubin or a fatbin (bytes, PTX text, or a file path) into ``device``.

    Raises
    ------
    InvalidImageError
        The data is not a kernel image, or the driver cannot use it on this device (the message names the
        kind detected).
    FileNotFoundError
        ``image`` is a path that does not exist.
    """
    text = base64.b64encode(_read_image(image)).decode("ascii")
    # With interrupts held back: the module Go loaded has its Module (and its finalizer) before a Ctrl-C
    # can come; one that comes meanwhile is raised after, and the Module, dropped, unloads when collected.
    return uninterrupted(lambda: Module(device, core.ModuleLoad(device.device_id, text)))
