"""Streams, events and CUDA graphs.

Waits (:meth:`Stream.synchronize`, :meth:`Event.synchronize`, :meth:`Device.synchronize`) release the GIL
in short slices and come back to Python between them, so other threads run meanwhile and Ctrl-C stops
them. Capture follows the driver's rules (``docs/contributing/driver-facts.md``); what would invalidate a capture
is refused with a :class:`CaptureError` that names the operation and the fix, and a capture the driver
invalidated anyway is ended by cudacore, so the stream always works again.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C functions the signal module wraps (no stubs)
import collections
import json
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from contextlib import suppress
from types import CodeType, FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar, get_args

from . import _handles
from ._api import core
from ._errors import closed_error, error
from ._handles import as_device, current_stream_of, pop_current, push_current, stream_handle
from ._native import fast

# The hot entries: METH_FASTCALL functions generated from the facade's declarations (no gopy wrapper).
_graph_launch = fast.graph_launch
_stream_query = fast.stream_query
_stream_wait = fast.stream_wait
_event_query = fast.event_query
_event_wait = fast.event_wait

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._device import Device
    from ._fast import Event as _CEvent
    from ._fast import Graph as _CGraph
    from ._fast import Stream as _CStream
else:
    _CStream, _CEvent, _CGraph = fast.Stream, fast.Event, fast.Graph

__all__ = [
    "CAPTURE_MODES",
    "CaptureMode",
    "CudaStreamProtocol",
    "Event",
    "EventHandle",
    "Graph",
    "Stream",
    "StreamLike",
    "current_stream",
]

# Graph memory and its Buffers. A Buffer allocated on a capturing stream is an allocation node of the
# graph; the driver makes it real only at the graph's first launch. If the capture is aborted, or the graph
# destroyed before any launch, Go takes the memory off the books and reports the address as void
# (core.GraphVoided), and its Buffer is marked closed here: a later allocation may be given the same
# address, and a stale Buffer must never free it. Only Buffers allocated while a capture begun here may be
# in progress are remembered, weakly, by (device, address). Each also carries Go's owner token, which the
# allocation returned with the address and its close passes back: a close that comes before this layer
# heard of the void (on another thread, say) then frees nothing, even once the address belongs to another
# owner.
_capture_buffers: weakref.WeakValueDictionary[tuple[int, int], Any] = weakref.WeakValueDictionary()
# Taken by whoever reads or changes _capture_buffers: threads note and void Buffers at the same
# addresses at once, and a lookup and its change must see the same entry. Reentrant: a Graph collected
# while it is held voids its memory on the same thread.
_capture_lock = threading.RLock()
# Void reports (device, address) -> token that found no Buffer yet: an allocation that released the GIL
# (allocate_tiles, the synchronous strategy) can be voided by a capture that ends on another thread, or
# in its progress callback, before its Buffers are noted. Such a Buffer is voided when it is noted. Bounded:
# a report whose Buffer never comes (closed, or collected, before the report) goes with the oldest.
_unclaimed_voids: collections.OrderedDict[tuple[int, int], int] = collections.OrderedDict()
_UNCLAIMED_MAX = 4096


def note_capture_buffers(buffers: Iterable[Any]) -> None:
    """Remember Buffers of graph memory (Go gave each an owner token: see above)."""
    forget: dict[int, list[str]] = {}
    with _capture_lock:
        for b in buffers:
            key = (b.device_id, b.ptr)
            old = _capture_buffers.get(key)
            if old is not None and old is not b and not old.closed:
                old._void()  # the driver handed out its address again: its memory was void
                if old._graph_token:  # no free of it will come: Go forgets its stale token
                    forget.setdefault(b.device_id, []).append(f"{b.ptr}:{old._graph_token}")
            if _unclaimed_voids.get(key) == b._graph_token:
                del _unclaimed_voids[key]
                forget.setdefault(key[0], []).append(f"{key[1]}:{b._graph_token}")
                b._void()  # its capture ended, and Go voided it, before it got here
                continue
            _capture_buffers[key] = b
    for device_id, items in forget.items():
        core.GraphForgetVoid(device_id, ",".join(items))


# Device.allocate resolves its stream argument and notes capture buffers in C, with these.
fast.configure_streams(_handles.__dict__, stream_handle, note_capture_buffers)


def void_buffers(device_id: int) -> None:
    """Mark closed the Buffers whose graph memory Go reports void.

    Each report names the address and the owner token that went stale with it: the Buffer remembered at
    that address is closed only if it carries that token. Between Go's report and this lookup another
    thread's capture may have been handed the address, and its new Buffer (with a new token) is live.
    """
    text = core.GraphVoided(device_id)
    if text:
        closed = []
        with _capture_lock:
            for item in text.split(","):
                p, _, token = item.partition(":")
                key = (device_id, int(p))
                b = _capture_buffers.get(key)
                if b is None:
                    _unclaimed_voids[key] = int(token)  # its Buffer may not be noted yet
                    while len(_unclaimed_voids) > _UNCLAIMED_MAX:
                        _unclaimed_voids.popitem(last=False)
                    continue
                if getattr(b, "_graph_token", 0) != int(token):
                    continue
                del _capture_buffers[key]
                if not b.closed:
                    b._void()
                    closed.append(item)
        # No free of these will come, so Go stops keeping them void. A Buffer closed before (its free
        # may still wait for a capture to end) is not reported: its free forgets its token itself.
        if closed:
            core.GraphForgetVoid(device_id, ",".join(closed))


#: A capture mode (see :meth:`Stream.capture`): a type checker refuses any other string, as
#: :meth:`Stream.begin_capture` does at run time.
CaptureMode: TypeAlias = Literal["thread_local", "global", "relaxed"]

#: The capture modes: see :meth:`Stream.capture`.
CAPTURE_MODES: tuple[CaptureMode, ...] = get_args(CaptureMode)


class CudaStreamProtocol(Protocol):
    """A stream of any library that speaks the CUDA stream protocol: ``__cuda_stream__()`` returns
    ``(version, handle)``. cudacore's :class:`Stream` is one, as are cuda.core's and, where their versions
    export it, CuPy's and PyTorch's streams; every ``stream=`` argument of cudacore takes one."""

    def __cuda_stream__(self) -> tuple[int, int]: ...

#: How long one GIL-released wait slice lasts at most, in milliseconds: Ctrl-C is seen within it.
WAIT_SLICE_MS = 50


def _device(device: Device | int | None) -> Device:
    # Device is the layer above: _handles maps an ordinal (or None: the current device) to it (see the
    # contract there).
    return as_device(device)


def current_stream(device: Device | int | None = None) -> Stream:
    """This thread's current stream on ``device`` (None: the current device).

    It is the stream of the innermost ``with stream:`` block of that device open on this thread, else the
    device's legacy default stream (:meth:`Stream.legacy`). Every ``stream=None`` argument means it.
    Inside a ``with stream:`` block whose stream was closed, it is that closed stream (``closed`` is
    True), and calls with ``stream=None`` raise :class:`InvalidHandleError` until the block ends.
    """
    dev = _device(device)
    stream = current_stream_of(dev.device_id)
    return Stream.legacy(dev) if stream is None else stream


def _wait(fn: Any, *args: Any) -> None:
    """Call the hot entry ``fn(*args, WAIT_SLICE_MS)`` until it reports done. Each call releases the GIL
    for at most one slice; KeyboardInterrupt and other signals are delivered between calls."""
    while not fn(*args, WAIT_SLICE_MS):
        pass


# Keyboard interrupts at the edges: Python runs a signal's handler in the main thread, at a check of its
# eval loop (the end of a call, a loop's back edge, a function's entry), wherever that thread is: between
# the driver beginning a capture and the `with` block being entered, on the first line of __exit__ before
# the capture is ended, or between a Go call that made a stream and the statement that stores its handle.
# A KeyboardInterrupt raised there would leave the stream capturing, or lose the stream. So while such an
# edge runs on the main thread (a capture block's __enter__ or __exit__, or another function registered
# with interrupt_edge, such as uninterrupted), SIGINT's handler is _held_handler: it holds an interrupt
# back when it comes inside an edge (or a call of one), and passes it on to the handler it replaced
# anywhere else, a capture block's body included. The held interrupt is raised once the edge is done.
# Only the main thread holds interrupts (Python runs signal handlers there alone), so this state is the
# main thread's; the handler never takes a lock, since it runs wherever that thread is. The handler is
# read and set through _signal, the C functions the signal module wraps: its wrappers convert to and from
# enums in Python code, which cost about 15 us a hold and release and is code where a signal is handled.
_hold: dict[str, Any] = {"depth": 0, "prev": None, "pending": False}
_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


def _held_handler(signum: int, frame: FrameType | None) -> None:
    f = frame
    while f is not None:
        if f.f_code in _EDGES:
            _hold["pending"] = True
            return
        f = f.f_back
    prev = _hold["prev"]
    if callable(prev):
        prev(signum, frame)


def _hold_interrupts() -> bool:
    """Put _held_handler in place for one more hold; False where it cannot be (not the main thread, or
    SIGINT is not handled by a Python function: ignored, or the default action)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        current = _signal.getsignal(signal.SIGINT)
        if current is not _held_handler:
            if not callable(current):
                return False
            _hold["prev"], _hold["depth"], _hold["pending"] = current, 0, False
            _signal.signal(signal.SIGINT, _held_handler)
    except ValueError:  # signals are not ours to set here (another interpreter)
        return False
    _hold["depth"] += 1
    return True


def _release_interrupts(raise_held: bool) -> None:
    """End one hold (the caller's, an edge's); the last puts the replaced handler back. With
    ``raise_held``, an interrupt held back meanwhile is raised now, by that handler; while an outer edge
    that holds is still on the stack, it is left for that edge's release to raise instead.

    An interrupt that comes inside this function is not lost: every call here is made before the pending
    flag is read (and the flag is read, cleared and acted on with no call in between, where no signal is
    handled), so one that comes while _held_handler is in place sets the flag in time to be read, and one
    that comes once the replaced handler is back is raised by that handler where it comes."""
    caller = sys._getframe(1)
    prev = _hold["prev"]
    deliver = raise_held and callable(prev)
    _hold["depth"] -= 1
    if _hold["depth"] == 0:
        if _signal.getsignal(signal.SIGINT) is _held_handler:
            _signal.signal(signal.SIGINT, prev)
        _hold["prev"] = None
    elif _edge_above(caller):
        return
    pending = _hold["pending"]
    _hold["pending"] = False
    if pending and deliver:
        prev(signal.SIGINT, caller)


def _edge_above(frame: FrameType) -> bool:
    """Whether a frame of an edge's code calls ``frame``, at any depth."""
    f = frame.f_back
    while f is not None:
        if f.f_code in _EDGES:
            return True
        f = f.f_back
    return False


#: The code of the functions in whose frames (and their callees') an interrupt is held back while a hold
#: is in place: the capture block's edges, and the functions registered with :func:`interrupt_edge`.
_EDGES: set[CodeType] = set()


def interrupt_edge(fn: _F) -> _F:
    """Register ``fn`` as an edge: a KeyboardInterrupt that comes while a frame of ``fn`` is on the main
    thread's stack, between its own ``_hold_interrupts()`` and ``_release_interrupts()``, is held back and
    raised by the release. ``fn`` must call both itself (the release in a ``finally``), its first
    statement the hold: an interrupt at its entry comes before anything was done, one at the end of the
    hold's call is held, as the frame is an edge's. For windows that a plain ``try`` cannot close: a
    descriptor made by a call (``socket.recv_fds``) exists before the statement that hands it to its owner.
    """
    _EDGES.add(fn.__code__)
    return fn


def uninterrupted(fn: Callable[[], _T]) -> _T:
    """``fn()`` with keyboard interrupts held back (on the main thread; see :func:`interrupt_edge`): one that
    comes meanwhile is raised once ``fn`` is done. For a step that makes or gives back what an object owns
    and records it there (a driver object's handle stored in its Python object; a descriptor taken off its
    owner's list and closed), which an interrupt between the two would lose, or give back twice."""
    held = _hold_interrupts()
    try:
        return fn()
    finally:
        if held:
            _release_interrupts(raise_held=True)


interrupt_edge(uninterrupted)

_consume: Callable[[Iterable[Any]], None] = collections.deque(maxlen=0).extend


def _store(obj: object, name: str, make: Callable[..., Any], *args: Any) -> None:
    """``obj.<name> = make(*args)`` in one C-level step, for ``make`` a C function (a Go entry): no signal is
    handled between its return and the store (``map`` and ``deque.extend`` run no bytecode), so a Ctrl-C
    comes before the call or once ``obj`` holds what it made. A hold (:func:`uninterrupted`) does the
    same for any code, at the cost of two ``sigaction`` calls."""
    _consume(map(setattr, (obj,), (name,), map(make, *[(a,) for a in args])))


class Stream(_CStream):
    """A CUDA stream: work on it runs in order, concurrently with other streams.

    Create one with :meth:`Device.create_stream` (or ``Stream(device)``). ``Stream.legacy(d)`` and
    ``Stream.per_thread(d)`` are the device's default streams.

    ``with stream:`` makes it this thread's current stream (and its device the current device) for the
    block, as in CuPy and PyTorch: calls given ``stream=None`` use it. Blocks nest, each thread has its
    own, and leaving one restores what was current before. Leaving does not close the stream; call
    :meth:`close` (or let it be garbage collected) for that. A stream closed inside its own ``with``
    block stays current until the block ends, and calls with ``stream=None`` there raise
    :class:`InvalidHandleError` (``CUDACORE_ERROR_CLOSED``) rather than fall back to another stream.

    Parameters
    ----------
    device : Device or int, optional
        The device (default: the current device, see :func:`cudacore.current_device`).
    non_blocking : bool
        True (the default) makes a stream that does not synchronize with the legacy default stream, which
        keeps synchronous work elsewhere legal while it captures.
    priority : int
        Lower is greater, within the device's range (``Stream.priority_range(d)``, for example ``(0, -5)``).

    Raises
    ------
    InvalidValueError
        For a priority outside the device's range (the driver would clamp it in silence); the message
        names the range.
    """

    # The C base (cudacore/native/stream.c) holds what the direct path checks: _device, _handle, _owned and
    # _closed. close() clears _owned and sets _closed before Go destroys the stream.
    __slots__ = ("_non_blocking", "_priority")
    _device: Device

    def __init__(self, device: Device | int | None = None, *, non_blocking: bool = True, priority: int = 0) -> None:
        dev = _device(device)
        self._device = dev
        self._handle = 0
        self._owned = False
        self._closed = False
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"create_stream(): priority must be an int, not {type(priority).__name__}")
        least, greatest = Stream.priority_range(dev)
        if not greatest <= priority <= least:
            raise error(
                "CUDA_ERROR_INVALID_VALUE",
                f"create_stream(): priority {priority} is outside device {dev.device_id}'s range, {greatest} "
                f"(the greatest) to {least} (the least, the default's); lower numbers are greater priorities",
                op="cudacore.create_stream",
                priority=priority,
                least=least,
                greatest=greatest,
            )
        uninterrupted(lambda: self._create(dev.device_id, bool(non_blocking), priority))
        info = json.loads(core.StreamInfo(dev.device_id, self._handle))
        self._non_blocking = info["non_blocking"]
        self._priority = info["priority"]

    def _create(self, device_id: int, non_blocking: bool, priority: int) -> None:
        # With interrupts held back (uninterrupted): the stream Go made is this object's before a Ctrl-C
        # can come, and its close or collection destroys it.
        self._handle = core.StreamCreate(device_id, non_blocking, priority)
        self._owned = True

    @classmethod
    def _special(cls, device: Device | int | None, handle: int) -> Stream:
        s = object.__new__(cls)
        s._device = _device(device)
        s._handle = handle
        s._owned = False
        s._closed = False
        s._non_blocking = False
        s._priority = 0
        return s

    @classmethod
    def legacy(cls, device: Device | int | None = None) -> Stream:
        """The legacy default stream (handle 1): it synchronizes with every blocking stream."""
        return cls._special(device, 1)

    @classmethod
    def per_thread(cls, device: Device | int | None = None) -> Stream:
        """The per-thread default stream (handle 2): a different stream on every thread."""
        return cls._special(device, 2)

    @staticmethod
    def priority_range(device: Device | int | None = None) -> tuple[int, int]:
        """``(least, greatest)`` stream priority of the device; greatest is the smallest number."""
        least, greatest = json.loads(core.StreamPriorityRange(_device(device).device_id))
        return least, greatest

    @property
    def handle(self) -> int:
        """The driver's stream handle (what ``allocate(n, stream=...)`` and other libraries take)."""
        return self._handle

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol: ``(0, handle)``, so that cuda.core, CuPy (``Stream.from_external``) and
        other libraries take this stream. The stream must stay open while they use it.

        Raises
        ------
        InvalidHandleError
            If the stream is closed (``CUDACORE_ERROR_CLOSED``).
        """
        if self._closed:
            raise closed_error("Stream", "cudacore.cuda_stream")
        return (0, self._handle)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` destroyed the stream (never for the default streams)."""
        return self._closed

    @property
    def device(self) -> Device:
        """The stream's device."""
        return self._device

    @property
    def non_blocking(self) -> bool:
        """Whether the stream does not synchronize with the legacy default stream."""
        return self._non_blocking

    @property
    def priority(self) -> int:
        """The stream's priority after clamping."""
        return self._priority

    @property
    def capturing(self) -> bool:
        """Whether the stream is capturing into a graph now."""
        return bool(self._info()["capturing"])

    @property
    def capture_mode(self) -> CaptureMode | None:
        """The mode of the capture in progress, or None."""
        return self._info()["mode"]

    def _info(self) -> dict[str, Any]:
        return json.loads(core.StreamInfo(self._device.device_id, self._handle))

    # query() and synchronize() are the C base's hot methods: on the direct path when they may (an open
    # Stream this process owns, no capture anywhere, not a fork child), else through these, with the
    # caller's arguments as they came.

    def _query(self) -> bool:
        """The general path of :meth:`query`: through Go, which checks the stream and reports."""
        return _stream_query(self._device.device_id, self._handle)

    def _synchronize(self) -> None:
        """The general path of :meth:`synchronize`: the wait in GIL-released slices through Go."""
        # Straight to the wait: it queries first itself, and a synchronize mostly finds work in flight.
        _wait(_stream_wait, self._device.device_id, self._handle)

    def record(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new timing event if None) on this stream and return it."""
        if event is None:
            event = Event(self._device)
        event.record(self)
        return event

    def wait(self, event: Event | Stream | CudaStreamProtocol) -> None:
        """Make later work on this stream wait for ``event`` (the host does not wait), or for the work
        queued so far on another Stream of cudacore's (through an event recorded on it now).

        Raises
        ------
        TypeError
            ``event`` is neither an Event nor a stream.
        InvalidHandleError
            ``event`` is a closed Stream, or a stream cudacore did not create (record an Event there with
            that library, and wait for it).
        """
        if isinstance(event, Event):
            fast.stream_wait_event(self._device.device_id, self._handle, event._live())
            return
        if event is None or isinstance(event, (int, bool)):
            raise TypeError(f"wait() takes an Event or a stream, not {type(event).__name__}")
        if event is self:
            return  # a stream's work is in order already
        marker = Event(self._device, timing=False)
        try:
            marker.record(event)  # the stream argument as every call takes it: its errors explain
            fast.stream_wait_event(self._device.device_id, self._handle, marker._live())
        finally:
            marker.close()

    wait_event = wait

    def begin_capture(self, mode: CaptureMode = "thread_local") -> None:
        """Start capturing the work issued on this stream into a graph (see :meth:`capture`)."""
        if mode not in CAPTURE_MODES:
            raise error("CUDA_ERROR_INVALID_VALUE", f"unknown capture mode {mode!r}: use one of {', '.join(CAPTURE_MODES)}", op="cudacore.begin_capture")
        # Go registers the capture before the driver begins it, and the snapshot the fast path reads says
        # so from then on: no call takes the direct path, which knows nothing of captures.
        core.StreamBeginCapture(self._device.device_id, self._handle, mode)

    def end_capture(self) -> Graph:
        """End the capture and return the graph (instantiated on first launch, or with :meth:`Graph.instantiate`).

        Raises
        ------
        CaptureError
            If cudacore ended the capture already because an operation in it failed: the error names that
            first operation and the driver's code.
        IllegalStateError
            If the stream is not capturing.
        """
        return uninterrupted(self._end_capture)

    def _end_capture(self) -> Graph:
        # With interrupts held back: the graph Go made is a Graph before a Ctrl-C can come (one that comes
        # meanwhile is raised after, and the Graph, dropped, is destroyed when collected).
        try:
            graph_id = core.StreamEndCapture(self._device.device_id, self._handle)
        except BaseException:
            self._end_failed()
            raise
        graph = Graph._adopt(graph_id, self._device)
        # A graph destroyed during the capture (where the driver forbids it) went when it ended: the
        # Buffers of its graph memory that no launch made real are void.
        void_buffers(self._device.device_id)
        return graph

    def _capture_over(self) -> None:
        # Whatever the capture allocated is void when it made no graph.
        void_buffers(self._device.device_id)

    def _still_capturing(self) -> bool:
        try:
            return self.capturing
        except BaseException:  # noqa: BLE001 - a stream that cannot say captures no more
            return False

    def _end_failed(self) -> None:
        # An end or abort that was refused (on a thread other than the one that began a GLOBAL or
        # THREAD_LOCAL capture, or on a stream joined to another's capture) or that failed with the stream
        # still capturing leaves the capture going: it stays listed, since the direct path and the
        # capture-time allocations read the list. Otherwise the capture is over.
        if not self._still_capturing():
            self._capture_over()

    def abort_capture(self) -> None:
        """End the capture in progress, if any, and discard it.

        Raises
        ------
        CaptureError
            On a thread other than the one that began a GLOBAL or THREAD_LOCAL capture (the driver's 908),
            or on a stream joined to another stream's capture (903). The capture goes on.
        """
        try:
            core.StreamAbortCapture(self._device.device_id, self._handle)
        except BaseException:
            self._end_failed()
            raise
        self._capture_over()

    def capture(self, mode: CaptureMode = "thread_local") -> _Capture:
        """Capture the work issued on this stream inside the ``with`` block into a graph.

        >>> with s.capture() as graph:
        ...     buf.copy_from(pinned_in, stream=s)
        ...     buf.copy_to(pinned_out, stream=s)
        >>> graph.launch(s); s.synchronize()

        The graph yielded is filled in, and instantiated, when the block ends. If the block raises, the
        capture is ended and discarded, and the exception propagates.

        Parameters
        ----------
        mode : {"thread_local", "global", "relaxed"}
            What the capture forbids elsewhere: ``"global"`` forbids unsafe calls (synchronous
            allocation, synchronizing) on every thread, ``"thread_local"`` on this thread, ``"relaxed"``
            nowhere. Synchronous copies, which use the legacy stream, are refused in every mode while a
            blocking stream captures.

        Notes
        -----
        A ``KeyboardInterrupt`` never leaves the stream capturing: one that comes while the block is being
        entered ends the capture begun there and is raised in its place; one that comes while the block is
        left is held back until the capture has ended (the graph made, or the capture discarded) and is
        raised then.
        """
        return _Capture(self, mode)

    def close(self) -> None:
        """Destroy the stream (ending and discarding a capture in progress). Idempotent; the default
        streams are not closed. See the class notes for closing a stream that is current."""
        device_id = self._device.device_id  # first: a Ctrl-C in this call comes before anything is done
        if self._owned:
            self._owned = False
            self._closed = True
            core.StreamDestroy(device_id, self._handle)
            self._capture_over()  # destroying a capturing stream discarded its capture, if it had one

    destroy = close

    def __enter__(self) -> Self:
        """Make this stream current on this thread, and its device the current device, until the block ends.

        Raises
        ------
        InvalidHandleError
            If the stream is closed (``CUDACORE_ERROR_CLOSED``).
        """
        if self._closed:
            raise closed_error("Stream", "cudacore.stream_enter")
        push_current(self, self._device._ordinal, self)
        return self

    def __exit__(self, *exc: object) -> None:
        """Make the stream and device that were current before the block current again (no close)."""
        pop_current(self)

    def _finalize(self) -> None:
        if getattr(self, "_owned", False):
            with suppress(Exception):  # interpreter shutdown or a dead driver: nothing to do
                self.close()

    __del__ = fast.finalizer  # _finalize, called again where a Ctrl-C cut it short (cudacore._owner.Owner)

    def __reduce__(self) -> Any:
        # A stream this process created is its driver object: a copy would own it too, and destroy it (at
        # its close or garbage collection) under the original, whose calls would then hand the driver a
        # destroyed stream (the direct path makes them without Go's check). The default streams are no
        # one's: they travel as what they are.
        if not self._owned and not self._closed and self._handle in (1, 2):
            return (Stream.legacy if self._handle == 1 else Stream.per_thread, (self._device,))
        raise TypeError("a cudacore.Stream cannot be pickled or copied: create a stream where it is needed (Device.create_stream())")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._handle == self._handle and other._device == self._device

    def __hash__(self) -> int:
        return hash(("cudacore.Stream", self._device.device_id, self._handle))

    def __repr__(self) -> str:
        kind = {1: "legacy", 2: "per-thread"}.get(self._handle)
        if kind and not self._owned and not self._closed:
            return f"<cudacore.Stream {kind} default stream, device {self._device.device_id}>"
        state = " destroyed" if self._closed else ""
        flags = "non-blocking" if self._non_blocking else "blocking"
        return f"<cudacore.Stream 0x{self._handle:x}{state}, {flags}, priority {self._priority}, device {self._device.device_id}>"


class _Capture:
    """The context manager of :meth:`Stream.capture`: begins the capture on entry and ends it (or, if the
    block raised, discards it) on exit, with keyboard interrupts held back at both edges."""

    __slots__ = ("_graph", "_held", "_mode", "_stream")

    def __init__(self, stream: Stream, mode: CaptureMode) -> None:
        self._stream = stream
        self._mode = mode
        self._graph = Graph._pending(stream._device)
        self._held = False

    @interrupt_edge
    def __enter__(self) -> Graph:
        self._held = _hold_interrupts()
        try:
            self._stream.begin_capture(self._mode)
        except BaseException:
            if self._held:
                self._held = False
                _release_interrupts(raise_held=False)  # the error raised is the answer
            raise
        if self._held and _hold["pending"]:
            # Interrupted on the way in: the block never runs, so its capture is discarded here.
            self._graph._destroyed = True
            try:
                self._stream.abort_capture()
            finally:
                self._held = False
                _release_interrupts(raise_held=True)
        return self._graph

    @interrupt_edge
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if exc_type is not None:
                self._graph._destroyed = True  # nothing was captured into it: a dead graph, not a pending one
                self._stream.abort_capture()
                return
            try:
                done = self._stream.end_capture()
            except BaseException:
                self._graph._destroyed = True  # the capture failed: no graph will come
                raise
            self._graph._take(done)
            self._graph.instantiate()
        finally:
            if self._held:
                self._held = False
                _release_interrupts(raise_held=True)


#: What every ``stream=`` argument takes: a cudacore :class:`Stream`, any object with ``__cuda_stream__``
#: (:class:`CudaStreamProtocol`: cuda.core, CuPy and PyTorch streams), a driver handle as an int, or None
#: for this thread's current stream (:func:`current_stream`). CuPy and PyTorch streams without the
#: protocol are taken at run time too (by their ``ptr`` and ``cuda_stream``); their libraries' types are
#: not known to cudacore's annotations.
StreamLike: TypeAlias = Stream | CudaStreamProtocol | int | None


class Event(_CEvent):
    """A CUDA event: a marker in a stream's work that the host or other streams can wait for.

    Parameters
    ----------
    device : Device or int, optional
        The device (default: the current device).
    timing : bool, optional
        Whether the event can measure :meth:`elapsed_time` (default: True, except for interprocess
        events, which cannot); non-timing events are cheaper.
    interprocess : bool
        Whether other processes can open the event (:meth:`ipc_handle`), to order their work after work of
        this process.
    """

    # The C base (cudacore/native/event.c) holds _device and _handle (0 once closed: close() clears it before
    # Go destroys the event), which the direct path reads.
    __slots__ = ("_interprocess", "_timing")
    _device: Device

    def __init__(self, device: Device | int | None = None, *, timing: bool | None = None, interprocess: bool = False) -> None:
        dev = _device(device)
        self._device = dev
        self._interprocess = bool(interprocess)
        self._timing = (not self._interprocess) if timing is None else bool(timing)
        self._handle = 0
        if self._interprocess and self._timing:
            raise error(
                "CUDA_ERROR_INVALID_VALUE",
                "an interprocess event cannot measure time (the driver forbids it): leave timing out or pass timing=False",
                op="cudacore.create_event",
            )
        # The event Go makes is this object's before a Ctrl-C can come: made and stored in one C-level step
        # (_store), which costs far less than a hold (an event is made per Stream.wait of a stream).
        if self._interprocess:
            _store(self, "_handle", core.EventCreateInterprocess, dev.device_id)
        else:
            _store(self, "_handle", core.EventCreate, dev.device_id, self._timing)

    @classmethod
    def _adopt(cls, device: Device, handle: int) -> Event:
        """An Event object for an event Go already made and registered (an opened interprocess event)."""
        e = object.__new__(cls)
        e._device, e._timing, e._interprocess, e._handle = device, False, True, handle
        return e

    @property
    def interprocess(self) -> bool:
        """Whether other processes can open the event."""
        return self._interprocess

    def ipc_handle(self) -> EventHandle:
        """An :class:`EventHandle` with which another process opens this event (``interprocess=True`` only).
        Record the event here, send the handle, and there ``stream.wait_event(handle.open())``."""
        if not self._interprocess:
            raise error(
                "CUDA_ERROR_INVALID_VALUE",
                "this event was not created for other processes: create it with Event(device, interprocess=True)",
                op="cudacore.ipc_event",
            )
        return EventHandle(self._device.device_id, core.EventIpcHandle(self._live()))

    def __reduce__(self) -> tuple[Any, ...]:
        # Only an interprocess event means something in another process: it travels as its handle.
        if not self._interprocess:
            raise TypeError("only an interprocess Event (Event(device, interprocess=True)) can be pickled; it opens as the same event elsewhere")
        return (_open_event_handle, (self.ipc_handle(),))

    @property
    def handle(self) -> int:
        """The driver's event handle (0 after :meth:`close`)."""
        return self._handle

    @property
    def device(self) -> Device:
        return self._device

    @property
    def timing(self) -> bool:
        return self._timing

    def _live(self) -> int:
        if not self._handle:
            raise closed_error("Event", "cudacore.event")
        return self._handle

    def record(self, stream: StreamLike = None) -> Event:
        """Record the event on ``stream`` (None: the current stream of the event's device); returns self."""
        fast.event_record(self._live(), self._device.device_id, stream_handle(stream, self._device.device_id))
        return self

    # query() and synchronize() are the C base's hot methods: on the direct path when they may (a live
    # Event, no capture anywhere, not a fork child), else through these, with the caller's arguments.

    def _query(self) -> bool:
        """The general path of :meth:`query`: through Go."""
        return _event_query(self._live())

    def _synchronize(self) -> None:
        """The general path of :meth:`synchronize`: the wait in GIL-released slices through Go."""
        _wait(_event_wait, self._live())

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event's completion to ``end``'s (both timing events, recorded)."""
        if not isinstance(end, Event):
            raise TypeError(f"elapsed_time() takes an Event, not {type(end).__name__}")
        return core.EventElapsed(self._live(), end._live())

    def close(self) -> None:
        """Destroy the event. Idempotent."""
        handle, self._handle = self._handle, 0
        if handle:
            core.EventDestroy(handle)

    def _finalize(self) -> None:
        if getattr(self, "_handle", 0):
            with suppress(Exception):
                self.close()

    __del__ = fast.finalizer  # _finalize, called again where a Ctrl-C cut it short (cudacore._owner.Owner)

    def __repr__(self) -> str:
        if not self._handle:
            return "<cudacore.Event closed>"
        return f"<cudacore.Event 0x{self._handle:x}, device {self._device.device_id}, timing={self._timing}>"


class EventHandle:
    """What another process needs to open an interprocess :class:`Event`: made by
    :meth:`Event.ipc_handle`. Plain data (64 bytes as hex and a device ordinal): it pickles, and can be sent
    any way."""

    __slots__ = ("device_id", "handle")

    def __init__(self, device_id: int, handle: str) -> None:
        self.device_id, self.handle = device_id, handle

    def open(self, device: Device | int | None = None) -> Event:
        """The event in this process: streams here can wait on it (``stream.wait_event(ev)``) and the host
        can synchronize it. Not in the process that made it (the driver refuses; use the event itself)."""
        dev = _device(self.device_id if device is None else device)
        return Event._adopt(dev, core.EventOpenIpc(dev.device_id, self.handle))

    def __reduce__(self) -> tuple[Any, ...]:
        return (EventHandle, (self.device_id, self.handle))

    def __repr__(self) -> str:
        return f"<cudacore.EventHandle device {self.device_id}>"


def _open_event_handle(handle: EventHandle) -> Event:
    return handle.open()


class Graph(_CGraph):
    """A captured CUDA graph: replay the captured work with :meth:`launch`.

    Made by :meth:`Stream.capture` or :meth:`Stream.end_capture`. Each launch moves the host data that
    is in the captured pinned buffers at that moment. :meth:`destroy` (or :meth:`close`, or the end of a
    ``with`` block) frees it and the memory its allocations hold; it is idempotent, and launching a
    destroyed graph raises :class:`InvalidHandleError`.
    """

    # The C base (cudacore/native/graph.c) holds _device and _exec, the executable graph the direct path
    # may launch (0: launch through Go); destroy() clears _exec before Go destroys the graph.
    __slots__ = ("_destroyed", "_id")
    _destroyed: bool
    _device: Device
    _id: int

    def __init__(self) -> None:
        raise TypeError("graphs come from Stream.capture() or Stream.end_capture()")

    @classmethod
    def _pending(cls, device: Device) -> Graph:
        g = object.__new__(cls)
        g._id = 0
        g._exec = 0
        g._device = device
        g._destroyed = False
        return g

    @classmethod
    def _adopt(cls, graph_id: int, device: Device) -> Graph:
        g = cls._pending(device)
        g._id = graph_id
        return g

    def _take(self, other: Graph) -> None:
        self._id, other._id = other._id, 0
        self._exec, other._exec = other._exec, 0

    def _live(self, what: str) -> int:
        if self._destroyed:
            raise error("CUDACORE_ERROR_CLOSED", f"cannot {what} a destroyed graph; capture it again", op=f"cudacore.graph_{what}")
        if not self._id:
            raise error("CUDA_ERROR_ILLEGAL_STATE", f"cannot {what} the graph before its capture ends (leave the `with stream.capture()` block first)", op=f"cudacore.graph_{what}")
        return self._id

    @property
    def device(self) -> Device:
        return self._device

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    def _info(self) -> dict[str, Any]:
        return json.loads(core.GraphInfo(self._live("inspect")))

    @property
    def node_count(self) -> int:
        """The number of nodes captured (copies, memsets, kernels, allocations, frees)."""
        return self._info()["node_count"]

    @property
    def memory_held(self) -> int:
        """Bytes of the allocations made on the stream during the capture (graph memory nodes)."""
        return self._info()["memory_held"]

    @property
    def escapes(self) -> list[str]:
        """The escape audit: work cudacore issued while the capture ran that is not in this graph (it ran
        at once, on another stream or synchronously), such as ``"copy on stream 0x... on device 0"``; the
        first 32. :attr:`escaped` counts them all."""
        return list(self._info()["escapes"])

    @property
    def escaped(self) -> int:
        """How many operations escaped the capture (see :attr:`escapes`)."""
        return int(self._info()["escaped"])

    @property
    def allocations(self) -> int:
        """How many allocations the capture made (graph memory nodes)."""
        return self._info()["allocations"]

    def instantiate(self) -> Graph:
        """Make the executable graph now rather than at the first launch; returns self."""
        core.GraphInstantiate(self._live("instantiate"))
        return self

    def debug_dot(self, path: str | os.PathLike[str], *, verbose: bool = False) -> None:
        """Write the captured graph as a Graphviz DOT file, for reading or rendering (``dot -Tsvg``).

        It shows every node the driver holds, including those cudacore did not issue (a kernel's own
        allocations, a library's copies), which :attr:`node_count` only counts. It works before and
        after instantiation.

        Parameters
        ----------
        path : str or os.PathLike
            The file to write (created or replaced); its folder must exist.
        verbose : bool
            Add every node's parameters: addresses, sizes, kernel arguments, events.

        Raises
        ------
        InvalidValueError
            If ``path`` is empty, not valid UTF-8, names a folder, pipe or socket, or its folder does not
            exist.
        InvalidHandleError
            If the graph was destroyed (``CUDACORE_ERROR_CLOSED``).
        CUDAError
            ``CUDA_ERROR_OPERATING_SYSTEM`` if the driver cannot write the file.
        """
        try:
            name = os.fsdecode(os.fspath(path))
        except TypeError:
            raise TypeError(f"debug_dot() takes a file path (str or os.PathLike) as path, not {type(path).__name__}") from None
        if not isinstance(verbose, bool):
            raise TypeError(f"debug_dot() takes True or False as verbose, not {type(verbose).__name__}")
        try:
            name.encode()
        except UnicodeEncodeError:  # undecodable bytes (surrogateescape): the path reaches Go as UTF-8
            raise error("CUDA_ERROR_INVALID_VALUE", f"path {name!r} is not valid UTF-8: give a path that is", op="cudacore.graph_debug_dot") from None
        core.GraphDebugDot(self._live("debug_dot"), os.path.abspath(name) if name else name, verbose)

    def _stream_args(self, stream: StreamLike) -> tuple[int, int]:
        if isinstance(stream, Stream) and stream.device != self._device:
            raise error("CUDA_ERROR_INVALID_VALUE", f"the graph belongs to device {self._device.device_id} but the stream to device {stream.device.device_id}", op="cudacore.graph_launch")
        return self._device.device_id, stream_handle(stream, self._device.device_id)

    def _launch(self, stream: StreamLike = None) -> None:
        """The general path of :meth:`launch`, through Go."""
        # launch() is the C base's hot method: once Go has launched the graph and handed out its executable
        # graph, C launches it on an open Stream this process owns, while nothing captures, without entering
        # this function (the direct path: cudacore/direct.go). C reads the stream and the executable graph
        # with the GIL held until the driver has the call; destroy() and Stream.close() clear what it reads
        # before they reach Go. What C does not take comes here, with the caller's arguments.
        # The common case skips the checks that Go makes again anyway.
        if type(stream) is Stream and stream._device is self._device and self._id:
            self._exec = _graph_launch(self._id, stream._device._ordinal, stream._handle)
            return
        self._exec = _graph_launch(self._live("launch"), *self._stream_args(stream))

    def upload(self, stream: StreamLike = None) -> None:
        """Upload the graph to the device on ``stream``, so that the first launch is as fast as the others."""
        fast.graph_upload(self._live("upload"), *self._stream_args(stream))

    def update(self, other: Graph) -> None:
        """Take ``other``'s parameters (same topology) into this graph's executable graph.

        Raises
        ------
        CUDAError
            ``CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`` if the topologies differ, or if either graph
            allocated memory during its capture (graph memory): the driver would move this graph's
            allocations to the other graph's addresses.
        """
        if not isinstance(other, Graph):
            raise TypeError(f"update() takes a Graph, not {type(other).__name__}")
        core.GraphUpdate(self._live("update"), other._live("update"))

    def __reduce__(self) -> Any:
        # A graph is this process's driver object: a copy would alias it (and destroy it twice).
        raise TypeError("a cudacore.Graph cannot be pickled or copied: capture it again where it is needed")

    def destroy(self) -> None:
        """Free the graph and the memory its allocations hold. Idempotent."""
        if self._destroyed:
            return
        self._exec = 0  # before Go destroys it: no direct launch from now on
        if self._id:
            core.GraphDestroy(self._id)  # a failure leaves the graph to destroy again
            void_buffers(self._device.device_id)  # its memory, if it was never launched
        self._destroyed = True
        self._id = 0

    close = destroy

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _finalize(self) -> None:
        if getattr(self, "_id", 0) and not getattr(self, "_destroyed", True):
            with suppress(Exception):
                self.destroy()

    __del__ = fast.finalizer  # _finalize, called again where a Ctrl-C cut it short (cudacore._owner.Owner)

    def __repr__(self) -> str:
        if self._destroyed:
            return "<cudacore.Graph destroyed>"
        if not self._id:
            return "<cudacore.Graph (capture in progress)>"
        info = self._info()
        return f"<cudacore.Graph {info['node_count']} nodes, {info['memory_held']} bytes held, device {self._device.device_id}>"

