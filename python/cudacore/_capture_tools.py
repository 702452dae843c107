"""Capture diagnostics: a rehearsal that finds the first illegal operation, and graphed functions.

:func:`rehearse` runs a capture body once, inside a capture that is then discarded, and reports the
first operation that capture refused or that invalidated it, with the Python ``file:line`` that issued it,
rather than the last symptom (a later call that fails because the capture was already invalidated, or the
error of ``end_capture``). It also reports the escape audit (:attr:`Graph.escapes`): work cudacore issued
while the capture ran that did not go into it.

:func:`graphed` wraps a function so that its first call captures it into a graph and later calls replay
that graph; if the capture fails, the function runs eagerly from then on and the reason is kept. By default
each call returns fresh copies of the Buffers in the function's result (``outputs="copy"``), which the
caller may keep; ``outputs="static"`` returns the graph's own Buffers, which the next call overwrites.
"""

from __future__ import annotations

import copy
import os
import threading
import traceback
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, ParamSpec, TypeAlias, TypeVar, get_args, overload

from . import _copy, _errors
from . import _stream as _streams
from ._errors import CaptureError, CUDAError, error
from ._native import fast
from ._stream import CAPTURE_MODES, CaptureMode, Stream

__all__ = ["GRAPHED_OUTPUTS", "CaptureDiagnosis", "Graphed", "GraphedOutputs", "graphed", "rehearse"]

_PACKAGE_DIR = str(Path(__file__).resolve().parent) + os.sep

P = ParamSpec("P")
R = TypeVar("R")

#: What a :func:`graphed` function's calls return: ``"copy"``, fresh copies of the Buffers in its result
#: (the caller's to keep), or ``"static"``, the graph's own Buffers (overwritten by the next call).
GraphedOutputs: TypeAlias = Literal["copy", "static"]

#: The values of :data:`GraphedOutputs`.
GRAPHED_OUTPUTS: tuple[GraphedOutputs, ...] = get_args(GraphedOutputs)

#: How deep in a result's tuples, lists, sets and dicts Buffers are looked for.
_MAX_DEPTH = 8


@dataclass
class CaptureDiagnosis:
    """What :func:`rehearse` found.

    Attributes
    ----------
    ok : bool
        The body captured cleanly: no capture error and nothing escaped.
    first : dict or None
        The first capture error: ``op``, ``name`` (the result), ``message``, ``where`` (``"file:line"``
        of the Python line that issued the operation) and ``stack`` (the innermost user frames).
    symptoms : list of dict
        The capture errors after the first one, in the same form: consequences, not causes.
    raised : BaseException or None
        What the body raised, if it raised.
    escapes : list of str
        The escape audit of the capture (see :attr:`Graph.escapes`).
    node_count : int
        Nodes the capture recorded (0 when it failed).
    """

    ok: bool
    first: dict[str, Any] | None
    symptoms: list[dict[str, Any]] = field(default_factory=list)
    raised: BaseException | None = None
    escapes: list[str] = field(default_factory=list)
    node_count: int = 0

    def __str__(self) -> str:
        if self.ok:
            return f"capture rehearsal: ok ({self.node_count} nodes, nothing escaped)"
        own = self.raised is not None and not isinstance(self.raised, CaptureError)
        lines = ["capture rehearsal: FAILED" if self.first or own else "capture rehearsal: work escaped the capture"]
        if self.first:
            lines.append(f"  first illegal operation, at {self.first['where']}: {self.first['op']} ({self.first['name']})")
            lines.append(f"    {self.first['message']}")
        if own:
            # An error of the body's own (not a capture's): the rehearsal could not see the rest of it.
            assert self.raised is not None
            where = _raised_at(self.raised)
            lines.append(f"  the body raised {type(self.raised).__name__}{f', at {where}' if where else ''}: {self.raised}")
        if self.symptoms:
            lines.append(f"  {len(self.symptoms)} later error(s) follow from it; the first at {self.symptoms[0]['where']}")
        if self.escapes:
            lines.append(f"  {len(self.escapes)} operation(s) escaped the capture (ran at once, not in the graph):")
            lines += [f"    {e}" for e in self.escapes]
        return "\n".join(lines)


_watch = threading.local()


def _user_stack() -> list[str]:
    frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith(_PACKAGE_DIR)]
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in reversed(frames)][:8]


def _raised_at(exc: BaseException) -> str:
    """The ``file:line`` of user code where ``exc`` was raised (the innermost frame of its traceback outside
    this package), or ``""``."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_PACKAGE_DIR)]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _check_stream(stream: object, op: str, *, none: bool) -> None:
    if not isinstance(stream, Stream):
        accepted = "a cudacore.Stream (or None, for a new stream)" if none else "a cudacore.Stream"
        hint = ""
        if hasattr(stream, "__cuda_stream__"):
            # Captures are tracked on cudacore's own streams; another library can work on one through its
            # __cuda_stream__, the other way round.
            hint = (
                ": a capture runs on a stream of cudacore's; create one with Device.create_stream() and hand it to "
                "the other library (cudacore.Stream exports __cuda_stream__)"
            )
        raise TypeError(f"{op}: stream must be {accepted}, not {type(stream).__name__}{hint}")


def _note(exc: CUDAError) -> None:
    seen = getattr(_watch, "seen", None)
    if seen is None or not isinstance(exc, CaptureError):
        return
    stack = _user_stack()
    seen.append({
        "op": exc.op,
        "name": exc.name,
        "message": str(exc.args[0]) if exc.args else "",
        "where": stack[0].split(" in ")[0] if stack else "?",
        "stack": stack,
    })


_errors.HOOKS.append(_note)


def rehearse(body: Callable[[Any], object], stream: Stream | None = None, *, mode: CaptureMode = "thread_local") -> CaptureDiagnosis:
    """Run ``body(stream)`` inside a capture on ``stream``, discard the capture, and report what went wrong.

    Every :class:`CaptureError` made while the body runs, on this thread, is noted with the Python line
    that caused it, also those the body catches and swallows: the first one is the cause. The captured
    work never runs (a capture only records it); work that escaped the capture did run.

    Parameters
    ----------
    body : callable
        Called with the capturing stream; it issues the work to capture on it.
    stream : Stream, optional
        The stream to capture (default: a new non-blocking stream on device 0, closed afterwards).
    mode : {"thread_local", "global", "relaxed"}
        The capture mode, as in :meth:`Stream.capture`.

    Returns
    -------
    CaptureDiagnosis
        An exception the body raised is kept in ``raised`` (with its traceback) and named by the report;
        one that is not an :class:`Exception` (``KeyboardInterrupt``, ``SystemExit``) propagates.

    Raises
    ------
    TypeError
        If ``stream`` is neither a :class:`Stream` nor None.
    IllegalStateError
        If ``stream`` is capturing already (a capture of the caller's, or one it joined): the rehearsal
        needs a capture of its own, and that capture goes on untouched. Rehearse on another stream, or
        before or after that capture.
    """
    op = "cudacore.rehearse"
    if stream is not None:
        _check_stream(stream, op, none=True)
        if stream.capturing:
            raise error(
                "CUDA_ERROR_ILLEGAL_STATE",
                f"{op}: {stream!r} is capturing already; the rehearsal makes and discards a capture of its own, so "
                "rehearse on another stream, or before or after that capture (which goes on untouched)",
                op=op,
            )
    own = stream is None
    s = Stream() if stream is None else stream
    seen: list[dict[str, Any]] = []
    prev = getattr(_watch, "seen", None)
    _watch.seen = seen
    raised: BaseException | None = None
    escapes: list[str] = []
    nodes = 0
    began = False  # only the rehearsal's own capture is ever aborted here, never one it failed to begin
    try:
        s.begin_capture(mode)
        began = True
        try:
            body(s)
        except Exception as exc:  # noqa: BLE001 - the rehearsal reports it
            raised = exc
        try:
            graph = s.end_capture()
        except CUDAError as exc:
            if raised is None:
                raised = exc
        else:
            escapes, nodes = graph.escapes, graph.node_count
            graph.destroy()
    finally:
        _watch.seen = prev
        if began and not s.closed and s.capturing:  # a body that closed the stream discarded its capture
            s.abort_capture()
        if own:
            s.close()
    first = seen[0] if seen else None
    return CaptureDiagnosis(
        ok=first is None and raised is None and not escapes,
        first=first,
        symptoms=seen[1:],
        raised=raised,
        escapes=escapes,
        node_count=nodes,
    )


def _buffers_in(result: object, depth: int = 0) -> list[Any]:
    """The device Buffers in ``result``: itself, or held by its tuples, lists, sets and dict values."""
    if isinstance(result, fast.Buffer):
        return [result]
    if depth >= _MAX_DEPTH:
        return []
    if isinstance(result, (tuple, list, set, frozenset)):
        items: Any = result
    elif isinstance(result, dict):
        items = result.values()
    else:
        return []
    return [b for item in items for b in _buffers_in(item, depth + 1)]


def _device_arrays_in(result: object, where: str = "result", depth: int = 0) -> list[str]:
    """Where ``result`` holds memory a graph may write that is not a cudacore Buffer, which
    ``outputs="copy"`` cannot copy: a :class:`PinnedBuffer`, or another library's device array (an object
    with ``__cuda_array_interface__``, or with ``__dlpack__`` on a device other than the CPU)."""
    if isinstance(result, fast.Buffer) or depth > _MAX_DEPTH or isinstance(result, (str, bytes, bytearray, memoryview)):
        return []
    if isinstance(result, dict):
        return [w for k, v in result.items() for w in _device_arrays_in(v, f"{where}[{k!r}]", depth + 1)]
    if isinstance(result, (tuple, list)):
        return [w for i, v in enumerate(result) for w in _device_arrays_in(v, f"{where}[{i}]", depth + 1)]
    if isinstance(result, (set, frozenset)):
        return [w for v in result for w in _device_arrays_in(v, f"an item of {where}", depth + 1)]
    try:
        foreign = (
            isinstance(result, fast.PinnedBuffer)
            or hasattr(result, "__cuda_array_interface__")
            or (hasattr(result, "__dlpack__") and result.__dlpack_device__()[0] != 1)  # type: ignore[attr-defined]
        )
    except Exception:  # noqa: BLE001 - a property that raises: not an array we can name
        foreign = False
    return [f"{where} ({type(result).__module__}.{type(result).__qualname__})"] if foreign else []


def _rebuild(result: Any, items: list[Any]) -> Any:
    """A new container of ``result``'s type holding ``items`` (its values, for a dict) in their order."""
    if isinstance(result, tuple):
        make = getattr(result, "_make", None)
        if hasattr(result, "_fields") and callable(make):  # a namedtuple
            return make(items)
        return tuple(items) if type(result) is tuple else type(result)(items)
    if isinstance(result, frozenset):
        return type(result)(items)
    new = copy.copy(result)  # a list, set or dict (or a subclass, its other state kept)
    if isinstance(result, dict):
        new.clear()
        new.update(zip(result.keys(), items, strict=True))
    elif isinstance(result, list):
        new[:] = items
    else:
        new.clear()
        new.update(items)
    return new


class _Copier:
    """Fresh copies of the Buffers of one result, ordered on ``stream`` after the work that wrote them."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.made: list[Any] = []
        self.done: dict[int, Any] = {}  # id(original) -> its copy: a Buffer found twice is copied once

    def buffer(self, b: Any) -> Any:
        if b.closed:
            return b  # nothing to copy (fn returned a Buffer it had closed)
        got = self.done.get(id(b))
        if got is not None:
            return got
        s = self.stream
        if b.device_id == s.device.device_id:
            new = s.device.allocate(b.size, stream=s)
            self.made.append(new)
            _copy.device_to_device(new, b, s)
        else:
            # A Buffer of another device: its copy is made there, after everything on the stream.
            new = b.device.allocate(b.size)
            self.made.append(new)
            s.synchronize()
            _copy.device_to_device(new, b, None)
        self.done[id(b)] = new
        return new

    def copy(self, result: Any, depth: int = 0) -> Any:
        """``result`` with each Buffer in it (itself, or in its tuples, lists, sets and dict values) replaced
        by a fresh copy; containers holding none and every other value are returned as they are."""
        if isinstance(result, fast.Buffer):
            return self.buffer(result)
        if depth >= _MAX_DEPTH or not isinstance(result, (tuple, list, set, frozenset, dict)):
            return result
        old = list(result.values()) if isinstance(result, dict) else list(result)
        new = [self.copy(v, depth + 1) for v in old]
        if all(a is b for a, b in zip(old, new, strict=True)):
            return result
        return _rebuild(result, new)

    def discard(self) -> None:
        """Close the copies made so far (a copy failed: none of them reaches the caller)."""
        for b in self.made:
            try:
                b.close()
            except Exception:  # noqa: BLE001, S112 - the copy's own error is the one to raise
                continue


def _graph_buffers() -> weakref.WeakSet[Any]:
    """The Buffers of graph memory known now (allocated during some capture), weakly."""
    with _streams._capture_lock:
        return weakref.WeakSet(_streams._capture_buffers.values())


class Graphed(Generic[P, R]):
    """A function captured into a graph on its first call and replayed on later calls; see :func:`graphed`.

    Attributes
    ----------
    graph : Graph or None
        The captured graph, once the first call captured it.
    fallback_reason : str or None
        Why the function runs eagerly: the capture failed, or could not be replayed (None while it is
        graphed or not yet called).
    fallbacks : list of str
        Every fallback to eager execution, in order, each with its reason (a :meth:`reset` keeps them).
    error : BaseException or None
        The exception the capture failed with.
    warmup : int
        How many calls run eagerly before the capture.
    outputs : {"copy", "static"}
        What calls return: fresh copies of the Buffers in the result (``"copy"``), or the graph's own
        Buffers, which the next call overwrites (``"static"``); see :func:`graphed`.
    """

    def __init__(
        self, fn: Callable[P, R], stream: Any, mode: CaptureMode, warmup: int = 0, outputs: GraphedOutputs = "copy"
    ) -> None:
        _check_options(stream, mode, warmup, outputs)
        self._fn = fn
        self._stream = stream
        self._mode = mode
        self.warmup = warmup
        self.outputs: GraphedOutputs = outputs
        self._warmed = 0
        self.fallbacks: list[str] = []
        # The captured call's arguments: each device Buffer among them is a static input, which later
        # calls' Buffers are copied into before the replay; every other argument is baked into the graph.
        self._args: tuple[Any, ...] = ()
        self._kwargs: dict[str, Any] = {}
        self._lock = threading.Lock()
        # The thread inside a call, while it holds the lock: a call from inside fn on that thread (fn
        # calling itself) is part of the outer call and must not wait for the lock it holds.
        self._owner: int | None = None
        self.graph: Any = None
        self.fallback_reason: str | None = None
        self.error: BaseException | None = None
        self._result: Any = None
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "graphed")

    @property
    def eager(self) -> bool:
        """Whether calls run the function eagerly (its capture failed)."""
        return self.fallback_reason is not None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        me = threading.get_ident()
        if self._owner == me:
            # fn called itself: the inner call is part of the outer one's work, captured with it (and so
            # replayed with it) or run eagerly with it; the outer call's result is the one copied out.
            return self._fn(*args, **kwargs)
        with self._lock:
            self._owner = me
            try:
                if self.fallback_reason is not None:
                    return self._out(self._fn(*args, **kwargs))
                if self.graph is None:
                    if self._warmed < self.warmup:
                        self._warmed += 1  # a warm-up call: eager, before the capture (lazy setup, autotuning)
                        return self._out(self._fn(*args, **kwargs))
                    return self._out(self._capture(*args, **kwargs))
                # Inputs, launch and copies out in one turn: another thread's call between them would
                # overwrite this call's inputs, or its outputs, on the stream.
                self._load_inputs(args, kwargs)
                self.graph.launch(self._stream)
                return self._out(self._result)
            finally:
                self._owner = None

    def _out(self, result: R) -> R:
        """What a call returns: ``result`` itself (``outputs="static"``), or ``result`` with each Buffer in
        it replaced by a fresh copy, made on the stream after the work that wrote it (``"copy"``)."""
        if self.outputs == "static":
            return result
        copier = _Copier(self._stream)
        try:
            return copier.copy(result)  # type: ignore[no-any-return]
        except BaseException:
            copier.discard()
            raise

    def _load_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Copy a later call's Buffers into the captured call's (the graph's static inputs), on the
        graph's stream before its launch; refuse a call the graph cannot stand for."""
        op = "cudacore.graphed"
        if len(args) != len(self._args) or kwargs.keys() != self._kwargs.keys():
            raise error(
                "CUDA_ERROR_INVALID_VALUE",
                f"{op}: {self.__name__} was captured with {len(self._args)} positional argument(s) and keywords "
                f"{sorted(self._kwargs)}, and is called with {len(args)} and {sorted(kwargs)}: a graph replays one "
                "call's shape; call it as it was captured, or reset() it to capture again",
                op=op,
            )
        pairs = [(f"argument {i}", new, old) for i, (new, old) in enumerate(zip(args, self._args, strict=True))]
        pairs += [(f"argument {k}=", kwargs[k], self._kwargs[k]) for k in kwargs]
        copies = []
        for name, new, old in pairs:
            if new is old:
                continue
            if isinstance(old, fast.Buffer):
                if not isinstance(new, fast.Buffer) or new.size != old.size:
                    got = f"{new.size} bytes" if isinstance(new, fast.Buffer) else type(new).__name__
                    raise error(
                        "CUDA_ERROR_INVALID_VALUE",
                        f"{op}: {name} of {self.__name__} is a static input of {old.size} bytes (the captured call's "
                        f"Buffer, which later calls' Buffers are copied into) and this call passes {got}; pass a "
                        "Buffer of the same size, or reset() to capture again",
                        op=op,
                    )
                copies.append((old, new))
                continue
            same = False
            try:
                same = bool(new == old)
            except Exception:  # noqa: BLE001 - an array's ambiguous ==: not the same value
                same = False
            if not same:
                raise error(
                    "CUDA_ERROR_INVALID_VALUE",
                    f"{op}: {name} of {self.__name__} was {old!r} when captured and is {new!r} now: the graph baked in "
                    "the captured value (only Buffers are inputs a replay copies); pass the value in a Buffer, or "
                    "reset() to capture again",
                    op=op,
                )
        for old, new in copies:
            _copy.device_to_device(old, new, self._stream)

    def _capture(self, *args: P.args, **kwargs: P.kwargs) -> R:
        diag_seen: list[dict[str, Any]] = []
        prev = getattr(_watch, "seen", None)
        _watch.seen = diag_seen
        before = _graph_buffers()
        try:
            with self._stream.capture(self._mode) as graph:
                result = self._fn(*args, **kwargs)
        except CUDAError as exc:
            first = diag_seen[0] if diag_seen else None
            where = f" at {first['where']}" if first else ""
            self.error = exc
            self._fall_back(f"capture failed{where}: {first['message'] if first else exc}")
            return self._fn(*args, **kwargs)
        finally:
            _watch.seen = prev
        # A capture that ended cleanly can still be incomplete: an illegal operation whose error fn
        # swallowed is not in the graph, and work that escaped it ran once and would never be replayed.
        escapes = graph.escapes
        kept = self._kept_memory(graph, result, before) if not (diag_seen or escapes) else []
        if diag_seen or escapes or kept:
            graph.destroy()
            if diag_seen:
                first = diag_seen[0]
                self._fall_back(f"an illegal operation was left out of the capture at {first['where']}: {first['message']}")
            elif escapes:
                self._fall_back(f"{len(escapes)} operation(s) escaped the capture and would not be replayed: {'; '.join(escapes)}")
            else:
                self._fall_back(
                    f"{self.__name__} keeps memory it allocated inside the capture ({len(kept)} Buffer(s) of graph memory "
                    "still open when it returned, in its result or elsewhere): a graph cannot be launched again while "
                    "its last launch's memory is in use, so each call runs eagerly and returns its own Buffers. To keep "
                    "it graphed, allocate what it returns before the first call and have it write there, and close "
                    "its temporaries inside it"
                )
            # fn's work of this call ran as far as it was not captured; run it whole, eagerly.
            return self._fn(*args, **kwargs)
        self.graph, self._result = graph, result
        self._args, self._kwargs = args, dict(kwargs)
        if self.outputs == "copy":
            arrays = _device_arrays_in(result)
            if arrays:
                warnings.warn(
                    f"cudacore.graphed: {self.__name__} returns memory that is not a cudacore Buffer "
                    f"({'; '.join(arrays[:4])}{'; ...' if len(arrays) > 4 else ''}): outputs='copy' copies only "
                    "Buffers, so it is returned as it is, and if the graph writes it, each later call overwrites "
                    "it. Return the device Buffer (and view or copy it to the host after the call), or copy it "
                    "out yourself",
                    UserWarning,
                    stacklevel=3,
                )
        graph.launch(self._stream)
        return result

    def _fall_back(self, reason: str) -> None:
        """Run eagerly from now on, for ``reason``, kept in :attr:`fallback_reason` and :attr:`fallbacks`."""
        self.fallback_reason = reason
        self.fallbacks.append(reason)

    def _kept_memory(self, graph: Any, result: object, before: weakref.WeakSet[Any]) -> list[Any]:
        """The Buffers of graph memory that this capture allocated and fn left open: in its result, or
        on the capturing stream. Each launch of the graph allocates them again, which the driver allows
        only once the previous launch's are freed, so such a graph could not be replayed."""
        if not graph.allocations:
            return []
        device, handle = self._stream.device.device_id, self._stream.handle
        with _streams._capture_lock:
            made = list(_streams._capture_buffers.values())
        mine = {id(b) for b in _buffers_in(result)}
        return [
            b
            for b in made
            if b not in before
            and not b.closed
            and getattr(b, "_graph_token", 0) != 0
            and b.device_id == device
            and (b.stream_handle == handle or id(b) in mine)
        ]

    def reset(self) -> None:
        """Forget the graph (destroying it) and any fallback: the next call captures again.

        Raises
        ------
        IllegalStateError
            If called from inside the graphed function (its call is not over): call it afterwards.
        """
        if self._owner == threading.get_ident():
            raise error(
                "CUDA_ERROR_ILLEGAL_STATE",
                f"cudacore.graphed: reset() of {self.__name__} from inside its own call; reset it after the call returns",
                op="cudacore.graphed_reset",
            )
        with self._lock:
            if self.graph is not None:
                self.graph.destroy()
            self.graph, self.fallback_reason, self.error, self._result = None, None, None, None
            self._args, self._kwargs, self._warmed = (), {}, 0

    def __repr__(self) -> str:
        state = "eager: " + self.fallback_reason if self.fallback_reason else "graphed" if self.graph else "not yet captured"
        return f"<cudacore.graphed {self.__name__} ({state}, outputs={self.outputs!r})>"


def _check_options(stream: object, mode: object, warmup: object, outputs: object) -> None:
    """Refuse a bad option of :func:`graphed` when it is given, not at the capture (where a bad mode
    would only have made the capture fail, and the function run eagerly)."""
    op = "cudacore.graphed"
    _check_stream(stream, op, none=False)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise TypeError(f"{op}: warmup must be an int >= 0 (the eager calls before the capture), not {warmup!r}")
    if not isinstance(mode, str) or mode not in CAPTURE_MODES:
        raise error("CUDA_ERROR_INVALID_VALUE", f"{op}: unknown capture mode {mode!r}: use one of {', '.join(map(repr, CAPTURE_MODES))}", op=op)
    if not isinstance(outputs, str) or outputs not in GRAPHED_OUTPUTS:
        raise error(
            "CUDA_ERROR_INVALID_VALUE",
            f"{op}: outputs must be one of {', '.join(map(repr, GRAPHED_OUTPUTS))}, not {outputs!r}: 'copy' returns fresh "
            "copies of the result's Buffers, which the caller keeps; 'static' returns the graph's own Buffers, which "
            "the next call overwrites",
            op=op,
        )


@overload
def graphed(
    fn: Callable[P, R],
    *,
    stream: Stream,
    mode: CaptureMode = "thread_local",
    warmup: int = 0,
    outputs: GraphedOutputs = "copy",
) -> Graphed[P, R]: ...
@overload
def graphed(
    fn: None = None,
    *,
    stream: Stream,
    mode: CaptureMode = "thread_local",
    warmup: int = 0,
    outputs: GraphedOutputs = "copy",
) -> Callable[[Callable[P, R]], Graphed[P, R]]: ...
def graphed(
    fn: Callable[P, R] | None = None,
    *,
    stream: Stream,
    mode: CaptureMode = "thread_local",
    warmup: int = 0,
    outputs: GraphedOutputs = "copy",
) -> Graphed[P, R] | Callable[[Callable[P, R]], Graphed[P, R]]:
    """Capture ``fn`` into a graph on its first call (after ``warmup`` eager calls) and replay the graph on
    later calls.

    ``fn`` must issue its GPU work on ``stream``. The first ``warmup`` calls run ``fn`` eagerly (lazy
    set-up, autotuning: work that must not be captured). The next call captures its work and launches the
    graph once; each later call launches the graph on ``stream`` again (it does not wait). The captured
    call's device Buffers are the graph's static inputs: a later call's Buffer in the same place is copied
    into the captured one on ``stream`` before the replay (the same object needs no copy), and one of
    another size is refused; any other argument is baked into the graph and must be equal to the captured
    one, or the call is refused (``InvalidValueError``), as is a call of another shape (argument count,
    keywords).

    What a call returns depends on ``outputs``. The graph writes its results into the same memory at each
    replay (the Buffers ``fn`` returned when it was captured, allocated before the capture), so:

    - ``"copy"`` (the default): each call returns ``fn``'s result with every Buffer in it (the result
      itself, or in its tuples, lists, sets and dict values) replaced by a fresh Buffer of the same size,
      allocated from cudacore's allocator on ``stream`` and filled by a device-to-device copy ordered on
      ``stream`` after the launch. The copies are the caller's: later calls never touch them; close them
      (or let them be collected) when done. Containers holding no Buffer and every other value (None,
      numbers, host objects) are returned as they are. Eager calls (warm-up, fallback) return copies too,
      so what a call returns does not depend on whether the capture succeeded. Device memory that is not
      a cudacore Buffer (a CuPy or PyTorch array viewing the graph's memory) cannot be copied: the capture
      warns (``UserWarning``) and returns it as it is.
    - ``"static"``: each call returns ``fn``'s result as it is: the graph's own Buffers, the same objects at
      every call, which the next call overwrites (on ``stream``, when its launch runs). Read or copy out
      what you keep before calling again. Nothing detects a stale read: an earlier result and a later one
      are the same memory. No allocation and no copy are made per call.

    If the capture fails, ``fn`` runs eagerly on that call and every later one; the wrapper keeps working
    and records why (``.fallback_reason``, ``.error``, and every fallback in ``.fallbacks``). A capture that
    ends but cannot be replayed faithfully counts as failed: when ``fn`` swallowed a capture error, when
    work escaped the capture (it ran once, on another stream or synchronously, and a replay would not
    repeat it), and when ``fn`` keeps memory it allocated inside the capture (returns it, or leaves it open
    elsewhere): a graph's next launch needs that memory back, so each call runs eagerly and returns
    Buffers the caller owns.

    A call of the wrapper from inside ``fn`` (recursion) runs ``fn`` directly, as part of the outer
    call: captured with it, or run eagerly with it, and its result is not copied (the outer call's is).
    Calls from several threads take turns: each call's input copies, launch and output copies are made
    together.

    Use as ``step = cudacore.graphed(fn, stream=s)`` or as a decorator, ``@cudacore.graphed(stream=s)``.

    Parameters
    ----------
    fn : callable, optional
        The function to graph; leave it out to use ``graphed`` as a decorator.
    stream : Stream
        The stream ``fn`` issues its work on, and the graph is launched on.
    mode : {"thread_local", "global", "relaxed"}
        The capture mode, as in :meth:`Stream.capture`.
    warmup : int
        How many calls run ``fn`` eagerly before the capture.
    outputs : {"copy", "static"}
        What calls return: fresh copies of the result's Buffers, the caller's to keep (``"copy"``), or the
        graph's own Buffers, overwritten by the next call (``"static"``).

    Returns
    -------
    Graphed
        The wrapper (or, without ``fn``, a decorator that makes one).

    Raises
    ------
    TypeError
        If ``stream`` is not a :class:`Stream`, or ``warmup`` is not an int >= 0.
    InvalidValueError
        If ``mode`` or ``outputs`` is not one of its choices (the message lists them).
    """
    _check_options(stream, mode, warmup, outputs)
    if fn is None:

        def decorate(f: Callable[P, R]) -> Graphed[P, R]:
            return Graphed(f, stream, mode, warmup, outputs)

        return decorate
    return Graphed(fn, stream, mode, warmup, outputs)
