"""Misuse that once crashed or hung the process: each must end in a typed error or succeed, quickly."""

from __future__ import annotations

import sys
import threading
from typing import Any, ClassVar

import pytest

import cudacore as cc


@pytest.mark.parametrize(("count", "size"), [(2**40, 16), (2**30, 1 << 20), (3, 1 << 40)])
def test_tiles_beyond_the_device_are_an_out_of_memory_error(count: int, size: int) -> None:
    d = cc.Device(0)
    before = d.memory_stats()["in_use"]
    with pytest.raises(cc.OutOfMemoryError):
        d.allocate_tiles(count, size)
    assert d.memory_stats()["in_use"] == before


def test_graph_update_from_itself_and_crosswise_never_hangs() -> None:
    d = cc.Device(0)
    s = d.create_stream()
    src, dst = d.allocate_pinned(4096), d.allocate(4096, stream=s)
    graphs = []
    for _ in range(2):
        with s.capture() as g:
            dst.copy_from(src, stream=s)
        graphs.append(g)
    g1, g2 = graphs
    errors: list[BaseException] = []

    def work(a: cc.Graph, b: cc.Graph) -> None:
        try:
            a.update(a)
            for _ in range(50):
                a.update(b)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(g1, g2)), threading.Thread(target=work, args=(g2, g1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "graph updates deadlocked"
    assert errors == []
    for g in graphs:
        g.destroy()
    dst.close()
    src.close()
    s.close()


@pytest.mark.parametrize("priority", [None, "16", 1.5, True])
def test_stream_priority_must_be_an_int(priority: object) -> None:
    with pytest.raises(TypeError, match="priority"):
        cc.Device(0).create_stream(priority=priority)  # type: ignore[arg-type]


def test_unknown_strategy_is_named_even_with_memory_allocated() -> None:
    d = cc.Device(0)
    with d.allocate(1 << 20), pytest.raises(cc.InvalidValueError, match="bogus"):
        d.set_allocation_strategy("bogus")


def test_a_graph_cannot_be_pickled_into_an_alias() -> None:
    import copy
    import pickle

    d = cc.Device(0)
    s = d.create_stream()
    buf, src = d.allocate(64, stream=s), d.allocate_pinned(64)
    with s.capture() as g:
        buf.copy_from(src, stream=s)
    for dup in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be pickled"):
            dup(g)
    g.destroy()
    buf.close()
    src.close()
    s.close()


@pytest.mark.parametrize("how", ["close", "collect"])
def test_buffer_from_before_a_capture_freed_during_it_is_freed_after(how: str) -> None:
    """Issue 11 #7: the free waits for the capture to end (the driver refuses it on the capturing stream),
    and the memory comes back; nothing raises, nothing leaks."""
    import gc

    d = cc.Device(0)
    s = d.create_stream()
    gc.collect()  # an earlier test's garbage freed by the collection below would skew the count
    before = d.memory_stats()["in_use"]
    buf = d.allocate(1 << 20, stream=s)
    src = d.allocate_pinned(64)
    with s.capture() as g:
        small = d.allocate(64, stream=s)
        small.copy_from(src, stream=s)
        if how == "close":
            buf.close()
        else:
            del buf
            gc.collect()
        small.close()  # graph memory of this capture: a node of the graph
    g.launch(s)
    s.synchronize()
    g.destroy()
    assert d.memory_stats()["in_use"] == before
    src.close()
    s.close()


@pytest.mark.sim
def test_a_transient_init_failure_is_not_remembered() -> None:
    """Issue 11 #11: one failed cuInit fails that call; the next one initializes again."""
    from conftest import run_python

    code = (
        "import cudacore as cc\n"
        "try:\n"
        "    cc.device_count()\n"
        "    print('no error')\n"
        "except cc.CUDAError as e:\n"
        "    print('first', e.name)\n"
        "print('then', cc.device_count())\n"
    )
    r = run_python(code, {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_FAULTS": "cuInit:1:999"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["first", "CUDA_ERROR_UNKNOWN", "then", "1"]


@pytest.mark.sim
def test_a_transient_priority_query_failure_fails_one_stream_only() -> None:
    """Issue 11 #11: the device's priority range is read again after a failure (a fresh process, whose
    first stream reads it)."""
    from conftest import run_python

    code = (
        "import cudacore as cc\n"
        "d = cc.Device(0)\n"
        "try:\n"
        "    d.create_stream()\n"
        "    print('no error')\n"
        "except cc.CUDAError as e:\n"
        "    print('first', e.name)\n"
        "d.create_stream().close()\n"
        "print('then ok')\n"
    )
    r = run_python(code, {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_FAULTS": "cuCtxGetStreamPriorityRange:1:999"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["first", "CUDA_ERROR_UNKNOWN", "then", "ok"]


def test_limit_overrides_from_threads_leave_the_original_value() -> None:
    """Issue 11 #12: overrides that overlap on several threads end with the value from before them."""
    d = cc.Device(0)
    original = d.limits.stack_size
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def work(value: int) -> None:
        try:
            for _ in range(20):
                barrier.wait(timeout=10)
                with d.limits.override(stack_size=value):
                    barrier.wait(timeout=10)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(v,)) for v in (2048, 4096, 5120, 8192)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert d.limits.stack_size == original
    # Nested on one thread: the inner block's end gives the outer block's value back.
    with d.limits.override(stack_size=2048):
        with d.limits.override(stack_size=4096):
            assert d.limits.stack_size == 4096
        assert d.limits.stack_size == 2048
    assert d.limits.stack_size == original


@pytest.mark.parametrize(("device", "exc"), [(1.5, TypeError), ("0", TypeError), (True, TypeError)])
def test_asbuffer_device_argument_is_checked(device: object, exc: type[BaseException]) -> None:
    """Issue 11 #14: a bad device argument is a TypeError naming it, not an AttributeError."""

    class Arr:
        __cuda_array_interface__: ClassVar[dict[str, Any]] = {
            "data": (0x1000, False), "shape": (4,), "typestr": "|u1", "version": 3,
        }

    with pytest.raises(exc, match="device"):
        cc.asbuffer(Arr(), device=device)  # type: ignore[arg-type]


def test_asbuffer_takes_a_numpy_integer_as_the_device() -> None:
    np = pytest.importorskip("numpy")
    d = cc.Device(0)
    keep = d.allocate(16)

    class Arr:
        __cuda_array_interface__: ClassVar[dict[str, Any]] = {
            "data": (keep.ptr, False), "shape": (16,), "typestr": "|u1", "version": 3,
        }

    b = cc.asbuffer(Arr(), device=np.int64(0))
    assert b.device_id == 0 and b.size == 16
    b.close()
    keep.close()


@pytest.mark.parametrize(
    ("cai", "exc", "match"),
    [({"shape": (4,), "typestr": "|u1"}, ValueError, "lacks 'data'"), ([1, 2], TypeError, "must be a dict")],
)
def test_asbuffer_names_a_bad_cuda_array_interface(cai: object, exc: type[BaseException], match: str) -> None:
    """Issue 11 #14: no KeyError or AttributeError from a malformed __cuda_array_interface__."""

    class Arr:
        __cuda_array_interface__ = cai

    with pytest.raises(exc, match=match):
        cc.asbuffer(Arr())


def test_a_graph_from_an_aborted_capture_is_dead_not_pending() -> None:
    """Issue 11 #14: the Graph of a capture whose block raised says it is gone, and a launch says to
    capture again, instead of "(capture in progress)" forever."""
    d = cc.Device(0)
    s = d.create_stream()
    with pytest.raises(RuntimeError, match="boom"), s.capture() as g:
        raise RuntimeError("boom")
    assert "in progress" not in repr(g)
    with pytest.raises(cc.CUDAError, match="capture it again") as info:
        g.launch(s)
    assert info.value.name == "CUDACORE_ERROR_CLOSED"
    g.destroy()  # idempotent on a dead graph
    s.close()


@pytest.mark.parametrize(
    ("interval", "exc"), [("10", TypeError), (True, TypeError), (0, ValueError), (2**63, ValueError), (float("nan"), ValueError)]
)
def test_memory_recorder_interval_is_checked(interval: object, exc: type[BaseException]) -> None:
    """Issue 11 #14: a bad interval is refused up front, never a background thread that dies."""
    with pytest.raises(exc, match="interval_ms"):
        cc.MemoryRecorder(interval_ms=interval)  # type: ignore[arg-type]


def test_kernel_launch_names_a_negative_stream_first() -> None:
    """Issue 11 #14: stream=-1 is refused up front with a message about the stream, not at the end of a
    long launch description."""
    from conftest import ROOT

    d = cc.Device(0)
    k = d.load_module(ROOT / "tests" / "kernels" / "fill.ptx").function("fill")
    buf = d.allocate(64)
    try:
        with pytest.raises(cc.InvalidValueError) as info:
            k.launch(1, 1, (buf, 1, 4), stream=-1)
        assert str(info.value).startswith("stream must be")
    finally:
        buf.close()


def test_strategy_switches_racing_allocations_lose_nothing() -> None:
    """Issue 11 #5: a strategy switch between an allocation and its free on other threads never frees a
    block through the wrong allocator (in_use went to ~2**64 and memory was lost)."""
    d = cc.Device(0)
    before = d.allocation_strategy
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            while not stop.is_set():
                d.allocate(4096).close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    switched = 0
    try:
        for i in range(1000):
            try:
                d.set_allocation_strategy("sync" if i % 2 else "pool")
                switched += 1
            except cc.IllegalStateError:
                pass  # refused while a block is out: the documented answer
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert errors == []
    stats = d.memory_stats()
    assert stats["in_use"] == 0 and stats["allocations"] >= stats["frees"] - 0
    d.set_allocation_strategy(before)


@pytest.mark.sim
def test_dlpack_for_a_stream_closed_on_another_device_is_a_closed_error() -> None:
    """A consumer stream cudacore closed on any device never reaches the driver (the simulator would end
    the process, as the real driver crashes)."""
    import json

    from conftest import run_python

    code = (
        "import cudacore as cc\n"
        "s = cc.Device(1).create_stream()\n"
        "h = s.handle\n"
        "s.close()\n"
        "b = cc.Device(0).allocate(16)\n"
        "try:\n"
        "    b.__dlpack__(stream=h)\n"
        "    print('exported')\n"
        "except cc.CUDAError as e:\n"
        "    print(e.name)\n"
        "b.close()\n"
    )
    devices = json.dumps([{"name": "sim-a"}, {"name": "sim-b"}])
    r = run_python(code, {"CUDACORE_BACKEND": "sim", "CUDACORE_SIM_DEVICES": devices})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "CUDACORE_ERROR_CLOSED"


@pytest.mark.parametrize("mode", ["thread_local", "global"])
def test_reading_memory_statistics_during_a_capture_keeps_it_valid(mode: str) -> None:
    """On the H100 a pool usage query during a capture succeeds and invalidates the capture; cudacore's
    statistics must not query the pool then (they report the last values read)."""
    d = cc.Device(0)
    s = d.create_stream()
    buf = d.allocate(4096, stream=s)
    pinned = d.allocate_pinned(4096)
    with s.capture(mode=mode) as g:
        buf.copy_from(pinned, stream=s)
        stats = d.memory_stats()
        assert stats["in_use"] >= 4096
        d.would_fit(1, 4096)
        d.memory_info()
        repr(d)
    g.launch(s)
    s.synchronize()
    g.destroy()
    buf.close()
    pinned.close()
    s.close()


def test_release_cached_memory_while_a_blocking_stream_captures_loses_nothing() -> None:
    """Found by tests/fuzz.py: a release during the capture of a blocking stream freed the legacy stream's
    cached blocks there (the driver refuses that, 906, and ends the capture); the blocks were dropped from
    the cache unfreed, and the device's free memory never came back. Now they stay cached until the capture
    ends, the capture survives, and a later release frees them."""
    d = cc.Device(0)
    d.release_cached_memory()
    free = d.memory_info()[0]
    d.allocate(47096).close()  # cached on the legacy stream
    s = d.create_stream(non_blocking=False)
    s.begin_capture("relaxed")
    d.release_cached_memory()
    s.end_capture().destroy()  # the capture was not invalidated
    d.release_cached_memory()
    assert d.memory_info()[0] == free
    s.close()


@pytest.mark.parametrize("mode", ["thread_local", "global", "relaxed"])
def test_strategy_switch_during_a_capture_is_refused(mode: str) -> None:
    """Found by tests/fuzz.py: a switch while a stream captured closed the old allocator under the capture;
    its cached blocks were never given back to the device (free memory stayed low for good), and the new
    allocator did not know the stream captured. Now the switch is a CaptureError and changes nothing."""
    d = cc.Device(0)
    d.release_cached_memory()
    free = d.memory_info()[0]
    d.allocate(200_000).close()  # cached by the current allocator
    s = d.create_stream()
    s.begin_capture(mode)
    with pytest.raises(cc.CaptureError, match="end or abort"):
        d.set_allocation_strategy("sync")
    s.abort_capture()
    assert d.allocation_strategy == "pool"
    d.release_cached_memory()
    assert d.memory_info()[0] == free
    s.close()


@pytest.mark.sim
def test_a_failed_pinned_free_can_be_retried() -> None:
    """Found by tests/fault_sweep.py: when cuMemFreeHost failed, cudacore had already forgotten the memory,
    so closing again said "not pinned memory ... or it was freed already" and pinned_in_use never came
    back down. Now the memory stays live and a second close frees it."""
    from cudacore import testing

    d = cc.Device(0)
    before = d.memory_stats()["pinned_in_use"]
    p = d.allocate_pinned(65536)
    testing.inject_fault("cuMemFreeHost", 1, "CUDA_ERROR_UNKNOWN")
    with pytest.raises(cc.CUDAError, match="cuMemFreeHost"):
        p.close()
    testing.clear_faults()
    assert not p.closed
    p.close()
    assert p.closed
    assert d.memory_stats()["pinned_in_use"] == before


@pytest.mark.sim
def test_a_collected_pinned_buffer_whose_free_failed_is_freed_later() -> None:
    """A PinnedBuffer collected while cuMemFreeHost fails cannot be closed again by anyone: its memory
    stayed counted in pinned_in_use for good (found by an adversarial review). It is kept and freed by the
    next pinned free, or by release_cached_memory()."""
    import gc

    from cudacore import testing

    d = cc.Device(0)
    before = d.memory_stats()["pinned_in_use"]
    for retry in ("release_cached_memory", "another close"):
        p = d.allocate_pinned(65536)
        testing.inject_fault("cuMemFreeHost", 1, "CUDA_ERROR_UNKNOWN")
        unraisable: list[Any] = []
        hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
        try:
            del p
            gc.collect()
        finally:
            sys.unraisablehook = hook
            testing.clear_faults()
        assert [type(u.exc_value).__name__ for u in unraisable] == ["CUDAError"], "the failure is reported"
        assert d.memory_stats()["pinned_in_use"] == before + 65536, "still allocated"
        if retry == "release_cached_memory":
            d.release_cached_memory()
        else:
            d.allocate_pinned(4096).close()
        assert d.memory_stats()["pinned_in_use"] == before, f"freed by {retry}"


@pytest.mark.sim
def test_tiles_that_fail_during_a_capture_give_back_the_earlier_ones_after_it() -> None:
    """GPU fuzzer seed 5858: a tile that fails while another stream captures (the driver refused it) must
    not make the earlier tiles' frees, or a release of the cache, run inside the capture: they wait for it
    to end, the capture stays valid, and nothing stays in use."""
    import gc

    from cudacore import testing

    d = cc.Device(0)
    s, other = d.create_stream(), d.create_stream()
    gc.collect()
    before = d.memory_stats()["in_use"]
    s.begin_capture(mode="relaxed")
    try:
        testing.inject_fault("cuMemAllocFromPoolAsync", 2, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
        with pytest.raises(cc.CaptureError, match="tile 2 of 6"):
            d.allocate_tiles(6, 3 << 20, stream=other)
        assert d.memory_stats()["in_use"] == before + (3 << 20), "the first tile's free waits for the capture"
    finally:
        testing.clear_faults()
        g = s.end_capture()  # still a valid capture: nothing unsafe ran in it
    g.destroy()
    gc.collect()
    assert d.memory_stats()["in_use"] == before
    s.close()
    other.close()


@pytest.mark.parametrize("mode", ["relaxed", "thread_local", "global"])
def test_a_stream_closed_during_a_capture_says_it_was_closed(mode: str) -> None:
    """A stream closed while another stream captures is destroyed at the driver when the capture ends (in
    GLOBAL and THREAD_LOCAL mode, on this thread). Until then it is closed all the same: using it is the
    closed error, not "not a live cudacore stream" (an adversarial tester's finding)."""
    d = cc.Device(0)
    cap, s = d.create_stream(), d.create_stream()
    cap.begin_capture(mode)
    try:
        s.close()
        for use in (s.synchronize, s.query, lambda: cc.Event(d).record(s)):
            with pytest.raises(cc.CUDAError) as exc:
                use()
            assert exc.value.name == "CUDACORE_ERROR_CLOSED", str(exc.value)
            assert "was closed" in str(exc.value)
    finally:
        cap.end_capture().destroy()
        cap.close()
