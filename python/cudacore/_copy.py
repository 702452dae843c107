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

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._api import core
from ._errors import CUDAError, error
from ._handles import current_stream_of, stream_handle
from ._native import fast
from ._stream import Stream as _Stream
from ._stream import StreamLike
from ._tables import HELD_COPY_MAX

# This module is below _memory (Buffer.copy_from and copy_to call it), so it takes buffers by their C base
# types: every cudacore.Buffer (ExternalBuffer included) and PinnedBuffer is an instance of them, and the
# copies use only what the base types have (ptr, size, device_id, closed).
if TYPE_CHECKING:
    from ._fast import Buffer, PinnedBuffer
else:
    Buffer, PinnedBuffer = fast.Buffer, fast.PinnedBuffer

__all__ = [
    "device_to_device",
    "device_to_host",
    "fill",
    "host_to_device",
    "readonly_error",
    "register_protocols",
    "transfer",
]

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


def host_to_device(buf: Buffer, host: Any, stream: object = None, nbytes: int | None = None, offset: int = 0) -> None:
    """Copy ``host`` (all of it, or its first ``nbytes``) into device buffer ``buf`` at byte ``offset``."""
    op = "cudacore.copy_from"
    _check_buffer(buf, "destination", op)
    _check_writable(buf, op)
    handle = _stream_arg(buf, stream, op)
    n = _size(nbytes, _host_nbytes(host, op), op)
    if n > buf.size - offset:
        raise _invalid(f"{op}: the copy is {n} bytes but the device buffer holds only {buf.size - offset} from offset {offset}", op)
    # The door exports host through the buffer protocol for the call: the pointer is the exporter's, and
    # arrays of Python objects are refused before Go is entered. The call is a use of buf (fast.using): a
    # close() on another thread waits for it, and buf.ptr, read inside, raises once buf is closed.
    with fast.using(buf):
        if handle != SYNC and n <= HELD_MAX:
            fast.copy_to_device_held(buf.device_id, buf.ptr + offset, host, n, handle)
        else:
            fast.copy_to_device(buf.device_id, buf.ptr + offset, host, n, handle)
    _finish(buf, stream)


def device_to_host(host: Any, buf: Buffer, stream: object = None, nbytes: int | None = None, offset: int = 0) -> None:
    """Copy device buffer ``buf`` from byte ``offset`` (all the rest, or ``nbytes``) into the start of
    writable host memory ``host``."""
    op = "cudacore.copy_to"
    _check_buffer(buf, "source", op)
    handle = _stream_arg(buf, stream, op)
    _host_nbytes(host, op)  # a clear TypeError for a device Buffer or a non-buffer host
    n = _size(nbytes, buf.size - offset, op)
    if n > buf.size - offset:
        raise _invalid(f"{op}: the copy is {n} bytes but the device buffer holds only {buf.size - offset} from offset {offset}", op)
    # The GIL stays held only into a PinnedBuffer: a copy into pageable memory waits for the work queued on
    # the stream first, and holding the GIL across that wait would stop every thread and Ctrl-C.
    with fast.using(buf):  # as host_to_device
        if handle != SYNC and n <= HELD_MAX and isinstance(host, PinnedBuffer):
            fast.copy_to_host_held(buf.device_id, host, buf.ptr + offset, n, handle)
        else:
            fast.copy_to_host(buf.device_id, host, buf.ptr + offset, n, handle)
    _finish(buf, stream)


def device_to_device(
    dst: Buffer, src: Buffer, stream: StreamLike = None, nbytes: int | None = None, *, dst_offset: int = 0, src_offset: int = 0
) -> None:
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
        _peer_copy(dst, src, stream, nbytes, dst_offset, src_offset)
        return
    handle = _stream_arg(dst, stream, op)
    dst_n, src_n = dst.size - dst_offset, src.size - src_offset
    n = _size(nbytes, src_n, op)
    if n > src_n or n > dst_n:
        raise _invalid(f"{op}: the copy is {n} bytes but the source holds {src_n} and the destination {dst_n}", op)
    with fast.using(dst, src):  # as host_to_device
        if handle != SYNC:
            fast.copy_device_held(dst.device_id, dst.ptr + dst_offset, src.ptr + src_offset, n, handle)
        else:
            fast.copy_device(dst.device_id, dst.ptr + dst_offset, src.ptr + src_offset, n, handle)
    _finish(dst, stream)


def _peer_copy(dst: Buffer, src: Buffer, stream: object, nbytes: int | None, dst_offset: int = 0, src_offset: int = 0) -> None:
    op = "cudacore.copy_peer"
    dst_n, src_n = dst.size - dst_offset, src.size - src_offset
    n = _size(nbytes, src_n, op)
    if n > src_n or n > dst_n:
        raise _invalid(f"{op}: the copy is {n} bytes but the source holds {src_n} and the destination {dst_n}", op)
    if stream is None:
        with fast.using(dst, src):  # as host_to_device
            fast.copy_peer(dst.device_id, dst.device_id, dst.ptr + dst_offset, src.device_id, src.ptr + src_offset, n, SYNC)
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
    handle = stream_handle(stream)
    with fast.using(dst, src):
        fast.copy_peer_held(ordinal, dst.device_id, dst.ptr + dst_offset, src.device_id, src.ptr + src_offset, n, handle)


# -- the general copy: Buffer.copy_from / copy_to with any memory ---------------------------------------

#: Makes a cudacore Buffer of another library's device array, or host memory of a host DLPack tensor, for
#: one copy: ``convert(obj, device_ordinal, stream, op, writable)`` returns ``(kind, memory, release)``,
#: ``kind`` "device" (memory a Buffer) or "host" (memory with the buffer protocol), and ``release()`` to
#: call after the copy; None when ``obj`` offers neither interface. Registered by cudacore._external, which
#: owns those protocols and sits above this module.
_convert: Callable[[Any, int, object, str, bool], tuple[str, Any, Callable[[], None]] | None] | None = None


def register_protocols(convert: Callable[[Any, int, object, str, bool], tuple[str, Any, Callable[[], None]] | None]) -> None:
    """Install the converter of the CUDA Array Interface and DLPack (see :data:`_convert`)."""
    global _convert
    _convert = convert


def _nothing() -> None:
    return None


def _offset_arg(value: object, name: str, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise _invalid(f"{op}: {name} must be >= 0, got {value}", op)
    return value


def _is_host(obj: Any) -> bool:
    """Whether ``obj`` is host memory of the buffer protocol (checked without exporting it twice)."""
    if isinstance(obj, (bytes, bytearray, memoryview, PinnedBuffer)):
        return True
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    except (ValueError, BufferError):
        return True  # an exporter that cannot export this array (numpy datetime64): _host_nbytes says why
    return True


def _classify(other: Any, ordinal: int, stream: object, op: str, writable: bool) -> tuple[str, Any, Callable[[], None]]:
    """What ``other`` is to a copy: ("device", Buffer, release) or ("host", buffer-protocol memory, release)."""
    if isinstance(other, Buffer):
        return "device", other, _nothing
    if isinstance(other, PinnedBuffer):
        return "host", other, _nothing
    device_array = hasattr(other, "__cuda_array_interface__") or (
        hasattr(other, "__dlpack__") and hasattr(other, "__dlpack_device__") and other.__dlpack_device__()[0] in (2, 13)
    )
    if not device_array and _is_host(other):
        return "host", other, _nothing
    converted = _convert(other, ordinal, stream, op, writable) if _convert is not None else None
    if converted is None:
        raise TypeError(
            f"{op}: {type(other).__name__} is neither host memory (the buffer protocol: bytes, bytearray, memoryview, "
            "numpy; a PinnedBuffer; a host DLPack tensor) nor device memory (a cudacore Buffer, an array with "
            "__cuda_array_interface__ or a CUDA DLPack tensor)"
        )
    return converted


def _host_slice(host: Any, start: int, n: int, op: str, writable: bool) -> Any:
    """Bytes ``start:start+n`` of host memory, as a memoryview of bytes (released by the caller)."""
    try:
        mv = memoryview(host)
    except TypeError:
        raise TypeError(f"{op}: host memory must support the buffer protocol, not {type(host).__name__}") from None
    if not mv.c_contiguous:
        mv.release()
        raise _invalid(f"{op}: the host memory must be C-contiguous to copy part of it (host_offset or nbytes)", op)
    if writable and mv.readonly:
        mv.release()
        raise _invalid(f"{op}: the destination host memory ({type(host).__name__}) is read-only", op)
    if "O" in mv.format:  # refused before the cast to bytes below hides it, as a whole copy is refused
        mv.release()
        raise _invalid(f"{op}: the host memory holds Python objects (dtype=object), whose bytes are pointers; copy numbers instead", op)
    flat = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    return flat[start : start + n]


def transfer(
    buf: Buffer,
    other: Any,
    stream: StreamLike,
    nbytes: int | None,
    offset: int,
    other_offset: int,
    *,
    into: bool,
) -> None:
    """The general case of ``Buffer.copy_from`` (``into=True``: ``other`` into ``buf``) and ``copy_to``
    (``into=False``: ``buf`` into ``other``).

    ``other`` is host memory (the buffer protocol, a PinnedBuffer, a host DLPack tensor) or device memory (a
    cudacore Buffer, an array with ``__cuda_array_interface__`` or a CUDA DLPack tensor: a device-to-device
    copy, between devices a peer copy). ``offset`` is the byte offset into ``buf``, ``other_offset`` into
    ``other``. Without ``nbytes`` the copy moves all of both sides from their offsets, which must then hold
    the same number of bytes: a size mismatch is an InvalidValueError, never a partial copy. With ``nbytes``
    both sides must hold at least that many bytes from their offsets.
    """
    op = "cudacore.copy_from" if into else "cudacore.copy_to"
    _check_buffer(buf, "destination" if into else "source", op)
    offset = _offset_arg(offset, "offset", op)
    other_offset = _offset_arg(other_offset, "src_offset" if into else "dst_offset", op)
    if nbytes is not None:
        nbytes = _size(nbytes, 0, op)
    if offset > buf.size:
        raise _invalid(f"{op}: offset {offset} is past the end of the buffer ({buf.size} bytes)", op)
    kind, mem, release = _classify(other, buf.device_id, stream, op, not into)
    try:
        if kind == "device":
            _check_buffer(mem, "source" if into else "destination", op)
        elif isinstance(mem, PinnedBuffer) and mem.closed:  # said before any size
            raise error("CUDACORE_ERROR_CLOSED", f"{op}: the {'source' if into else 'destination'} PinnedBuffer was closed", op=op)
        other_size = mem.size if kind == "device" else _host_nbytes(mem, op)
        name = "source" if into else "destination"
        mine, theirs = buf.size - offset, other_size - other_offset
        if theirs < 0:
            raise _invalid(f"{op}: the {name} offset {other_offset} is past the end of the {name} ({other_size} bytes)", op)
        if nbytes is None:
            if mine != theirs:
                where = f" from offset {offset}" if offset else ""
                their_where = f" from offset {other_offset}" if other_offset else ""
                raise _invalid(
                    f"{op}: the {name} holds {theirs} bytes{their_where} and the buffer {mine}{where}: a copy moves all of "
                    f"both unless nbytes= says how many; pass nbytes={min(mine, theirs)}, offsets, or a view "
                    f"(buf[start:stop]) of the right size",
                    op,
                )
            n = mine
        else:
            n = nbytes
            if n > mine or n > theirs:
                short = f"the buffer holds {mine}" + (f" from offset {offset}" if offset else "")
                if n > theirs:
                    short = f"the {name} holds {theirs}" + (f" from offset {other_offset}" if other_offset else "")
                raise _invalid(f"{op}: nbytes={n} but {short}", op)
        if kind == "device":
            if into:
                device_to_device(buf, mem, stream, n, dst_offset=offset, src_offset=other_offset)
            else:
                device_to_device(mem, buf, stream, n, dst_offset=other_offset, src_offset=offset)
            return
        if other_offset == 0 and n == other_size:
            host, part = mem, None
        else:
            part = host = _host_slice(mem, other_offset, n, op, not into)
        try:
            if into:
                host_to_device(buf, host, stream, n, offset)
            else:
                device_to_host(host, buf, stream, n, offset)
        finally:
            if part is not None:
                part.release()
    finally:
        release()


def fill(buf: Buffer, value: int, stream: object = None) -> None:
    """Set every byte of ``buf`` to ``value`` (0..255); see :meth:`cudacore.Buffer.fill`."""
    op = "cudacore.fill"
    _check_buffer(buf, "destination", op)
    _check_writable(buf, op)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: the value must be an int (a byte, 0..255), not {type(value).__name__}")
    if not 0 <= value <= 255:
        raise _invalid(f"{op}: the value must be a byte, 0..255, got {value}; fill sets each byte (cuMemsetD8)", op)
    handle = _stream_arg(buf, stream, op)
    with fast.using(buf):  # as host_to_device
        core.Fill(buf.device_id, buf.ptr, value, buf.size, handle)
    _finish(buf, stream)


def is_host_memory(obj: object) -> bool:
    """Whether ``obj`` is host memory a copy takes (a PinnedBuffer, the buffer protocol, a host DLPack
    tensor) and not device memory (a Buffer, the CUDA Array Interface, a CUDA DLPack tensor)."""
    if isinstance(obj, Buffer) or hasattr(obj, "__cuda_array_interface__"):
        return False
    if isinstance(obj, PinnedBuffer) or _is_host(obj):
        return True
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    return callable(dlpack_device) and int(dlpack_device()[0]) in (1, 3)  # kDLCPU, kDLCUDAHost


def host_memory(obj: Any, ordinal: int, stream: object, op: str) -> tuple[Any, int, Callable[[], None]]:
    """``obj``'s host memory for an upload: (memory with the buffer protocol, its size, release to call
    after the copy).

    Raises
    ------
    TypeError
        If ``obj`` is device memory (naming the copy-free view) or not memory at all.
    """
    kind, mem, release = _classify(obj, ordinal, stream, op, False)
    if kind != "host":
        release()
        raise TypeError(
            f"{op}: {type(obj).__name__} is device memory already: view it without a copy with "
            "Device.from_array(x), or copy it into a Buffer with buf.copy_from(x)"
        )
    try:
        return mem, _host_nbytes(mem, op), release
    except BaseException:
        release()
        raise


#: The fields of a staging tuning (:func:`staging_tuning`).
STAGING_FIELDS = ("chunk", "buffers", "workers", "piece", "burst")


def staging_tuning(device: int = 0, **fields: int) -> dict[str, int]:
    """How ``device`` stages pageable copies, changed first when fields are given: an internal hook for
    benchmarks that compare settings in one process (``scripts/gpu/pageable_probe.py``), not an API.

    Parameters
    ----------
    device
        The device ordinal.
    **fields
        ``chunk`` (bytes per pinned staging buffer, the unit of one DMA), ``buffers`` (staging buffers per
        device at most), ``workers`` (goroutines copying host memory for one copy; 1: the calling thread)
        ``piece`` (bytes a worker copies at a time) and ``burst`` (bytes one copy enqueues for the copy
        engine before it lets them drain, so that other streams' copies get their turn; negative: never).
        A field left out, or 0, is its default. Changing
        the tuning frees the staging buffers; the next copy allocates them at the new size.

    Returns
    -------
    dict
        The tuning in force afterwards, every field filled in.

    Raises
    ------
    TypeError
        If ``device`` is not an int.
    InvalidValueError
        For an unknown field, a value that is not an int, or one out of bounds; a device that does not
        exist.
    CUDAError
        With ``CUDA_ERROR_NOT_READY`` while a staged copy runs on ``device``; a ``CaptureError`` while a
        capture is in progress.
    """
    op = "cudacore.staging_tuning"
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"{op}: device must be an int (a device ordinal), not {type(device).__name__}")
    if unknown := sorted(set(fields) - set(STAGING_FIELDS)):
        raise _invalid(f"{op}: unknown field(s) {unknown}; the fields are {list(STAGING_FIELDS)}", op)
    for name, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid(f"{op}: {name} must be an int, not {type(value).__name__}", op)
    spec = json.dumps({name: fields.get(name, 0) for name in STAGING_FIELDS}) if fields else ""
    tuning: dict[str, int] = json.loads(core.StagingTuning(device, spec))
    return tuning
