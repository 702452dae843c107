"""A KeyboardInterrupt at the edges of ``with stream.capture()`` never leaves the stream capturing.

Python runs a signal's handler between two bytecodes of the main thread, wherever it is. The sweep here
trips SIGINT at every bytecode of cudacore's capture code (stream.py, and contextlib, where a context
manager of a generator would run) on the way into and out of a capture block, one position per run: a real
signal, handled by whatever SIGINT handler is in place, as a Ctrl-C is. After each run the stream must not
be capturing, must not be listed as capturing (the direct path and the recycle log read that list), and the
graph must be either a whole one that launches or a destroyed one.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import cudacore as cc
from cudacore import _stream
from cudacore._native import fast

WATCHED = (str(Path(_stream.__file__).resolve()), str(Path(__import__("contextlib").__file__).resolve()))


class Tripper:
    """A trace function that raises SIGINT at the ``at``-th bytecode (or line) run in the watched files."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.seen = 0
        self.fired = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            if frame.f_code.co_name == "__del__" or str(Path(frame.f_code.co_filename).resolve()) not in WATCHED:
                return None  # a finalizer the collector runs meanwhile is no edge of the capture
            # Opcode events where the interpreter gives them (3.11; CPython 3.12's settrace gives none when
            # they are asked for in the call event), line events everywhere: on 3.12 the sweep steps by line.
            frame.f_trace_opcodes = True
            frame.f_trace_lines = True
            return self
        if event in ("opcode", "line"):
            if self.seen == self.at and not self.fired:
                self.fired = True
                signal.raise_signal(signal.SIGINT)  # handled at the next check of the eval loop
            self.seen += 1
        return self


def _capture_once(dev: cc.Device, s: cc.Stream, buf: cc.Buffer, pinned: cc.PinnedBuffer, at: int, fail: bool) -> tuple[Tripper, bool, Any]:
    tripper = Tripper(at)
    interrupted, graph = False, None
    try:
        sys.settrace(tripper)
        try:
            with s.capture() as graph:
                buf.copy_from(pinned, stream=s)
                if fail:
                    raise ValueError("the block's own error")
        finally:
            sys.settrace(None)
    except KeyboardInterrupt:
        interrupted = True
    except ValueError:
        assert fail
    return tripper, interrupted, graph


@pytest.mark.parametrize("fail", [False, True], ids=["block-ends", "block-raises"])
def test_an_interrupt_at_every_bytecode_of_the_capture_edges_leaves_no_capture(dev: cc.Device, fail: bool) -> None:
    if threading.current_thread() is not threading.main_thread() or not callable(signal.getsignal(signal.SIGINT)):
        pytest.skip("needs the main thread and a Python SIGINT handler")
    s = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    pinned = dev.allocate_pinned(4096)
    handler = signal.getsignal(signal.SIGINT)
    runs = interrupts = 0
    try:
        for at in range(100000):
            tripper, interrupted, graph = _capture_once(dev, s, buf, pinned, at, fail)
            runs += 1
            interrupts += interrupted
            where = f"SIGINT at bytecode {at} of the capture's edges"
            assert not s.capturing, where
            assert not fast.capturing(), where
            assert signal.getsignal(signal.SIGINT) is handler, where
            if graph is not None and not graph.destroyed:
                assert not fail and graph.node_count == 1, where
                graph.launch(s)
                graph.destroy()
            if not tripper.fired:
                break  # every position was tried
        else:
            pytest.fail("the sweep did not end")
        s.synchronize()
    finally:
        buf.close()
        pinned.close()
        s.close()
    assert runs > 20 and interrupts > 0, (runs, interrupts)


def test_an_interrupt_held_at_the_exit_is_raised_once_the_capture_ended(dev: cc.Device) -> None:
    """A Ctrl-C that comes while the block is left is raised after the capture has ended: the graph is
    whole, and the handler that was in place is back."""
    if threading.current_thread() is not threading.main_thread() or not callable(signal.getsignal(signal.SIGINT)):
        pytest.skip("needs the main thread and a Python SIGINT handler")
    s = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    pinned = dev.allocate_pinned(4096)
    real_end = _stream.Stream.end_capture

    def end_then_interrupt(self: cc.Stream) -> cc.Graph:
        g = real_end(self)
        signal.raise_signal(signal.SIGINT)  # right after the driver ended it, before the Graph is kept
        return g

    handler = signal.getsignal(signal.SIGINT)
    _stream.Stream.end_capture = end_then_interrupt  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt), s.capture() as g:
            buf.copy_from(pinned, stream=s)
    finally:
        _stream.Stream.end_capture = real_end  # type: ignore[method-assign]
    assert not s.capturing and signal.getsignal(signal.SIGINT) is handler
    assert not g.destroyed and g.node_count == 1
    g.launch(s)
    s.synchronize()
    for x in (g, buf, pinned, s):
        x.close()


def _every_signal_check(call: Any) -> list[tuple[int, bool, BaseException | None]]:
    """``call()`` with a real SIGINT at each point where Python handles one in turn (the sweep's
    ``fuzz_mix.Tripper``), until a position lies beyond the call: per run, whether the signal fired and
    what the call raised."""
    import fuzz_mix

    out: list[tuple[int, bool, BaseException | None]] = []
    for at in range(10_000):
        tripper, raised = fuzz_mix.Tripper(at), None
        try:
            sys.settrace(tripper)
            try:
                call()
            finally:
                sys.settrace(None)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            raised = exc
        if not tripper.fired:
            return out
        out.append((at, tripper.fired, raised))
    pytest.fail("the sweep did not end")


def _needs_main_thread() -> None:
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("needs the main thread and Python's own SIGINT handler")


def test_every_interrupt_of_a_hold_is_delivered() -> None:
    """A Ctrl-C anywhere in a hold (``_owner.uninterrupted``: the hold, the work, the release) is raised
    once the work is done, never lost: one that came inside ``_release_interrupts`` after it had read the
    pending flag (in the signal module's wrappers it called then) was dropped, and the call returned."""
    from cudacore import _owner

    _needs_main_thread()
    done: list[int] = []

    def work() -> None:
        done.clear()
        done.extend(range(3))
        done.append(len(done))  # a call: a check inside the hold

    runs = _every_signal_check(lambda: _owner.uninterrupted(work))
    assert len(runs) > 5
    lost = [at for at, _, raised in runs if not isinstance(raised, KeyboardInterrupt)]
    assert lost == [], f"the interrupt was lost at positions {lost} of {len(runs)}"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_inner_hold_leaves_its_interrupt_to_the_outer_one() -> None:
    """Holds nest (a capture block's exit ends the capture through another hold): an interrupt that comes
    inside the inner one is raised by the outer one's release, once the outer work is done, not in the
    middle of it."""
    from cudacore import _owner

    _needs_main_thread()
    steps: list[str] = []

    def outer() -> None:
        steps.clear()
        steps.append("outer")
        _owner.uninterrupted(lambda: steps.append("inner"))
        steps.append("after the inner hold")

    runs = _every_signal_check(lambda: _owner.uninterrupted(outer))
    assert len(runs) > 5
    for at, _, raised in runs:
        assert isinstance(raised, KeyboardInterrupt), f"position {at}: {raised!r}"
        assert steps in ([], ["outer", "inner", "after the inner hold"]), f"position {at}: the outer work stopped at {steps}"


def test_every_interrupt_at_the_capture_edges_is_delivered(dev: cc.Device) -> None:
    """``with s.capture()``: a Ctrl-C at any signal check of the block's edges or its body is raised by the
    time the block is left, and leaves no capture."""
    _needs_main_thread()
    s = dev.create_stream()
    buf = dev.allocate(4096, stream=s)
    pinned = dev.allocate_pinned(4096)
    graphs: list[cc.Graph] = []

    def block() -> None:
        with s.capture() as g:
            graphs.append(g)
            buf.copy_from(pinned, stream=s)

    try:
        runs = _every_signal_check(block)
        assert len(runs) > 20
        lost = [at for at, _, raised in runs if not isinstance(raised, KeyboardInterrupt)]
        assert lost == [], f"the interrupt was lost at positions {lost} of {len(runs)}"
        assert not s.capturing and not fast.capturing()
    finally:
        for g in graphs:
            g.destroy()
        for x in (buf, pinned, s):
            x.close()
