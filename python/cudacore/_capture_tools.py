"""Capture diagnostics: a rehearsal that finds the first illegal operation, and graphed functions.

:func:`rehearse` runs a capture body once, inside a capture that is then discarded, and reports the
first operation that capture refused or that invalidated it, with the Python ``file:line`` that issued it,
rather than the last symptom (a later call that fails because the capture was already invalidated, or the
error of ``end_capture``). It also reports the escape audit (:attr:`Graph.escapes`): work cudacore issued
while the capture ran that did not go into it.

:func:`graphed` wraps a function so that its first call captures it into a graph and later calls replay
that graph; if the capture fails, the function runs eagerly from then on and the reason is kept.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar

from . import _errors
from ._errors import CaptureError, CUDAError
from ._stream import Stream

__all__ = ["CaptureDiagnosis", "Graphed", "graphed", "rehearse"]

_PACKAGE_DIR = str(Path(__file__).resolve().parent) + os.sep

P = ParamSpec("P")
R = TypeVar("R")


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
        lines = ["capture rehearsal: FAILED" if self.first else "capture rehearsal: work escaped the capture"]
        if self.first:
            lines.append(f"  first illegal operation, at {self.first['where']}: {self.first['op']} ({self.first['name']})")
            lines.append(f"    {self.first['message']}")
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


def rehearse(body: Callable[[Any], object], stream: Any = None, *, mode: str = "thread_local") -> CaptureDiagnosis:
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
    """
    own = stream is None
    s = Stream() if own else stream
    seen: list[dict[str, Any]] = []
    prev = getattr(_watch, "seen", None)
    _watch.seen = seen
    raised: BaseException | None = None
    escapes: list[str] = []
    nodes = 0
    try:
        s.begin_capture(mode)
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
        if s.capturing:
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


class Graphed(Generic[P, R]):
    """A function captured into a graph on its first call and replayed on later calls; see :func:`graphed`.

    Attributes
    ----------
    graph : Graph or None
        The captured graph, once the first call captured it.
    fallback_reason : str or None
        Why the function runs eagerly: the capture failed (None while it is graphed or not yet called).
    error : BaseException or None
        The exception the capture failed with.
    """

    def __init__(self, fn: Callable[P, R], stream: Any, mode: str) -> None:
        self._fn = fn
        self._stream = stream
        self._mode = mode
        self._lock = threading.Lock()
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
        with self._lock:
            if self.fallback_reason is not None:
                return self._fn(*args, **kwargs)
            if self.graph is None:
                return self._capture(*args, **kwargs)
            graph = self.graph
        graph.launch(self._stream)
        return self._result  # type: ignore[no-any-return]

    def _capture(self, *args: P.args, **kwargs: P.kwargs) -> R:
        diag_seen: list[dict[str, Any]] = []
        prev = getattr(_watch, "seen", None)
        _watch.seen = diag_seen
        try:
            with self._stream.capture(self._mode) as graph:
                result = self._fn(*args, **kwargs)
        except CUDAError as exc:
            first = diag_seen[0] if diag_seen else None
            where = f" at {first['where']}" if first else ""
            self.error = exc
            self.fallback_reason = f"capture failed{where}: {first['message'] if first else exc}"
            return self._fn(*args, **kwargs)
        finally:
            _watch.seen = prev
        # A capture that ended cleanly can still be incomplete: an illegal operation whose error fn
        # swallowed is not in the graph, and work that escaped it ran once and would never be replayed.
        escapes = graph.escapes
        if diag_seen or escapes:
            graph.destroy()
            if diag_seen:
                first = diag_seen[0]
                self.fallback_reason = f"an illegal operation was left out of the capture at {first['where']}: {first['message']}"
            else:
                self.fallback_reason = f"{len(escapes)} operation(s) escaped the capture and would not be replayed: {'; '.join(escapes)}"
            # fn's work of this call ran as far as it was not captured; run it whole, eagerly.
            return self._fn(*args, **kwargs)
        self.graph, self._result = graph, result
        graph.launch(self._stream)
        return result

    def reset(self) -> None:
        """Forget the graph (destroying it) and any fallback: the next call captures again."""
        with self._lock:
            if self.graph is not None:
                self.graph.destroy()
            self.graph, self.fallback_reason, self.error, self._result = None, None, None, None

    def __repr__(self) -> str:
        state = "eager: " + self.fallback_reason if self.fallback_reason else "graphed" if self.graph else "not yet captured"
        return f"<cudacore.graphed {self.__name__} ({state})>"


def graphed(fn: Callable[P, R] | None = None, *, stream: Any, mode: str = "thread_local") -> Any:
    """Capture ``fn`` into a graph on its first call and replay the graph on later calls.

    ``fn`` must issue its GPU work on ``stream``. The first call captures that work, launches the graph
    once and returns ``fn``'s result; each later call launches the graph on ``stream`` again (it does not
    wait) and returns the first call's result: the arguments of later calls are not looked at, so the
    graph works on the buffers of the first call (refill them to change the input), as with every CUDA
    graph. If the capture fails, ``fn`` runs eagerly on that call and every later one; the wrapper keeps
    working and records why (``.fallback_reason``, ``.error``). A capture that ends but is incomplete counts
    as failed: when ``fn`` swallowed a capture error, or when work escaped the capture (it ran once, on
    another stream or synchronously, and a replay would not repeat it).

    Use as ``step = cudacore.graphed(fn, stream=s)`` or as a decorator, ``@cudacore.graphed(stream=s)``.
    """
    if fn is None:
        return lambda f: Graphed(f, stream, mode)
    return Graphed(fn, stream, mode)
