"""Device and pinned host memory: Buffer, PinnedBuffer, tiles and statistics.

A :class:`Buffer` owns device memory from :meth:`Device.allocate` until :meth:`Buffer.close`, the end of
its ``with`` block, or garbage collection. The object itself is a C type (``cudacore/native/buffer.c``): the
allocate+close pair never runs Python code of ours on success, which is what keeps it as cheap as
CuPy's pool.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _accounts, _copy, _errors
from ._api import core
from ._diagnostics import label_allocations
from ._display import MemoryStats, buffer_html, format_bytes, new_memory_stats
from ._errors import OutOfMemoryError, error
from ._handles import as_device, stream_handle
from ._native import fast
from ._owner import adopt
from ._stream import StreamLike, note_capture_buffers

if TYPE_CHECKING:
    from ._device import Device
    from ._fast import Buffer as _CBuffer
    from ._fast import PinnedBuffer as _CPinnedBuffer
else:
    _CBuffer, _CPinnedBuffer = fast.Buffer, fast.PinnedBuffer

__all__ = ["ADVICE", "LEGACY_STREAM", "Buffer", "BufferView", "ManagedBuffer", "PinnedBuffer"]

#: The driver's handle for the legacy default stream.
LEGACY_STREAM = 1


class Buffer(_CBuffer):
    """Device memory owned by this object.

    Attributes
    ----------
    ptr : int
        The device address. Reading it after :meth:`close` raises :class:`InvalidHandleError` (code
        ``CUDACORE_ERROR_CLOSED``).
    size : int
        The size in bytes.
    device : Device
        The device it lives on.
    closed : bool
        Whether :meth:`close` has freed it.

    Notes
    -----
    ``close()`` frees in stream order on the stream the buffer was allocated on, and is idempotent: a
    second close does nothing, so there is never a double free. A buffer not closed is freed when it is
    garbage collected.
    """

    __slots__ = ()

    @property
    def device(self) -> Device:
        # The C object holds only the ordinal; _handles maps it to the Device (see the contract there).
        return as_device(self.device_id)

    @property
    def nbytes(self) -> int:
        """The size in bytes (as numpy and CuPy name it)."""
        return self.size

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        """Refused: a Buffer is device memory, which numpy cannot view (without this, ``numpy.asarray(buf)``
        would quietly make an array of one Python object).

        Raises
        ------
        TypeError
            Always, naming the ways to get the bytes to the host or to view them on the device.
        """
        raise TypeError(
            f"a cudacore Buffer ({self.size} bytes) is device memory, which numpy cannot view: copy it to the "
            "host with buf.copy_to(numpy.empty(buf.size, numpy.uint8)), or view it on the device with "
            "cupy.asarray(buf) or torch.from_dlpack(buf)"
        )

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3 of the CUDA Array Interface: a 1-D array of bytes, ordered on the buffer's stream.

        ``stream`` is the buffer's stream while its handle names it; once that stream is destroyed (or is
        another library's that nobody vouches for any more, after a device synchronize) it is None: no
        work of it is left to wait for, and a destroyed stream's handle must never reach a consumer.
        """
        ptr = self.ptr
        stream = core.BufferExportStream(self.device_id, ptr, self.stream_handle)
        return {
            "shape": (self.size,),
            "typestr": "|u1",
            "data": (ptr, False),
            "strides": None,
            "version": 3,
            "stream": None if stream < 0 else LEGACY_STREAM if stream == 0 else stream,
        }

    # copy_from and copy_to are methods of the C type: a copy of all of host memory of the buffer's size
    # (a PinnedBuffer, or the buffer protocol) with at most a stream runs there without Python code; every
    # other call (device memory, nbytes=, offsets, another size, which is refused) comes to _copy_from /
    # _copy_to, whose signatures are the methods' own.

    def _copy_from(
        self, src: Any, stream: StreamLike = None, *, nbytes: int | None = None, offset: int = 0, src_offset: int = 0
    ) -> None:
        """``copy_from(src, stream=None, *, nbytes=None, offset=0, src_offset=0)``: copy ``src`` into this
        buffer.

        ``src`` is host memory (bytes-like, numpy and anything with the buffer protocol, a
        :class:`PinnedBuffer`, a host DLPack tensor) or device memory (a :class:`Buffer` or a view of one,
        an array with ``__cuda_array_interface__``, a CUDA DLPack tensor: a device-to-device copy, a peer
        copy between devices). With ``stream=None`` the copy runs on the current stream and is synchronous;
        with a stream it is ordered on it (keep ``src`` alive and unchanged until the stream has passed the
        copy, except pageable host memory, which is staged before the call returns).

        Parameters
        ----------
        nbytes : int, optional
            How many bytes to copy. Without it the copy moves all of ``src`` (from ``src_offset``) into all
            of this buffer (from ``offset``), and the two must be the same size.
        offset : int
            The byte offset in this buffer where the copy lands.
        src_offset : int
            The byte offset in ``src`` where the copy starts.

        Raises
        ------
        InvalidValueError
            If the sizes differ and ``nbytes`` is not given, or either side holds fewer than ``nbytes``
            bytes from its offset (never a partial copy), or this buffer is read-only.
        TypeError
            If ``src`` is neither host nor device memory.
        """
        _copy.transfer(self, src, stream, nbytes, offset, src_offset, into=True)

    def _copy_to(
        self, dst: Any, stream: StreamLike = None, *, nbytes: int | None = None, offset: int = 0, dst_offset: int = 0
    ) -> None:
        """``copy_to(dst, stream=None, *, nbytes=None, offset=0, dst_offset=0)``: copy this buffer into
        ``dst``: writable host memory or device memory, as :meth:`copy_from` takes. ``offset`` is where the
        copy starts in this buffer, ``dst_offset`` where it lands in ``dst``; without ``nbytes`` both sides
        must hold the same number of bytes from their offsets (``buf.copy_to(bytearray(10), nbytes=10)``
        reads the first 10 bytes).
        """
        _copy.transfer(self, dst, stream, nbytes, offset, dst_offset, into=False)

    def fill(self, value: int, stream: StreamLike = None) -> None:
        """Set every byte of this buffer to ``value`` (0..255: a byte memset, cuMemsetD8). With
        ``stream=None`` it runs on the current stream and is synchronous; with a stream it is ordered on it
        (inside a capture of that stream it is a memset node of the graph). Fill part of a buffer through a
        view: ``buf[start:stop].fill(0)``.

        Raises
        ------
        InvalidValueError
            If ``value`` is not in 0..255, or the buffer is read-only.
        """
        _copy.fill(self, value, stream)

    def __getitem__(self, key: slice) -> BufferView:
        """``buf[start:stop]``: a :class:`BufferView` of those bytes, sharing this buffer's memory.

        Negative bounds count from the end, as in Python; a bound past the end is refused, not clamped
        (a view is memory, and a shorter one than asked for would copy less than asked for).

        Raises
        ------
        TypeError
            If ``key`` is not a slice (read one value with ``copy_to(host, offset=i, nbytes=n)``).
        ValueError
            If the slice has a step other than 1, or a bound lies outside the buffer.
        """
        if not isinstance(key, slice):
            raise TypeError(
                f"a Buffer is sliced by bytes (buf[start:stop], a view), not indexed by {type(key).__name__}: "
                "read values with buf.copy_to(host, offset=start, nbytes=n)"
            )
        if key.step is not None and key.step != 1:
            raise ValueError(
                f"a Buffer view is one contiguous range of bytes: buf[start:stop] has no step (got step {key.step}); "
                "copy strided data with a kernel or another library's array"
            )
        size = self.size
        bounds = []
        for name, value, default in (("start", key.start, 0), ("stop", key.stop, size)):
            if value is None:
                bounds.append(default)
                continue
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise TypeError(f"a Buffer view's {name} must be an int, not {type(value).__name__}")
            v = value.__index__()
            v = v + size if v < 0 else v
            if not 0 <= v <= size:
                raise ValueError(f"buf[{key.start}:{key.stop}]: the {name} {value} lies outside the buffer ({size} bytes)")
            bounds.append(v)
        start, stop = bounds
        if stop < start:
            raise ValueError(f"buf[{key.start}:{key.stop}]: the stop {key.stop} is before the start {key.start}")
        view: BufferView = self._view(start, stop - start, BufferView)
        view._offset = start
        view._readonly = bool(getattr(self, "_readonly", False))
        return view

    def __reduce__(self) -> tuple[Any, ...]:
        # Memory of the device's allocator may be cached and handed out again while another process maps
        # it, so it is not shared: SharedBuffer (Device.allocate_shareable) is. A Buffer whose owner knows
        # better (a view of shared memory) says what to send instead.
        why = _why_not_sent(self.owner)  # a string: the traceback keeps no reference to the owner
        if why is not None:
            raise TypeError(why)
        raise TypeError(
            "a cudacore.Buffer cannot be sent to another process: allocate it with Device.allocate_shareable(nbytes) "
            "(a SharedBuffer, which pickles as a handle the other process opens), or copy its bytes"
        )

    def _repr_html_(self) -> str:
        return buffer_html(self)

    def __repr__(self) -> str:
        if self.closed:
            return f"<cudacore.Buffer closed, {self.size} bytes, device {self.device_id}>"
        return f"<cudacore.Buffer 0x{self.ptr:x}, {self.size} bytes, device {self.device_id}>"


class BufferView(Buffer):
    """Bytes ``start:stop`` of another :class:`Buffer` (``buf[start:stop]``), sharing its memory.

    A view is a Buffer everywhere (copies, :meth:`fill`, kernel arguments, DLPack and the CUDA Array
    Interface, further slicing) and frees nothing: its :meth:`close` only lets go of the parent. It keeps
    the parent object alive, and the parent's memory too: the parent's ``close()`` raises ``BufferError``
    while a view of it is open. A view is ordered on its parent's stream, and is read-only when its parent
    is.

    Attributes
    ----------
    parent : Buffer
        The buffer viewed (None once the view is closed).
    offset : int
        Where the view starts in the parent, in bytes.
    """

    __slots__ = ("_offset", "_readonly")
    _offset: int
    _readonly: bool

    @property
    def parent(self) -> Buffer | None:
        """The buffer viewed (None once the view is closed)."""
        return self.owner  # type: ignore[no-any-return]

    @property
    def offset(self) -> int:
        """Where the view starts in the parent, in bytes."""
        return int(getattr(self, "_offset", 0))

    @property
    def readonly(self) -> bool:
        """Whether the parent's memory is read-only (a view of a read-only ExternalBuffer)."""
        return bool(getattr(self, "_readonly", False))

    def copy_from(
        self, src: Any, stream: StreamLike = None, *, nbytes: int | None = None, offset: int = 0, src_offset: int = 0
    ) -> None:
        """As :meth:`Buffer.copy_from`, refused into a read-only view."""
        if self.readonly:
            raise _copy.readonly_error(self, "cudacore.copy_from")
        super().copy_from(src, stream, nbytes=nbytes, offset=offset, src_offset=src_offset)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """As :attr:`Buffer.__cuda_array_interface__`, with the parent's read-only flag."""
        cai = super().__cuda_array_interface__
        cai["data"] = (cai["data"][0], self.readonly)
        return cai

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self.ptr:x}"
        return f"<cudacore.BufferView {state}, {self.size} bytes at offset {self.offset} of {self.owner!r}>"


#: The hints :meth:`ManagedBuffer.advise` takes, and the driver's CUmem_advise values.
ADVICE: dict[str, int] = {
    "read_mostly": 1,
    "unset_read_mostly": 2,
    "preferred_location": 3,
    "unset_preferred_location": 4,
    "accessed_by": 5,
    "unset_accessed_by": 6,
}


def _location(where: object, what: str) -> int:
    """A device number of the managed-memory calls: a Device or ordinal, or ``"cpu"`` (the host: -1)."""
    if isinstance(where, str):
        if where.lower() in ("cpu", "host"):
            return -1
        raise error("CUDA_ERROR_INVALID_VALUE", f"{what} must be a Device, a device ordinal or \"cpu\", not {where!r}", op=f"cudacore.{what}")
    if isinstance(where, bool) or not isinstance(where, int) and not hasattr(where, "device_id"):
        raise TypeError(f"{what} must be a Device, a device ordinal or \"cpu\", not {type(where).__name__}")
    ordinal = where if isinstance(where, int) else int(where.device_id)  # type: ignore[attr-defined]
    if ordinal < 0:
        raise error("CUDA_ERROR_INVALID_DEVICE", f"{what} must be a device ordinal >= 0 or \"cpu\", not {ordinal}", op=f"cudacore.{what}")
    return ordinal


class ManagedBuffer(Buffer):
    """Managed (unified) memory: one address valid on the host and on every device, migrated by the driver
    on demand. Made by :meth:`Device.allocate_managed`.

    It is a :class:`Buffer` (copies, ``__cuda_array_interface__``, DLPack, ``close()``), and it can be larger
    than the device's memory: the driver pages it in and out. :meth:`prefetch` moves it ahead of use, and
    :meth:`advise` tells the driver how it will be used. On the simulator the calls check their arguments
    and move nothing.
    """

    __slots__ = ()

    def prefetch(self, to: object, stream: StreamLike = None) -> None:
        """Migrate the memory to ``to`` (a :class:`Device`, an ordinal, or ``"cpu"``), ordered on ``stream``
        (None: the legacy default stream). It does not wait.

        Raises
        ------
        InvalidDeviceError
            If ``to`` names no device of this machine.
        """
        core.ManagedPrefetch(self.device_id, self.ptr, self.size, _location(to, "prefetch"), stream_handle(stream, self.device_id))

    def advise(self, advice: str, device: object) -> None:
        """Tell the driver how the memory will be used by ``device`` (a :class:`Device`, an ordinal, or
        ``"cpu"``).

        Parameters
        ----------
        advice : str
            One of :data:`ADVICE`: ``"read_mostly"`` (read-only copies on each reader),
            ``"preferred_location"`` (keep it on ``device``), ``"accessed_by"`` (keep it mapped for
            ``device``), or their ``"unset_..."`` forms.
        """
        code = ADVICE.get(advice) if isinstance(advice, str) else None
        if code is None:
            raise error("CUDA_ERROR_INVALID_VALUE", f"unknown advice {advice!r}: use one of {', '.join(ADVICE)}", op="cudacore.advise")
        core.ManagedAdvise(self.device_id, self.ptr, self.size, code, _location(device, "advise"))

    def __repr__(self) -> str:
        if self.closed:
            return f"<cudacore.ManagedBuffer closed, {self.size} bytes, device {self.device_id}>"
        return f"<cudacore.ManagedBuffer 0x{self.ptr:x}, {self.size} bytes, device {self.device_id}>"


def allocate_managed(device: Device, nbytes: int) -> ManagedBuffer:
    """Managed memory of ``nbytes``; see :meth:`Device.allocate_managed`."""
    _positive("nbytes", nbytes, "cudacore.allocate_managed")
    ordinal = device.device_id
    # Through adopt (cudacore._owner): a KeyboardInterrupt between the allocation and its Buffer loses nothing.
    buf: ManagedBuffer = adopt(lambda owner: fast.wrap(ordinal, core.ManagedAllocate(ordinal, nbytes, owner), nbytes, 0, ManagedBuffer))
    return buf


class PinnedBuffer(_CPinnedBuffer):
    """Page-locked (pinned) host memory owned by this object, with the buffer protocol.

    ``memoryview(h)`` and :meth:`numpy` view it without a copy. Copies between pinned memory and the
    device run at full bus speed and can be asynchronous. :meth:`close` is refused while views exist.
    """

    __slots__ = ()

    def numpy(self, dtype: Any = "uint8") -> Any:
        """A numpy array viewing this memory (no copy)."""
        import numpy as np

        return np.frombuffer(self, dtype=dtype)  # type: ignore[call-overload, unused-ignore]  # PEP 688 needs 3.12

    @property
    def nbytes(self) -> int:
        return self.size

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        if self.closed:
            return f"<cudacore.PinnedBuffer closed, {self.size} bytes>"
        return f"<cudacore.PinnedBuffer 0x{self.ptr:x}, {self.size} bytes>"


# The C objects instantiate these subclasses, and every door raises through the one funnel, _errors.
fast.configure(Buffer, PinnedBuffer, _errors)


def allocate_pinned(device: Device, nbytes: int) -> PinnedBuffer:
    return fast.allocate_pinned(device.device_id, nbytes)


def _positive(name: str, value: Any, op: str = "cudacore.allocate_tiles") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {name} must be an int, not {type(value).__name__}")
    if value <= 0:
        raise error("CUDA_ERROR_INVALID_VALUE", f"{op}: {name} must be positive, got {value}", op=op)
    return value


def _why_not_sent(owner: object) -> str | None:
    """What the owner of a Buffer's memory says instead of the default refusal to pickle, if anything."""
    why = getattr(owner, "why_not_sent", None)
    return None if why is None else str(why())


def allocate_tiles(
    device: Device,
    count: int,
    tile_size: int,
    *,
    stream: StreamLike = None,
    progress: Callable[[int, int], object] | bool | None = None,
) -> list[Buffer]:
    """All-or-nothing allocation of ``count`` tiles; see :meth:`Device.allocate_tiles`."""
    _positive("count", count)
    _positive("tile_size", tile_size)
    handle = stream_handle(stream, device.device_id)
    ordinal = device.device_id
    callback, bar = _progress(progress, count, tile_size)
    if callback is None:
        # Through adopt (cudacore._owner): a KeyboardInterrupt between the allocation and the Buffers loses nothing.
        out = adopt(lambda owner: _wrap_tiles(ordinal, core.AllocateTiles(ordinal, count, tile_size, handle, owner), tile_size, handle))
        label_allocations(ordinal, [t.ptr for t in out])
        note_capture_buffers([t for t in out if t._graph_token])  # graph memory: Go gave it an owner token
        return out
    # With a progress callback the tiles come in batches (about 1% each), so that it is called while the
    # allocation proceeds; a failing batch releases every earlier tile, keeping it all or nothing.
    batch = max(1, math.ceil(count / 100))
    tiles: list[Buffer] = []
    try:
        while len(tiles) < count:
            n = min(batch, count - len(tiles))
            try:
                def take(owner: int, n: int = n) -> list[Buffer]:
                    return _wrap_tiles(ordinal, core.AllocateTiles(ordinal, n, tile_size, handle, owner), tile_size, handle)

                batch_tiles = adopt(take)
                tiles.extend(batch_tiles)
                label_allocations(ordinal, [t.ptr for t in batch_tiles])
            except OutOfMemoryError as exc:
                done = len(tiles) + int(exc.fields.get("tiles_allocated", "0"))
                _release_all(tiles)
                core.MemoryRelease(ordinal)
                raise _tiles_oom(device, exc, done, count, tile_size) from exc
            if callback(len(tiles), count) is False:
                _release_all(tiles)
                raise InterruptedError(f"allocate_tiles cancelled by the progress callback after {len(tiles)} of {count} tiles; all released")
    except BaseException:
        _release_all(tiles)
        raise
    finally:
        if bar is not None:
            bar.close()
    note_capture_buffers([t for t in tiles if t._graph_token])
    return tiles


def _wrap_tiles(ordinal: int, text: str, tile_size: int, handle: int) -> list[Buffer]:
    """Buffers for the "address:token" tiles core.AllocateTiles returned, each with its owner token."""
    out = []
    for item in text.split(","):
        p, _, token = item.partition(":")
        b = fast.wrap(ordinal, int(p), tile_size, handle)
        b._graph_token = int(token)
        out.append(b)
    return out


def _release_all(tiles: list[Buffer]) -> None:
    for t in reversed(tiles):
        t.close()


def _tiles_oom(device: Device, exc: OutOfMemoryError, done: int, count: int, tile_size: int) -> OutOfMemoryError:
    free, _ = device.memory_info()
    fit = free // tile_size
    fields = dict(exc.fields, tiles_requested=str(count), tiles_allocated=str(done), free=str(free), tiles_fit=str(fit))
    message = (
        f"allocated {done} of {count} tiles of {format_bytes(tile_size)} before running out of memory "
        f"(all released again); {fit} tiles of that size fit in the {format_bytes(free)} free now"
    )
    if exc.cause:  # the message leads with the verdict, as Go's does
        message = str(exc.args[0]).split(": ", 1)[0] + ": " + message
    out = OutOfMemoryError(message, code=exc.code, name=exc.name, op=exc.op, fields=fields)
    out.flight_record = exc.flight_record
    return out


def _progress(progress: Any, count: int, tile_size: int) -> tuple[Callable[[int, int], object] | None, Any]:
    if progress is None or progress is False:
        return None, None
    if progress is True:
        try:
            from tqdm.auto import tqdm  # type: ignore[import-untyped, unused-ignore]
        except ImportError as exc:
            # Checked before anything is allocated: the argument cannot be honoured here.
            raise error(
                "CUDA_ERROR_INVALID_VALUE",
                "cudacore.allocate_tiles: progress=True draws a tqdm progress bar, and tqdm is not installed: "
                "install it (pip install tqdm), or pass progress=False or a callable(done, total)",
                op="cudacore.allocate_tiles",
            ) from exc
        bar = tqdm(total=count, unit="tile", desc=f"allocating {count} tiles of {tile_size} B")

        def update(done: int, total: int) -> None:
            bar.update(done - bar.n)

        return update, bar
    if not callable(progress):
        raise TypeError("progress must be a callable(done, total), True (a tqdm bar) or None")
    return progress, None


def would_fit(device: Device, count: int, tile_size: int) -> dict[str, Any]:
    _positive("count", count, "cudacore.would_fit")
    _positive("tile_size", tile_size, "cudacore.would_fit")
    return json.loads(core.AdmitTiles(device.device_id, count, tile_size))


def memory_stats(device: Device) -> MemoryStats:
    counters = json.loads(core.MemoryStats(device.device_id))
    counters["by_library"] = _accounts.split(device.device_id, counters["pool_used"], counters["by_library"])
    return new_memory_stats(counters)
