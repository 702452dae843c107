"""What every handle (``_memory``, ``_stream``, ``_copy``) needs below itself: the stream argument, the
current device and streams of each thread, and the way back from a device ordinal to its
:class:`~cudacore.Device`.

The current state is per thread. The current device is device 0 until ``with device:`` or
``Device.use()`` changes it; the current stream of each device is its legacy default stream until
``with stream:`` makes a stream current (``with stream:`` also makes the stream's device current). Every
``stream=None`` argument resolves through :func:`stream_handle` to the current stream of the device the
call works on; the legacy default stream resolves to handle 0, the value the doors took for None before.

Device is in the layer above the handles (it composes them: ``Device.allocate``, ``create_stream``...), so
the handles cannot import ``_device``. Yet some must hand out a Device at run time: ``Buffer.device`` (the
Buffer is a C object holding only the ordinal) and ``Stream(0)`` (which takes an ordinal or None). They go
through :func:`as_device`, which calls the Device class ``_device`` registered here.

Contract: ``cudacore._device`` calls :func:`register_device_type` once, when it is imported, and nothing
else does. Every import of a cudacore module runs the package's ``__init__`` first, which imports
``_device``; so by the time any handle exists the class is registered. A handle that calls
:func:`as_device` while ``_device`` has not been imported is a bug in the package, and says so.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from . import _api
from ._api import core
from ._errors import error
from ._native import fast

if TYPE_CHECKING:
    from ._device import Device  # annotations only: _device is the layer above
    from ._stream import Stream  # annotations only: _stream is built on this module

__all__ = [
    "as_device",
    "current_ordinal",
    "current_stream_of",
    "pop_current",
    "push_current",
    "register_device_type",
    "set_current_ordinal",
    "stream_handle",
]


class _Current(threading.local):
    """One thread's current device and open blocks (a new thread starts with the defaults). Its current
    streams are :func:`_streams`'s."""

    def __init__(self) -> None:
        self.ordinal: int | None = None  # None: device 0
        # What each open `with device:` / `with stream:` block replaced: (the object that entered, the
        # ordinal before, the stream ordinal it changed or -1, the stream before or None).
        self.saved: list[tuple[object, int | None, int, Stream | None]] = []


_current = _Current()

#: This thread's current streams, by device ordinal (absent: the legacy default stream). The dict lives in
#: the thread's state, where the C hot paths read it without a thread-local's lookup; this module is the
#: only one that changes it.
_streams: Callable[[], dict[int, Stream]] = fast.thread_streams

# How many `with stream:` blocks are open, on all threads together: while none is, stream=None is the legacy
# default stream without a look at the thread's state (the hot paths check this one global). A thread's own
# blocks always count here (the lock keeps every change), so a nonzero count is all it takes to be exact.
open_stream_blocks = 0
_open_lock = threading.Lock()


def current_ordinal() -> int:
    """The ordinal of this thread's current device (0 unless ``with device:`` or ``Device.use()`` set it)."""
    ordinal = _current.ordinal
    return 0 if ordinal is None else ordinal


def set_current_ordinal(ordinal: int) -> None:
    """Make device ``ordinal`` current on this thread (``Device.use()``): until a ``with`` block that was
    open before ends, or the next ``use()``."""
    _current.ordinal = ordinal


def current_stream_of(ordinal: int) -> Stream | None:
    """This thread's current stream on device ``ordinal``, or None for the legacy default stream."""
    if not open_stream_blocks:
        return None
    return _streams().get(ordinal)


def push_current(entered: object, ordinal: int, stream: Stream | None) -> None:
    """Enter a ``with device:`` (stream None) or ``with stream:`` block: make ``ordinal`` the current
    device and ``stream`` the current stream of that device, remembering what they replace."""
    global open_stream_blocks
    cur = _current
    if stream is None:
        cur.saved.append((entered, cur.ordinal, -1, None))
    else:
        with _open_lock:
            open_stream_blocks += 1
        streams = _streams()
        cur.saved.append((entered, cur.ordinal, ordinal, streams.get(ordinal)))
        streams[ordinal] = stream
    cur.ordinal = ordinal


def pop_current(entered: object) -> None:
    """Leave the block ``entered`` opened: put back the device and stream it replaced.

    Blocks end in the reverse order of their start on one thread (``with`` guarantees it); a block left
    out of order (``__exit__`` called by hand on another object than the innermost) is an
    IllegalStateError, and nothing changes.
    """
    cur = _current
    if not cur.saved or cur.saved[-1][0] is not entered:
        raise error(
            "CUDA_ERROR_ILLEGAL_STATE",
            f"{entered!r} is not the innermost `with` block of device or stream on this thread: "
            "leave the blocks in the reverse order of entering them, on the thread that entered them",
            op="cudacore.current",
        )
    global open_stream_blocks
    _, ordinal, stream_ordinal, stream = cur.saved.pop()
    cur.ordinal = ordinal
    if stream_ordinal >= 0:
        if stream is None:
            _streams().pop(stream_ordinal, None)
        else:
            _streams()[stream_ordinal] = stream
        with _open_lock:
            open_stream_blocks -= 1


def stream_handle(stream: object, device: int | None = None) -> int:
    """The driver handle of a stream argument: a Stream, an int handle, or None: this thread's current
    stream of device ``device`` (None: the current device), 0 when that is the legacy default stream.

    Raises
    ------
    InvalidHandleError
        ``stream`` is None and the current stream was closed (``CUDACORE_ERROR_CLOSED``).
    """
    if stream is None:
        if not open_stream_blocks:  # no `with stream:` block open anywhere: the common case, kept short
            return 0
        ordinal = current_ordinal() if device is None else device
        current = _streams().get(ordinal)
        if current is None:
            return 0
        if current.closed:
            raise error(
                "CUDACORE_ERROR_CLOSED",
                f"the current stream of device {ordinal} on this thread was closed inside its `with stream:` "
                "block, so stream=None has no stream to use: pass a stream, or leave the block (which makes "
                "the previous stream current again)",
                op="cudacore.current_stream",
            )
        return current.handle
    handle: object
    if isinstance(stream, int) and not isinstance(stream, bool):
        handle = stream
    else:
        handle = _foreign_handle(stream)
        if handle is None:
            handle = getattr(stream, "handle", stream)
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise TypeError(
            "stream must be a cudacore Stream, a stream of another library (an object with __cuda_stream__, a "
            f"CuPy or PyTorch stream), an int handle or None, not {type(stream).__name__}"
        )
    if handle < 0:
        raise error(
            "CUDA_ERROR_INVALID_VALUE", f"stream must be a Stream, a stream handle (>= 0) or None, got {handle}", op="cudacore.stream"
        )
    return handle


# -- streams of other libraries -------------------------------------------------------------------------
#
# cudacore passes the handle of a stream it did not create to the driver only while it knows the stream
# is alive: during the call that names it, and afterwards while a watcher vouches for it (Go's books:
# cudacore/internal/process/foreign.go). A watcher is a weak reference to a stream object whose handle
# lives exactly as long as the object: CuPy's Stream destroys its handle when it is collected, so the
# watch ends (StreamGone) when the object goes; PyTorch's streams come from a pool PyTorch never destroys,
# so theirs never ends. Other objects (cuda.core's Stream, which close() destroys while the object lives,
# CuPy's and PyTorch's ExternalStream, any __cuda_stream__ object, a bare int) are not watched: a block
# allocated on one and freed after the call waits for a device synchronize instead (docs/guide/memory.md). A
# Buffer allocated on a stream object holds the object until it is freed (cudacore/native/buffer.c), so a
# CuPy stream is destroyed only after the last of its blocks was freed in its order.

#: handle -> the weak reference that watches it (CuPy streams)
_watches: dict[int, Any] = {}
#: handles watched for the life of the process (PyTorch's pooled streams)
_forever: set[int] = set()


def _foreign_handle(stream: object) -> int | None:
    """The handle of a stream object of another library, watching it where its kind allows; None for an
    object that is none of them (a cudacore Stream, or something the caller refuses)."""
    if type(stream).__module__.startswith("cudacore."):
        return None  # a Stream of cudacore's (its handle, closed or not, is Go's to check)
    protocol = getattr(type(stream), "__cuda_stream__", None)
    if protocol is not None:
        pair = stream.__cuda_stream__()  # type: ignore[attr-defined]
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], int) and not isinstance(pair[1], bool)):
            raise TypeError(
                f"{type(stream).__name__}.__cuda_stream__() must return (version, handle) with an int handle, got {pair!r}"
            )
        handle: int = pair[1]
    else:
        found = getattr(stream, "ptr", None) if _is_cupy_stream(stream) else getattr(stream, "cuda_stream", None)
        if not isinstance(found, int):
            return None
        handle = found
    if handle > 2:  # 0, 1 and 2 are the default streams, which live for good
        _watch(stream, handle)
    return handle


def _is_cupy_stream(stream: object) -> bool:
    cls = type(stream)
    return cls.__module__.startswith("cupy.") and cls.__name__ in ("Stream", "ExternalStream")


def _watch(stream: object, handle: int) -> None:
    cls = type(stream)
    module, name = cls.__module__, cls.__name__
    if name == "ExternalStream" or getattr(stream, "_foreign_stream_ref", None) is not None:
        return  # the handle is someone else's, who may destroy it while this object lives
    if module.startswith("torch."):
        if handle not in _forever:
            core.StreamWatch(handle)
            _forever.add(handle)
        return
    if not (module.startswith("cupy.") and name == "Stream"):
        return
    ref = _watches.get(handle)
    if ref is not None and ref() is stream:
        return

    def gone(r: Any, handle: int = handle) -> None:
        # CuPy's Stream destroys its handle as it is collected (its __del__ runs before this callback); every
        # Buffer allocated on it held it until freed, so none is left to free. A newer stream object that
        # took the handle over meanwhile keeps the watch.
        if _watches.get(handle) is r:
            del _watches[handle]
            if not _api.forked():
                core.StreamGone(handle)

    try:
        ref = weakref.ref(stream, gone)
    except TypeError:
        return  # cannot be watched: its blocks wait for a device synchronize when freed late
    _watches[handle] = ref
    core.StreamWatch(handle)


_device_type: type[Device] | None = None


def register_device_type(cls: type[Device]) -> None:
    """Called by ``cudacore._device`` at import, with :class:`cudacore.Device`."""
    global _device_type
    _device_type = cls


def as_device(device: Device | int | None) -> Device:
    """The Device for a device argument: a Device (itself), an ordinal, or None (this thread's current
    device)."""
    cls = _device_type
    if cls is None:
        raise ImportError("cudacore._device has not registered the Device class: import cudacore first")
    if device is None:
        return cls(current_ordinal())
    if isinstance(device, cls):
        return device
    return cls(cast("int", device))  # an ordinal, or something Device refuses with a TypeError
