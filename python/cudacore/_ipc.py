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
small shared-memory file with one slot per import: :meth:`IpcHandle.open` takes a slot and
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
import functools
import json
import mmap
import os
import select
import socket
import struct
import sys
import threading
import weakref
from collections.abc import Callable
from multiprocessing import context, reduction, resource_sharer
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ._api import check_not_forked, core
from ._errors import CUDAError, error
from ._handles import as_device, stream_handle
from ._memory import Buffer
from ._native import fast
from ._owner import Descriptors, Owner, close_buffer, owner_of, uninterrupted
from ._stream import Event, _hold_interrupts, _release_interrupts, interrupt_edge

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._device import Device

__all__ = ["ImportedBuffer", "IpcHandle", "SharedBuffer", "allocate_shareable"]

_T = TypeVar("_T")
_A = TypeVar("_A")

# -- the lease ------------------------------------------------------------------------------------------

_LEASE_SIZE = 4096
_LEASE_MAGIC = b"cclease2"
_HEAD = struct.Struct("<8siI")  # magic, exporter pid, closed flag
_SLOT = struct.Struct("<qq")  # an import's process id and its owner's token (_Mapping.token); zeros: free
_SLOTS_AT = _HEAD.size
_SLOTS = (_LEASE_SIZE - _SLOTS_AT) // _SLOT.size  # imports of one export at once, in all processes
_SLOTS_END = _SLOTS_AT + _SLOTS * _SLOT.size
_FREE = bytes(_SLOT.size)


def _find_slot(mm: mmap.mmap, slot: bytes) -> int:
    """The offset of the first slot whose bytes are ``slot``, or -1 (a match across two slots is skipped)."""
    at = mm.find(slot, _SLOTS_AT, _SLOTS_END)
    while at >= 0 and (at - _SLOTS_AT) % _SLOT.size:
        at = mm.find(slot, at + 1, _SLOTS_END)
    return at


class _Lease(Descriptors):
    """The imports of one export, across processes: a shared page with one slot per import (its process
    and its owner's token), changed under a lock of the file (between processes, see :func:`_file_lock`)
    and a thread lock (between threads of one process: a lock of the file taken twice by one process, or
    through one open file description, excludes nothing). It owns its descriptors and mapping (closed
    once, by :meth:`close`).

    In an importing process one lease object serves every import of the export (see :func:`_attach`):
    :attr:`users` holds the tokens of the imports that use it, and :attr:`exporter_gone` answers whether
    the exporter has exited (a poll of a pidfd of it, which the lease owns, where the kernel has them;
    None: ask :func:`_alive`)."""

    __slots__ = ("_fd", "_lock_file", "_mm", "_unlock_file", "exporter_gone", "users")

    _thread_lock = threading.Lock()

    def __init__(self, fd: int, *, dup: bool = False) -> None:
        """Own ``fd``, or with ``dup`` a duplicate of it, made and owned in one C-level step (extend over
        map: no interrupt can come between the dup and its owner)."""
        super().__init__([] if dup else [fd])
        self.exporter_gone: Callable[[], object] | None = None
        self.users: set[int] = set()
        if dup:
            try:
                self.fds.extend(map(os.dup, [fd]))
            except OSError as exc:  # a number that names no open file (closed behind the handle's back)
                self.close()
                raise _lease_not_open(fd, exc) from exc
            fd = self.fds[0]
        self._fd = fd
        try:
            self._mm = mmap.mmap(fd, _LEASE_SIZE)
        except (OSError, ValueError) as exc:
            # A pipe, a socket, a read-only or short file: not a lease that export() made.
            self.close()
            raise error(
                "CUDA_ERROR_INVALID_VALUE",
                f"the handle's lease descriptor is not a cudacore lease (it cannot be mapped: {exc}); "
                "use an IpcHandle from SharedBuffer.export() as it arrived",
                op="cudacore.open_shared",
            ) from exc
        except BaseException:
            self.close()
            raise
        magic, exporter, _ = _HEAD.unpack_from(self._mm, 0)
        if magic != _LEASE_MAGIC or exporter <= 0:
            self.close()
            raise error("CUDA_ERROR_INVALID_VALUE", "the handle's lease is not a cudacore lease", op="cudacore.open_shared")
        try:
            self._lock_file, self._unlock_file = _file_lock(self)
        except BaseException:
            self.close()
            raise

    @classmethod
    def create(cls) -> _Lease:
        return _new_lease(cls)

    def _release(self) -> None:
        mm = getattr(self, "_mm", None)
        if mm is not None:
            with contextlib.suppress(Exception):
                mm.close()
        super()._release()

    @property
    def fd(self) -> int:
        return self._fd

    def usable(self) -> bool:
        """Whether the lease can be read: not closed, nor its mapping (a close that an interrupt cut short
        after unmapping it leaves ``closed`` unset; its next close finishes it)."""
        mm = getattr(self, "_mm", None)
        return not self.closed and mm is not None and not mm.closed

    def ended(self) -> bool:
        """Whether the exporter has closed the memory or exited. Read without the locks: the closed flag,
        once set, stays set."""
        _, exporter, closed = _HEAD.unpack_from(self._mm, 0)
        if closed:
            return True
        gone = self.exporter_gone
        return bool(gone()) if gone is not None else not _alive(exporter)

    def _locked(self, fn: Callable[[_A], _T], arg: _A) -> _T:
        """``fn(arg)`` under the lease's locks: the owner's (the lease is not closed meanwhile), the thread
        lock and the record lock.

        A plain function, not a context manager: a KeyboardInterrupt can come only at the end of a call, at
        a loop's back edge or at a function's entry, and here each of those lies inside the ``with`` or
        ``try`` that gives its lock back. A context manager holds its locks across the return of its
        ``__enter__`` and the entry of its ``__exit__``, where an interrupt leaves them held (the thread lock
        is not reentrant: the next lease call of the thread then waits for good). For the same reason the
        file's lock is taken and given back by calls of C objects (:func:`_file_lock`), which have no entry
        where an interrupt could come.

        Raises
        ------
        IllegalStateError
            In a process forked from one that had loaded cudacore: the child shares the parent's open file
            description, and with it the lock, so it would change the page unexcluded from the parent.
        """
        check_not_forked()
        with self._lock:
            if not self.usable():
                raise error("CUDACORE_ERROR_CLOSED", "the lease was closed", op="cudacore.open_shared")
            with self._thread_lock:
                try:
                    self._lock_file()
                    return fn(arg)
                finally:
                    self._unlock_file()

    def _taken(self) -> list[tuple[int, int]]:
        """The offset and process id of each slot taken."""
        slots = _SLOT.iter_unpack(self._mm[_SLOTS_AT:_SLOTS_END])
        return [(_SLOTS_AT + i * _SLOT.size, pid) for i, (pid, _) in enumerate(slots) if pid]

    def take(self, pid: int, token: int) -> None:
        """Take a slot for the import of process ``pid`` whose owner's token is ``token`` (an importer's
        lease, which :func:`_attach` gave that import).

        Without the owner's lock, unlike :meth:`_locked`: an importer's lease is closed only while no
        import uses it (:func:`_forget_idle`), and this runs while one does. The steps are those of
        :meth:`_locked` and :meth:`ended`, written out: an open makes this call and :meth:`give_back`
        once each.

        Raises
        ------
        IllegalStateError
            If the exporter has closed the memory or exited, or every slot is taken by a live process.
        """
        check_not_forked()
        mm = self._mm
        with self._thread_lock:
            try:
                self._lock_file()
                _, exporter, closed = _HEAD.unpack_from(mm, 0)
                gone = self.exporter_gone
                if closed or (gone() if gone is not None else not _alive(exporter)):
                    raise error(
                        "CUDA_ERROR_ILLEGAL_STATE",
                        f"the exporting process {exporter} has closed this memory (or exited); export it again from a live SharedBuffer",
                        op="cudacore.open_shared",
                    )
                at = _find_slot(mm, _FREE)
                if at < 0:  # every slot taken: reuse one of a process that has exited
                    at = next((at for at, pid in self._taken() if not _alive(pid)), -1)
                    if at < 0:
                        raise error("CUDA_ERROR_ILLEGAL_STATE", f"{_SLOTS} imports hold this memory already", op="cudacore.open_shared")
                _SLOT.pack_into(mm, at, pid, token)
            finally:
                self._unlock_file()

    def give_back(self, pid: int, token: int) -> None:
        """Free the slot that :meth:`take` took for ``pid`` and ``token``; nothing where none is (again).
        Without the owner's lock, as :meth:`take`."""
        check_not_forked()
        mm = self._mm
        with self._thread_lock:
            try:
                self._lock_file()
                at = _find_slot(mm, _SLOT.pack(pid, token))
                if at >= 0:
                    mm[at : at + _SLOT.size] = _FREE
            finally:
                self._unlock_file()

    def holders(self) -> list[int]:
        """The live processes holding a slot (slots of exited ones are freed on the way)."""
        return self._locked(self._holders, None)

    def _holders(self, _: None) -> list[int]:
        alive: dict[int, bool] = {}
        for at, pid in self._taken():
            if pid not in alive:
                alive[pid] = _alive(pid)
            if not alive[pid]:
                self._mm[at : at + _SLOT.size] = _FREE
        return [pid for pid, live in alive.items() if live]

    def close_if_free(self) -> list[int]:
        """Mark the export closed unless live processes hold it; returns those holders."""
        return self._locked(self._close_if_free, None)

    def _close_if_free(self, _: None) -> list[int]:
        live = [pid for pid in dict.fromkeys(pid for _, pid in self._taken()) if _alive(pid)]
        if not live:
            magic, exporter, _ = _HEAD.unpack_from(self._mm, 0)
            _HEAD.pack_into(self._mm, 0, magic, exporter, 1)
        return live

    def release(self) -> None:
        self.close()


#: ``struct flock`` of 64-bit Linux: type, whence, start, length (0: to the end of the file) and pid
#: (0, as open file description locks require). Both locks cover the whole file.
_FLOCK = struct.Struct("@hhqqi4x")
_OFD_LOCKS = sys.platform == "linux" and hasattr(fcntl, "F_OFD_SETLKW") and struct.calcsize("P") == 8
_WHOLE_FILE_WRITE = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
_WHOLE_FILE_UNLOCK = _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0)


def _file_lock(lease: _Lease) -> tuple[Callable[[], object], Callable[[], object]]:
    """How ``lease`` takes and gives back the lock that excludes other processes from its page: two C
    callables (no Python frame of their own, so an interrupt comes only before or after them).

    A POSIX record lock (``lockf``) belongs to the process and the file, and the close of *any* descriptor
    of the file in the process drops it: an IpcHandle closed, an idle lease let go or a duplicate closed by
    one thread while another is inside a lease section would let another process in. So the lock is an
    open file description lock (``F_OFD_SETLKW``), which belongs to the description it is taken through,
    taken through a description this lease opens for itself (``/proc/self/fd/N`` opened anew gives a new
    one) and owns until it is closed, which :meth:`_Lease.close` does only outside every section (under
    the owner's lock, or for an importer's lease once no import uses it). The descriptors of the lease
    that cross processes share one description (``dup``, ``SCM_RIGHTS``), whose lock would be both
    sides': each process's own description is what makes the lock exclude. OFD and POSIX locks of one
    file conflict, so a process that fell back (below) and one that did not still exclude each other.

    Where the kernel has no OFD locks (before Linux 3.15) or the description cannot be opened (no
    ``/proc``, or the file's permissions refuse), the lease falls back to the POSIX record lock through
    its own descriptor: correct between processes, except while another thread of this process closes a
    descriptor of the same file during a section, which drops the lock early."""
    fd = lease.fd
    if _OFD_LOCKS:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _WHOLE_FILE_WRITE)  # asks the kernel, takes nothing
            # Made and owned in one C-level step (extend over map): no interrupt between the open and the
            # append. Close-on-exec: never inherited by a program this process starts.
            lease.fds.extend(map(functools.partial(os.open, flags=os.O_RDWR | os.O_CLOEXEC), [f"/proc/self/fd/{fd}"]))
        except OSError:
            pass
        else:
            own = lease.fds[-1]
            return (
                functools.partial(fcntl.fcntl, own, fcntl.F_OFD_SETLKW, _WHOLE_FILE_WRITE),
                functools.partial(fcntl.fcntl, own, fcntl.F_OFD_SETLK, _WHOLE_FILE_UNLOCK),
            )
    return functools.partial(fcntl.lockf, fd, fcntl.LOCK_EX), functools.partial(fcntl.lockf, fd, fcntl.LOCK_UN)


def _lease_not_open(fd: int, exc: OSError) -> CUDAError:
    return error("CUDA_ERROR_INVALID_VALUE", f"the handle's lease descriptor {fd} is not open: {exc}", op="cudacore.open_shared")


@interrupt_edge
def _new_lease(cls: type[_Lease]) -> _Lease:
    """A new lease (:meth:`_Lease.create`). Its descriptor exists from memfd_create's return on, before a
    statement could hand it to its owner: interrupts are held back until the lease owns it."""
    held = _hold_interrupts()
    try:
        fd = os.memfd_create("cudacore-lease", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, _LEASE_SIZE)
            os.pwrite(fd, _HEAD.pack(_LEASE_MAGIC, os.getpid(), 0), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)
    finally:
        if held:
            _release_interrupts(raise_held=True)  # raised here, the lease is collected and closes it


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: an exited process not yet reaped (a zombie) holds nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # no /proc: the signal's answer stands
    # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ")".
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def _exited() -> bool:
    return True


def _watch_exporter(lease: _Lease) -> None:
    """Set ``lease.exporter_gone`` (an importer's lease): a poll of a pidfd of the exporter, which becomes
    readable once the process has exited, reaped or not, so that opening asks one system call where
    :func:`_alive` asks two and reads /proc. Where the kernel has no pidfds (before Linux 5.3, or a
    sandbox that refuses the call) it stays None, and each open asks :func:`_alive`."""
    _, exporter, _ = _HEAD.unpack_from(lease._mm, 0)
    try:
        lease.fds.extend(map(os.pidfd_open, [exporter]))  # made and owned in one C-level step
    except ProcessLookupError:
        lease.exporter_gone = _exited
        return
    except OSError:
        return
    poll = select.poll()
    poll.register(lease.fds[-1], select.POLLIN)
    lease.exporter_gone = functools.partial(poll.poll, 0)


#: The leases this process maps as an importer, by the identity of the lease's file (device, inode), which
#: cannot name another file while the lease holds a descriptor of it. Every import of one export here
#: uses one lease, and it stays mapped once the last of them closes, so that opening that export again maps
#: nothing: an idle one (no import uses it) is let go once its export is closed or its exporter has
#: exited, and the oldest idle ones beyond _IDLE_LEASES, when an open maps another lease.
_leases: dict[tuple[int, int], _Lease] = {}
_leases_lock = threading.Lock()
_IDLE_LEASES = 8


def _attach(mapping: _Mapping, fd: int) -> _Lease:
    """The lease that descriptor ``fd`` names, mapped in this process (now, if it was not), and used by
    ``mapping`` from now on: the lease is not let go until ``mapping`` discards its token from
    :attr:`_Lease.users`."""
    try:
        st = os.fstat(fd)
    except OSError as exc:
        raise _lease_not_open(fd, exc) from exc
    key = (st.st_dev, st.st_ino)
    with _leases_lock:
        lease = _leases.get(key)
        if lease is None or not lease.usable():
            lease = _Lease(fd, dup=True)
            try:
                _watch_exporter(lease)
            except BaseException:
                lease.close()
                raise
            _forget_idle(_IDLE_LEASES - 1)
            _leases[key] = lease
        # No call between the two: an interrupt comes before both or after both.
        mapping.lease = lease
        lease.users.add(mapping.token)
        return lease


def _forget_idle(keep: int) -> None:
    """Close the idle leases (under ``_leases_lock``) whose exports are closed or whose exporters have
    exited, and the oldest of the others beyond ``keep``."""
    idle = [(key, lease) for key, lease in _leases.items() if not lease.users]
    for n, (key, lease) in enumerate(idle):
        if len(idle) - n > keep or not lease.usable() or lease.ended():
            del _leases[key]
            lease.close()


def _forget_idle_leases() -> None:
    """Let go of the idle leases whose exports are closed or whose exporters have exited (and of the
    oldest beyond the bound)."""
    with _leases_lock:
        _forget_idle(_IDLE_LEASES)


# -- the exporter's side --------------------------------------------------------------------------------


class _Share(Owner):
    """Owns one shareable allocation in the exporting process (the owner of its SharedBuffer). Go records
    the allocation under its token (``core.ShareAllocate``), so it is freed once, by
    ``core.OwnedFree``, whoever gets there first."""

    __slots__ = ("device_id", "exported", "kind", "lease", "ptr", "size", "stream", "views")

    def __init__(self, device_id: int, size: int, kind: str, stream: int) -> None:
        super().__init__()
        self.device_id, self.size, self.kind, self.stream = device_id, size, kind, stream
        self.ptr = 0
        self.lease: _Lease | None = None
        self.exported: tuple[str, str] | None = None  # (handle, pool id): the same for every export
        self.views: weakref.WeakSet[_View] = weakref.WeakSet()  # IpcHandle.open() in this process

    def _refuse(self) -> None:
        views = len(self.views)
        if views:
            raise error(
                "CUDA_ERROR_ILLEGAL_STATE",
                f"{views} Buffer{'s' if views > 1 else ''} opened from an IpcHandle in this process still "
                f"view{'' if views > 1 else 's'} this memory; close {'them' if views > 1 else 'it'} first",
                op="cudacore.free_shareable",
            )
        holders = self.lease.holders() if self.lease is not None and self.lease.usable() else []
        if holders:
            raise error(
                "CUDA_ERROR_ILLEGAL_STATE",
                f"processes {holders} still hold this memory open (imported from an IpcHandle); "
                "they must close their ImportedBuffers first",
                op="cudacore.free_shareable",
            )

    def _release(self) -> None:
        """Free the memory; held by importers that opened it since the refusals were checked, it is freed
        once they let go (as when collected)."""
        lease = self.lease
        if lease is not None and lease.usable() and lease.close_if_free():
            _hold(self)
            return
        core.OwnedFree(self.token)
        _exported.pop((self.device_id, self.ptr), None)
        if lease is not None:
            lease.close()

    def _collect(self) -> None:
        self._release()

    def try_free(self) -> bool:
        """Free the memory if no importer holds it now (for :func:`_reap`); whether it was."""
        with self._lock:
            lease = self.lease
            if lease is not None and not lease.closed and lease.close_if_free():
                return False
            core.OwnedFree(self.token)
            if lease is not None:
                lease.close()
            self.closed = True
            return True


class _View(Owner):
    """What a Buffer that IpcHandle.open() returns in the exporting process holds: the SharedBuffer's
    owner, which refuses to free while it lives. It owns nothing itself."""

    __slots__ = ("share",)

    def __init__(self, share: _Share) -> None:
        super().__init__()
        self.share = share
        share.views.add(self)

    def _release(self) -> None:
        self.share.views.discard(self)

    def why_not_sent(self) -> str:
        """Why a Buffer viewing the memory does not pickle, and what to send instead."""
        return (
            "a Buffer opened from an IpcHandle cannot be sent to another process: send the SharedBuffer it "
            "views (it pickles as a handle the other process opens), or an IpcHandle from its export()"
        )


def _hold(share: _Share) -> None:
    """Keep ``share``, which importers hold, until they let go (freed by :func:`_reap`)."""
    with _pending_lock:
        _pending.append(_Held(share))
    _exported.pop((share.device_id, share.ptr), None)


class _Held:
    """A collected or closed SharedBuffer's allocation that importers still hold: freed once they let go."""

    __slots__ = ("lease", "token")

    def __init__(self, share: _Share) -> None:
        self.token, self.lease = share.token, share.lease

    def free(self) -> bool:
        if self.lease is not None and self.lease.close_if_free():
            return False
        core.OwnedFree(self.token)
        if self.lease is not None:
            self.lease.close()
        return True


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


_pending: list[_Held] = []  # closed or collected while held by importers: freed when they let go
_pending_lock = threading.RLock()  # reentrant: a Popen's collection (below) may come during a reap


def _reap() -> None:
    """Free what was closed or collected while importers held it, where they have let go since."""
    with _pending_lock:
        keep = []
        for held in _pending:
            # A failing free must not stop the others; that block is kept for the next try.
            try:
                if not held.free():
                    keep.append(held)
            except CUDAError:
                keep.append(held)
        _pending[:] = keep
    _close_started()


atexit.register(_reap)


class SharedBuffer(Buffer):
    """Device memory that other processes can open: see :meth:`Device.allocate_shareable`.

    :meth:`export` (or pickling) hands it to another process. It is not drawn from the device's
    allocator: :meth:`Device.memory_stats` counts it apart, in ``shared_in_use``. Its memory is held by
    one owner (``cudacore._owner``): close is idempotent and thread-safe, and refuses (freeing nothing)
    while other processes, Buffers opened from its handles in this process, or DLPack exports use it.
    """

    __slots__ = ("_own",)

    def _share(self, op: str) -> _Share:
        share = owner_of(self, _Share)
        if share is None or self.closed or share.closed:
            raise error("CUDACORE_ERROR_CLOSED", "the SharedBuffer was closed", op=op)
        return share

    @property
    def kind(self) -> str:
        """How it is shared: ``"pool"`` (exportable pool, a file descriptor) or ``"ipc"`` (cuIpcMemHandle)."""
        return str(self._share("cudacore.export").kind)

    def export(self) -> IpcHandle:
        """An :class:`IpcHandle` for another process. For pool memory it first waits for the work queued so
        far on the buffer's stream (the allocation is stream-ordered), so the importer sees the bytes written
        before the export. Every export of one SharedBuffer carries the same lease, made once."""
        share = self._share("cudacore.export")
        if _pending or _started:
            _reap()
        with share._lock:  # one lease and one driver export, however many threads export at once
            if self.closed or share.closed:
                raise error("CUDACORE_ERROR_CLOSED", "cannot export a closed SharedBuffer", op="cudacore.export")
            if share.kind == "pool":
                _wait_for_stream(self.device_id, share.stream)
            if share.exported is None:
                # The handle of an allocation never changes, nor does its pool's descriptor: the driver is
                # asked once, and later exports duplicate what it gave.
                share.exported = _driver_export(self.device_id, share.ptr, share.kind)
            if share.lease is None:
                share.lease = _Lease.create()
            handle, pool_id = share.exported
            # The duplicates are made and owned in one C-level step (extend over map: no interrupt can come
            # between a dup and its append); the owner holds them until the IpcHandle does.
            fds = Descriptors([])
            fds.fds.extend(map(os.dup, [_pool_fds[self.device_id], share.lease.fd] if share.kind == "pool" else [share.lease.fd]))
        return IpcHandle(
            kind=share.kind,
            device_id=self.device_id,
            size=share.size,
            handle=handle,
            pool_id=pool_id,
            pool_fd=fds.fds[0] if share.kind == "pool" else None,
            lease_fd=fds.fds[-1],
            exporter=os.getpid(),
            ptr=share.ptr,
            owner=fds,
        )

    def close(self) -> None:
        """Free the memory. Idempotent and thread-safe. Raises, and frees nothing, while it is in use:
        :class:`IllegalStateError` while other processes hold it open or Buffers opened from its handles
        in this process view it, ``BufferError`` while a DLPack export lives."""
        close_buffer(self, owner_of(self, _Share))

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
    if _pending or _started:
        _reap()
    handle = stream_handle(stream, device.device_id)
    ordinal = device.device_id
    kind = kind or core.ShareKind(ordinal)
    # The owner exists before the allocation, which Go records under its token: an interrupt anywhere from
    # here on loses nothing (collected, the owner frees by the token).
    share = _Share(ordinal, nbytes, kind, handle)
    share.ptr = core.ShareAllocate(ordinal, nbytes, handle, kind, share.token)
    _exported[(ordinal, share.ptr)] = weakref.ref(share)
    buf = fast.borrow(SharedBuffer, ordinal, share.ptr, nbytes, handle, share)
    buf._own = share
    return buf


# -- the importer's side --------------------------------------------------------------------------------


class _Mapping(Owner):
    """Owns one opened import (the owner of its ImportedBuffer): the mapping, which Go records under its
    token (``core.ShareImport``), its slot in the exporter's lease and its use of the lease's mapping in
    this process (:func:`_attach`)."""

    __slots__ = ("exporter", "lease")

    def __init__(self, exporter: int) -> None:
        super().__init__()
        self.lease: _Lease | None = None
        self.exporter = exporter

    def why_not_sent(self) -> str:
        """Why the ImportedBuffer does not pickle, and what to send instead."""
        return (
            f"an ImportedBuffer cannot be sent on to another process: it is memory of process {self.exporter} "
            "opened here, and only its exporter can share it. Have process "
            f"{self.exporter} send the SharedBuffer (or an IpcHandle from SharedBuffer.export()) to the "
            "other process too"
        )

    def _release(self) -> None:
        # A failed unmapping raises here with the slot still taken: the memory stays mapped and held (the
        # exporter must not free it), and close() can be called again.
        core.OwnedFree(self.token)
        lease = self.lease
        if lease is not None:
            # Each step gives back nothing a second time (a close that an interrupt cut short runs again).
            with contextlib.suppress(CUDAError):
                lease.give_back(os.getpid(), self.token)
            lease.users.discard(self.token)
        if _pending:
            # The exporter is this process (an import opened here): a SharedBuffer it closed or dropped
            # while this import held it is freed now, not at its next shareable call.
            with contextlib.suppress(CUDAError):
                _reap()


class ImportedBuffer(Buffer):
    """Device memory of another process, opened from an :class:`IpcHandle`. :meth:`close` (or garbage
    collection) unmaps it and lets the exporter free it; it refuses (``BufferError``, unmapping nothing)
    while a DLPack export lives."""

    __slots__ = ("_own",)

    def close(self) -> None:
        close_buffer(self, owner_of(self, _Mapping))

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

    __slots__ = ("_owner", "device_id", "exporter", "handle", "kind", "lease_fd", "pool_fd", "pool_id", "ptr", "size")

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
        owner: Descriptors | None = None,
    ) -> None:
        # The descriptors' one owner (cudacore._owner): closed once, by close() or collection. Made first, so
        # that an interrupt in what follows leaves them owned.
        self._owner = owner if owner is not None else Descriptors([fd for fd in (pool_fd, lease_fd) if fd is not None])
        self.kind, self.device_id, self.size, self.handle, self.pool_id = kind, device_id, size, handle, pool_id
        self.pool_fd, self.lease_fd, self.exporter, self.ptr = pool_fd, lease_fd, exporter, ptr

    @property
    def _closed(self) -> bool:
        return self._owner.closed

    def fds(self) -> list[int]:
        """The file descriptors the handle owns (the pool's, if any, then the lease's); none once closed."""
        if self._closed:
            return []
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
        # Go checks the ordinal (the handle's, by default) as it opens the device.
        ordinal = self.device_id if device is None else as_device(device).device_id
        pid = os.getpid()
        if self.exporter == pid:
            ref = _exported.get((self.device_id, self.ptr))
            share = ref() if ref is not None else None
            if share is None or share.closed:
                raise error("CUDA_ERROR_ILLEGAL_STATE", "the SharedBuffer this handle names was closed", op="cudacore.open_shared")
            with share._lock:
                if share.closed:
                    raise error("CUDA_ERROR_ILLEGAL_STATE", "the SharedBuffer this handle names was closed", op="cudacore.open_shared")
                # The view holds the memory as an importer does: SharedBuffer.close() refuses while it lives.
                return fast.borrow(Buffer, self.device_id, self.ptr, self.size, share.stream, _View(share))
        # The owner exists before the lease is used, the slot taken and the memory mapped (Go records the
        # mapping under its token): collected after an interrupt anywhere from here, it unmaps and gives
        # the slot and the lease back.
        mapping = _Mapping(self.exporter)
        try:
            _attach(mapping, self.lease_fd).take(pid, mapping.token)
        except BaseException:
            mapping.close()
            raise
        pool_fd = -1 if self.pool_fd is None else self.pool_fd
        try:
            ptr = core.ShareImport(ordinal, self.kind, self.handle, pool_fd, self.pool_id, self.size, mapping.token)
        except BaseException:
            # Refused (during a capture, say) or interrupted: the slot goes back now, not when the owner is
            # collected, which the raised exception's traceback delays while the caller keeps it (the
            # exporter's close would be refused meanwhile). Whatever Go mapped under the token is unmapped.
            mapping.close()
            raise
        buf = fast.borrow(ImportedBuffer, ordinal, ptr, self.size, 0, mapping)
        buf._own = mapping
        return buf

    def close(self) -> None:
        """Close the descriptors the handle owns. Idempotent and thread-safe."""
        self._owner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        if self._closed:
            raise error("CUDACORE_ERROR_CLOSED", "cannot send a closed IpcHandle", op="cudacore.export")
        fds = self.fds()
        popen = context.get_spawning_popen()
        if popen is not None:
            # Pickled into a process being started: the descriptor numbers themselves are inherited when it
            # starts, after this handle may be gone, so they are duplicated and kept open until it has
            # started (see _close_started).
            kept = Descriptors([])
            kept.fds.extend(map(os.dup, fds))  # made and owned in one C-level step, as in export()
            fds = list(kept.fds)
            with _pending_lock:
                _started.append((weakref.ref(popen, _popen_gone), kept))
        return (_rebuild_handle, (self._meta(), _dup_fds(fds)))

    def send(self, sock: socket.socket) -> None:
        """Send the handle over a connected Unix socket (``AF_UNIX``), descriptors by ``SCM_RIGHTS``."""
        body = json.dumps(self._meta()).encode()
        socket.send_fds(sock, [struct.pack("<I", len(body)) + body], self.fds())

    @classmethod
    def receive(cls, sock: socket.socket) -> IpcHandle:
        """Receive a handle that :meth:`send` sent on the other end of ``sock``.

        Raises
        ------
        InvalidValueError
            If what arrived is not a handle :meth:`send` sent (the other end closed the socket first, or
            sent something else); the descriptors that came with it are closed.
        """
        timeout = sock.gettimeout()
        if timeout != 0.0:  # wait where a Ctrl-C is taken at once (interrupts are held while receiving)
            ready, _, _ = select.select([sock], [], [], timeout)
            if not ready:
                raise TimeoutError("timed out")
        data, owner = _receive(sock)
        try:
            return _from_meta(_parse_message(data), list(owner.fds), owner)
        except BaseException:
            owner.close()
            raise

    def __repr__(self) -> str:
        return f"<cudacore.IpcHandle {self.kind}, {self.size} bytes, device {self.device_id}, from process {self.exporter}>"


#: Descriptors duplicated for processes being started (see IpcHandle.__reduce__), with the start's Popen:
#: the child has its copies once the Popen knows its pid (or is gone), and ours are closed then.
_started: list[tuple[weakref.ReferenceType[Any], Descriptors]] = []


def _close_started(every: bool = False) -> None:
    """Close the descriptors kept for processes that have started since (all of them with ``every``)."""
    with _pending_lock:
        done = [item for item in _started if every or _has_started(item[0]())]
        _started[:] = [item for item in _started if item not in done]
    for _, kept in done:
        kept.close()


def _popen_gone(_ref: Any) -> None:
    with contextlib.suppress(Exception):
        _close_started()


def _has_started(popen: Any) -> bool:
    return popen is None or getattr(popen, "pid", None) is not None


atexit.register(_close_started, True)


#: The fields of a handle's description and their types (``bool`` is checked apart: it is an int too).
_META_FIELDS: dict[str, type] = {
    "kind": str,
    "device_id": int,
    "size": int,
    "handle": str,
    "pool_id": str,
    "exporter": int,
    "ptr": int,
    "has_pool_fd": bool,
}


def _malformed(why: str) -> CUDAError:
    return error("CUDA_ERROR_INVALID_VALUE", f"IpcHandle.receive: {why}; it takes what IpcHandle.send sent", op="cudacore.receive")


def _parse_message(data: bytes) -> dict[str, Any]:
    """The handle's description in a message of :meth:`IpcHandle.send`: a little-endian length, then that
    many bytes of JSON. Anything else is an InvalidValueError saying what was wrong."""
    if not data:
        raise _malformed("the other end sent nothing (it closed the socket)")
    if len(data) < 4:
        raise _malformed(f"a message of {len(data)} bytes is too short to be a handle")
    (n,) = struct.unpack_from("<I", data, 0)
    if n > len(data) - 4:
        raise _malformed(f"the message says {n} bytes follow its length, but {len(data) - 4} did")
    try:
        meta = json.loads(data[4 : 4 + n])
    except (UnicodeDecodeError, ValueError) as exc:
        raise _malformed(f"the message is not a handle's description ({exc})") from None
    if not isinstance(meta, dict):
        raise _malformed(f"the message holds a JSON {type(meta).__name__}, not a handle's description")
    for key, kind in _META_FIELDS.items():
        value = meta.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _malformed(f"the handle's {key!r} is {value!r}, not a {kind.__name__}")
    if meta["kind"] not in ("pool", "ipc"):
        raise _malformed(f"the handle's kind is {meta['kind']!r}, not 'pool' or 'ipc'")
    return meta


@interrupt_edge
def _driver_export(device_id: int, ptr: int, kind: str) -> tuple[str, str]:
    """The driver's handle of the allocation at ``ptr`` and its pool's id. The pool's descriptor that comes
    with a pool kind's (a new one each call) is kept as the device's, or closed where the device has one:
    it exists from the Go call's return on, so interrupts are held back until it is kept or closed."""
    held = _hold_interrupts()
    try:
        info = json.loads(core.ShareExport(device_id, ptr, kind))
        if info["fd"] >= 0:
            with _pending_lock:
                if _pool_fds.setdefault(device_id, info["fd"]) != info["fd"]:
                    os.close(info["fd"])
        return info["handle"], info["pool_id"]
    finally:
        if held:
            _release_interrupts(raise_held=True)


@interrupt_edge
def _receive(sock: socket.socket) -> tuple[bytes, Descriptors]:
    """A message of :meth:`IpcHandle.send` and the owner of the descriptors that came with it. The
    descriptors exist from the return of the receiving call (inside ``socket.recv_fds``) on, before any
    statement could hand them over: interrupts are held back until their owner holds them."""
    held = _hold_interrupts()
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        return data, Descriptors(fds)
    finally:
        if held:
            _release_interrupts(raise_held=True)  # raised here, the owner is collected and closes them


@interrupt_edge
def _dup_fds(fds: list[int]) -> Any:
    """``multiprocessing``'s duplicates of ``fds`` for pickling (``reduction.DupFd``): each is made and
    registered inside the standard library, with interrupts held back meanwhile, so that none is made and
    then lost to a Ctrl-C before it is registered.

    Pickled into a process being started, they are the Popen's (it closes them once the child has
    started): a list of its DupFd. Otherwise they are registered with the resource sharer, which keeps
    each open until a process unpickling the handle takes it, or this process exits; they come in a
    :class:`_Sharing`, which takes them back if it is collected before the pickler has written it (an
    interrupt here or anywhere before that, or a pickling that failed)."""
    held = _hold_interrupts()
    try:
        if context.get_spawning_popen() is not None:
            return [reduction.DupFd(fd) for fd in fds]
        sharing = _Sharing()
        sharing.dups.extend(map(resource_sharer.DupFd, fds))  # made and owned in one C-level step
        return sharing
    finally:
        if held:
            _release_interrupts(raise_held=True)  # raised here, `sharing` is collected and takes them back


class _Sharing(Owner):
    """The duplicates of a handle's descriptors that ``multiprocessing``'s resource sharer keeps for a
    pickling of it (``resource_sharer.DupFd``), owned until the pickler writes them (:meth:`__reduce__`);
    from then on the pickle is their claim, and the process that unpickles it takes them. Collected or
    closed before that, it takes them back from the sharer and closes them: otherwise the sharer would
    keep them open until this process exits (an interrupt inside ``IpcHandle.__reduce__``, after the
    registration, left two of them so)."""

    __slots__ = ("dups",)

    def __init__(self) -> None:
        self.dups: list[Any] = []  # first: interrupted in what follows, the collected owner still has them
        super().__init__()

    def __reduce__(self) -> tuple[Any, ...]:
        # No call after `closed` is set: the pickler (C code) writes the value before any interrupt can come.
        value = (_shared_fds, (tuple(d._id for d in self.dups),))
        self.closed = True
        return value

    def _release(self) -> None:
        uninterrupted(self._unshare)

    def _unshare(self) -> None:
        sharer = resource_sharer._resource_sharer  # type: ignore[attr-defined]
        while self.dups:
            _, key = self.dups.pop()._id
            with sharer._lock:
                entry = sharer._cache.pop(key, None)
            if entry is not None:
                with contextlib.suppress(OSError):
                    entry[1]()  # the sharer's close of its duplicate


def _shared_fds(ids: tuple[Any, ...]) -> list[Any]:
    """Unpickling a :class:`_Sharing`: the DupFd objects of the descriptors the resource sharer of the
    pickling process keeps (their ``detach()`` receives each, as a pickled ``resource_sharer.DupFd``'s)."""
    dups = []
    for ident in ids:
        dup: Any = object.__new__(resource_sharer.DupFd)
        dup._id = ident
        dups.append(dup)
    return dups


def _from_meta(meta: dict[str, Any], fds: list[int], owner: Descriptors | None = None) -> IpcHandle:
    fds = list(fds)
    if len(fds) != 1 + bool(meta["has_pool_fd"]):
        raise _malformed(f"{len(fds)} file descriptors came with the handle, where it needs {1 + bool(meta['has_pool_fd'])}")
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
        owner=owner,
    )


def _rebuild_handle(meta: dict[str, Any], dupfds: list[Any]) -> IpcHandle:
    return _from_meta(meta, [d.detach() for d in dupfds])


def _open_handle(handle: IpcHandle) -> Buffer:
    """Unpickling a SharedBuffer: open the handle here; the handle's descriptors are closed once opened."""
    try:
        return handle.open()
    finally:
        handle.close()
