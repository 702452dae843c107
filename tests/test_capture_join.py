"""Capture across streams (fork and join): a stream that waits on an event recorded in a capture joins it.

Its work goes into the same graph and every capture rule applies to it (allocations become graph memory,
frees of older memory wait for the capture's end, synchronizing it is refused) until the stream that began
the capture ends it, which needs every joined stream's work joined back. These run on the simulator and,
with CUDACORE_BACKEND=cuda, on the GPU.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import cudacore as cc
from cudacore import _api

N = 64 << 10
MODES = ["global", "thread_local", "relaxed"]


def captures() -> int:
    return int(json.loads(_api.call(_api.core.StreamObjects))["captures"])


def rand(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


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
