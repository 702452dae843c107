"""What every handle (``_memory``, ``_stream``, ``_copy``) needs below itself: the stream argument, and
the way back from a device ordinal to its :class:`~cudacore.Device`.

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

from typing import TYPE_CHECKING, cast

from ._errors import error

if TYPE_CHECKING:
    from ._device import Device  # annotations only: _device is the layer above

__all__ = ["as_device", "register_device_type", "stream_handle"]


def stream_handle(stream: object) -> int:
    """The driver handle of a stream argument: None (the legacy default stream), a Stream, or an int."""
    if stream is None:
        return 0
    handle = getattr(stream, "handle", stream)
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise TypeError(f"stream must be a cudacore Stream, an int handle or None, not {type(stream).__name__}")
    if handle < 0:
        raise error(
            "CUDA_ERROR_INVALID_VALUE", f"stream must be a Stream, a stream handle (>= 0) or None, got {handle}", op="cudacore.stream"
        )
    return handle


_device_type: type[Device] | None = None


def register_device_type(cls: type[Device]) -> None:
    """Called by ``cudacore._device`` at import, with :class:`cudacore.Device`."""
    global _device_type
    _device_type = cls


def as_device(device: Device | int | None) -> Device:
    """The Device for a device argument: a Device (itself), an ordinal, or None (device 0)."""
    cls = _device_type
    if cls is None:
        raise ImportError("cudacore._device has not registered the Device class: import cudacore first")
    if device is None:
        return cls(0)
    if isinstance(device, cls):
        return device
    return cls(cast("int", device))  # an ordinal, or something Device refuses with a TypeError
