"""The one way a Python object of cudacore owns driver memory or file descriptors.

Every such object (SharedBuffer, ImportedBuffer, ManagedBuffer, tiles, leases, IpcHandles) keeps what it
owns in one :class:`Owner`, which follows these rules:

- **One owner of the state.** Only the Owner changes it, under its lock.
- **Idempotent, thread-safe close.** :meth:`Owner.close` runs once however many threads call it; a close
  that failed (the driver refused) leaves the Owner open, so that it can be called again.
- **Refusals before anything is freed.** :meth:`Owner._refuse` raises before :meth:`Owner._release`
  gives anything back; for a Buffer, :func:`close_buffer` checks the Owner's refusals, then the C
  Buffer's own (a live DLPack export), and only then frees.
- **Nothing lost to a KeyboardInterrupt.** Memory is named in Go by the Owner's :attr:`~Owner.token`
  before the call that makes it returns (``process.Own``), so an interrupt between that call and the
  Python bookkeeping loses nothing: the Owner, collected, frees by its token, and Go frees a token once.
  Memory that a C Buffer of ``cudacore._fast`` will own by its address is made through :func:`adopt`.
- **A graph keeps the memory alive.** Go's free by token waits for the live graphs that use the memory
  (``stream.Manager.FreeGraphAware``), as a Buffer's free does.
"""

from __future__ import annotations

import contextlib
import os
from _thread import RLock as _RLock
from collections.abc import Callable
from itertools import count
from typing import Any, TypeVar

from . import _api
from ._api import core
from ._native import fast
from ._stream import uninterrupted

__all__ = ["Descriptors", "Owner", "adopt", "close_buffer", "uninterrupted"]

_T = TypeVar("_T")
_O = TypeVar("_O", bound="Owner")

#: Tokens name Owners in Go; never 0 (the token of no owner) and never reused in a process.
_tokens = count(1)


class Owner:
    """Owns driver memory named by :attr:`token` (see the module's rules). Subclasses add what else they
    own in :meth:`_release` and what forbids a close in :meth:`_refuse`.

    Attributes
    ----------
    token : int
        Names this owner in Go: the calls that allocate for it take it, ``core.OwnedFree`` frees by it.
    closed : bool
        Whether :meth:`close` has given everything back.
    """

    __slots__ = ("__weakref__", "_lock", "closed", "token")

    def __init__(self) -> None:
        self.token = next(_tokens)
        self._lock = _RLock()  # the type threading.RLock() returns, without that function's call
        self.closed = False

    def _refuse(self) -> None:
        """Raise if what the owner holds must not be given back now (nothing is changed then)."""

    def _release(self) -> None:
        """Give back what the owner holds: the memory Go recorded under the token (a second call frees
        nothing). Raises, leaving the memory owned, if the driver refuses."""
        core.OwnedFree(self.token)

    def close(self) -> None:
        """Give back what the owner holds, once; raises (and gives back nothing) where :meth:`_refuse`
        does, and leaves the owner open where the release failed."""
        with self._lock:
            if self.closed:
                return
            self._refuse()
            self._release()
            self.closed = True

    def _collect(self) -> None:
        """What collection does (no one is left to refuse to): :meth:`_release`."""
        self._release()

    def _finalize(self) -> None:
        # An owner whose __init__ a KeyboardInterrupt cut short has no `closed` yet: nothing was allocated
        # under its token then, but a Descriptors may hold descriptors already (they come first).
        if getattr(self, "closed", False) or _api.forked():  # a forked child's memory belongs to its parent
            return
        with contextlib.suppress(Exception):
            self._collect()

    # C (fast.finalize): calls _finalize again where a Ctrl-C cut it short, then delivers the Ctrl-C past
    # the finalizer; a finalizer in Python would stop where the signal came, and what it still owned would
    # be lost (each _release gives back what is left, and nothing twice).
    __del__ = fast.finalizer


class Descriptors(Owner):
    """Owns file descriptors (an IpcHandle's, a lease's): closed once, never a number that may already
    belong to another file. Each descriptor leaves the owner's list before it is closed, with interrupts
    held back from the one to the other (:func:`uninterrupted`): a Ctrl-C there neither leaves it open
    nor lets it be closed twice."""

    __slots__ = ("fds",)

    def __init__(self, fds: list[int]) -> None:
        self.fds = list(fds)  # first: interrupted in what follows, the collected owner still closes them
        super().__init__()

    def _release(self) -> None:
        uninterrupted(self._close_fds)

    def _close_fds(self) -> None:
        while self.fds:
            fd = self.fds.pop()
            with contextlib.suppress(OSError):
                os.close(fd)


class _Creation(Owner):
    """The owner of memory made for C Buffers until they hold it (see :func:`adopt`)."""

    __slots__ = ()

    def _collect(self) -> None:
        core.OwnedFree(self.token)


def adopt(make: Callable[[int], _T]) -> _T:
    """Make memory that C Buffers own by address, with nothing lost to an interrupt: ``make(token)``
    allocates, naming ``token`` in the Go call (which records the memory under it), and wraps the result
    in Buffers; then Go forgets the token (``core.OwnedClaim``), the Buffers owning the memory.

    Interrupted before the Buffers exist, the token's owner frees the memory when collected. Buffers made
    meanwhile are locals of frames inside this one, so they go first: their free by address takes their
    block off the token (``process.disownAt``), and the token frees only the rest.
    """
    creation = _Creation()
    return _adopt(creation, make)


def _adopt(creation: _Creation, make: Callable[[int], _T]) -> _T:
    made = make(creation.token)
    core.OwnedClaim(creation.token)
    creation.closed = True
    return made


def close_buffer(buf: Any, owner: Owner | None) -> None:
    """Close ``buf``, a Buffer viewing memory that ``owner`` holds (``fast.borrow``): the owner's refusals,
    then the C Buffer's (a live DLPack export raises ``BufferError``), and only then the owner's release.
    Called again after a failed release, it tries the release again."""
    if owner is None:
        fast.Buffer.close(buf)
        return
    with owner._lock:
        if owner.closed:
            fast.Buffer.close(buf)
            return
        owner._refuse()
        fast.Buffer.close(buf)
        owner._release()
        owner.closed = True


def owner_of(buf: Any, kind: type[_O]) -> _O | None:
    """The owner of ``buf`` of class ``kind``: the one its ``_own`` slot names (kept after the C Buffer
    closed, so that a failed release can be retried), else the C Buffer's ``owner``."""
    owner = getattr(buf, "_own", None)
    if owner is None:
        owner = buf.owner
    return owner if isinstance(owner, kind) else None

