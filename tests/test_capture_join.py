"""Capture across streams (fork and join): a stream that waits on an event recorded in a capture joins it.

Its work goes into the same graph and every capture rule applies to it (allocations become graph memory,
frees of older memory wait for the capture's end, synchronizing it is refused) until the stream that began
the capture ends it, which needs every joined stream's work joined back. These run on the simulator and,
with CUDACORE_BACKEND=cuda, on the GPU.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import cudacore as cc

from conftest import objects, rand

N = 64 << 10
MODES = ["global", "thread_local", "relaxed"]


def captures() -> int:
    return objects()["captures"]


@pytest.mark.parametrize("mode", MODES)
def test_fork_join_round_trip(dev, mode):
    s, side = dev.create_stream(), dev.create_stream()
    inp, outp = dev.allocate_pinned(N), dev.allocate_pinned(N)
    a, b = dev.allocate(N, stream=s), dev.allocate(N, stream=s)
    s.synchronize()
    with s.capture(mode=mode) as graph:
        a.copy_from(inp, stream=s)
        side.wait(s.record())
        assert side.capturing, "waiting on an event recorded in the capture joins it"
        assert side.capture_mode == mode
        cc.device_to_device(b, a, stream=side)
        s.wait(side.record())
        b.copy_to(outp, stream=s)
    assert not side.capturing, "the capture's end takes the joined stream out too"
    assert graph.node_count == 3
    for seed in range(3):
        want = rand(N, seed)
        inp.numpy()[:] = want
        graph.launch(s)
        s.synchronize()
        assert np.array_equal(outp.numpy(), want)
    side.synchronize()  # an ordinary stream again
    graph.destroy()
    for x in (a, b, inp, outp):
        x.close()


def test_allocation_on_a_joined_stream_is_graph_memory(dev):
    if dev.allocation_strategy != "pool":
        pytest.skip("needs the pool strategy")
    s, side = dev.create_stream(), dev.create_stream()
    dev.allocate(1 << 20, stream=side).close()  # a block cached on side, which the capture must not take
    side.synchronize()
    with s.capture() as graph:
        side.wait(s.record())
        buf = dev.allocate(1 << 20, stream=side)
        cc.device_to_device(buf, buf, stream=side)
        buf.close()  # graph memory of this capture: a free node
        s.wait(side.record())
    assert graph.allocations == 1
    assert graph.memory_held == 1 << 20
    graph.launch(s)
    s.synchronize()
    graph.destroy()


def test_older_buffer_closed_on_a_joined_stream_waits_for_the_end(dev):
    s, side = dev.create_stream(), dev.create_stream()
    buf = dev.allocate(1 << 20, stream=side)
    side.synchronize()
    before = dev.memory_stats()["in_use"]
    with s.capture() as graph:
        side.wait(s.record())
        buf.close()  # not graph memory: the driver would refuse its free on a capturing stream
        assert buf.closed
        s.wait(side.record())
    assert dev.memory_stats()["in_use"] == before - (1 << 20), "freed once the capture ended"
    graph.destroy()


def test_unjoined_work_fails_the_capture_and_gives_everything_back(dev):
    s, side = dev.create_stream(), dev.create_stream()
    buf = dev.allocate(N, stream=s)
    s.synchronize()
    before = dev.memory_stats()["in_use"]
    with pytest.raises(cc.CaptureError) as info, s.capture():
        side.wait(s.record())
        side_buf = dev.allocate(N, stream=side) if dev.allocation_strategy == "pool" else None
        cc.device_to_device(buf, buf, stream=side)
    err = info.value
    assert err.code == 904, err
    assert "not joined back" in str(err) and "error 904" in str(err), err
    assert not s.capturing and not side.capturing
    assert captures() == 0
    if side_buf is not None:
        assert side_buf.closed, "graph memory of a failed capture is void"
    assert dev.memory_stats()["in_use"] == before
    side.synchronize()
    s.synchronize()
    buf.close()


@pytest.mark.parametrize("end", ["end_capture", "abort_capture"])
def test_only_the_origin_ends_the_capture(dev, end):
    s, side = dev.create_stream(), dev.create_stream()
    s.begin_capture()
    try:
        side.wait(s.record())
        with pytest.raises(cc.CaptureError) as info:
            getattr(side, end)()
        assert info.value.code == 903
        assert "only that stream can end it" in str(info.value)
        assert s.capturing and side.capturing, "refused before the driver: the capture goes on"
        s.wait(side.record())
    finally:
        graph = s.end_capture()
    graph.destroy()
    assert not side.capturing


def test_two_captures_never_merge(dev):
    s1, s2 = dev.create_stream(), dev.create_stream()
    s1.begin_capture("relaxed")
    s2.begin_capture("relaxed")
    ev = s1.record()
    with pytest.raises(cc.CaptureError) as info:
        s2.wait(ev)
    assert info.value.code == 902
    assert s1.capturing and s2.capturing
    s2.end_capture().destroy()
    s1.end_capture().destroy()


def test_a_capture_waits_only_on_its_own_events(dev):
    s, other = dev.create_stream(), dev.create_stream()
    ev = other.record()
    with s.capture() as graph:
        with pytest.raises(cc.CaptureError) as info:
            s.wait(ev)
        assert info.value.code == 905
        assert s.capturing
    graph.destroy()
    s.wait(ev)  # outside the capture it is an ordinary wait


@pytest.mark.parametrize("which", ["legacy", "per_thread"])
def test_default_streams_cannot_join(dev, which):
    s = dev.create_stream()
    default = getattr(cc.Stream, which)(dev)
    with s.capture() as graph:
        with pytest.raises(cc.CaptureError, match="cannot join a capture"):
            default.wait(s.record())
        assert s.capturing
    graph.destroy()


def test_rules_apply_to_a_joined_stream(dev):
    s = dev.create_stream(non_blocking=True)
    side = dev.create_stream(non_blocking=False)
    buf = dev.allocate(4096)
    with s.capture(mode="relaxed") as graph:
        buf.copy_from(bytes(4096))  # the legacy stream: no blocking stream captures yet
        side.wait(s.record())
        with pytest.raises(cc.CaptureError) as info:
            side.synchronize()
        assert info.value.code == 900
        with pytest.raises(cc.CaptureError) as info:
            buf.copy_from(bytes(4096))  # side is blocking: the legacy stream would depend on the capture
        assert info.value.code == 906
        ev = side.record()
        with pytest.raises(cc.CaptureError) as info:
            ev.synchronize()
        assert info.value.code == 907
        s.wait(ev)
        assert s.capturing and side.capturing
    graph.destroy()
    side.synchronize()
    buf.close()


def test_closing_a_joined_stream_keeps_its_work_in_the_capture(dev):
    s, side = dev.create_stream(), dev.create_stream()
    inp, outp = dev.allocate_pinned(N), dev.allocate_pinned(N)
    a, b = dev.allocate(N, stream=s), dev.allocate(N, stream=s)
    s.synchronize()
    with s.capture() as graph:
        a.copy_from(inp, stream=s)
        side.wait(s.record())
        cc.device_to_device(b, a, stream=side)
        joined = side.record()
        side.close()
        with pytest.raises(cc.CUDAError):
            side.synchronize()  # closed to cudacore at once
        s.wait(joined)
        b.copy_to(outp, stream=s)
    want = rand(N, 9)
    inp.numpy()[:] = want
    graph.launch(s)
    s.synchronize()
    assert np.array_equal(outp.numpy(), want)
    graph.destroy()
    for x in (a, b, inp, outp):
        x.close()

# Misuse and lifetimes: each test below checks that in_use, pinned_in_use and the live streams, events,
# graphs and captures are back where they started once it has closed what it made.


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
    s.close()
    side.close()


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
    g.launch(s)
    s.synchronize()
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
    s.close()
    side.close()


def test_close_joined_never_joined_back(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    buf = dev.allocate(N, stream=s)
    s.synchronize()
    with pytest.raises(cc.CaptureError) as info, s.capture():
        side.wait(s.record())
        cc.device_to_device(buf, buf, stream=side)
        side.close()
    assert info.value.code == 904
    buf.close()
    s.close()


def test_gc_buffers_after_unjoined(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    bufs = []
    with pytest.raises(cc.CaptureError), s.capture():
        side.wait(s.record())
        bufs.append(dev.allocate(N, stream=side))
        bufs.append(dev.allocate(N, stream=s))
    del bufs
    gc.collect()
    s.close()
    side.close()


def test_raise_in_with_after_fork(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    with pytest.raises(ValueError), s.capture():
        side.wait(s.record())
        b = dev.allocate(N, stream=side)
        raise ValueError
    assert not side.capturing and b.closed
    side.synchronize()
    s.close()
    side.close()


def test_release_and_strategy_during_fork(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    with s.capture(mode="relaxed") as g:
        side.wait(s.record())
        b = dev.allocate(N, stream=side)
        dev.release_cached_memory()
        with pytest.raises(cc.CUDAError):
            dev.set_allocation_strategy(dev.allocation_strategy)  # refused while buffers are live
        b.close()
        s.wait(side.record())
    g.launch(s)
    s.synchronize()
    g.destroy()
    s.close()
    side.close()


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
    s.close()
    side.close()


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
    s.close()
    side.close()


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
            except BaseException as e:  # noqa: BLE001 - asserted empty below
                errs.append(e)

        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert not errs, errs
    g.launch(s)
    s.synchronize()
    g.destroy()
    s.close()
    side.close()


def test_graph_memory_of_joined_used_after(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    with s.capture() as g:
        side.wait(s.record())
        b = dev.allocate(N, stream=side)
        s.wait(side.record())
    g.launch(s)
    s.synchronize()
    b.copy_from(bytes(N), stream=s)
    s.synchronize()
    b.close()
    g.destroy()
    s.synchronize()
    s.close()
    side.close()


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
    s.close()
    side.close()
    other.close()


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
    g.launch(s)
    s.synchronize()
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
    s.close()
    t.close()


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


@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_abort_from_another_thread_leaves_books_and_driver_agreeing(dev, base, mode):
    s, side = dev.create_stream(), dev.create_stream()
    s.begin_capture(mode)
    side.wait(s.record())
    errs = []

    def abort():
        try:
            s.abort_capture()
        except cc.CUDAError as e:
            errs.append(e)

    t = threading.Thread(target=abort)
    t.start()
    t.join()
    assert [e.code for e in errs] == [908]
    assert s.capturing and side.capturing, "the driver still captures both"
    s.abort_capture()  # on the thread that began it
    assert not s.capturing and not side.capturing
    side.synchronize()
    s.synchronize()
    s.close()
    side.close()


def test_garbage_buffer_of_a_joined_stream_after_the_join_back(dev, base):
    s, side = dev.create_stream(), dev.create_stream()
    try:
        with s.capture() as g:
            side.wait(s.record())
            b = dev.allocate(N, stream=side)
            cc.device_to_device(b, b, stream=side)
            s.wait(side.record())
            del b  # the user queued nothing more on side; the collector's free did
            gc.collect()
        g.launch(s)
        s.synchronize()
        g.destroy()
    finally:
        s.close()
        side.close()


def test_capture_memory_closed_before_a_joined_stream_is_done_with_it(dev, base):
    """A Buffer of the capture closed on the origin while a joined stream still uses it: once a stream
    joined, the free is no node of the graph (it could run before the joined stream's copy) but waits for
    the capture's end, and each launch's allocation is freed after that launch."""
    if dev.allocation_strategy != "pool":
        pytest.skip("needs the pool strategy")
    s, side = dev.create_stream(), dev.create_stream()
    with s.capture() as g:
        buf = dev.allocate(N, stream=s)
        side.wait(s.record())
        cc.device_to_device(buf, buf, stream=side)
        buf.close()  # the origin has not waited for side's copy
        s.wait(side.record())
    assert g.allocations == 1
    for _ in range(3):
        g.launch(s)
        s.synchronize()
    g.destroy()
    s.close()
    side.close()


def test_a_capture_cannot_wait_on_an_event_of_an_ended_capture(dev, base):
    s, t = dev.create_stream(), dev.create_stream()
    with t.capture() as first:
        ev = t.record()
    with s.capture() as second:
        with pytest.raises(cc.CaptureError) as info:
            s.wait(ev)
        assert info.value.code == 907
        assert s.capturing, "refused before the driver: the capture goes on"
    assert second.node_count == 0
    first.destroy()
    second.destroy()
    s.close()
    t.close()
