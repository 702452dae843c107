"""Devices: detection, properties and the allocation strategy of each."""

from __future__ import annotations

import atexit
import json
import operator
import os
import threading
from contextlib import suppress
from typing import TYPE_CHECKING, Any, ClassVar

from . import _copy, _diagnostics, _ipc, _memory
from ._api import core
from ._display import device_html
from ._errors import CUDAError, DriverNotFoundError, error
from ._external import asbuffer
from ._handles import (
    current_ordinal,
    pop_current,
    push_current,
    register_device_type,
    set_current_ordinal,
)
from ._limits import Limits, limits_for
from ._module import Module, load_module
from ._native import fast
from ._stream import WAIT_SLICE_MS, Stream, StreamLike

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._display import MemoryStats
    from ._fast import Device as _CDevice
    from ._memory import Buffer, ManagedBuffer, PinnedBuffer
    from ._module import ImageLike
else:
    _CDevice = fast.Device

_device_allocate = fast.device_allocate


__all__ = ["Device", "backend", "current_device", "device_count", "devices", "driver_version"]


def backend() -> str:
    """The backend this process uses: ``"cuda"`` (the real driver) or ``"sim"`` (the simulator)."""
    return core.Backend()


def driver_version() -> tuple[int, int]:
    """The CUDA version of the driver as ``(major, minor)``, for example ``(13, 0)``."""
    v = core.DriverVersion()
    return v // 1000, v % 1000 // 10


def device_count() -> int:
    """The number of devices the driver sees: 0 where there is no CUDA driver or no device
    (:func:`unavailable_reason` says which), as ``torch.cuda.device_count()`` does.

    Raises
    ------
    CUDAError
        Any other failure: a bad ``CUDACORE_BACKEND`` or simulator setting (``InvalidValueError``), or a
        driver that failed to initialize.
    """
    try:
        return core.DeviceCount()
    except DriverNotFoundError:
        return 0
    except CUDAError as e:
        if e.name == "CUDA_ERROR_NO_DEVICE":
            return 0
        raise


def devices() -> list[Device]:
    """Every device, in ordinal order (none where there is no driver or no device)."""
    return [Device(i) for i in range(device_count())]


def unavailable_reason() -> str | None:
    """Why cudacore cannot use a device in this process (the error that says so, as text), or None when
    it can. Never raises."""
    try:
        n = core.DeviceCount()
    except CUDAError as e:
        return f"{type(e).__name__}: {e}"
    return None if n > 0 else "the driver sees no device"


def is_available() -> bool:
    """Whether cudacore can use a device in this process: the driver (or the simulator) loads and sees at
    least one device. Never raises; :func:`unavailable_reason` says why not."""
    return unavailable_reason() is None


def current_device() -> Device:
    """This thread's current device: device 0, unless ``with device:``, ``with stream:`` or
    :meth:`Device.use` made another one current. Every ``device=None`` argument means it.

    Raises
    ------
    DriverNotFoundError
        Where there is no CUDA driver (``CUDA_ERROR_NO_DEVICE``'s error where the driver sees no device):
        the message says to check :func:`is_available` first, as ``Device(i)`` does.
    """
    return Device(current_ordinal())


def _unavailable(e: CUDAError) -> CUDAError:
    """``e`` (no driver, or no device) again, its message pointing at the calls that check without raising."""
    return error(
        e.name,
        f"{e}. cudacore.is_available() says whether a device can be used without raising, and "
        "cudacore.unavailable_reason() gives this reason",
        op=e.op,
        **e.fields,
    )


def _ordinal(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("device ordinal must be an int, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"device ordinal must be an int, not {type(value).__name__}") from None


def _peer_ordinal(peer: Any) -> int:
    if isinstance(peer, Device):
        return peer._ordinal
    ordinal = _ordinal(peer)
    if ordinal < 0:
        raise error("CUDA_ERROR_INVALID_VALUE", f"device ordinal must be >= 0, got {ordinal}", op="cudacore.can_access_peer")
    return ordinal


class Device(_CDevice):
    """A CUDA device. ``Device(i)`` returns the same object for the same ordinal.

    Opening a device retains its primary context and chooses how it allocates memory
    (:attr:`allocation_strategy`). Properties are read once; :meth:`memory_info` asks the driver each time.

    ``with device:`` makes it this thread's current device for the block (nesting restores the previous
    one); :meth:`use` makes it current until changed. Calls that take ``device=None`` use the current
    device, and ``stream=None`` means the current stream of the device a call works on.

    Parameters
    ----------
    ordinal : int
        The device's index, from 0 to ``device_count() - 1``.

    Raises
    ------
    InvalidValueError
        If there is no device with that ordinal.
    DriverNotFoundError
        If no CUDA driver can be loaded (set ``CUDACORE_BACKEND=sim`` to use the simulator).
    """

    # The C base (cudacore/native/device.c) holds _ordinal, which the direct path reads.
    __slots__ = ("_props",)
    _props: dict[str, Any]

    _cache: ClassVar[dict[int, Device]] = {}
    _lock = threading.Lock()

    def __new__(cls, ordinal: int = 0) -> Device:  # noqa: PYI034 - not meant to be subclassed
        ordinal = _ordinal(ordinal)
        dev = cls._cache.get(ordinal)
        if dev is not None:
            return dev
        if ordinal < 0:
            raise error("CUDA_ERROR_INVALID_VALUE", f"device ordinal must be >= 0, got {ordinal}", op="cudacore.device")
        try:
            props = json.loads(core.DeviceProperties(ordinal))
        except CUDAError as e:
            if isinstance(e, DriverNotFoundError) or e.name == "CUDA_ERROR_NO_DEVICE":
                raise _unavailable(e) from None
            raise
        with cls._lock:
            dev = cls._cache.get(ordinal)
            if dev is None:
                dev = object.__new__(cls)
                dev._ordinal = ordinal
                dev._set_props(props)
                cls._cache[ordinal] = dev
        return dev

    def _set_props(self, props: dict[str, Any]) -> None:
        self._props = props

    def __reduce__(self) -> tuple[Any, ...]:
        return (Device, (self._ordinal,))

    @property
    def device_id(self) -> int:
        """The ordinal of this device."""
        return self._ordinal

    ordinal = device_id

    @property
    def name(self) -> str:
        """The product name, for example ``"NVIDIA H100 80GB HBM3"``."""
        return self._props["name"]

    @property
    def uuid(self) -> str:
        """The device UUID as nvidia-smi prints it (``GPU-xxxxxxxx-...``)."""
        return self._props["uuid"]

    @property
    def pci_bus_id(self) -> str:
        """The PCI bus id, ``domain:bus:device.function``."""
        return self._props["pci_bus_id"]

    @property
    def compute_capability(self) -> tuple[int, int]:
        """``(major, minor)``, for example ``(9, 0)`` for Hopper."""
        major, minor = self._props["compute_capability"]
        return major, minor

    @property
    def multiprocessor_count(self) -> int:
        """The number of streaming multiprocessors."""
        return self._props["multiprocessor_count"]

    @property
    def total_memory(self) -> int:
        """Total device memory in bytes."""
        return self._props["total_memory"]

    @property
    def memory_pools_supported(self) -> bool:
        """Whether the driver offers stream-ordered memory pools on this device."""
        return self._props["memory_pools_supported"]

    @property
    def tcc_driver(self) -> bool:
        """Whether the device runs the Windows TCC driver (always False on Linux)."""
        return self._props["tcc_driver"]

    @property
    def managed_memory(self) -> bool:
        """Whether the device supports managed (unified) memory."""
        return self._props["managed_memory"]

    @property
    def integrated(self) -> bool:
        """Whether the device is integrated with the host (shares its memory)."""
        return self._props["integrated"]

    @property
    def allocation_strategy(self) -> str:
        """``"pool"`` (stream-ordered, cuMemAllocAsync) or ``"sync"`` (cuMemAlloc/cuMemFree)."""
        return self._props["allocation_strategy"]

    @property
    def allocation_strategy_reason(self) -> str:
        """Why this device got its allocation strategy, in one sentence."""
        return self._props["allocation_strategy_reason"]

    @property
    def properties(self) -> dict[str, Any]:
        """Every property the driver reported, as a new dict."""
        return dict(self._props)

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` device memory in bytes, as the driver reports it now."""
        return core.DeviceFreeMemory(self._ordinal), self._props["total_memory"]

    @property
    def limits(self) -> Limits:
        """The device's limits: ``d.limits.malloc_heap_size = 256 << 20`` (see :class:`cudacore.Limits`)."""
        return limits_for(self)

    def load_module(self, image: ImageLike) -> Module:
        """Load PTX, a cubin or a fatbin (bytes, PTX text or a path) into this device: a :class:`cudacore.Module`."""
        return load_module(self, image)

    # -- current device -----------------------------------------------------------------------------------

    def use(self) -> Device:
        """Make this device current on this thread (see :func:`cudacore.current_device`); returns it.

        It stays current until the next ``use()``, or until a ``with`` block of device or stream that was
        open before the call ends (which restores what was current when it began).
        """
        set_current_ordinal(self._ordinal)
        return self

    def __enter__(self) -> Self:
        """Make this device current on this thread until the block ends."""
        push_current(self, self._ordinal, None)
        return self

    def __exit__(self, *exc: object) -> None:
        """Make the device that was current before the block current again."""
        pop_current(self)

    # -- streams ----------------------------------------------------------------------------------------

    def create_stream(self, non_blocking: bool = True, priority: int = 0) -> Stream:
        """A new :class:`cudacore.Stream` on this device.

        Parameters
        ----------
        non_blocking : bool
            True (the default): the stream does not synchronize with the legacy default stream.
        priority : int
            Lower is greater; clamped to the device's range.
        """
        return Stream(self, non_blocking=non_blocking, priority=priority)

    def synchronize(self) -> None:
        """Wait for all work on this device. Other threads run meanwhile; Ctrl-C stops the wait.

        Raises
        ------
        CaptureError
            While a stream of this device captures (the driver's error 900).
        """
        fresh = True  # a wait given up earlier (Ctrl-C) may still run: it does not cover newer work
        while not core.DeviceSynchronize(self._ordinal, WAIT_SLICE_MS, fresh):
            fresh = False

    # -- several devices -------------------------------------------------------------------------------

    def can_access_peer(self, peer: Device | int) -> bool:
        """Whether this device can read and write ``peer``'s memory directly (NVLink or PCIe peer to peer).

        False for the device itself. Copies between any two devices work either way
        (:func:`cudacore.device_to_device`); without peer access the driver stages them through the host.
        """
        return bool(core.CanAccessPeer(self._ordinal, _peer_ordinal(peer)))

    def enable_peer_access(self, peer: Device | int) -> None:
        """Let this device access ``peer``'s memory: kernels here may then read and write ``peer``'s
        buffers, those of its memory pools included (cuCtxEnablePeerAccess and cuMemPoolSetAccess).
        Idempotent; one direction only (call it on ``peer`` too for the other).

        Raises
        ------
        NotSupportedError
            If the two cannot access each other (``can_access_peer`` is False), or ``peer`` is this device.
        """
        other = _peer_ordinal(peer)
        if other == self._ordinal:
            raise error("CUDA_ERROR_INVALID_VALUE", f"device {other} is this device; peer access is between two devices", op="cudacore.enable_peer_access")
        core.EnablePeerAccess(self._ordinal, other)

    # -- memory -----------------------------------------------------------------------------------------

    def allocate_shareable(self, nbytes: int, stream: StreamLike = None, *, kind: str | None = None) -> _ipc.SharedBuffer:
        """Allocate ``nbytes`` of device memory that other processes can open (a :class:`SharedBuffer`).

        Export it with :meth:`SharedBuffer.export` or pickle it into a ``multiprocessing`` worker: see
        docs/guide/multi-gpu.md. By default, with the pool strategy the memory comes from an exportable pool,
        ordered on ``stream``, and with the synchronous one from cuMemAlloc (see ``kind``). It is not drawn from this device's allocator
        (no cache: its memory must not be reused while another process maps it).

        Parameters
        ----------
        nbytes : int
            The size in bytes, positive.
        stream : Stream, optional
            The stream the allocation and its free are ordered on (pool kind); None: the legacy stream.
        kind : {None, "pool", "ipc"}
            How the memory is shared: None follows the allocation strategy; ``"ipc"`` asks for cuMemAlloc
            memory with a cuIpcMemHandle (which other libraries, CuPy's ``ipcOpenMemHandle`` for one, can
            open too), ``"pool"`` for an exportable pool's block (needs memory pools).

        Raises
        ------
        InvalidValueError
            If ``nbytes`` is not positive, or ``kind`` unknown.
        NotSupportedError
            For ``kind="pool"`` on a device without memory pools.
        CaptureError
            While a stream captures (shareable memory is made before or after a capture).
        """
        return _ipc.allocate_shareable(self, nbytes, stream, kind)

    def allocate(self, nbytes: int, stream: StreamLike = None) -> Buffer:
        """Allocate ``nbytes`` of device memory, ordered on ``stream`` (None: this device's current stream).

        Returns a :class:`Buffer`; use it in a ``with`` block or call ``close()``.

        Raises
        ------
        OutOfMemoryError
            If the memory is not there (also a ``MemoryError``). The message says what was asked, what is
            free, what this process holds and what to try; nothing stays allocated.
        InvalidValueError
            If ``nbytes`` is not positive.
        """
        # C resolves the stream (the current one for None) and hands a buffer allocated while a stream
        # captures to the capture bookkeeping (_stream.note_capture_buffers).
        return _device_allocate(self._ordinal, nbytes, stream)

    def from_array(self, array: Any) -> Buffer:
        """A CuPy/PyTorch/Numba array (``__cuda_array_interface__`` or ``__dlpack__``) on this device as a
        :class:`cudacore.Buffer` without a copy: see :func:`cudacore.asbuffer`.

        It never copies, so it takes device memory only: host data (numpy, bytes, a CPU tensor) is uploaded
        by :meth:`to_device`.

        Raises
        ------
        TypeError
            If ``array`` is host memory (the message names :meth:`to_device`), or not an array.
        """
        if _copy.is_host_memory(array):
            raise TypeError(
                f"Device.from_array views device memory without a copy, and {type(array).__name__} is host memory: "
                "upload it with Device.to_device(array) (a new Buffer holding a copy)"
            )
        return asbuffer(array, device=self)

    def to_device(self, host: Any, stream: StreamLike = None) -> Buffer:
        """Upload host data into a new :class:`Buffer` of its size on this device: a numpy array, anything
        with the buffer protocol (bytes, bytearray, memoryview, array.array), a :class:`PinnedBuffer`, or a
        host DLPack tensor (a CPU torch tensor, say). The buffer is allocated on ``stream`` and the copy
        ordered there (None: the current stream, and the copy is synchronous), as
        ``allocate(n, stream).copy_from(host, stream)``.

        Raises
        ------
        TypeError
            If ``host`` is device memory (use :meth:`from_array` to view it without a copy), or not memory.
        InvalidValueError
            If ``host`` is empty (a Buffer holds at least one byte).
        """
        op = "cudacore.to_device"
        memory, nbytes, release = _copy.host_memory(host, self._ordinal, stream, op)
        try:
            buf = self.allocate(nbytes, stream)
            try:
                _copy.host_to_device(buf, memory, stream, nbytes)
            except BaseException:
                buf.close()
                raise
        finally:
            release()
        return buf

    def allocate_managed(self, nbytes: int) -> ManagedBuffer:
        """Allocate ``nbytes`` of managed (unified) memory: a :class:`ManagedBuffer`, valid on the host and
        every device, which may be larger than this device's memory (the driver pages it).

        Raises
        ------
        NotSupportedError
            If the device has no managed memory (see :attr:`managed_memory`).
        CaptureError
            During a capture that forbids synchronous allocation on this thread.
        """
        return _memory.allocate_managed(self, nbytes)

    def allocate_pinned(self, nbytes: int) -> PinnedBuffer:
        """Allocate ``nbytes`` of page-locked host memory (a :class:`PinnedBuffer`, with the buffer protocol)."""
        return _memory.allocate_pinned(self, nbytes)

    def allocate_tiles(
        self, count: int, tile_size: int, *, stream: StreamLike = None, progress: Any = None
    ) -> list[Buffer]:
        """Allocate ``count`` buffers of ``tile_size`` bytes, all or nothing.

        Parameters
        ----------
        count, tile_size : int
            How many tiles, and the bytes in each.
        stream : Stream, optional
            The stream the tiles are ordered on.
        progress : callable or bool, optional
            ``progress(done, total)`` is called as tiles are allocated (returning False cancels);
            ``True`` shows a tqdm progress bar.

        Raises
        ------
        OutOfMemoryError
            If they do not all fit. Every tile already taken is released first, and the message says how
            many tiles of that size fit now.
        """
        return _memory.allocate_tiles(self, count, tile_size, stream=stream, progress=progress)

    def would_fit(self, count: int, tile_size: int = 1) -> bool:
        """Whether ``count`` allocations of ``tile_size`` bytes would fit now (free memory plus the cache)."""
        return bool(_memory.would_fit(self, count, tile_size)["fits"])

    def memory_stats(self) -> MemoryStats:
        """The allocator's counters: ``in_use``, ``peak_in_use``, ``cached``, ``reserved``,
        ``allocations``, ``frees``, ``ooms``, ``failures``, ``recycled`` (of the allocations, those served
        with a block closed just before, without entering the allocator: docs/guide/memory.md), ``limit``,
        ``pinned_in_use``, ``pinned_staging`` (the pinned staging buffers of pageable copies, at most eight
        of 4 MiB: docs/guide/memory.md), ``orphaned`` (freed blocks of other libraries' streams that were destroyed
        meanwhile, waiting for a device synchronize: docs/guide/memory.md), ``strategy``, ``graph_destroy_failures`` and ``graph_destroys_pending``
        (graph destroys the driver refused, and graphs kept to destroy again: docs/guide/capture.md),
        ``pool_used`` (what the allocator's pool hands out, to every library drawing from it),
        ``pool_shared`` (whether that is the pool of :func:`cudacore.share_pool`) and ``by_library``
        (``pool_used`` split by library: the libraries' counts, the remainder of the one library without a
        count as ``"<name> (by difference)"``, the rest ``"unattributed"``; empty on the ``"sync"``
        strategy: docs/guide/one-pool.md), ..."""
        return _memory.memory_stats(self)

    def reset_peak_memory_stats(self) -> int:
        """Set ``peak_in_use`` to what is in use now; returns it."""
        return core.MemoryResetPeak(self._ordinal)

    def release_cached_memory(self) -> int:
        """Give the allocator's cached memory back to the device, and what the exportable pool of
        :meth:`allocate_shareable` keeps for reuse; returns the bytes the allocator still caches."""
        cached = core.MemoryRelease(self._ordinal)  # synchronizes the device first
        core.ShareRelease(self._ordinal)
        return cached

    @property
    def memory_limit(self) -> int | None:
        """A cap on the bytes this process's allocator hands out on this device (None: no cap)."""
        return self.memory_stats()["limit"] or None

    @memory_limit.setter
    def memory_limit(self, nbytes: int | None) -> None:
        if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int)):
            raise TypeError(f"memory_limit must be an int number of bytes or None, not {type(nbytes).__name__}")
        core.MemorySetLimit(self._ordinal, 0 if nbytes is None else nbytes)

    def set_allocation_strategy(self, strategy: str = "auto", *, track: bool = False) -> None:
        """Rebuild this device's allocator: ``"auto"``, ``"pool"`` or ``"sync"``.

        Refused while memory is allocated through the current allocator (:class:`IllegalStateError`) and
        while a stream captures (:class:`CaptureError`). ``track=True`` records every live allocation (see
        :meth:`live_allocations`), at some cost per call.
        """
        if not isinstance(strategy, str):
            raise TypeError(f"strategy must be a str, not {type(strategy).__name__}")
        if strategy not in ("auto", "pool", "sync"):  # the name first: whatever is allocated, a typo is a typo
            raise error(
                "CUDA_ERROR_INVALID_VALUE",
                f"unknown allocation strategy {strategy!r}: use \"auto\", \"pool\" or \"sync\"",
                op="cudacore.allocation_strategy",
            )
        self._set_props(json.loads(core.DeviceSetAllocationStrategy(self._ordinal, strategy, bool(track))))
        if track:  # live allocations then name the Python line that made each
            _diagnostics.track_python_stacks()

    def live_allocations(self) -> list[dict[str, Any]]:
        """The allocations alive now (with ``track=True``; else empty): ptr, size, stream, where (the
        innermost Python frames that made it, ``file:line in function``, innermost first)."""
        return json.loads(core.MemoryLive(self._ordinal))

    def _repr_html_(self) -> str:
        return device_html(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other._ordinal == self._ordinal

    def __hash__(self) -> int:
        return hash(("cudacore.Device", self._ordinal))

    def __repr__(self) -> str:
        major, minor = self.compute_capability
        gib = self.total_memory / (1 << 30)
        return (
            f"<cudacore.Device {self._ordinal}: {self.name!r}, compute {major}.{minor}, "
            f"{gib:.1f} GiB, allocator {self.allocation_strategy!r}>"
        )


def _release_at_exit() -> None:
    """At interpreter exit, give each open device's cached memory back to the driver.

    Memory that Buffers closed into the allocator's cache is still allocated as far as the driver knows;
    tools that check for leaks at exit (compute-sanitizer's ``--leak-check full``) would count it. The
    release synchronizes each device first. A forked child (which may not use the driver) and a failure
    are skipped silently; ``CUDACORE_RELEASE_AT_EXIT=0`` turns it off.
    """
    if os.environ.get("CUDACORE_RELEASE_AT_EXIT", "1") == "0":
        return
    for dev in list(Device._cache.values()):
        with suppress(Exception):
            dev.release_cached_memory()


atexit.register(_release_at_exit)

# The handles below (Buffer.device, Stream(0), ...) reach Device through _handles, never by importing this
# module: register the class there now, at import (the contract is in _handles' docstring).
register_device_type(Device)
