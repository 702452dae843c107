"""The current device and stream: ``with stream:``, ``with device:``, ``Device.use()`` and ``stream=None``."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import cudacore as cc
from cudacore import _copy, _handles, _module, _stream

from conftest import run_python

TWO_DEVICES = json.dumps([{"name": "sim-a", "total_memory": 1 << 30}, {"name": "sim-b", "total_memory": 1 << 30}])


@pytest.fixture
def dev() -> Iterator[cc.Device]:
    d = cc.Device(0)
    yield d
    # Nothing stays allocated, and the pool's cache goes back (later files read the free memory).
    gc.collect()
    assert d.memory_stats()["in_use"] == 0
    d.release_cached_memory()
    assert cc.current_stream() == cc.Stream.legacy(d) and cc.current_device() is d
    assert _handles.open_stream_blocks == 0  # every block the test opened was left


def test_defaults_are_device_0_and_its_legacy_stream(dev: cc.Device) -> None:
    assert cc.current_device() is dev
    s = cc.current_stream()
    assert s == cc.Stream.legacy(dev) and s.handle == 1 and s.device is dev and not s.closed
    assert cc.current_stream(dev) == cc.current_stream(0) == s
    assert _handles.stream_handle(None, 0) == 0  # the legacy default stream, as before
    with dev.allocate(64) as buf:
        assert buf.stream_handle == 0


def test_with_stream_makes_it_current_and_nesting_restores(dev: cc.Device) -> None:
    s1, s2 = dev.create_stream(), dev.create_stream()
    try:
        with s1 as entered:
            assert entered is s1
            assert cc.current_stream() is s1
            with s2:
                assert cc.current_stream() is s2
                with s1:
                    assert cc.current_stream() is s1
                assert cc.current_stream() is s2
            assert cc.current_stream() is s1
        assert cc.current_stream() == cc.Stream.legacy(dev)
        # Leaving does not close: the streams still work.
        assert not s1.closed and not s2.closed
        s1.synchronize()
        with dev.allocate(64, stream=s2) as buf:
            assert buf.stream_handle == s2.handle
    finally:
        s1.close()
        s2.close()


def test_exception_in_block_restores_the_previous_stream(dev: cc.Device) -> None:
    s = dev.create_stream()
    with pytest.raises(KeyError), s:
        raise KeyError("x")
    assert cc.current_stream() == cc.Stream.legacy(dev)
    assert not s.closed
    s.close()


def test_stream_none_means_the_current_stream(dev: cc.Device) -> None:
    s = dev.create_stream()
    with s:
        assert _handles.stream_handle(None, 0) == s.handle
        with dev.allocate(256) as buf:  # allocation ordered on the current stream
            assert buf.stream_handle == s.handle
        tiles = dev.allocate_tiles(3, 128)
        assert {t.stream_handle for t in tiles} == {s.handle}
        for t in tiles:
            t.close()
        assert cc.Event().record().handle  # records on s: a legal enqueue
    with dev.allocate(256) as buf:
        assert buf.stream_handle == 0
    s.close()


class _MyStream(cc.Stream):
    """A subclass: the C door reads its fields as it reads a Stream's (they are the C base's)."""

    __slots__ = ()


def test_allocate_takes_every_stream_form(dev: cc.Device) -> None:
    """Device.allocate resolves its stream in C for the common forms and in Python for the rest: each form
    orders the buffer on the stream it names, and a bad one is refused with the argument named."""
    s = dev.create_stream()
    sub = object.__new__(_MyStream)
    for slot in ("_device", "_handle", "_owned", "_closed", "_non_blocking", "_priority"):
        setattr(sub, slot, getattr(s, slot))
    sub._owned = False  # s owns the driver stream; the subclass only views it
    cases = [(None, 0), (s, s.handle), (s.handle, s.handle), (0, 0), (cc.Stream.legacy(dev), 1), (sub, s.handle)]
    for stream, want in cases:
        with dev.allocate(64, stream=stream) as buf:
            assert buf.stream_handle == want, stream
    with s:
        with dev.allocate(64) as buf:
            assert buf.stream_handle == s.handle
        with dev.allocate(64, stream=0) as buf:  # an explicit handle is not the current stream
            assert buf.stream_handle == 0
    with pytest.raises(cc.InvalidValueError, match="stream"):
        dev.allocate(64, stream=-1)
    with pytest.raises(cc.InvalidValueError, match="stream"):
        dev.allocate(64, stream=2**64)
    for bad in ("s", 1.5, True, object()):
        with pytest.raises(TypeError, match="stream"):
            dev.allocate(64, stream=bad)
    with pytest.raises(cc.InvalidValueError, match="size"):
        dev.allocate(0, stream=s)
    assert dev.memory_stats()["in_use"] == 0
    s.close()


def test_stream_none_inside_a_capture_is_captured(dev: cc.Device) -> None:
    """Work given stream=None inside `with s:` goes into s's capture: the graph holds it."""
    s = dev.create_stream()
    pinned = dev.allocate_pinned(256)
    pinned.numpy()[:] = 7
    out = dev.allocate_pinned(256)
    buf = dev.allocate(256, stream=s)
    with s, s.capture() as graph:
        buf.copy_from(pinned)  # stream=None: s, and no wait (waiting is illegal in a capture)
        buf.copy_to(out)
        scratch = dev.allocate(64)  # a graph allocation node
        scratch.close()
    assert graph.node_count >= 3
    assert graph.allocations == 1
    assert bytes(out.numpy()) == bytes(256)  # captured, not run
    graph.launch()  # stream=None: s again
    s.synchronize()
    assert bytes(out.numpy()) == b"\x07" * 256
    graph.close()
    buf.close()
    s.close()


def test_copy_with_stream_none_waits_for_the_current_stream(dev: cc.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a capture, a copy given stream=None on a current stream is synchronous: it waits for it."""
    waited: list[int] = []
    real = cc.Stream.synchronize

    def spy(self: cc.Stream) -> None:
        waited.append(self.handle)
        real(self)

    monkeypatch.setattr(cc.Stream, "synchronize", spy)
    s = dev.create_stream()
    host = bytearray(b"\x05" * 100)
    with dev.allocate(100, stream=s) as buf:
        buf.copy_from(host)  # the legacy stream: the synchronous copy, no stream to wait for
        assert waited == []
        with s:
            buf.copy_from(bytes(range(100)))
            got = bytearray(100)
            buf.copy_to(got)
            assert got == bytes(range(100))
            other = dev.allocate(100)
            cc.device_to_device(other, buf)
            other.close()
        assert waited == [s.handle] * 3
        assert _copy.SYNC == -1
    s.close()


def test_per_thread(dev: cc.Device) -> None:
    s = dev.create_stream()
    seen: dict[str, object] = {}
    ready, done = threading.Event(), threading.Event()

    def other() -> None:
        ready.wait()
        seen["current"] = cc.current_stream()
        with dev.allocate(64) as buf:
            seen["handle"] = buf.stream_handle
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with s:
        assert _handles.open_stream_blocks == 1  # so the other thread looks at its own state
        ready.set()
        done.wait(10)
    t.join(10)
    assert seen == {"current": cc.Stream.legacy(dev), "handle": 0}
    s.close()


def test_closing_the_current_stream(dev: cc.Device) -> None:
    """A stream closed inside its block stays current; stream=None there raises; the block's end restores."""
    outer = dev.create_stream()
    s = dev.create_stream()
    keep = dev.allocate(64, stream=outer)
    with outer:
        with s:
            s.close()
            assert cc.current_stream() is s and s.closed
            with pytest.raises(cc.InvalidHandleError, match="was closed inside its `with stream:` block") as e:
                dev.allocate(64)
            assert e.value.name == "CUDACORE_ERROR_CLOSED"
            with pytest.raises(cc.InvalidHandleError):
                keep.copy_from(b"x" * 64)
            with pytest.raises(cc.InvalidHandleError):
                cc.Event().record()
            # An explicit stream still works.
            with dev.allocate(64, stream=outer) as buf:
                buf.copy_from(b"y" * 64, stream=outer)
        assert cc.current_stream() is outer
        with dev.allocate(64) as buf:
            assert buf.stream_handle == outer.handle
    # A closed stream cannot be entered.
    with pytest.raises(cc.InvalidHandleError) as e:
        s.__enter__()
    assert e.value.name == "CUDACORE_ERROR_CLOSED"
    assert cc.current_stream() == cc.Stream.legacy(dev)
    keep.close()
    outer.close()


def test_closed_elsewhere_while_current(dev: cc.Device) -> None:
    """Another thread closing this thread's current stream has the same effect."""
    s = dev.create_stream()
    with s:
        t = threading.Thread(target=s.close)
        t.start()
        t.join(10)
        with pytest.raises(cc.InvalidHandleError):
            dev.allocate(64)
    with dev.allocate(64) as buf:
        assert buf.stream_handle == 0


def test_leaving_blocks_out_of_order_is_refused(dev: cc.Device) -> None:
    a, b = dev.create_stream(), dev.create_stream()
    a.__enter__()
    b.__enter__()
    with pytest.raises(cc.IllegalStateError, match="innermost"):
        a.__exit__(None, None, None)
    assert cc.current_stream() is b  # nothing changed
    b.__exit__(None, None, None)
    a.__exit__(None, None, None)
    assert cc.current_stream() == cc.Stream.legacy(dev)
    with pytest.raises(cc.IllegalStateError):
        a.__exit__(None, None, None)
    a.close()
    b.close()


def test_with_device_and_use_on_one_device(dev: cc.Device) -> None:
    with dev as entered:
        assert entered is dev and cc.current_device() is dev
    assert dev.use() is dev
    assert cc.current_device() is dev


def test_devices_and_streams_on_two_devices() -> None:
    code = """
import threading
import cudacore as cc

d0, d1 = cc.Device(0), cc.Device(1)
assert cc.current_device() is d0
with d1:
    assert cc.current_device() is d1
    assert cc.current_stream() == cc.Stream.legacy(d1)
    assert cc.Stream().device is d1                  # device=None: the current device
    assert cc.Event().device is d1
    with d0:
        assert cc.current_device() is d0
    assert cc.current_device() is d1
assert cc.current_device() is d0

s1 = d1.create_stream()
with s1:                                             # also makes its device current
    assert cc.current_device() is d1
    assert cc.current_stream() is s1 and cc.current_stream(d1) is s1
    assert cc.current_stream(d0) == cc.Stream.legacy(d0)   # per device
    with d0.allocate(64) as b0, d1.allocate(64) as b1:
        assert b0.stream_handle == 0 and b1.stream_handle == s1.handle
assert cc.current_device() is d0

# use(): until the next use(), or until an enclosing block ends
d1.use()
assert cc.current_device() is d1
seen = []
t = threading.Thread(target=lambda: seen.append(cc.current_device()))
t.start(); t.join()
assert seen == [d0]                                  # per thread
with d0:
    d1.use()
    assert cc.current_device() is d1
    d0.use()
assert cc.current_device() is d1                     # the block restored what was current when it began
d0.use()
s1.close()
print("ok")
"""
    r = run_python(code, {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": TWO_DEVICES})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_exports() -> None:
    assert cc.current_stream is cc._stream.current_stream
    assert cc.current_device is cc._device.current_device
    assert {"current_device", "current_stream"} <= set(cc.__all__)


@pytest.mark.gpu
def test_gpu_kernel_launch_with_stream_none_goes_on_the_current_stream(dev: cc.Device) -> None:
    """On a GPU: a kernel launched with stream=None inside `with s:` is captured by s's capture (so it went
    on s), the graph launched with stream=None runs on s, and a stream=None copy there waits for it."""
    k = dev.load_module(Path(__file__).parent / "kernels" / "fill.ptx").function("fill")
    n = 1 << 16
    s = dev.create_stream()
    out = dev.allocate_pinned(4 * n)
    with s, dev.allocate(4 * n) as buf:
        with s.capture() as graph:
            k.launch(grid=n // 256, block=256, args=(buf, 9, n))
        assert graph.node_count == 1
        graph.launch()
        buf.copy_to(out)
        assert out.numpy("uint32").tolist() == [9] * n
        k.launch(grid=n // 256, block=256, args=(buf, 4, n))
        buf.copy_to(out)
        assert out.numpy("uint32").tolist() == [4] * n
    graph.close()
    out.close()
    s.close()


def test_launches_and_records_with_stream_none_use_the_current_stream(dev: cc.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Graph.launch, Event.record and Kernel.launch given stream=None pass the current stream's handle."""
    seen: dict[str, int] = {}

    def graph_launch(graph_id: int, ordinal: int, handle: int) -> int:
        seen["graph"] = handle
        return 0  # no executable graph handed out: the next launch comes here too

    def kernel_launch(fn: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shm: int, handle: int, *rest: object) -> int:
        seen["kernel"] = handle
        return 0

    monkeypatch.setattr(_stream, "_graph_launch", graph_launch)
    monkeypatch.setattr(_module, "_launch", kernel_launch)
    kernel = dev.load_module(Path(__file__).parent / "kernels" / "fill.ptx").function("fill")
    s = dev.create_stream()
    with dev.allocate(256, stream=s) as buf:
        with s.capture() as graph:  # an empty capture is a graph too
            pass
        with s:
            graph.launch()
            kernel.launch(grid=1, block=64, args=(buf, 1, 64))
        assert seen == {"graph": s.handle, "kernel": s.handle}
        graph.launch()
        kernel.launch(grid=1, block=64, args=(buf, 1, 64))
        assert seen == {"graph": 0, "kernel": 0}
    graph.close()
    s.close()


def test_event_record_with_stream_none_uses_the_current_stream(dev: cc.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    real = _stream.fast
    seen: list[int] = []

    class Spy:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def event_record(self, event: int, ordinal: int, handle: int) -> None:
            seen.append(handle)
            real.event_record(event, ordinal, handle)

    monkeypatch.setattr(_stream, "fast", Spy())
    s = dev.create_stream()
    e = cc.Event(timing=False)
    with s:
        e.record()
        s.record(e)
    e.record()
    assert seen == [s.handle, s.handle, 0]
    e.close()
    s.close()


def test_from_dlpack_passes_the_current_stream_to_the_producer(dev: cc.Device) -> None:
    class Stop(Exception):
        pass

    class Producer:
        stream: object = None

        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 0)

        def __dlpack__(self, stream: object = None, max_version: object = None) -> object:
            self.stream = stream
            raise Stop

    p = Producer()
    with pytest.raises(Stop):
        cc.interop.from_dlpack(p)
    assert p.stream == 1  # DLPack's legacy default stream
    s = dev.create_stream()
    with s, pytest.raises(Stop):
        cc.interop.from_dlpack(p)
    assert p.stream == s.handle
    s.close()
