"""Copies between host memory and device buffers (``Buffer.copy_from`` / ``Buffer.copy_to`` land here).

Host memory is anything with the buffer protocol (bytes, bytearray, memoryview, array.array, numpy
arrays: C-contiguous) or a :class:`PinnedBuffer`. With ``stream=None`` a copy is ordered on the current
stream of the buffer's device (its legacy default stream unless a ``with stream:`` block is open) and is
synchronous: it returns when the data has arrived, as in CuPy and PyTorch (inside a capture of the current
stream it is recorded into the graph instead, and nothing waits). With a stream it is ordered on that
stream:

- pinned memory (a PinnedBuffer, or a numpy view of one) is copied by the GPU's DMA engines while the call
  returns at once: keep the host memory alive and unchanged until the stream has passed the copy;
- pageable memory is staged through cudacore's pinned buffers, so a host-to-device copy returns once the
  data is staged (the memory may be reused at once), and a device-to-host copy returns when the data has
  arrived. Inside a capture only pinned memory is allowed (the graph keeps the host address).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errors import CUDAError, error
from ._handles import current_stream_of, stream_handle
from ._native import fast
from ._stream import Stream as _Stream
from ._tables import HELD_COPY_MAX

# This module is below _memory (Buffer.copy_from and copy_to call it), so it takes buffers by their C base
# types: every cudacore.Buffer (ExternalBuffer included) and PinnedBuffer is an instance of them, and the
# copies use only what the base types have (ptr, size, device_id, closed).
if TYPE_CHECKING:
    from ._fast import Buffer, PinnedBuffer
else:
    Buffer, PinnedBuffer = fast.Buffer, fast.PinnedBuffer

__all__ = ["device_to_device", "device_to_host", "host_to_device", "readonly_error"]

#: Asynchronous copies up to this size keep the GIL (they only enqueue work); larger ones release it. Go
#: owns the bound (pkg/stream.HeldCopyMax), as does C, through the generated tables.
HELD_MAX = HELD_COPY_MAX

#: The stream argument of the Go copy functions that means "synchronous".
SYNC = -1


def _invalid(message: str, op: str) -> CUDAError:
    return error("CUDA_ERROR_INVALID_VALUE", message, op=op)


def _host_nbytes(host: Any, op: str) -> int:
    """The size of host memory in bytes, without exporting it (the copy's door takes the one export)."""
    if isinstance(host, PinnedBuffer):
        return int(host.size)
    if isinstance(host, Buffer):
        raise TypeError(f"{op}: the host side is a device Buffer; use cudacore.device_to_device(dst, src, stream) for device copies")
    if isinstance(host, (bytes, bytearray)):
        return len(host)
    nbytes = getattr(host, "nbytes", None)  # memoryview, numpy
    if isinstance(nbytes, int):
        dtype = getattr(host, "dtype", None)
        if getattr(dtype, "kind", "") in ("M", "m"):
            # numpy cannot export datetime64 and timedelta64 through the buffer protocol, contiguous or not.
            raise TypeError(
                f"{op}: numpy cannot export a {dtype} array through the buffer protocol; copy its 64-bit "
                "integers instead: pass array.view('int64')"
            )
        return nbytes
    try:
        with memoryview(host) as mv:
            return mv.nbytes
    except TypeError:
        raise TypeError(
            f"{op}: host memory must support the buffer protocol (bytes, bytearray, memoryview, numpy) "
            f"or be a PinnedBuffer, not {type(host).__name__}"
        ) from None


def _check_buffer(buf: Any, what: str, op: str) -> None:
    if not isinstance(buf, Buffer):
        raise TypeError(f"{op}: {what} must be a cudacore Buffer, not {type(buf).__name__}")
    if buf.closed:
        raise error("CUDACORE_ERROR_CLOSED", f"{op}: the {what} buffer was closed", op=op)


def readonly_error(buf: Any, op: str) -> CUDAError:
    """The refusal of a write into ``buf``, memory its owner declared read-only (an ExternalBuffer)."""
    owner = type(getattr(buf, "owner", None)).__name__
    return _invalid(
        f"{op}: the destination is read-only: its owner ({owner}) declared the memory read-only (the CUDA Array "
        "Interface's data=(ptr, True), or DLPack's read-only flag); write into a writable array instead",
        op,
    )


def _check_writable(buf: Buffer, op: str) -> None:
    # Only an ExternalBuffer can be read-only; the slot is absent from every other Buffer.
    if getattr(buf, "_readonly", False):
        raise readonly_error(buf, op)


def _stream_arg(buf: Buffer, stream: object, op: str) -> int:
    if stream is None:
        # The current stream; the legacy default stream is the synchronous copy itself.
        return SYNC if current_stream_of(buf.device_id) is None else stream_handle(None, buf.device_id)
    # The common case, checked without the public properties: Python's share is most of a small copy's cost.
    if type(stream) is _Stream and stream._device._ordinal == buf.device_id:  # type: ignore[attr-defined]
        return stream._handle  # type: ignore[attr-defined]
    dev = getattr(stream, "device", None)
    if dev is not None and getattr(dev, "device_id", buf.device_id) != buf.device_id:
        raise _invalid(
            f"{op}: the buffer is on device {buf.device_id} but the stream belongs to device {dev.device_id}; "
            "use a stream of the buffer's device",
            op,
        )
    return stream_handle(stream)


def _finish(buf: Buffer, stream: object) -> None:
    """After a copy given ``stream=None`` on a current stream other than the default: wait for it, so that
    the copy is synchronous as with the default stream, unless that stream is capturing (the copy is then a
    node of the graph, and waiting is illegal there)."""
    if stream is None:
        current = current_stream_of(buf.device_id)
        if current is not None and not current.capturing:
            current.synchronize()


def _size(nbytes: int | None, default: int, op: str) -> int:
    if nbytes is None:
        return default
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"{op}: nbytes must be an int, not {type(nbytes).__name__}")
    if nbytes < 0:
        raise _invalid(f"{op}: nbytes must be >= 0, got {nbytes}", op)
    return nbytes


def host_to_device(buf: Buffer, host: Any, stream: object = None, nbytes: int | None = None) -> None:
    """Copy ``host`` (all of it, or its first ``nbytes``) into the start of device buffer ``buf``."""
    op = "cudacore.copy_from"
    _check_buffer(buf, "destination", op)
    _check_writable(buf, op)
    handle = _stream_arg(buf, stream, op)
    n = _size(nbytes, _host_nbytes(host, op), op)
    if n > buf.size:
        raise _invalid(f"{op}: the copy is {n} bytes but the device buffer holds only {buf.size}", op)
    # The door exports host through the buffer protocol for the call: the pointer is the exporter's, and
    # arrays of Python objects are refused before Go is entered.
    if handle != SYNC and n <= HELD_MAX:
        fast.copy_to_device_held(buf.device_id, buf.ptr, host, n, handle)
    else:
        fast.copy_to_device(buf.device_id, buf.ptr, host, n, handle)
    _finish(buf, stream)


def device_to_host(host: Any, buf: Buffer, stream: object = None, nbytes: int | None = None) -> None:
    """Copy device buffer ``buf`` (all of it, or its first ``nbytes``) into writable host memory ``host``."""
    op = "cudacore.copy_to"
    _check_buffer(buf, "source", op)
    handle = _stream_arg(buf, stream, op)
    _host_nbytes(host, op)  # a clear TypeError for a device Buffer or a non-buffer host
    n = _size(nbytes, buf.size, op)
    if n > buf.size:
        raise _invalid(f"{op}: the copy is {n} bytes but the device buffer holds only {buf.size}", op)
    if handle != SYNC and n <= HELD_MAX:
        fast.copy_to_host_held(buf.device_id, host, buf.ptr, n, handle)
    else:
        fast.copy_to_host(buf.device_id, host, buf.ptr, n, handle)
    _finish(buf, stream)


def device_to_device(dst: Buffer, src: Buffer, stream: object = None, nbytes: int | None = None) -> None:
    """Copy device buffer ``src`` (all of it, or its first ``nbytes``) into ``dst``.

    The two may be on different devices (a peer copy, cuMemcpyPeerAsync): then ``stream`` is a
    :class:`cudacore.Stream` of either device, or None for a copy that is done when the call returns. Peer
    access is not needed (without it the driver stages the copy through the host); order work on the other
    device after the copy with an event (``ev.record(stream)``, ``other_stream.wait_event(ev)``).
    """
    op = "cudacore.copy"
    _check_buffer(dst, "destination", op)
    _check_buffer(src, "source", op)
    _check_writable(dst, op)
    if dst.device_id != src.device_id:
        _peer_copy(dst, src, stream, nbytes)
        return
    handle = _stream_arg(dst, stream, op)
    n = _size(nbytes, src.size, op)
    if n > src.size or n > dst.size:
        raise _invalid(f"{op}: the copy is {n} bytes but the source holds {src.size} and the destination {dst.size}", op)
    if handle != SYNC:
        fast.copy_device_held(dst.device_id, dst.ptr, src.ptr, n, handle)
    else:
        fast.copy_device(dst.device_id, dst.ptr, src.ptr, n, handle)
    _finish(dst, stream)


def _peer_copy(dst: Buffer, src: Buffer, stream: object, nbytes: int | None) -> None:
    op = "cudacore.copy_peer"
    n = _size(nbytes, src.size, op)
    if n > src.size or n > dst.size:
        raise _invalid(f"{op}: the copy is {n} bytes but the source holds {src.size} and the destination {dst.size}", op)
    if stream is None:
        fast.copy_peer(dst.device_id, dst.device_id, dst.ptr, src.device_id, src.ptr, n, SYNC)
        return
    if not isinstance(stream, _Stream):
        raise TypeError(
            f"{op}: a copy between devices {src.device_id} and {dst.device_id} takes a cudacore Stream of either device "
            f"(or None), not {type(stream).__name__}"
        )
    ordinal = stream.device.device_id
    if ordinal not in (dst.device_id, src.device_id):
        raise _invalid(
            f"{op}: the copy is from device {src.device_id} to device {dst.device_id} but the stream belongs to device {ordinal}; "
            "use a stream of either",
            op,
        )
    fast.copy_peer_held(ordinal, dst.device_id, dst.ptr, src.device_id, src.ptr, n, stream_handle(stream))
