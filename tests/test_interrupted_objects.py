"""A Ctrl-C between a Go call that makes or gives back a driver object (a stream, an event, a graph, a module)
and the Python bookkeeping of it loses nothing (issue 30, "no window where a Ctrl-C loses it", for the
core objects; the signal sweep's core calls found these).

Each test wraps the Go entry so that a real SIGINT arrives as it returns, as a Ctrl-C there does: the
handler in place runs at the next point where Python handles a signal, which was before the handle was
stored (or, for a close, between marking the object closed and destroying it). The object must end up
owned (and so destroyed when closed or collected) or destroyed, and the interrupt must still be raised.
"""

from __future__ import annotations

import gc
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cudacore as cc
from cudacore._native import core

from conftest import objects

pytestmark = pytest.mark.sim

PTX = (Path(__file__).resolve().parent / "kernels" / "fill.ptx").read_bytes()


@pytest.fixture(autouse=True)
def _main_thread() -> None:
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("needs the main thread and Python's own SIGINT handler")


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """Make Go's ``entry`` deliver a real SIGINT as it returns."""
    real = getattr(core, entry)

    def wrapped(*args: Any) -> Any:
        out = real(*args)
        signal.raise_signal(signal.SIGINT)
        return out

    monkeypatch.setattr(core, entry, wrapped)


def _accounting(d: cc.Device) -> tuple[dict[str, int], int]:
    gc.collect()
    return objects(), d.memory_stats()["in_use"]


def _capturing(d: cc.Device) -> cc.Stream:
    s = d.create_stream()
    s.begin_capture()
    with d.allocate(4096, stream=s):  # graph memory: the graph's to free
        pass
    return s


MAKERS: dict[str, tuple[str, Callable[[cc.Device, list[Any]], Any]]] = {
    "create_stream": ("StreamCreate", lambda d, keep: d.create_stream()),
    "create_event": ("EventCreate", lambda d, keep: cc.Event(d)),
    "create_interprocess_event": ("EventCreateInterprocess", lambda d, keep: cc.Event(d, interprocess=True)),
    "end_capture": ("StreamEndCapture", lambda d, keep: keep[0].end_capture()),
    "load_module": ("ModuleLoad", lambda d, keep: d.load_module(PTX)),
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_an_object_made_as_a_ctrl_c_comes_is_not_lost(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Before: the stream, event, module or graph (with its graph memory) Go had made stayed alive for
    good, its handle dropped with the interrupted frame."""
    d = cc.Device(0)
    keep = [_capturing(d)] if name == "end_capture" else []
    before = _accounting(d)
    entry, make = MAKERS[name]
    _interrupt_after(monkeypatch, entry)
    with pytest.raises(KeyboardInterrupt):
        make(d, keep)
    monkeypatch.undo()
    after = _accounting(d)
    if name == "end_capture":  # the capture is over and its graph, dropped, is destroyed
        before[0]["captures"] -= 1
        assert not keep[0].capturing
        keep[0].close()
    assert after == before


def test_a_module_unloaded_as_a_ctrl_c_comes_is_unloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: Module.unload() detached its finalizer, and a Ctrl-C at the end of that call came before Go
    unloaded the module: loaded for good, with nothing left to unload it."""
    import weakref

    d = cc.Device(0)
    before = _accounting(d)
    m = d.load_module(PTX)
    real = weakref.finalize.detach

    def detach(self: weakref.finalize) -> Any:
        out = real(self)
        signal.raise_signal(signal.SIGINT)
        return out

    monkeypatch.setattr(weakref.finalize, "detach", detach)
    with pytest.raises(KeyboardInterrupt):
        m.unload()
    monkeypatch.undo()
    assert m.closed
    m.unload()  # again: nothing to do
    del m
    assert _accounting(d) == before


def test_a_stream_closed_as_a_ctrl_c_comes_is_destroyed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: Stream.close() marked the stream closed, then read the device's ordinal through a Python
    property, where a Ctrl-C came before Go destroyed the stream: closed for Python, alive in Go for good."""
    d = cc.Device(0)
    before = _accounting(d)
    s = d.create_stream()
    reads: list[int] = []

    def device_id(self: cc.Device) -> int:
        reads.append(1)
        if len(reads) == 1:
            signal.raise_signal(signal.SIGINT)
        return int(self._ordinal)

    monkeypatch.setattr(cc.Device, "device_id", property(device_id))
    with pytest.raises(KeyboardInterrupt):
        s.close()
    monkeypatch.undo()
    s.close()
    del s
    assert _accounting(d) == before
