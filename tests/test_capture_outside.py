"""Stream-ordered allocation and free outside a capture (docs/guide/capture.md, "Memory outside the capture").

The driver treats cuMemAllocAsync, cuMemAllocFromPoolAsync and cuMemFreeAsync on a stream that is not part
of a capture as unsafe calls: while a GLOBAL capture runs anywhere, or a THREAD_LOCAL one on the calling
thread, it refuses them (900) and invalidates the capture (docs/contributing/driver-facts.md). So cudacore refuses such
an allocation before the driver, whether or not its cache could serve it, and keeps every free, cache
release and stream destruction that would make one until the captures have ended. Each test checks that
the capture goes on and, with the `base` fixture, that nothing is left behind. They run on the simulator
and on a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import cudacore as cc

from conftest import objects

N = 1 << 20

#: (mode, the call on another thread than the capture's): where the driver forbids the calls, and where not.
FORBIDDING = [("global", False), ("global", True), ("thread_local", False)]
ALLOWING = [("relaxed", False), ("relaxed", True), ("thread_local", True)]


@pytest.fixture
def pool_dev(dev: cc.Device) -> cc.Device:
    if dev.allocation_strategy != "pool":
        pytest.skip("stream-ordered allocation needs the pool strategy")
    return dev


def on_thread(other: bool, fn: Callable[[], Any]) -> Any:
    """fn() on this thread, or on a new one; what it returned, or the exception it raised."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 - handed back to the test, which checks its type
            out.append(e)

    if other:
        t = threading.Thread(target=run)
        t.start()
        t.join()
    else:
        run()
    return out[0]


def refused_900(result: Any) -> bool:
    return isinstance(result, cc.CaptureError) and result.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"


@pytest.mark.parametrize("cached", [False, True], ids=["cache miss", "cache hit"])
@pytest.mark.parametrize("target", ["stream", "legacy"])
@pytest.mark.parametrize(("mode", "other"), FORBIDDING)
def test_allocation_outside_a_forbidding_capture_is_refused_and_the_capture_goes_on(
    pool_dev: cc.Device, base: Any, mode: str, other: bool, target: str, cached: bool
) -> None:
    d = pool_dev
    s, u = d.create_stream(), d.create_stream()
    where = u if target == "stream" else None  # None: the legacy stream (no `with stream:` block is open)
    if cached:
        d.allocate(N, stream=where).close()  # the next allocation of this size on it is a cache hit
    s.begin_capture(mode)
    inside = d.allocate(N, stream=s)  # on the capturing stream: a graph node, allowed
    got = on_thread(other, lambda: d.allocate(N, stream=where))
    assert refused_900(got), got
    assert "not part of a capture" in str(got)
    inside.close()
    g = s.end_capture()  # not invalidated
    g.destroy()
    u.close()
    s.close()


@pytest.mark.parametrize(("mode", "other"), ALLOWING)
def test_allocation_outside_an_allowing_capture_succeeds(pool_dev: cc.Device, base: Any, mode: str, other: bool) -> None:
    d = pool_dev
    s, u = d.create_stream(), d.create_stream()
    s.begin_capture(mode)
    got = on_thread(other, lambda: d.allocate(N, stream=u))
    assert isinstance(got, cc.Buffer), got
    got.close()
    s.end_capture().destroy()
    u.close()
    s.close()


@pytest.mark.parametrize(("mode", "other"), FORBIDDING)
def test_a_stream_closed_during_a_forbidding_capture_is_destroyed_when_it_ends(
    pool_dev: cc.Device, base: Any, mode: str, other: bool
) -> None:
    d = pool_dev
    s, u = d.create_stream(), d.create_stream()
    d.allocate(N, stream=u).close()  # a block cached on u: destroying u frees it
    live = objects()["streams"]
    s.begin_capture(mode)
    assert on_thread(other, u.close) is None
    assert u.closed
    with pytest.raises(cc.CUDAError):
        d.allocate(N, stream=u.handle)  # closed to cudacore at once, also by its handle
    assert objects()["streams"] == live - 1
    s.end_capture().destroy()  # not invalidated by the free of u's cached block
    assert d.release_cached_memory() == 0, "u's cached block was given back, not lost"
    s.close()


@pytest.mark.parametrize(("mode", "other"), FORBIDDING)
def test_release_of_cached_memory_during_a_capture_waits_for_its_end(
    pool_dev: cc.Device, base: Any, mode: str, other: bool
) -> None:
    d = pool_dev
    s, u = d.create_stream(), d.create_stream()
    d.allocate(N, stream=u).close()
    d.allocate(N).close()  # and one on the legacy stream
    cached = d.memory_stats()["cached"]
    s.begin_capture(mode)
    assert on_thread(other, d.release_cached_memory) == cached, "nothing is freed during the capture"
    s.end_capture().destroy()
    assert d.release_cached_memory() == 0
    u.close()
    s.close()


@pytest.mark.parametrize(("mode", "other"), FORBIDDING)
def test_graph_memory_freed_after_a_launch_during_a_forbidding_capture(
    pool_dev: cc.Device, base: Any, mode: str, other: bool
) -> None:
    d = pool_dev
    s, t = d.create_stream(), d.create_stream()
    with s.capture() as g:
        buf = d.allocate(N, stream=s)
    buf.close()  # before the first launch: each launch's allocation is freed after the launch
    t.begin_capture(mode)
    assert on_thread(other, lambda: g.launch(s)) is None
    t.end_capture().destroy()  # the free after the launch waited for this end instead of invalidating it
    g.launch(s)  # the driver would refuse it if the last launch's allocation were still live
    s.synchronize()
    g.destroy()
    t.close()
    s.close()


@pytest.mark.parametrize(("mode", "other"), FORBIDDING + ALLOWING)
def test_a_free_that_waits_from_the_per_thread_stream_is_made_on_the_legacy_stream(
    pool_dev: cc.Device, base: Any, mode: str, other: bool
) -> None:
    """A free that waits for the captures to end runs on whichever thread ends the last one, where the
    per-thread default stream is that thread's own: it is made on the legacy stream instead, which waits for
    the work of every blocking stream, each thread's per-thread stream included."""
    d = pool_dev
    s = d.create_stream()
    b = on_thread(other, lambda: d.allocate(N, stream=cc.Stream.per_thread(d)))
    ptr = b.ptr
    start = cc.flight_record(1)[-1]["seq"]
    s.begin_capture(mode)
    on_thread(other, b.close)
    s.end_capture().destroy()
    frees = [e["stream"] for e in cc.flight_record(after=start) if e["kind"] == "free" and e["ptr"] == ptr]
    assert frees == [cc.Stream.legacy(d).handle]
    s.close()
