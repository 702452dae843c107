"""Adversarial checks of capture across streams (review of the fork/join change)."""

from __future__ import annotations

import gc
import json
import threading

import pytest

import cudacore as cc
from cudacore import _api

N = 64 << 10


def objects() -> dict:
    return json.loads(_api.call(_api.core.StreamObjects))


@pytest.fixture
def base(dev):
    gc.collect()
    before = objects(), dev.memory_stats()["in_use"], dev.memory_stats()["pinned_in_use"]
    yield before
    gc.collect()
    after = objects(), dev.memory_stats()["in_use"], dev.memory_stats()["pinned_in_use"]
    assert after == before


def test_close_origin_while_joined(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    s.begin_capture()
    side.wait(s.record())
    buf = dev.allocate(N, stream=side)
    s.close()
    assert not side.capturing
    side.synchronize()
    assert buf.closed
    side.close()


def test_abort_while_joined(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    s.begin_capture()
    side.wait(s.record())
    buf = dev.allocate(N, stream=side)
    s.abort_capture()
    assert not side.capturing
    assert buf.closed
    side.synchronize()
    s.close(); side.close()


def test_join_twice_and_nested(dev, base):
    s, a, b = dev.create_stream(), dev.create_stream(), dev.create_stream()
    with s.capture() as g:
        e = s.record()
        a.wait(e)
        a.wait(e)
        b.wait(a.record())
        assert b.capturing
        x = dev.allocate(N, stream=b)
        x.close()
        a.wait(b.record())
        s.wait(a.record())
    assert not a.capturing and not b.capturing
    g.launch(s); s.synchronize()
    g.destroy()
    for t in (s, a, b):
        t.close()


def test_joined_begin_capture(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    with s.capture() as g:
        side.wait(s.record())
        with pytest.raises(cc.CUDAError):
            side.begin_capture()
        assert side.capturing
        s.wait(side.record())
    g.destroy()
    s.close(); side.close()


def test_close_joined_never_joined_back(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    buf = dev.allocate(N, stream=s)
    s.synchronize()
    with pytest.raises(cc.CaptureError) as info, s.capture():
        side.wait(s.record())
        cc.device_to_device(buf, buf, stream=side)
        side.close()
    assert info.value.code == 904
    buf.close(); s.close()


def test_gc_buffers_after_unjoined(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    bufs = []
    with pytest.raises(cc.CaptureError), s.capture():
        side.wait(s.record())
        bufs.append(dev.allocate(N, stream=side))
        bufs.append(dev.allocate(N, stream=s))
    del bufs
    gc.collect()
    s.close(); side.close()


def test_raise_in_with_after_fork(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    with pytest.raises(ValueError), s.capture():
        side.wait(s.record())
        b = dev.allocate(N, stream=side)
        raise ValueError
    assert not side.capturing and b.closed
    side.synchronize()
    s.close(); side.close()


def test_release_and_strategy_during_fork(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    with s.capture(mode="relaxed") as g:
        side.wait(s.record())
        b = dev.allocate(N, stream=side)
        dev.release_cached_memory()
        try:
            dev.set_allocation_strategy(dev.allocation_strategy)
        except cc.CUDAError as e:
            print("strategy:", e)
        b.close()
        s.wait(side.record())
    g.launch(s); s.synchronize()
    g.destroy()
    s.close(); side.close()


def test_host_waits_event_of_joined(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    with s.capture(mode="relaxed") as g:
        side.wait(s.record())
        ev = side.record()
        with pytest.raises(cc.CaptureError):
            ev.synchronize()
        with pytest.raises(cc.CaptureError):
            ev.query()
        s.wait(ev)
    with pytest.raises(cc.CUDAError):
        ev.synchronize()
    g.destroy()
    s.close(); side.close()


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_device_sync_during_fork(dev, base, mode):
    s, side = dev.create_stream(), dev.create_stream()
    with s.capture(mode=mode) as g:
        side.wait(s.record())
        with pytest.raises(cc.CaptureError):
            dev.synchronize()
        assert s.capturing and side.capturing
        s.wait(side.record())
    g.destroy()
    s.close(); side.close()


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_join_from_other_thread(dev, base, mode):
    s, side = dev.create_stream(), dev.create_stream()
    errs = []
    with s.capture(mode=mode) as g:
        ev = s.record()
        def work():
            try:
                side.wait(ev)
                b = dev.allocate(N, stream=side)
                b.close()
                s.wait(side.record())
            except Exception as e:
                errs.append(e)
        t = threading.Thread(target=work); t.start(); t.join()
    assert not errs, errs
    g.launch(s); s.synchronize()
    g.destroy()
    s.close(); side.close()


def test_graph_memory_of_joined_used_after(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    with s.capture() as g:
        side.wait(s.record())
        b = dev.allocate(N, stream=side)
        s.wait(side.record())
    g.launch(s); s.synchronize()
    b.copy_from(bytes(N), stream=s)
    s.synchronize()
    b.close()
    g.destroy()
    s.synchronize()
    s.close(); side.close()


def test_join_after_failed_join_op(dev, base):
    """An op on a joined stream that the driver refuses ends the capture for the origin too."""
    s, side = dev.create_stream(), dev.create_stream()
    s.begin_capture("relaxed")
    side.wait(s.record())
    other = dev.create_stream()
    ev = other.record()
    with pytest.raises(cc.CaptureError):
        side.wait(ev)  # 905
    assert s.capturing and side.capturing
    s.wait(side.record())
    s.end_capture().destroy()
    s.close(); side.close(); other.close()


def test_closed_joined_stream_graph_memory(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    with s.capture() as g:
        side.wait(s.record())
        b = dev.allocate(N, stream=side)
        c = dev.allocate(N, stream=side)
        cc.device_to_device(b, c, stream=side)
        ev = side.record()
        side.close()
        s.wait(ev)
        del c  # garbage: its free must not become work on side that nothing can join back
        gc.collect()
    g.launch(s); s.synchronize()
    b.close()
    g.destroy()
    s.synchronize()
    s.close()


def test_closed_joined_stream_older_buffer(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    old = dev.allocate(N, stream=side)
    side.synchronize()
    with s.capture() as g:
        side.wait(s.record())
        ev = side.record()
        side.close()
        old.close()
        s.wait(ev)
    g.destroy()
    s.close()


def test_closed_joined_with_other_capture_global(dev, base):
    s, side, t = dev.create_stream(), dev.create_stream(), dev.create_stream()
    old = dev.allocate(N, stream=side)
    old.close()  # cached on side
    side.synchronize()
    t.begin_capture("global")
    s.begin_capture("relaxed")
    side.wait(s.record())
    ev = side.record()
    side.close()
    s.wait(ev)
    s.end_capture().destroy()
    assert t.capturing
    t.end_capture().destroy()
    s.close(); t.close()


def test_closed_joined_stream_refuses_allocation_by_handle(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    h = side.handle
    with s.capture() as g:
        side.wait(s.record())
        ev = side.record()
        side.close()
        with pytest.raises(cc.CUDAError) as info:
            dev.allocate(N, stream=h)  # closed to cudacore: nothing may be queued on it
        assert "closed" in str(info.value)
        s.wait(ev)
    g.destroy()
    s.close()
