"""Device memory and events shared between processes.

A :class:`SharedBuffer` (from :meth:`Device.allocate_shareable`) is device memory another process can
open. :meth:`SharedBuffer.export` gives an :class:`IpcHandle`; :meth:`IpcHandle.open` in the other process
gives an :class:`ImportedBuffer` viewing the same memory. Pickling a SharedBuffer (into a spawn worker's
arguments, a ``multiprocessing`` Queue or Pipe) carries such a handle and unpickles as the ImportedBuffer.

How the memory travels, by the device's allocation strategy:

- ``"pool"``: the block comes from an exportable memory pool of the device. The handle is the pool's POSIX
  file descriptor plus 64 bytes naming the block (cuMemPoolExportToShareableHandle,
  cuMemPoolExportPointer). A file descriptor crosses to another process only through the kernel: cudacore
  sends it with ``SCM_RIGHTS`` over a Unix socket, which ``multiprocessing`` does when it pickles (its
  ``reduction.DupFd``), and :meth:`IpcHandle.send` / :meth:`IpcHandle.receive` do over a socket of yours.
  ``pidfd_getfd`` was not chosen: it needs ptrace rights over the sender, which Yama's default
  (``ptrace_scope=1``) refuses between siblings.
- ``"sync"``: the block comes from cuMemAlloc and the handle is its 64-byte cuIpcMemHandle.

Lifetime. The exporter's memory stays valid while an importer holds it. Every export carries a *lease*, a
small shared-memory file with one slot per importing process: :meth:`IpcHandle.open` takes a slot and
:meth:`ImportedBuffer.close` gives it back. :meth:`SharedBuffer.close` while a live process holds a slot
raises :class:`IllegalStateError` naming the processes, and leaves the memory alone; slots of processes
that have exited are ignored. A SharedBuffer garbage collected while held is freed once the last holder
lets go (checked at later shareable calls and at exit). An importer whose exporter has closed the memory
cannot open the handle (:class:`IllegalStateError`).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import mmap
import os
import socket
import struct
import threading
import weakref
from multiprocessing import context, reduction
from typing import TYPE_CHECKING, Any, Literal

from ._api import core
from ._errors import CUDAError, error
from ._handles import as_device, stream_handle
from ._memory import Buffer
from ._native import fast
from ._stream import Event

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._device import Device

__all__ = ["ImportedBuffer", "IpcHandle", "SharedBuffer", "allocate_shareable"]

# -- the lease ------------------------------------------------------------------------------------------

_LEASE_SIZE = 4096
_LEASE_MAGIC = b"cclease1"
_SLOTS = 256  # importing processes one export can have at once
_HEAD = struct.Struct("<8siI")  # magic, exporter pid, closed flag
_SLOT = struct.Struct("<i")
_ALL_SLOTS = struct.Struct(f"<{_SLOTS}i")


class _Lease:
    """The importers of one export, across processes: a shared page of pid slots, changed under a POSIX
    record lock (between processes) and a thread lock (between threads of one process, which record
    locks do not separate)."""

    __slots__ = ("_fd", "_lock", "_mm")

    _thread_lock = threading.Lock()

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._mm = mmap.mmap(fd, _LEASE_SIZE)
        magic, _, _ = _HEAD.unpack_from(self._mm, 0)
        if magic != _LEASE_MAGIC:
            self._mm.close()
            raise error("CUDA_ERROR_INVALID_VALUE", "the handle's lease is not a cudacore lease", op="cudacore.open_shared")

    @classmethod
    def create(cls) -> _Lease:
        fd = os.memfd_create("cudacore-lease", os.MFD_CLOEXEC)
        os.ftruncate(fd, _LEASE_SIZE)
        os.pwrite(fd, _HEAD.pack(_LEASE_MAGIC, os.getpid(), 0), 0)
        return cls(fd)

    @property
    def fd(self) -> int:
        return self._fd

    @contextlib.contextmanager
    def _locked(self) -> Any:
        with self._thread_lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def _slots(self) -> tuple[int, ...]:
        return _ALL_SLOTS.unpack_from(self._mm, _HEAD.size)

    def take(self, pid: int) -> None:
        with self._locked():
            _, exporter, closed = _HEAD.unpack_from(self._mm, 0)
            if closed or not _alive(exporter):
                raise error(
                    "CUDA_ERROR_ILLEGAL_STATE",
                    f"the exporting process {exporter} has closed this memory (or exited); export it again from a live SharedBuffer",
                    op="cudacore.open_shared",
                )
            slots = self._slots()
            if 0 in slots:
                free = slots.index(0)
            else:  # every slot taken: reuse one of a process that has exited
                dead = [i for i, p in enumerate(slots) if not _alive(p)]
                if not dead:
                    raise error("CUDA_ERROR_ILLEGAL_STATE", f"{_SLOTS} processes hold this memory already", op="cudacore.open_shared")
                free = dead[0]
            _SLOT.pack_into(self._mm, _HEAD.size + 4 * free, pid)

    def give_back(self, pid: int) -> None:
        with self._locked():
            slots = self._slots()
            if pid in slots:
                _SLOT.pack_into(self._mm, _HEAD.size + 4 * slots.index(pid), 0)

    def holders(self) -> list[int]:
        """The live processes holding a slot (exited ones are cleared on the way)."""
        with self._locked():
            out = []
            for i, p in enumerate(self._slots()):
                if p and _alive(p):
                    out.append(p)
                elif p:
                    _SLOT.pack_into(self._mm, _HEAD.size + 4 * i, 0)
            return out

    def close_if_free(self) -> list[int]:
        """Mark the export closed unless live processes hold it; returns those holders."""
        with self._locked():
            live = [p for p in self._slots() if p and _alive(p)]
            if not live:
                magic, exporter, _ = _HEAD.unpack_from(self._mm, 0)
                _HEAD.pack_into(self._mm, 0, magic, exporter, 1)
            return live

    def release(self) -> None:
        with contextlib.suppress(Exception):
            self._mm.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the exporter's side --------------------------------------------------------------------------------


class _Share:
    """Owns one shareable allocation in the exporting process (the owner of its SharedBuffer)."""

    __slots__ = ("__weakref__", "device_id", "exported", "freed", "kind", "lease", "ptr", "size", "stream")

    def __init__(self, device_id: int, ptr: int, size: int, kind: str, stream: int) -> None:
        self.device_id, self.ptr, self.size, self.kind, self.stream = device_id, ptr, size, kind, stream
        self.lease: _Lease | None = None
        self.exported: tuple[str, str] | None = None  # (handle, pool id): the same for every export
        self.freed = False

    def free(self) -> list[int]:
        """Free the memory unless live importers hold it; returns those holders (nothing freed then)."""
        if self.freed:
            return []
        if self.lease is not None:
            holders = self.lease.close_if_free()
            if holders:
                return holders
        core.ShareFree(self.device_id, self.ptr, self.kind, self.stream)
        self.freed = True
        _exported.pop((self.device_id, self.ptr), None)
        if self.lease is not None:
            self.lease.release()
        return []

    def __del__(self) -> None:
        if self.freed:
            return
        with contextlib.suppress(Exception):
            if self.free():
                # Held by another process: the memory must stay valid; a stand-in frees it later.
                later = _Share(self.device_id, self.ptr, self.size, self.kind, self.stream)
                later.lease, self.lease = self.lease, None
                self.freed = True
                _exported.pop((self.device_id, self.ptr), None)
                with _pending_lock:
                    _pending.append(later)


_exported: dict[tuple[int, int], weakref.ReferenceType[_Share]] = {}
_pool_fds: dict[int, int] = {}  # device -> a descriptor of its exportable pool, duplicated for each export
_sync_events: dict[int, Event] = {}
_sync_lock = threading.Lock()


def _wait_for_stream(device_id: int, stream: int) -> None:
    """Wait for the work queued so far on a stream of the device (an event recorded there, synchronized)."""
    with _sync_lock:
        ev = _sync_events.get(device_id)
        if ev is None:
            ev = _sync_events[device_id] = Event(device_id, timing=False)
        try:
            ev.record(stream)
        except CUDAError as exc:
            if exc.name != "CUDACORE_ERROR_CLOSED":
                raise
            return  # the stream was closed: its work finished then, there is nothing to wait for
        ev.synchronize()


_pending: list[_Share] = []  # collected while held by importers: freed when they let go
_pending_lock = threading.Lock()


def _reap() -> None:
    """Free what was collected while importers held it, where they have let go since."""
    with _pending_lock:
        keep = []
        for share in _pending:
            # A failing free must not stop the others; that block is dropped.
            with contextlib.suppress(Exception):
                if share.free():
                    keep.append(share)
        _pending[:] = keep


atexit.register(_reap)


class SharedBuffer(Buffer):
    """Device memory that other processes can open: see :meth:`Device.allocate_shareable`.

    :meth:`export` (or pickling) hands it to another process. It is not drawn from the device's
    allocator, so it does not show in :meth:`Device.memory_stats`.
    """

    __slots__ = ()

    @property
    def kind(self) -> str:
        """How it is shared: ``"pool"`` (exportable pool, a file descriptor) or ``"ipc"`` (cuIpcMemHandle)."""
        owner = self.owner
        if owner is None:
            raise error("CUDACORE_ERROR_CLOSED", "the SharedBuffer was closed", op="cudacore.export")
        return str(owner.kind)

    def export(self) -> IpcHandle:
        """An :class:`IpcHandle` for another process. For pool memory it first waits for the work queued so
        far on the buffer's stream (the allocation is stream-ordered), so the importer sees the bytes written
        before the export."""
        share: _Share = self.owner
        if self.closed or share.freed:
            raise error("CUDACORE_ERROR_CLOSED", "cannot export a closed SharedBuffer", op="cudacore.export")
        if _pending:
            _reap()
        if share.kind == "pool":
            _wait_for_stream(self.device_id, share.stream)
        if share.exported is None:
            # The handle of an allocation never changes, nor does its pool's descriptor: the driver is asked
            # once, and later exports duplicate what it gave.
            info = json.loads(core.ShareExport(self.device_id, share.ptr, share.kind))
            if info["fd"] >= 0:
                with _pending_lock:
                    if _pool_fds.setdefault(self.device_id, info["fd"]) != info["fd"]:
                        os.close(info["fd"])
            share.exported = (info["handle"], info["pool_id"])
        if share.lease is None:
            share.lease = _Lease.create()
        handle, pool_id = share.exported
        return IpcHandle(
            kind=share.kind,
            device_id=self.device_id,
            size=share.size,
            handle=handle,
            pool_id=pool_id,
            pool_fd=os.dup(_pool_fds[self.device_id]) if share.kind == "pool" else None,
            lease_fd=os.dup(share.lease.fd),
            exporter=os.getpid(),
            ptr=share.ptr,
        )

    def close(self) -> None:
        """Free the memory. Raises :class:`IllegalStateError` (and frees nothing) while other processes
        hold it open; idempotent otherwise."""
        if self.closed:
            return
        share: _Share = self.owner
        holders = share.free()
        if holders:
            raise error(
                "CUDA_ERROR_ILLEGAL_STATE",
                f"processes {holders} still hold this memory open (imported from an IpcHandle); "
                "they must close their ImportedBuffers first",
                op="cudacore.free_shareable",
            )
        super().close()

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def __reduce__(self) -> tuple[Any, ...]:
        return (_open_handle, (self.export(),))

    def __repr__(self) -> str:
        if self.closed:
            return f"<cudacore.SharedBuffer closed, {self.size} bytes, device {self.device_id}>"
        return f"<cudacore.SharedBuffer 0x{self.ptr:x}, {self.size} bytes, device {self.device_id}, {self.kind}>"


def allocate_shareable(device: Device, nbytes: int, stream: object = None, kind: str | None = None) -> SharedBuffer:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"nbytes must be an int, not {type(nbytes).__name__}")
    if kind is not None and kind not in ("pool", "ipc"):
        raise error("CUDA_ERROR_INVALID_VALUE", f'unknown kind {kind!r}: use "pool", "ipc" or None (the device\'s)', op="cudacore.allocate_shareable")
    if _pending:
        _reap()
    handle = stream_handle(stream, device.device_id)
    ordinal = device.device_id
    kind = kind or core.ShareKind(ordinal)
    ptr = core.ShareAllocate(ordinal, nbytes, handle, kind)
    share = _Share(ordinal, ptr, nbytes, kind, handle)
    _exported[(ordinal, ptr)] = weakref.ref(share)
    buf = fast.borrow(SharedBuffer, ordinal, ptr, nbytes, handle, share)
    return buf


# -- the importer's side --------------------------------------------------------------------------------


class _Mapping:
    """Owns one opened import (the owner of its ImportedBuffer)."""

    __slots__ = ("closed", "device_id", "kind", "lease", "lock", "ptr")

    def __init__(self, device_id: int, ptr: int, kind: str, lease: _Lease | None) -> None:
        self.device_id, self.ptr, self.kind, self.lease = device_id, ptr, kind, lease
        self.closed = False
        self.lock = threading.Lock()  # one unmapping, however many threads close at once

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            # A failed unmapping leaves the memory mapped: it stays open, and held (the exporter must not
            # free it), so that close() can be called again.
            core.ShareClose(self.device_id, self.ptr, self.kind)
            self.closed = True
        if self.lease is not None:
            self.lease.give_back(os.getpid())
            self.lease.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class ImportedBuffer(Buffer):
    """Device memory of another process, opened from an :class:`IpcHandle`. :meth:`close` (or garbage
    collection) unmaps it and lets the exporter free it."""

    __slots__ = ()

    def close(self) -> None:
        if self.closed:
            return
        owner = self.owner
        if isinstance(owner, _Mapping):
            owner.close()
        super().close()

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self.ptr:x}"
        return f"<cudacore.ImportedBuffer {state}, {self.size} bytes, device {self.device_id}>"


class IpcHandle:
    """What another process needs to open a :class:`SharedBuffer`: made by :meth:`SharedBuffer.export`.

    It owns up to two file descriptors (the pool's, the lease's) until :meth:`close`. It pickles through
    ``multiprocessing`` (which passes the descriptors with ``SCM_RIGHTS``); over a Unix socket of your own use
    :meth:`send` and :meth:`receive`. A handle opens once per process; open it again after closing the
    buffer, or export again.
    """

    __slots__ = ("_closed", "device_id", "exporter", "handle", "kind", "lease_fd", "pool_fd", "pool_id", "ptr", "size")

    def __init__(
        self,
        *,
        kind: str,
        device_id: int,
        size: int,
        handle: str,
        pool_id: str,
        pool_fd: int | None,
        lease_fd: int,
        exporter: int,
        ptr: int,
    ) -> None:
        self.kind, self.device_id, self.size, self.handle, self.pool_id = kind, device_id, size, handle, pool_id
        self.pool_fd, self.lease_fd, self.exporter, self.ptr = pool_fd, lease_fd, exporter, ptr
        self._closed = False

    def fds(self) -> list[int]:
        """The file descriptors the handle owns (the pool's, if any, then the lease's)."""
        return [fd for fd in (self.pool_fd, self.lease_fd) if fd is not None]

    def _meta(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "device_id": self.device_id,
            "size": self.size,
            "handle": self.handle,
            "pool_id": self.pool_id,
            "exporter": self.exporter,
            "ptr": self.ptr,
            "has_pool_fd": self.pool_fd is not None,
        }

    def open(self, device: Device | int | None = None) -> Buffer:
        """Map the memory into this process: an :class:`ImportedBuffer` (in the exporting process itself, a
        Buffer viewing the SharedBuffer's memory). ``device`` (default: the exporter's ordinal) is the device
        that opens it, which must be the same GPU or a peer of it.

        Raises
        ------
        IllegalStateError
            If the exporter closed the memory or exited.
        """
        if self._closed:
            raise error("CUDACORE_ERROR_CLOSED", "this IpcHandle was closed", op="cudacore.open_shared")
        dev = as_device(self.device_id if device is None else device)
        if self.exporter == os.getpid():
            ref = _exported.get((self.device_id, self.ptr))
            share = ref() if ref is not None else None
            if share is None or share.freed:
                raise error("CUDA_ERROR_ILLEGAL_STATE", "the SharedBuffer this handle names was closed", op="cudacore.open_shared")
            return fast.borrow(Buffer, self.device_id, self.ptr, self.size, share.stream, share)
        lease = _Lease(os.dup(self.lease_fd))
        try:
            lease.take(os.getpid())
        except BaseException:
            lease.release()
            raise
        try:
            pool_fd = -1 if self.pool_fd is None else self.pool_fd
            ptr = core.ShareImport(dev.device_id, self.kind, self.handle, pool_fd, self.pool_id)
        except BaseException:
            lease.give_back(os.getpid())
            lease.release()
            raise
        return fast.borrow(ImportedBuffer, dev.device_id, ptr, self.size, 0, _Mapping(dev.device_id, ptr, self.kind, lease))

    def close(self) -> None:
        """Close the descriptors the handle owns. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for fd in self.fds():
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        if self._closed:
            raise error("CUDACORE_ERROR_CLOSED", "cannot send a closed IpcHandle", op="cudacore.export")
        fds = self.fds()
        if context.get_spawning_popen() is not None:
            # Pickled into a process being started: the descriptor numbers themselves are inherited when it
            # starts, after this handle may be gone, so they are duplicated and kept open for it.
            fds = [os.dup(fd) for fd in fds]
            _kept_for_children.extend(fds)
        return (_rebuild_handle, (self._meta(), [reduction.DupFd(fd) for fd in fds]))

    def send(self, sock: socket.socket) -> None:
        """Send the handle over a connected Unix socket (``AF_UNIX``), descriptors by ``SCM_RIGHTS``."""
        body = json.dumps(self._meta()).encode()
        socket.send_fds(sock, [struct.pack("<I", len(body)) + body], self.fds())

    @classmethod
    def receive(cls, sock: socket.socket) -> IpcHandle:
        """Receive a handle that :meth:`send` sent on the other end of ``sock``."""
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        (n,) = struct.unpack_from("<I", data, 0)
        meta = json.loads(data[4 : 4 + n])
        return _from_meta(meta, fds)

    def __repr__(self) -> str:
        return f"<cudacore.IpcHandle {self.kind}, {self.size} bytes, device {self.device_id}, from process {self.exporter}>"


#: Descriptors duplicated for processes being started (see IpcHandle.__reduce__); closed at exit.
_kept_for_children: list[int] = []


def _close_kept() -> None:
    for fd in _kept_for_children:
        with contextlib.suppress(OSError):
            os.close(fd)
    _kept_for_children.clear()


atexit.register(_close_kept)


def _from_meta(meta: dict[str, Any], fds: list[int]) -> IpcHandle:
    fds = list(fds)
    pool_fd = fds.pop(0) if meta["has_pool_fd"] else None
    return IpcHandle(
        kind=meta["kind"],
        device_id=meta["device_id"],
        size=meta["size"],
        handle=meta["handle"],
        pool_id=meta["pool_id"],
        pool_fd=pool_fd,
        lease_fd=fds[0],
        exporter=meta["exporter"],
        ptr=meta["ptr"],
    )


def _rebuild_handle(meta: dict[str, Any], dupfds: list[Any]) -> IpcHandle:
    return _from_meta(meta, [d.detach() for d in dupfds])


def _open_handle(handle: IpcHandle) -> Buffer:
    """Unpickling a SharedBuffer: open the handle here; the handle's descriptors are closed once opened."""
    try:
        return handle.open()
    finally:
        handle.close()
