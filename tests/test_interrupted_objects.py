"""A Ctrl-C between a Go call that makes or gives back a driver object (a stream, an event, a graph, a module)
and the Python bookkeeping of it loses nothing (issue 30, "no window where a Ctrl-C loses it", for the
core objects; the signal sweep's core calls found these).

A real SIGINT comes at every point of the call where Python handles one (the signal sweep's Tripper), or
as a Go entry returns (wrapped so that it sends one), as a Ctrl-C there does: the handler in place runs at
the next such point, which was before the handle was stored (or, for a close, between marking the object
closed and destroying it). The object must end up owned (and so destroyed when closed or collected) or
destroyed, and the interrupt must still be raised.
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


MAKERS: dict[str, Callable[[cc.Device, list[Any]], Any]] = {
    "create_stream": lambda d, keep: d.create_stream(),
    "create_event": lambda d, keep: cc.Event(d),
    "create_interprocess_event": lambda d, keep: cc.Event(d, interprocess=True),
    "end_capture": lambda d, keep: keep[0].end_capture(),
    "load_module": lambda d, keep: d.load_module(PTX),
}


def _at_every_signal_check(call: Callable[[], Any], after: Callable[[], None]) -> int:
    """``call()`` with a real SIGINT at each point where Python handles one in turn (the signal sweep's
    Tripper), ``after()`` after each run; returns how many positions there were."""
    import sys

    import fuzz_mix

    for at in range(1000):
        tripper = fuzz_mix.Tripper(at)
        try:
            sys.settrace(tripper)
            try:
                call()
            finally:
                sys.settrace(None)
        except KeyboardInterrupt:
            pass
        after()
        if not tripper.fired:
            return at
    pytest.fail("the sweep did not end")


@pytest.mark.parametrize("name", list(MAKERS))
def test_an_object_made_as_a_ctrl_c_comes_is_not_lost(name: str) -> None:
    """A real SIGINT at every point of the call where Python handles one. Before: the stream, event,
    module or graph (with its graph memory) Go had made stayed alive for good where the signal came at the
    end of the Go call, its handle dropped with the interrupted frame."""
    d = cc.Device(0)
    keep: list[Any] = []
    make = MAKERS[name]

    def setup() -> None:
        if name == "end_capture":
            for s in keep:
                s.close()
            keep[:] = [_capturing(d)]

    setup()
    before = _accounting(d)

    def after() -> None:
        if name == "end_capture":
            assert before[0]["captures"] == 1
            keep[0].close()  # ends the capture if the interrupt came before end_capture did
            got = _accounting(d)
            assert got == ({**before[0], "captures": 0, "streams": before[0]["streams"] - 1}, before[1]), got
            keep[:] = [_capturing(d)]
        else:
            assert _accounting(d) == before

    positions = _at_every_signal_check(lambda: make(d, keep), after)
    keep[0].close() if keep else None
    assert positions > 2


def test_a_module_unloaded_as_a_ctrl_c_comes_is_unloaded() -> None:
    """Before: Module.unload() detached its finalizer, and a Ctrl-C at the end of that call came before Go
    unloaded the module: loaded for good, with nothing left to unload it. A real SIGINT at every point of
    unload() where Python handles one (the signal sweep's Tripper)."""
    import sys

    import fuzz_mix

    d = cc.Device(0)
    before = _accounting(d)
    for at in range(1000):
        m = d.load_module(PTX)
        tripper = fuzz_mix.Tripper(at)
        try:
            sys.settrace(tripper)
            try:
                m.unload()
            finally:
                sys.settrace(None)
        except KeyboardInterrupt:
            pass
        m.unload()  # again (an interrupt at its entry came before anything was done)
        assert m.closed
        del m
        assert _accounting(d) == before, f"SIGINT at position {at} of unload()"
        if not tripper.fired:
            break
    assert at > 2


def test_a_module_collected_as_a_ctrl_c_comes_is_unloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Module dropped is unloaded by its finalizer, called again where a Ctrl-C cut it short (a finalizer
    in Python would stop there, the Ctrl-C dropped by Python and the module loaded for good), and the
    Ctrl-C is delivered past the finalizer."""
    d = cc.Device(0)
    before = _accounting(d)
    m = d.load_module(PTX)
    _interrupt_after(monkeypatch, "ModuleUnload")  # the first try's unload done, then a Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        del m
        for _ in range(100):  # the interrupt comes at a check after the finalizer
            pass
    monkeypatch.undo()
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


def test_an_owner_collected_as_a_ctrl_c_comes_gives_back_what_it_owns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Owner, Stream, Event, Graph and Module finalize in C (``fast.finalizer``): where a Ctrl-C cuts the
    Python part short it is called again, and the Ctrl-C is raised past the finalizer. Before, the
    finalizer was Python's __del__: Python dropped the KeyboardInterrupt ("Exception ignored") and the
    owner's descriptors stayed open for good (the SIGINT storm, tests/sigint_storm.py, lost 30 to 40 in 5
    seconds of export and close)."""
    import os

    from cudacore import _api, _owner

    r, w = os.pipe()
    owner = _owner.Descriptors([r])
    real, calls = _api.forked, []

    def forked() -> bool:  # the finalizer's first call: a Ctrl-C comes as it returns
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)
        return real()

    monkeypatch.setattr(_api, "forked", forked)
    with pytest.raises(KeyboardInterrupt):
        del owner
        for _ in range(100):  # delivered at a check past the finalizer
            pass
    monkeypatch.undo()
    assert len(calls) == 2, "called again after the interrupt"
    with pytest.raises(OSError):
        os.fstat(r)  # closed
    os.close(w)


def test_a_dlpack_tensor_taken_as_a_ctrl_c_comes_is_given_back() -> None:
    """``from_dlpack`` with a real SIGINT at every point where Python handles one. Before: it renamed the
    capsule (the tensor the consumer's from then on, its destructor no longer calling the deleter) and only
    then made the owner that calls the deleter, so a Ctrl-C at the end of the rename lost the tensor: its
    producer, a Buffer, refused to close for good ("1 DLPack export of it is alive") and its memory stayed
    in use (the random mix, seed 41000099)."""
    import sys

    import fuzz_mix
    from cudacore import interop

    d = cc.Device(0)
    before = _accounting(d)
    for at in range(1000):
        buf = d.allocate(4096)
        tripper = fuzz_mix.Tripper(at)
        try:
            sys.settrace(tripper)
            try:
                interop.from_dlpack(buf)  # the view dropped: the tensor goes back to its producer
            finally:
                sys.settrace(None)
        except KeyboardInterrupt:
            pass
        gc.collect()
        buf.close()  # BufferError where the export was lost
        del buf
        assert _accounting(d) == before, f"SIGINT at position {at} of from_dlpack"
        if not tripper.fired:
            break
    assert at > 2


class _HostTensor:
    """A host DLPack tensor only (NumPy's, without the buffer protocol): a copy takes it by DLPack."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def __dlpack__(self, *, stream: object = None, max_version: tuple[int, int] | None = None) -> Any:
        return self.array.__dlpack__(stream=stream, max_version=max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.array.__dlpack_device__()  # type: ignore[no-any-return]


def test_a_host_dlpack_tensor_copied_as_a_ctrl_c_comes_is_released_once() -> None:
    """``Buffer.copy_from`` a host DLPack tensor with a real SIGINT at every point where Python handles one:
    the tensor's deleter (NumPy's drops the array's reference) runs exactly once, whether the copy took the
    tensor or not. Before: a Ctrl-C at the end of the capsule's rename lost the tensor (the array never
    released)."""
    import sys

    import numpy as np

    import fuzz_mix

    d = cc.Device(0)
    before = _accounting(d)
    array = np.arange(4096, dtype=np.uint8)
    refs = sys.getrefcount(array)
    with d.allocate(4096) as buf:
        for at in range(5000):
            tripper = fuzz_mix.Tripper(at)
            try:
                sys.settrace(tripper)
                try:
                    buf.copy_from(_HostTensor(array))
                finally:
                    sys.settrace(None)
            except KeyboardInterrupt:
                pass
            gc.collect()
            assert sys.getrefcount(array) == refs, f"SIGINT at position {at} of copy_from"
            if not tripper.fired:
                break
    assert at > 2
    assert _accounting(d) == before


def test_a_sigint_storm_loses_nothing() -> None:
    """Item 18's storm: real SIGINTs every few hundred microseconds (a thread's pthread_kill) over the calls
    that make and give back streams, events, Buffers, pinned, managed and shareable memory, tiles, modules
    and captures; afterwards every count is back and no capture block left its stream capturing
    (tests/sigint_storm.py; ``--seconds 60`` for a long run)."""
    import json
    import os
    import subprocess
    import sys

    here = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    env["CUDACORE_BACKEND"] = "sim"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(here.parent / "python"), os.environ.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, str(here / "sigint_storm.py"), "--seconds", "4"], env=env, capture_output=True, text=True, timeout=300, check=False)
    counts = json.loads(r.stdout.splitlines()[-1])
    assert counts["violations"] == [], r.stderr[-4000:]
    assert r.returncode == 0 and counts["interrupts"] > 100 and counts["ops"] > 1000, counts
